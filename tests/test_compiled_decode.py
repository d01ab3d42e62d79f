"""The CPU's compiled decode steps (``compile_decode=True``): the same greedy tokens as transformers and
as the eager engine, through batches of different lengths, prefill/decode mixes, preemption and prefix
hits; graphs compiled once at start-up and reused for every length and batch size; readable errors for
options it can't honour; a failed compile falls back to the reference path instead of failing.

One engine per model is compiled per module (a compile of the tiny models takes seconds to tens of
seconds on 2 cores); the tests share it. Speed is a benchmark's business (``benchmarks/decode_floor.py``).
"""

from __future__ import annotations

import random

import pytest
import torch
from hf_utils import load_hf_reference

from minengine.config import EngineConfig
from minengine.core.sampling_params import SamplingParams
from minengine.engine.compiled_decode import CompiledDecode
from minengine.engine.llm import LLM

pytestmark = pytest.mark.usefixtures("torch_one_thread")
# Weights not prepacked: with them the graph runs batch-1 steps only (test_prepacked_weights_...), and
# these tests are about the batched graphs
COMMON = dict(max_num_seqs=4, max_num_batched_tokens=32, max_model_len=160, block_size=8, num_blocks=80,
              prepack_weights=False)


def _prompts(n: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, 512) for _ in range(3 + 9 * i)] for i in range(n)]


@pytest.fixture(scope="module")
def compiled_llm(hf_model_dir) -> LLM:
    return LLM(hf_model_dir("llama"), compile_decode=True, **COMMON)


@pytest.fixture(scope="module")
def eager_llm(hf_model_dir) -> LLM:
    return LLM(hf_model_dir("llama"), **COMMON)


def _tokens(llm: LLM, prompts: list[list[int]], max_tokens: int = 24) -> list[list[int]]:
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    return [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]


def _frames_compiled() -> int:
    from torch._dynamo.utils import counters

    return sum(counters["frames"].values())


def test_compiled_steps_give_the_eager_and_hf_greedy_tokens(compiled_llm, eager_llm, hf_model_dir) -> None:
    prompts = _prompts(6)  # 3..48 tokens, chunked at 32 tokens a step: prefill and decode steps mix
    compiled = compiled_llm.llm_engine.model_runner.compiled_decode
    before = compiled.num_steps
    got = _tokens(compiled_llm, prompts)
    assert got == _tokens(eager_llm, prompts)
    hf = load_hf_reference(hf_model_dir("llama"))
    with torch.inference_mode():
        for ids, tokens in zip(prompts, got, strict=True):
            x = torch.tensor([ids])
            out = hf.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=24, do_sample=False,
                              pad_token_id=0)
            ref = out[0, len(ids):].tolist()  # HF stops at EOS (2); the engine was told to ignore it
            ref = ref[: ref.index(2) + 1] if 2 in ref else ref
            assert tokens[: len(ref)] == ref and len(ref) >= 4
    records = list(compiled_llm.llm_engine.step_records)
    all_decode = [r for r in records if r.num_prefill_tokens == 0]
    assert compiled.num_steps - before == len(all_decode) > 0  # every all-decode step ran the graph
    assert any(r.num_prefill_tokens > 0 and r.num_decode_tokens > 0 for r in records)  # mixes ran eagerly


def test_one_compile_serves_every_length_and_batch_size(compiled_llm) -> None:
    """Warm-up compiled B = 1 and B = 2 with L marked dynamic: new lengths and batch sizes reuse them."""
    compiled = compiled_llm.llm_engine.model_runner.compiled_decode
    assert compiled.disabled is None and compiled.compile_seconds > 0
    frames = _frames_compiled()
    _tokens(compiled_llm, _prompts(1, seed=3), max_tokens=40)  # B = 1, L from 4 to 43
    _tokens(compiled_llm, _prompts(4, seed=4), max_tokens=30)  # B = 2..4, uneven lengths
    assert _frames_compiled() == frames


def test_preemption_and_shared_prefix_blocks(hf_model_dir, compiled_llm) -> None:
    """A cache too small for the batch (preempted and recomputed) and rows sharing prefix blocks."""
    rng = random.Random(7)
    prefix = [rng.randrange(3, 512) for _ in range(20)]
    prompts = [prefix + [rng.randrange(3, 512) for _ in range(2 + 5 * i)] for i in range(5)]
    small = dict(COMMON, num_blocks=14, max_num_seqs=5)
    ref = _tokens(LLM(hf_model_dir("llama"), **small), prompts, max_tokens=30)
    llm = LLM(hf_model_dir("llama"), compile_decode=True, **small)  # inductor's cache: no new compile
    assert _tokens(llm, prompts, max_tokens=30) == ref
    engine = llm.llm_engine
    assert engine.num_preemptions > 0 and engine.prefix_cache_stats["hits"] > 0
    assert engine.model_runner.compiled_decode.num_steps > 0


