"""Speculative decoding in the simulator: the engine's real scheduler drafts and rolls back, the roofline
prices each verify step, and acceptance is a workload parameter.

The simulated speedup must agree with the closed form of ``perf.speculative.estimate`` (the same cost
model, Leviathan et al.'s expected accepted length) where the two describe the same thing: a batch of
requests decoding together. The simulator adds what the formula leaves out (prefills, requests finishing
at different times, drafts cut by ``max_tokens``), so the agreement is close, not exact.
"""

from __future__ import annotations

import math

import pytest

from minengine.perf.speculative import breakeven_batch, estimate, expected_tokens_per_step
from minengine.sim import DisaggregatedCluster, RequestSpec, SimResult, Simulator

MODEL, GPU = "llama-3.1-8b", "h100"
PROMPT, OUTPUT = 512, 256


def batch(n: int, output_len: int = OUTPUT, max_tokens: int | None = None) -> list[RequestSpec]:
    return [RequestSpec(0.0, PROMPT, output_len, max_tokens=max_tokens) for _ in range(n)]


def mean_tpot(sim: Simulator, n: int) -> float:
    summary = sim.run(batch(n)).summary()
    return summary.tpot.mean


def spec_sim(k: int, acceptance_rate: float, **kw) -> Simulator:
    return Simulator(MODEL, GPU, speculative_config={"method": "ngram", "num_speculative_tokens": k},
                     acceptance_rate=acceptance_rate, **kw)


def test_every_draft_accepted_gives_k_plus_one_tokens_a_step() -> None:
    result = spec_sim(3, 1.0).run(batch(1))
    decode_steps = [s for s in result.steps if s.num_decode_seqs]
    # The prefill samples the first token; 255 remain, four a step: 63 full steps and one of 3 tokens.
    assert len(decode_steps) == math.ceil((OUTPUT - 1) / 4)
    assert [s.num_accepted_tokens for s in decode_steps[:-1]] == [3] * (len(decode_steps) - 1)
    assert result.requests[0].num_output_tokens == OUTPUT
    assert result.requests[0].num_accepted_tokens == OUTPUT - 1 - len(decode_steps)


def full_batch_decode_rate(result: SimResult, batch_size: int) -> float:
    """Output tokens per second over the steps in which all ``batch_size`` requests decode and nothing
    prefills: the steady state the closed form describes (no prefill sharing the step, no stragglers)."""
    steps = [s for s in result.steps if s.num_decode_seqs == batch_size and not s.num_prefill_tokens]
    assert len(steps) >= 10, "too few steady-state steps to compare"
    tokens = sum(s.num_decode_seqs + s.num_accepted_tokens for s in steps)
    return tokens / sum(s.end - s.start for s in steps)


# At batch 256 with acceptance 0.9, the first requests finish before the last ones are prefilled (64
# prefill steps of 2,048 tokens against ~75 verify steps): no step has all 256 decoding, so no steady state.
STEADY_CASES = [(1, 0.0), (1, 0.6), (1, 0.9), (32, 0.0), (32, 0.6), (32, 0.9), (256, 0.0), (256, 0.6)]


