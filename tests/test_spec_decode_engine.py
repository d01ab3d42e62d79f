"""Speculative decoding in the engine: with drafts verified in the decode steps, greedy output is token for
token the output without them, in every scheduling mode.

The shipped story model rarely repeats itself, so n-gram drafts would almost all be rejected and the
accept path would go untested. An *oracle* drafter therefore proposes the continuation the engine
produced without speculation, with every third draft position (by a fixed pattern) replaced by a wrong
token: each step then accepts some drafts and rejects the rest, at every offset into a KV block, and the
output must still equal the reference. The real n-gram drafter runs in ``tests/test_smollm2.py`` (against
Hugging Face ``generate()``) and below on a prompt that repeats.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import pytest

from minengine.core.sampling_params import SamplingParams
from minengine.engine.llm import LLM

pytestmark = pytest.mark.usefixtures("torch_one_thread")

PROMPTS = [
    "Once upon a time there was a little dog.",
    "Tom had a red ball. He liked to throw it to his friend Sam every day after school.",
    "The sun",
    "Lily and her mom went to the park to see the big trees and the ducks in the pond. Lily laughed.",
    "Once upon a time there was a little cat.",  # shares its start with the first: prefix cache hits
]
SPEC = {"method": "ngram", "num_speculative_tokens": 4}


class OracleDrafter:
    """Proposes the reference continuation of each sequence, with a wrong token wherever
    (position + length) % 3 == 0, so acceptance varies from step to step."""

    def __init__(self, continuations: dict[tuple[int, ...], list[int]], k: int, vocab: int) -> None:
        self.continuations, self.k, self.vocab = continuations, k, vocab

    def propose(self, token_ids: Sequence[int]) -> list[int]:
        for prompt, output in self.continuations.items():
            n = len(prompt)
            if tuple(token_ids[:n]) == prompt:
                done = len(token_ids) - n
                drafts = list(output[done:done + self.k])
                return [(t + 1) % self.vocab if (i + len(token_ids)) % 3 == 0 else t
                        for i, t in enumerate(drafts)]
        return []


def run(prompts: list[str], params: SamplingParams | list[SamplingParams], oracle: bool = True,
        spec: dict = SPEC, **options) -> tuple[list, LLM]:
    reference = LLM("tinystories-4m", **options)
    ref = reference.generate(prompts, params, use_tqdm=False)
    llm = LLM("tinystories-4m", speculative_config=spec, **options)
    if oracle:
        continuations = {tuple(o.prompt_token_ids): list(o.outputs[0].token_ids) + [0] * 8 for o in ref}
        vocab = llm.llm_engine.model_config.vocab_size
        llm.llm_engine.scheduler.drafter = OracleDrafter(continuations, SPEC["num_speculative_tokens"], vocab)
    got = llm.generate(prompts, params, use_tqdm=False)
    for r, g in zip(ref, got, strict=True):
        mine, theirs = g.outputs[0], r.outputs[0]
        assert mine.token_ids == theirs.token_ids, (r.prompt, theirs.text, mine.text)
        assert (mine.text, mine.finish_reason) == (theirs.text, theirs.finish_reason)
    return got, llm


def drafted_and_accepted(llm: LLM) -> tuple[int, int]:
    steps = llm.step_records
    return sum(s.num_draft_tokens for s in steps), sum(s.num_accepted_tokens for s in steps)


SCENARIOS = {
    "default": dict(),
    "chunked_prefill_16": dict(max_num_batched_tokens=16),  # drafts cut to the budget, mixed steps
    "prefix_cache": dict(enable_prefix_caching=True),
    "no_prefix_cache": dict(enable_prefix_caching=False),
    "preempting_12_blocks": dict(num_blocks=12, max_model_len=96, max_num_batched_tokens=96),
    "block_size_4": dict(block_size=4),  # drafts cross block boundaries at every offset
}


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_greedy_output_is_unchanged_by_verified_drafts(scenario: str) -> None:
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    _, llm = run(PROMPTS, params, **SCENARIOS[scenario])
    drafted, accepted = drafted_and_accepted(llm)
    print(f"\n{scenario}: {accepted}/{drafted} drafts accepted")
    assert 0 < accepted < drafted  # both paths ran: kept drafts and rolled-back ones
    records = llm.llm_engine.request_records
    assert sum(r.num_accepted_tokens for r in records) == accepted
    assert sum(r.num_draft_tokens for r in records) == drafted
    assert llm.llm_engine.kv_cache_usage == 0  # every block came back
    if scenario.startswith("preempting"):
        assert llm.llm_engine.num_preemptions > 0


def test_max_tokens_and_stops_inside_a_run_of_accepted_drafts() -> None:
    # max_tokens 1..9: the last step's drafts are cut to what may still be emitted; EOS on (the model's
    # own end of story) and a stop string that can land in the middle of kept drafts
    base = [SamplingParams(temperature=0, max_tokens=m) for m in range(1, 10)]
    run(PROMPTS[:1] * 9, base)
    stops = [SamplingParams(temperature=0, max_tokens=60, stop=["."]),
             SamplingParams(temperature=0, max_tokens=60, stop=[" the"]),
             SamplingParams(temperature=0, max_tokens=200)]  # runs to EOS
    run(PROMPTS[1:4], stops)


def test_the_ngram_drafter_in_the_engine() -> None:
    # The story model does not continue a pattern, so vLLM's default 5-gram finds nothing after its first
    # token; matches of 1 to 3 tokens do find drafts (mostly wrong ones), and the output stays the same.
    prompts = ["One, two, three, four. One, two, three, four. One, two,", *PROMPTS[:3]]
    params = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)
    spec = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1, "prompt_lookup_max": 3}
    _, llm = run(prompts, params, oracle=False, spec=spec)
    drafted, accepted = drafted_and_accepted(llm)
    print(f"\nn-gram drafts: {accepted}/{drafted} accepted")
    assert drafted > 0


def test_sampled_requests_take_drafts_and_stay_reproducible() -> None:
    # At temperature > 0 the tokens differ from a run without drafts (the random draws differ; that the
    # distribution does not is tests/test_spec_decode.py's chi-square test), but a seeded request gives
    # the same text twice.
    params = SamplingParams(temperature=0.8, top_k=20, max_tokens=30, seed=7, ignore_eos=True)
    spec = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1, "prompt_lookup_max": 2}
    outs = []
    for _ in range(2):
        llm = LLM("tinystories-4m", speculative_config=spec)
        outs.append(llm.generate(PROMPTS[:2], params, use_tqdm=False))
        assert drafted_and_accepted(llm)[0] > 0
    assert [o.outputs[0].token_ids for o in outs[0]] == [o.outputs[0].token_ids for o in outs[1]]


def test_bad_speculative_config_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="its keys are method, num_speculative_tokens"):
        LLM("tinystories-4m", speculative_config={"num_spec_tokens": 3})
    with pytest.raises(ValueError, match="is not one of ngram"):
        LLM("tinystories-4m", speculative_config={"method": "eagle"})


def test_the_server_streams_verified_tokens_and_exports_vllms_counters() -> None:
    import httpx

    from minengine.server import ServerThread, create_app

    spec = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1, "prompt_lookup_max": 2}
    body = {"prompt": PROMPTS[1], "max_tokens": 24, "temperature": 0, "ignore_eos": True}
    reference = LLM("tinystories-4m").generate([PROMPTS[1]], SamplingParams(temperature=0, max_tokens=24,
                                                                            ignore_eos=True), use_tqdm=False)
    app = create_app(model="tinystories-4m", speculative_config=spec)
    with ServerThread(app) as srv, httpx.Client(base_url=srv.url, timeout=60) as http:
        plain = http.post("/v1/completions", json=body).json()["choices"][0]["text"]
        pieces = []
        with http.stream("POST", "/v1/completions", json={**body, "stream": True}) as r:
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    pieces.append(json.loads(line[6:])["choices"][0]["text"])
        metrics = {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
                   for line in http.get("/metrics").text.splitlines() if line and not line.startswith("#")}
    assert plain == "".join(pieces) == reference[0].outputs[0].text
    label = '{model_name="tinystories-4m"}'
    drafted = metrics[f"minengine:spec_decode_num_draft_tokens_total{label}"]
    accepted = metrics[f"minengine:spec_decode_num_accepted_tokens_total{label}"]
    assert drafted > 0 and 0 <= accepted <= drafted
    assert metrics[f"minengine:spec_decode_num_drafts_total{label}"] > 0


def test_the_run_summary_reports_acceptance_as_vllms_benchmark_does() -> None:
    from minengine.metrics.stats import summarize

    params = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)
    _, llm = run(PROMPTS[:3], params)
    drafted, accepted = drafted_and_accepted(llm)
    summary = summarize(list(llm.llm_engine.request_records), steps=list(llm.step_records))
    assert (summary.num_draft_tokens, summary.num_accepted_tokens) == (drafted, accepted)
    table = summary.format_table()
    assert "Speculative Decoding" in table and f"{100 * accepted / drafted:.2f}" in table
    plain = LLM("tinystories-4m")
    plain.generate(PROMPTS[:1], params, use_tqdm=False)
    assert "Speculative" not in summarize(list(plain.llm_engine.request_records),
                                          steps=list(plain.step_records)).format_table()
