"""The whole engine against Hugging Face: greedy outputs must be token-for-token identical to
``generate(do_sample=False)`` whatever the batching (chunked prefill, budgets, policies, prefix cache,
preemption). Also sampling, stop conditions, detokenization, records and input validation.

HF references are computed once per module (one prompt at a time: no padding to blur the numbers).
"""

from __future__ import annotations

import dataclasses
import random
from pathlib import Path

import pytest
import torch
from hf_utils import byte_tokenizer, load_hf_reference

from minengine.core.policies import PrefillFirstPolicy
from minengine.core.sampling_params import RequestOutputKind, SamplingParams
from minengine.engine.detokenizer import IncrementalDetokenizer
from minengine.engine.llm import LLM
from minengine.engine.sampler import Sampler
from minengine.models.loader import ASSETS_DIR, load_model

pytestmark = pytest.mark.usefixtures("torch_one_thread")

EOS = 2  # hf_utils' eos_token_id
GREEDY = SamplingParams(temperature=0)



def make_workload(n: int = 32, seed: int = 0) -> tuple[list[list[int]], list[int]]:
    """Prompts of 3-200 tokens (a third share one of two long prefixes) and 16-48 new tokens each."""
    rng = random.Random(seed)
    prefixes = [[rng.randrange(3, 512) for _ in range(80)] for _ in range(2)]
    prompts, max_tokens = [], []
    for i in range(n):
        length = 3 + (197 * i) // (n - 1)
        ids = [rng.randrange(3, 512) for _ in range(length)]
        if i % 3 == 0 and length > 20:
            keep = min(length - 5, 80)
            ids[:keep] = prefixes[i % 2][:keep]
        prompts.append(ids)
        max_tokens.append(16 + (i * 13) % 33)
    rng.shuffle(prompts)
    return prompts, max_tokens


@torch.inference_mode()
def hf_greedy(ref, prompts: list[list[int]], max_tokens: list[int]) -> list[list[int]]:
    outs = []
    for ids, n in zip(prompts, max_tokens, strict=True):
        x = torch.tensor([ids])
        out = ref.generate(
            x, attention_mask=torch.ones_like(x), max_new_tokens=n, do_sample=False, pad_token_id=0
        )
        new = out[0, len(ids) :].tolist()
        outs.append(new[: new.index(EOS) + 1] if EOS in new else new)
    return outs


@pytest.fixture(scope="module")
def model_dir(hf_model_dir) -> Path:
    return hf_model_dir("llama")


@pytest.fixture(scope="module")
def model(model_dir):
    return load_model(model_dir, device="cpu")