def _reference_attention(q, k_cache, v_cache, tables: list[list[int]], lens: list[int], scale: float):
    """Per row: gather its context from the paged cache, then SDPA (the eager path's method)."""
    bs, out = k_cache.shape[1], []
    for i, (table, n) in enumerate(zip(tables, lens, strict=True)):
        slots = torch.tensor([table[p // bs] * bs + p % bs for p in range(n)])
        keys = k_cache.flatten(0, 1)[slots].transpose(0, 1)[None]  # [1, H_kv, n, D]
        values = v_cache.flatten(0, 1)[slots].transpose(0, 1)[None]
        out.append(torch.nn.functional.scaled_dot_product_attention(
            q[i][None, :, None], keys, values, scale=scale, enable_gqa=True)[0, :, 0])
    return torch.stack(out)


@pytest.mark.parametrize(("compiled", "buffered"), [(False, False), (True, False), (True, True)],
                         ids=["eager", "compiled", "compiled-query-buffer"])
def test_decode_attention_reads_the_paged_cache_in_place(compiled: bool, buffered: bool) -> None:
    """DecodeTensors.attend against gather + SDPA: GQA, rows of different lengths, scattered blocks."""
    from minengine.models.paged_decode import DecodeTensors

    torch.manual_seed(0)
    bs, n_kv, group, d = 4, 2, 3, 8
    k_cache, v_cache = torch.randn(12, bs, n_kv, d), torch.randn(12, bs, n_kv, d)
    tables, lens = [[5, 2, 9], [7], [11, 3]], [11, 2, 6]  # each row's new token at lens - 1
    q, k, v = torch.randn(3, n_kv * group, d), torch.randn(3, n_kv, d), torch.randn(3, n_kv, d)
    new_slots = [t[(n - 1) // bs] * bs + (n - 1) % bs for t, n in zip(tables, lens, strict=True)]
    length = max(lens)
    context = torch.tensor([[t[p // bs] * bs + p % bs if p < n else 0 for p in range(length)]
                            for t, n in zip(tables, lens, strict=True)])
    meta = DecodeTensors(torch.tensor(new_slots), context, torch.arange(length) < torch.tensor(lens)[:, None],
                         torch.empty_like(q) if buffered else None)
    expected_k, expected_v = k_cache.clone(), v_cache.clone()
    expected_k.flatten(0, 1)[new_slots], expected_v.flatten(0, 1)[new_slots] = k, v
    expected = _reference_attention(q, expected_k, expected_v, tables, lens, d ** -0.5)
    attend = torch.compile(DecodeTensors.attend) if compiled else DecodeTensors.attend
    got = attend(meta, q, k, v, (k_cache, v_cache), d ** -0.5)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    assert torch.equal(k_cache, expected_k) and torch.equal(v_cache, expected_v)  # the new K/V written


def test_big_batches_run_compiled_too(hf_model_dir) -> None:
    """16 rows of ~300 tokens: more padded context than one eager decode group holds (4,096 tokens)."""
    from minengine.models.attention.reference import CPU_DECODE_GROUP_TOKENS

    # one step prefills every prompt, so every decode step after it has all 16 rows
    big = dict(max_num_seqs=16, max_num_batched_tokens=8192, max_model_len=400, block_size=16, num_blocks=400,
               prepack_weights=False)
    rng = random.Random(11)
    prompts = [[rng.randrange(3, 512) for _ in range(260 + 4 * i)] for i in range(16)]
    llm = LLM(hf_model_dir("llama"), compile_decode=True, **big)
    got = _tokens(llm, prompts, max_tokens=12)
    assert got == _tokens(LLM(hf_model_dir("llama"), **big), prompts, max_tokens=12)
    decodes = [r for r in llm.llm_engine.step_records if r.num_prefill_tokens == 0]
    assert len(decodes) == 11 and all(r.num_decode_tokens == 16 for r in decodes)
    assert 16 * 261 > CPU_DECODE_GROUP_TOKENS
    assert llm.llm_engine.model_runner.compiled_decode.num_steps == len(decodes)


def test_prepacked_weights_leave_batched_steps_to_the_eager_path(hf_model_dir, eager_llm) -> None:
    """With oneDNN on prepacked weights, the graph (which takes the ordinary weights) runs batch-1 steps
    only; batched decodes run eagerly on the packed ones. Same tokens either way; one graph compiled."""
    llm = LLM(hf_model_dir("llama"), compile_decode=True,
              **dict(COMMON, linear_kernel="onednn", prepack_weights=True))
    compiled = llm.llm_engine.model_runner.compiled_decode
    assert llm.llm_engine.linear_kernel.prepacked and compiled.max_batch == 1 and compiled.disabled is None
    prompts = _prompts(3, seed=5)
    assert _tokens(llm, prompts) == _tokens(eager_llm, prompts)
    decodes = [r for r in llm.llm_engine.step_records if r.num_prefill_tokens == 0]
    single = [r for r in decodes if r.num_decode_tokens == 1]
    assert single and len(single) < len(decodes)  # both kinds of decode step ran
    assert compiled.num_steps == len(single)


def test_steps_that_are_mostly_padding_run_eagerly(compiled_llm) -> None:
    from types import SimpleNamespace

    engine = compiled_llm.llm_engine
    with_kernel = engine.model_runner.compiled_decode
    # without the C++ kernel the graph's attention pays for every padded position (no compile needed here)
    without = CompiledDecode(engine.model, engine.kv_cache.kv_caches, engine.kv_cache.block_size,
                             compile_fn=lambda fn: fn, cpp_attention=False)

    def step(*contexts: int):
        return SimpleNamespace(scheduled=[SimpleNamespace(num_tokens=1, sample=True, start=n - 1)
                                          for n in contexts])

    assert without.can_run(step(100, 60, 90))  # 300 padded positions for 250 real ones
    assert not without.can_run(step(100, 10, 10, 10))  # 400 for 130: the eager groups waste less
    assert not without.can_run(step(1 << 17, 1 << 17, 1 << 17))  # over max_context_tokens
    # the kernel reads each row's own blocks: nothing is padded, every all-decode step runs compiled
    assert with_kernel.cpp_attention
    assert with_kernel.can_run(step(100, 10, 10, 10)) and with_kernel.can_run(step(1 << 17, 1 << 17, 1 << 17))
    assert not with_kernel.can_run(
        SimpleNamespace(scheduled=[SimpleNamespace(num_tokens=2, sample=True, start=3)]))


def test_the_graph_without_the_kernel_gives_the_same_tokens(hf_model_dir, eager_llm) -> None:
    """The products-and-sums attention (a machine where the C++ kernel does not build) in the graph."""
    llm = LLM(hf_model_dir("llama"), **COMMON)
    engine = llm.llm_engine
    compiled = CompiledDecode(engine.model, engine.kv_cache.kv_caches, engine.kv_cache.block_size,
                              cpp_attention=False)
    compiled.warmup(free_block=0)
    engine.model_runner.compiled_decode = compiled
    prompts = _prompts(4)
    assert _tokens(llm, prompts) == _tokens(eager_llm, prompts)
    assert compiled.num_steps > 0 and compiled.disabled is None


def test_a_failed_compile_warns_and_runs_eagerly(hf_model_dir, eager_llm) -> None:
    def broken(fn):
        def call(*args, **kwargs):
            raise RuntimeError("no C++ compiler")
        return call

    llm = LLM(hf_model_dir("llama"), **COMMON)
    engine = llm.llm_engine
    compiled = CompiledDecode(engine.model, engine.kv_cache.kv_caches, engine.kv_cache.block_size,
                              compile_fn=broken)
    with pytest.warns(RuntimeWarning, match="no C\\+\\+ compiler"):
        compiled.warmup(free_block=0)
    engine.model_runner.compiled_decode = compiled
    prompts = _prompts(3)
    assert _tokens(llm, prompts) == _tokens(eager_llm, prompts)
    assert compiled.disabled and compiled.num_steps == 0


def test_options_it_cannot_honour_are_readable_errors(hf_model_dir) -> None:
    with pytest.raises(ValueError, match="compile_decode must be True or False"):
        EngineConfig(model="x", compile_decode="yes")
    with pytest.raises(ValueError, match="full-attention models only"):
        LLM(hf_model_dir("mistral"), compile_decode=True, **COMMON)  # a sliding window
    with pytest.raises(ValueError, match="needs float32 weights"):
        LLM(hf_model_dir("llama"), dtype="bfloat16", compile_decode=True, **COMMON)
    from minengine.engine.worker import _compiled_decode

    engine = LLM(hf_model_dir("llama"), **COMMON).llm_engine
    with pytest.raises(ValueError, match="CPU fast path"):
        _compiled_decode(engine.model, engine.kv_cache, torch.device("meta"))


def test_the_cli_flags_reach_the_engine() -> None:
    from minengine.cli.main import build_parser
    from minengine.cli.serve import engine_options

    parser = build_parser()
    assert engine_options(parser.parse_args(["serve", "--compile-decode"]))["compile_decode"] is True
    assert "compile_decode" not in engine_options(parser.parse_args(["serve"]))
    assert parser.parse_args(["generate", "hi", "--compile-decode"]).compile_decode is True
