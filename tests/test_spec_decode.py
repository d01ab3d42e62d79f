"""Speculative decoding's two building blocks (issue 40), before the scheduler runs them:

* ``NgramProposer`` (prompt lookup) against a brute-force reading of its rule, on vLLM's own example and
  on random sequences;
* the rejection sampler: greedy keeps exactly the drafts the target's argmax agrees with; sampling emits
  tokens distributed as the target's distribution, checked by a chi-square test whose power is shown by
  planting the two classic mistakes, which the same test must reject.
"""

from __future__ import annotations

import random

import pytest
import torch

from minengine.config import SpeculativeConfig
from minengine.core.ngram_proposer import NgramProposer
from minengine.engine.rejection_sampler import greedy_verify, rejection_sample


# ------------------------------------------------------------------------------------ the config
def test_lookup_sizes_take_vllms_defaults_and_each_others_value() -> None:
    both = SpeculativeConfig()
    assert (both.method, both.prompt_lookup_min, both.prompt_lookup_max) == ("ngram", 5, 5)
    assert SpeculativeConfig(prompt_lookup_max=3).prompt_lookup_min == 3
    assert SpeculativeConfig(prompt_lookup_min=2).prompt_lookup_max == 2


@pytest.mark.parametrize(("kwargs", "words"), [
    (dict(method="eagle"), "is not one of ngram"),
    (dict(num_speculative_tokens=0), "num_speculative_tokens must be a positive int"),
    (dict(prompt_lookup_min=4, prompt_lookup_max=2), "must be <= prompt_lookup_max"),
    (dict(prompt_lookup_min=0, prompt_lookup_max=2), "prompt_lookup_min must be a positive int"),
])
def test_bad_settings_say_what_is_wrong(kwargs: dict, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        SpeculativeConfig(**kwargs)


# ------------------------------------------------------------------------------- n-gram proposer
def proposer(k: int, lo: int, hi: int, max_model_len: int = 1000) -> NgramProposer:
    config = SpeculativeConfig(num_speculative_tokens=k, prompt_lookup_min=lo, prompt_lookup_max=hi)
    return NgramProposer(config, max_model_len)


def by_the_rule(tokens: list[int], k: int, lo: int, hi: int, max_model_len: int) -> list[int]:
    """Every (n, i) written out: the longest n-gram ending the sequence that occurs earlier, its earliest
    occurrence, then the tokens after it."""
    k = min(k, max_model_len - len(tokens))
    matches = [(n, i) for n in range(lo, hi + 1) for i in range(len(tokens) - n)
               if tokens[i:i + n] == tokens[len(tokens) - n:]]
    if k <= 0 or not matches:
        return []
    n = max(n for n, _ in matches)
    i = min(i for m, i in matches if m == n)
    return tokens[i + n:i + n + k]


def test_vllms_example() -> None:
    # vLLM's NgramProposer.propose docstring: [4, 2, 3] has no earlier match, [2, 3] does, and only three
    # tokens follow it
    assert proposer(4, 2, 3).propose([1, 2, 3, 4, 2, 3]) == [4, 2, 3]


def test_the_longest_match_wins_and_its_earliest_occurrence() -> None:
    #         0  1  2  3  4  5  6  7  8  9
    tokens = [7, 1, 2, 9, 5, 1, 2, 8, 6, 2]
    tokens += [5, 1, 2]  # ends in "5 1 2" (at 4) and "1 2" (at 1 and 5): the 3-gram's follower is 8
    assert proposer(2, 1, 3).propose(tokens) == [8, 6]
    assert proposer(2, 1, 2).propose(tokens) == [9, 5]  # "1 2" first occurs at 1
    assert proposer(3, 4, 4).propose(tokens) == []  # no 4-gram repeats


def test_no_draft_past_the_context_or_from_a_short_sequence() -> None:
    tokens = [1, 2, 3, 1, 2]
    assert proposer(5, 2, 2, max_model_len=7).propose(tokens) == [3, 1]  # 2 tokens left in the context
    assert proposer(5, 2, 2, max_model_len=5).propose(tokens) == []
    assert proposer(3, 2, 2).propose([4]) == [] and proposer(3, 1, 1).propose([]) == []


def test_random_sequences_follow_the_rule() -> None:
    rng = random.Random(0)
    for _ in range(2000):
        tokens = [rng.randrange(4) for _ in range(rng.randrange(0, 40))]
        k, lo = rng.randrange(1, 6), rng.randrange(1, 4)
        hi, max_len = lo + rng.randrange(0, 3), len(tokens) + rng.randrange(0, 4)
        assert proposer(k, lo, hi, max_len).propose(tokens) == by_the_rule(tokens, k, lo, hi, max_len), tokens


# -------------------------------------------------------------------------------- greedy verify
def test_greedy_keeps_the_drafts_the_argmax_agrees_with() -> None:
    torch.manual_seed(0)
    for _ in range(300):
        k = int(torch.randint(0, 5, ()))
        logits = torch.randn(k + 1, 6)
        best = logits.argmax(-1).tolist()
        drafts = [b if torch.rand(()) < 0.7 else (b + 1) % 6 for b in best[:k]]
        out = greedy_verify(drafts, logits)
        agree = next((i for i in range(k) if drafts[i] != best[i]), k)
        assert out == best[:agree + 1]  # the agreeing drafts (the argmax itself), then one argmax more


# ------------------------------------------------------------------------------------ sampling
VOCAB, DRAWS = 5, 6000
# The critical value of chi-square with VOCAB - 1 = 4 degrees of freedom at significance 0.001: a correct
# sampler fails this test once in a thousand seeds (the seeds here are fixed, so a run is repeatable).
CHI2_CRITICAL = 18.47


def chi_square(tokens: list[int], probs: torch.Tensor) -> float:
    counts = torch.bincount(torch.tensor(tokens), minlength=VOCAB).double()
    expected = probs.double() * len(tokens)
    return float(((counts - expected) ** 2 / expected).sum())


def emitted_tokens(sample, drafts_of, target: torch.Tensor, draft: torch.Tensor | None,
                   seed: int) -> tuple[list[int], list[int]]:
    """The first and second emitted tokens of ``DRAWS`` verifications (the second where there is one)."""
    gen = torch.Generator().manual_seed(seed)
    firsts, seconds = [], []
    for _ in range(DRAWS):
        out = sample(drafts_of(gen), target, draft, gen)
        firsts.append(out[0])
        if len(out) > 1:
            seconds.append(out[1])
    return firsts, seconds


def always_keep(drafts, target, draft, gen):  # a planted mistake: drafts accepted without a test
    return [*drafts, int(torch.multinomial(target[len(drafts)], 1, generator=gen))]


def resample_from_p(drafts, target, draft, gen):  # a planted mistake: a rejection draws from p, not p - q
    out = []
    for i, x in enumerate(drafts):
        q = 1.0 if draft is None else float(draft[i, x])
        if float(torch.rand((), generator=gen)) * q < float(target[i, x]):
            out.append(x)
            continue
        return [*out, int(torch.multinomial(target[i], 1, generator=gen))]
    return [*out, int(torch.multinomial(target[len(drafts)], 1, generator=gen))]


TARGET = torch.tensor([[0.40, 0.30, 0.15, 0.10, 0.05],
                       [0.05, 0.15, 0.20, 0.25, 0.35],
                       [0.20, 0.20, 0.20, 0.20, 0.20]])
DRAFT_MODEL = torch.tensor([[0.10, 0.50, 0.10, 0.20, 0.10],
                            [0.30, 0.10, 0.30, 0.20, 0.10]])


def fixed_guess(gen: torch.Generator) -> list[int]:
    return [1, 4]  # an n-gram lookup's drafts: the same guess every time


def drawn_from_the_draft_model(gen: torch.Generator) -> list[int]:
    return [int(torch.multinomial(row, 1, generator=gen)) for row in DRAFT_MODEL]


@pytest.mark.parametrize(("drafts_of", "draft"), [(fixed_guess, None), (drawn_from_the_draft_model,
                                                                          DRAFT_MODEL)],
                         ids=["ngram", "draft_model"])
def test_emitted_tokens_follow_the_target_distribution(drafts_of, draft) -> None:
    firsts, seconds = emitted_tokens(rejection_sample, drafts_of, TARGET, draft, seed=1)
    # the first token always follows the target's first row; the second, emitted only when the first
    # draft was kept, follows the second row (the target here does not depend on the context)
    stats = chi_square(firsts, TARGET[0]), chi_square(seconds, TARGET[1])
    print(f"\nchi-square of the first and second tokens: {stats[0]:.1f}, {stats[1]:.1f} "
          f"(critical {CHI2_CRITICAL})")
    assert max(stats) < CHI2_CRITICAL, stats
    for mistake in (always_keep, resample_from_p):  # the same test has the power to see them
        planted, _ = emitted_tokens(mistake, drafts_of, TARGET, draft, seed=1)
        assert chi_square(planted, TARGET[0]) > 10 * CHI2_CRITICAL, mistake.__name__


def test_a_draft_the_target_rules_out_is_never_emitted() -> None:
    target = torch.tensor([[0.0, 0.5, 0.5, 0.0, 0.0], [0.2] * 5])
    gen = torch.Generator().manual_seed(0)
    outs = [rejection_sample([3], target, None, gen) for _ in range(200)]
    assert all(len(o) == 1 and o[0] in (1, 2) for o in outs)


def test_a_certain_draft_is_always_kept_and_earns_the_bonus() -> None:
    target = torch.tensor([[0.0, 1.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 1.0, 0.0]])
    assert rejection_sample([1], target, None, torch.Generator().manual_seed(0)) == [1, 3]


def test_target_rows_must_cover_the_drafts_and_the_bonus() -> None:
    with pytest.raises(ValueError, match="needs k \\+ 1"):
        rejection_sample([1, 2], TARGET[:2])