@pytest.mark.parametrize(("batch_size", "acceptance_rate"), STEADY_CASES)
def test_steady_state_speedup_agrees_with_the_roofline_estimate(batch_size: int, acceptance_rate: float
                                                               ) -> None:
    k = 3
    plain, spec = Simulator(MODEL, GPU), spec_sim(k, acceptance_rate)
    plain_run, spec_run = plain.run(batch(batch_size)), spec.run(batch(batch_size))
    steady = full_batch_decode_rate(spec_run, batch_size) / full_batch_decode_rate(plain_run, batch_size)
    closed_form = estimate(plain.cost_model, batch_size, PROMPT + OUTPUT // 2, k, acceptance_rate).speedup
    whole_run = plain_run.summary().tpot.mean / spec_run.summary().tpot.mean
    print(f"\nbatch {batch_size}, acceptance {acceptance_rate}: steady state {steady:.3f}x, closed form "
          f"{closed_form:.3f}x, whole run (mean TPOT) {whole_run:.3f}x")
    # Same cost model, same acceptance model: what differs is the sampled acceptance (a few hundred
    # draws) and the spread of context lengths around the mean the closed form uses.
    assert steady == pytest.approx(closed_form, rel=0.03)
    if acceptance_rate == 0.0:
        assert steady < 1.0  # every step verifies drafts that all fail: pure cost


def test_speculation_stops_paying_as_the_batch_grows() -> None:
    k, a = 4, 0.6
    speedups = []
    for b in (1, 64, 512):
        engine = dict(max_num_seqs=b, max_num_batched_tokens=8192)  # all b decode together
        plain, spec = Simulator(MODEL, GPU, **engine), spec_sim(k, a, **engine)
        speedups.append(full_batch_decode_rate(spec.run(batch(b)), b)
                        / full_batch_decode_rate(plain.run(batch(b)), b))
    assert speedups[0] > 2.0 and speedups[0] > speedups[1] > speedups[2]
    assert speedups[2] < 1.0  # past the ridge the verify step costs more than the tokens it wins
    assert breakeven_batch(Simulator(MODEL, GPU).cost_model, PROMPT + OUTPUT // 2, k, a) in (128, 256, 512)


def test_acceptance_counts_follow_the_rate_and_a_seed_repeats_them() -> None:
    a, k = 0.6, 4
    result = spec_sim(k, a).run(batch(8))
    drafted = sum(r.num_draft_tokens for r in result.requests)
    accepted = sum(r.num_accepted_tokens for r in result.requests)
    # Accepted length per verify step: min(Geometric, k) with mean a(1 - a^k) / (1 - a). Compare the
    # mean accepted per step with it, within 4 standard errors (the variance is below k^2 / 4).
    steps = drafted / k  # every verify step drafts k here, except ones cut by max_tokens (a handful)
    expected = expected_tokens_per_step(a, k) - 1
    assert accepted / steps == pytest.approx(expected, abs=4 * (k / 2) / math.sqrt(steps))
    again = spec_sim(k, a).run(batch(8))
    assert [r.num_accepted_tokens for r in again.requests] == [r.num_accepted_tokens for r in result.requests]
    other = spec_sim(k, a, seed=1).run(batch(8))
    assert [r.num_accepted_tokens for r in other.requests] != [r.num_accepted_tokens for r in result.requests]


def test_a_hidden_length_ends_inside_a_run_of_accepted_drafts() -> None:
    # The scheduler sees max_tokens 400 only; the executor ends each request with an EOS at its true
    # length, wherever that falls in a verify step's accepted tokens.
    specs = [RequestSpec(0.0, PROMPT, n, max_tokens=400) for n in (5, 17, 30, 101)]
    result = spec_sim(4, 1.0).run(specs)
    assert sorted(r.num_output_tokens for r in result.requests) == [5, 17, 30, 101]
    assert all(r.finish_reason == "stop" for r in result.requests)


def test_bad_speculation_settings_are_clear_errors() -> None:
    with pytest.raises(ValueError, match="acceptance_rate"):
        Simulator(MODEL, GPU, speculative_config={"method": "ngram", "num_speculative_tokens": 3})
    with pytest.raises(ValueError, match="acceptance_rate"):
        spec_sim(3, 1.5)
    with pytest.raises(ValueError, match="speculative_config"):
        Simulator(MODEL, GPU, acceptance_rate=0.5)
    with pytest.raises(ValueError, match="disaggregated"):
        DisaggregatedCluster(MODEL, GPU, speculative_config={"method": "ngram", "num_speculative_tokens": 3})


def test_the_same_simulator_repeats_its_run_and_says_what_it_simulates() -> None:
    sim = spec_sim(3, 0.6)
    first, second = sim.run(batch(4)), sim.run(batch(4))  # reset() restarts the draws for each run
    assert [r.num_accepted_tokens for r in first.requests] == [r.num_accepted_tokens for r in second.requests]
    assert "3 drafts a step kept at 0.6" in sim.describe()