@pytest.fixture(scope="module")
def workload(model_dir):
    prompts, max_tokens = make_workload()
    refs = hf_greedy(load_hf_reference(model_dir), prompts, max_tokens)
    # a random model that loops on one token would make this test prove little (REFERENCE.md)
    assert sorted(len(set(r)) for r in refs)[len(refs) // 2] >= 12, "reference outputs are not varied"
    return prompts, max_tokens, refs


def run(model, prompts, max_tokens, sampling=GREEDY, **options):
    llm = LLM(model, **options)
    params = [SamplingParams(**{**vars(sampling), "max_tokens": n}) for n in max_tokens]
    return llm, llm.generate(prompts, params, use_tqdm=False)


def assert_matches(outputs, refs):
    got = [o.outputs[0].token_ids for o in outputs]
    bad = [i for i, (g, r) in enumerate(zip(got, refs, strict=True)) if g != r]
    assert not bad, (
        f"{len(bad)} of {len(refs)} requests differ from HF, e.g. #{bad[0]}: {got[bad[0]]} vs {refs[bad[0]]}"
    )
    for o, r in zip(outputs, refs, strict=True):
        assert o.outputs[0].finish_reason == ("stop" if r[-1] == EOS else "length")


SCENARIOS = {
    "chunked_prefill_off": dict(enable_chunked_prefill=False),
    "chunked_budget_16": dict(max_num_batched_tokens=16),
    "chunked_budget_64": dict(max_num_batched_tokens=64, max_num_seqs=8),
    "prefill_first_unchunked": dict(policy="prefill_first", enable_chunked_prefill=False),
    "prefill_first_mixed_64": dict(
        policy=PrefillFirstPolicy(decode_with_prefill=True), max_num_batched_tokens=64
    ),
    "no_prefix_cache_block_8": dict(enable_prefix_caching=False, block_size=8, max_num_batched_tokens=64),
}


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_greedy_matches_hf(model, workload, scenario):
    prompts, max_tokens, refs = workload
    llm, outputs = run(model, prompts, max_tokens, **SCENARIOS[scenario])
    assert_matches(outputs, refs)
    steps = llm.step_records
    budget = llm.config.max_num_batched_tokens
    assert all(0 < s.num_tokens <= budget for s in steps)
    if scenario.startswith("prefill_first_unchunked"):  # V0 order: no step mixes prompts and decodes
        assert not any(s.num_prefill_tokens and s.num_decode_tokens for s in steps)
    if scenario.startswith("chunked_budget"):
        assert any(s.num_prefill_tokens and s.num_decode_tokens for s in steps)
    assert llm.llm_engine.kv_cache_usage == 0


def test_prefix_caching_hits_and_keeps_outputs(model, workload):
    prompts, max_tokens, refs = workload
    llm, outputs = run(model, prompts, max_tokens, max_num_batched_tokens=64)
    assert_matches(outputs, refs)
    first_hits = llm.llm_engine.prefix_cache_stats["hits"]
    assert first_hits > 0, "the shared prefixes should hit within one batch"
    again = llm.generate(
        prompts, [SamplingParams(temperature=0, max_tokens=n) for n in max_tokens], use_tqdm=False
    )
    assert_matches(again, refs)
    stats = llm.llm_engine.prefix_cache_stats
    assert stats["hits"] - first_hits > sum(len(p) for p in prompts) // 2, (
        "a repeated batch should mostly hit"
    )
    assert sum(s.prefix_cache_hits for s in llm.step_records) == stats["hits"] - first_hits
    assert sum(o.num_cached_tokens for o in again) == stats["hits"] - first_hits


def test_preemption_by_recompute_keeps_outputs(model, workload):
    prompts, max_tokens, refs = workload
    # 24 blocks of 16 = 384 tokens: room for one or two of the longest requests at a time
    llm, outputs = run(model, prompts, max_tokens, num_blocks=24, max_num_batched_tokens=64)
    assert_matches(outputs, refs)
    preemptions = llm.llm_engine.num_preemptions
    print(f"\npreemptions in the oversubscribed run: {preemptions}")
    assert preemptions > 0
    assert sum(r.num_preemptions for r in llm.request_records) == preemptions
    assert sum(s.num_preempted for s in llm.step_records) == preemptions
    assert max(s.kv_blocks_used for s in llm.step_records) <= 24 and llm.llm_engine.kv_cache_usage == 0


def test_sliding_window_model_matches_hf(hf_model_dir):
    """Mistral's window (24) is shorter than the sequences: chunks and decodes must mask it the same way."""
    path = hf_model_dir("mistral")
    prompts, max_tokens = make_workload(n=6, seed=1)
    refs = hf_greedy(load_hf_reference(path), prompts, max_tokens)
    _, outputs = run(load_model(path), prompts, max_tokens, max_num_batched_tokens=16, block_size=8)
    assert_matches(outputs, refs)


def test_records_and_step_timing(model, workload):
    prompts, max_tokens, _ = workload
    llm, outputs = run(model, prompts[:6], max_tokens[:6], max_num_batched_tokens=32)
    for o in outputs:
        r = o.record
        assert r.finish_time is not None and r.arrival_time <= r.first_scheduled_time <= r.token_times[0]
        assert len(r.token_times) == r.num_output_tokens == len(o.outputs[0].token_ids)
        assert r.token_times == sorted(r.token_times) and r.token_times[-1] <= r.finish_time
        assert r.finish_reason == o.outputs[0].finish_reason and r.num_prompt_tokens == len(
            o.prompt_token_ids
        )
    steps = llm.step_records
    assert [s.step for s in steps] == list(range(steps[0].step, steps[0].step + len(steps)))
    for s in steps:
        busy = s.t_schedule + s.t_prepare + s.t_forward + s.t_sample
        assert min(s.t_schedule, s.t_prepare, s.t_forward, s.t_sample) >= 0 and busy <= s.duration + 1e-6
    assert sum(s.num_prefill_tokens for s in steps) == sum(len(p) for p in prompts[:6]) - sum(
        o.num_cached_tokens for o in outputs
    )


# ------------------------------------------------------------------------------------------------
# Sampling
# ------------------------------------------------------------------------------------------------
def test_top_k_1_equals_greedy(model, workload):
    prompts, max_tokens, refs = workload
    sampling = SamplingParams(temperature=0.8, top_k=1)
    _, outputs = run(model, prompts[:8], max_tokens[:8], sampling, max_num_batched_tokens=64)
    assert_matches(outputs, refs[:8])


def test_seeded_sampling_does_not_depend_on_the_batch(model, workload):
    prompts = workload[0]
    params = SamplingParams(temperature=1.0, top_p=0.9, top_k=50, seed=1234, max_tokens=24, ignore_eos=True)
    alone = LLM(model).generate([prompts[5]], params, use_tqdm=False)[0].outputs[0].token_ids
    others = [SamplingParams(temperature=1.0, seed=s, max_tokens=20) for s in (1, 2)] + [SamplingParams()] * 3
    batch = prompts[:3] + [prompts[5]] + prompts[6:8]
    llm = LLM(model, max_num_batched_tokens=16, policy="prefill_first")
    outs = llm.generate(batch, others[:3] + [params] + others[3:], use_tqdm=False)
    assert outs[3].outputs[0].token_ids == alone
    greedy = LLM(model).generate(
        [prompts[5]], SamplingParams(temperature=0, max_tokens=24, ignore_eos=True), False
    )
    assert greedy[0].outputs[0].token_ids != alone, "sampling at temperature 1 should differ from greedy"


def test_unseeded_sampling_is_reproducible_by_engine_seed(model, workload):
    prompts = workload[0][:4]
    params = SamplingParams(temperature=1.0, max_tokens=16)
    runs = [
        [o.outputs[0].token_ids for o in LLM(model, seed=s).generate(prompts, params, use_tqdm=False)]
        for s in (7, 7, 8)
    ]
    assert runs[0] == runs[1] and runs[0] != runs[2]


def test_sampler_filters():
    logits = torch.tensor([[1.0, 3.0, 2.0, 0.0], [0.0, 0.0, 10.0, 9.0]])
    probs = Sampler.probabilities(logits, [SamplingParams(top_k=2), SamplingParams(top_p=0.5)])
    assert probs[0, 0] == 0 and probs[0, 3] == 0 and probs[0, 1] > probs[0, 2] > 0
    assert probs[1].tolist() == [0.0, 0.0, 1.0, 0.0]  # token 2 alone holds > 0.5 of the mass
    probs = Sampler.probabilities(logits, [SamplingParams(temperature=100.0)] * 2)
    assert torch.allclose(probs, torch.full_like(probs, 0.25), atol=0.02)


def _probabilities_before(logits: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    """The sampler's filters as they were written before they were batched (the reference)."""
    logits = logits / torch.tensor([p.temperature for p in params]).unsqueeze(1)
    vocab = logits.shape[1]
    top_k = [p.top_k if 0 < p.top_k < vocab else vocab for p in params]
    if any(k < vocab for k in top_k):
        k_th = torch.stack([logits[i].topk(k).values[-1] for i, k in enumerate(top_k)])
        logits = logits.masked_fill(logits < k_th.unsqueeze(1), float("-inf"))
    top_p = torch.tensor([p.top_p for p in params])
    if bool((top_p < 1).any()):
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        sorted_probs = sorted_logits.softmax(dim=-1)
        drop_sorted = sorted_probs.cumsum(dim=-1) - sorted_probs >= top_p.unsqueeze(1)
        drop_sorted[:, 0] = False
        drop = torch.zeros_like(drop_sorted).scatter(1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits.softmax(dim=-1)


def test_batched_filters_give_the_same_probabilities_and_tokens_as_before():
    """Each row equals the old filters applied to that row alone, bit for bit, so seeded draws are
    unchanged. (The old code, batched, also cut the float-rounding tail off top_p=1 rows whenever another
    row used top-p: a request's distribution depended on its neighbours. Not any more.)"""
    rng = random.Random(0)
    gen = torch.Generator().manual_seed(0)
    for _ in range(30):
        n, vocab = rng.randint(1, 9), rng.choice([7, 50, 1753])
        logits = torch.randn(n, vocab, generator=gen) * 3
        params = [SamplingParams(temperature=rng.choice([0.3, 1.0, 1.7]),
                                 top_k=rng.choice([0, 1, 5, 40, vocab]),
                                 top_p=rng.choice([1.0, 0.9, 0.5, 0.05]), seed=rng.randrange(100))
                  for _ in range(n)]
        new = Sampler.probabilities(logits, params)
        for i in range(n):
            alone = _probabilities_before(logits[i : i + 1], params[i : i + 1])[0]
            assert torch.equal(new[i], alone)
            seed = params[i].seed
            draws = [torch.multinomial(p, 20, replacement=True, generator=torch.Generator().manual_seed(seed))
                     for p in (new[i], alone)]
            assert torch.equal(draws[0], draws[1])


# ------------------------------------------------------------------------------------------------
# Stops, text, validation
# ------------------------------------------------------------------------------------------------
def test_stop_strings_truncate_text_and_deltas_never_split_characters(model, workload):
    tok = byte_tokenizer()
    llm = LLM(model, tokenizer=tok)
    prompt = workload[0][10]
    full = llm.generate(
        [prompt], SamplingParams(temperature=0, max_tokens=40, ignore_eos=True), use_tqdm=False
    )[0]
    text = full.outputs[0].text
    assert text == tok.decode(full.outputs[0].token_ids) and len(text) > 10
    i = next(i for i in range(len(text) // 3, len(text) - 2) if "\ufffd" not in text[i : i + 2])
    stop = text[i : i + 2]
    engine = llm.llm_engine
    engine.add_request(
        "s", prompt, SamplingParams(temperature=0, max_tokens=40, ignore_eos=True, stop=[stop, "\x00\x00"])
    )
    deltas, last = [], None
    while engine.has_unfinished_requests():
        for out in engine.step():
            deltas.append(out.outputs[0].delta_text)
            last = out
    assert last.outputs[0].text == text[: text.find(stop)] == "".join(deltas)
    assert last.outputs[0].finish_reason == "stop" and last.outputs[0].stop_reason == stop
    assert len(last.outputs[0].token_ids) < 40


@pytest.mark.parametrize("stop", [None, "found"])
def test_output_kinds_deliver_the_same_result(model, workload, stop):
    """CUMULATIVE repeats everything each step, DELTA sends only what is new, FINAL_ONLY waits for the end;
    the request and its final text are the same whichever is asked for (stop strings included)."""
    tok = byte_tokenizer()
    llm = LLM(model, tokenizer=tok)
    engine, prompts = llm.llm_engine, workload[0][8:11]
    base = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    reference = llm.generate(prompts, base, use_tqdm=False)
    stops = [None] * len(prompts)
    if stop == "found":  # a stop string from the middle of each reference text
        stops = [o.outputs[0].text[8:10] for o in reference]
    outs: dict[RequestOutputKind, dict[str, list]] = {}
    for kind in RequestOutputKind:
        for i, p in enumerate(prompts):
            params = dataclasses.replace(base, output_kind=kind, stop=[stops[i]] if stops[i] else None)
            engine.add_request(f"{kind.name}-{i}", p, params)
        got: dict[str, list] = {}
        while engine.has_unfinished_requests():
            for out in engine.step():
                got.setdefault(out.request_id, []).append(out)
        outs[kind] = got
    for i in range(len(prompts)):
        cum, delta, final = (outs[k][f"{k.name}-{i}"] for k in RequestOutputKind)
        assert len(final) == 1 and final[0].finished and len(cum) == len(delta) > 1
        whole = final[0].outputs[0]
        assert cum[-1].outputs[0].text == whole.text == "".join(o.outputs[0].text for o in delta)
        streamed = [t for o in delta for t in o.outputs[0].token_ids]
        assert cum[-1].outputs[0].token_ids == whole.token_ids == streamed
        assert [len(o.outputs[0].token_ids) for o in cum] == list(range(1, len(cum) + 1))
        assert all(len(o.outputs[0].token_ids) == 1 for o in delta)
        if stop is None:
            assert whole.token_ids == reference[i].outputs[0].token_ids
        else:
            assert whole.finish_reason == "stop" and whole.stop_reason == stops[i]
            assert stops[i] not in whole.text


def test_generate_builds_only_final_outputs_and_keeps_its_step_records(model, workload):
    llm = LLM(model)
    outs = llm.generate(workload[0][:6], SamplingParams(temperature=0, max_tokens=12, ignore_eos=True),
                        use_tqdm=False)
    assert all(len(o.outputs[0].token_ids) == 12 for o in outs)
    assert sum(s.num_decode_tokens + sum(1 for c in s.prefill_chunks) for s in llm.step_records) >= 6 * 12
    first = llm.step_records[0].step
    assert [s.step for s in llm.step_records] == list(range(first, first + len(llm.step_records)))
    again = llm.generate(workload[0][:2], SamplingParams(temperature=0, max_tokens=3), use_tqdm=False)
    assert len(again) == 2 and llm.step_records[0].step > first  # only the second call's steps


def test_incremental_detokenizer_keeps_multibyte_characters_whole():
    tok = byte_tokenizer()
    text = "héllo wörld 🙂 €100 ✓ 日本"
    ids = tok.encode(text)
    assert len(ids) == len(text.encode())  # one token per byte: characters do span tokens
    detok = IncrementalDetokenizer(tok, [], stop=["✓ 日"])
    deltas = []
    for t in ids:
        stop = detok.update([t])
        deltas.append(detok.get_delta(finished=stop is not None))
        if stop:
            break
    assert stop == "✓ 日" and "".join(deltas) == "héllo wörld 🙂 €100 " == detok.output_text
    assert not any("\ufffd" in d for d in deltas)


def test_max_model_len_and_eos(model, workload):
    prompts, max_tokens, refs = workload
    llm = LLM(model, max_model_len=40)
    out = llm.generate(
        [prompts[0][:30]], SamplingParams(temperature=0, max_tokens=None, ignore_eos=True), False
    )[0]
    assert out.outputs[0].finish_reason == "length" and len(out.outputs[0].token_ids) == 10
    stopped = [i for i, r in enumerate(refs) if r[-1] == EOS]
    if stopped:  # the EOS token is included in token_ids (as in vLLM), and ends the request
        i = stopped[0]
        o = LLM(model).generate([prompts[i]], SamplingParams(temperature=0, max_tokens=max_tokens[i]), False)[
            0
        ]
        assert o.outputs[0].token_ids == refs[i] and o.outputs[0].finish_reason == "stop"


def test_invalid_requests_fail_clearly_and_queue_nothing(model):
    llm = LLM(model, num_blocks=4, block_size=16)
    with pytest.raises(ValueError, match="no tokenizer"):
        llm.generate("hello")
    with pytest.raises(ValueError, match="token ids must be ints"):
        llm.generate([[1, 2, 100000]])
    with pytest.raises(ValueError, match="KV cache holds 64 tokens"):
        llm.generate([[5] * 10, [6] * 60], SamplingParams(max_tokens=20))
    with pytest.raises(ValueError, match="stop strings need a tokenizer"):
        llm.generate([[5] * 10], SamplingParams(stop="x"))
    assert not llm.llm_engine.has_unfinished_requests()
    with pytest.raises(TypeError, match="unknown engine option"):
        LLM(model, max_batch=3)


def test_abort_frees_blocks(model):
    llm = LLM(model)
    engine = llm.llm_engine
    engine.add_request("a", [5] * 40, SamplingParams(max_tokens=30))
    engine.add_request("b", [6] * 40, SamplingParams(max_tokens=30))
    engine.step()
    assert engine.kv_cache_usage > 0
    (out,) = engine.abort_request("a")
    assert out.finished and out.outputs[0].finish_reason == "abort"
    while engine.has_unfinished_requests():
        engine.step()
    assert engine.kv_cache_usage == 0


SHIPPED = ASSETS_DIR / "tinystories-4m"


@pytest.mark.skipif(
    not (SHIPPED / "model.safetensors").is_file(), reason="the shipped model is not built yet"
)
def test_shipped_model_text_generation_matches_hf():
    llm = LLM()  # the default model
    tok = llm.get_tokenizer()
    prompts = ["Once upon a time", "The little dog was very", "Lily and Tom went to the park. They"]
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=32), use_tqdm=False)
    ref = load_hf_reference(SHIPPED)
    for p, o in zip(prompts, outs, strict=True):
        ids = tok.encode(p)
        x = torch.tensor([ids])
        with torch.inference_mode():
            hf = ref.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=32, do_sample=False)
        assert o.outputs[0].token_ids == hf[0, len(ids) :].tolist()[: len(o.outputs[0].token_ids)]
        assert o.outputs[0].text == tok.decode(o.outputs[0].token_ids, skip_special_tokens=True)
        assert len(o.outputs[0].text) > 20
    stop_word = outs[0].outputs[0].text.split()[2]
    out = llm.generate(
        prompts[0], SamplingParams(temperature=0, max_tokens=32, stop=stop_word), use_tqdm=False
    )[0]
    assert out.outputs[0].finish_reason == "stop" and stop_word not in out.outputs[0].text


def test_kv_cache_sizing(model):
    from minengine.config import EngineConfig
    from minengine.engine.kv_cache import determine_num_blocks, kv_bytes_per_token
    from minengine.models.config import ModelConfig

    llama8b = ModelConfig(
        architecture="LlamaForCausalLM", vocab_size=128256, hidden_size=4096, intermediate_size=14336,
        num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8, head_dim=128,
    )  # fmt: skip
    assert kv_bytes_per_token(llama8b, torch.bfloat16) == 131072  # 128 KiB per token (REFERENCE.md)
    c = model.config
    per_block = 16 * 2 * c.num_hidden_layers * c.num_key_value_heads * c.head_dim * 4
    config = EngineConfig(kv_cache_memory_bytes=10 * per_block + 1).resolved(c.max_position_embeddings)
    assert determine_num_blocks(config, c, torch.float32, torch.device("cpu")) == 10
    llm = LLM(model, kv_cache_memory_bytes=10 * per_block)
    assert llm.llm_engine.kv_cache.num_blocks == 10 and llm.llm_engine.kv_cache.num_bytes == 10 * per_block
    with pytest.raises(ValueError, match="smaller than one block"):
        LLM(model, kv_cache_memory_bytes=per_block - 1)


@pytest.mark.parametrize("kwargs", [{"top_p": 5e-324}, {"temperature": 1e-30}, {"top_p": 1e-9, "top_k": 1}])
def test_degenerate_sampling_params_keep_the_most_likely_token(kwargs):
    """Found by fuzzing the server: a top_p that rounds to 0 once dropped every token and produced NaN."""
    logits = torch.randn(2, 50, generator=torch.Generator().manual_seed(0))
    params = SamplingParams(**{"temperature": 1.0, **kwargs})
    probs = Sampler.probabilities(logits, [params, params]) if not params.greedy else None
    if probs is not None:
        assert torch.isfinite(probs).all()
        assert probs.argmax(-1).tolist() == logits.argmax(-1).tolist()
    else:
        assert kwargs.get("temperature", 1.0) < 1e-5
