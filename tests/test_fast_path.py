"""The GPU engine's path, tested on a CPU: CUDA-graph bookkeeping (buckets, padding, static buffers) with an
eager-replay stand-in, the Triton attention backend run by Triton's interpreter (``conftest.py``), the
plan of what runs on which device, and whole-engine greedy equivalence with the reference path.
On a CPU, ``attention_backend="gather"`` is the reference path, byte for byte (no scratch block, no
graphs).
"""

from __future__ import annotations

import random

import pytest
import torch

from minengine.config import EngineConfig
from minengine.core.sampling_params import SamplingParams
from minengine.engine.fast_path import (
    DecodeGraphRunner,
    DecodeInputs,
    EagerReplayBackend,
    bucket_for,
    capture_sizes,
)
from minengine.engine.llm import LLM
from minengine.engine.worker import plan_execution
from minengine.models.attention import AttentionMetadata
from minengine.models.attention.backends import CppBackend, TritonBackend
from minengine.models.attention.triton_kernels import triton_available
from minengine.models.loader import build_random_model

needs_triton = pytest.mark.skipif(triton_available() is not None, reason=str(triton_available()))
GREEDY = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
CPU = torch.device("cpu")


# ---- buckets ----
def test_capture_sizes_are_powers_of_two_then_max_num_seqs() -> None:
    assert capture_sizes(256) == [1, 2, 4, 8, 16, 32, 64, 128, 256]
    assert capture_sizes(5) == [1, 2, 4, 5]  # max_num_seqs itself is captured: no step falls off the end
    assert capture_sizes(40) == [1, 2, 4, 8, 16, 32, 40]
    assert capture_sizes(1000)[-1] == 512
    assert capture_sizes(8, [16, 4, 1, 4]) == [1, 4]  # explicit sizes: sorted, deduplicated, capped


def test_bucket_is_the_next_size_up_or_none() -> None:
    sizes = capture_sizes(64)
    assert [bucket_for(n, sizes) for n in (1, 2, 3, 5, 8, 9, 17, 64)] == [1, 2, 4, 8, 8, 16, 32, 64]
    assert bucket_for(65, sizes) is None


def test_plan_by_device_and_flags() -> None:
    cpu = plan_execution(EngineConfig(attention_backend="gather"), CPU)
    assert (cpu.attention_backend, cpu.cuda_graphs, cpu.extra_blocks) == ("gather", False, 0)
    gpu = plan_execution(EngineConfig(), torch.device("cuda"))  # a device object needs no GPU
    assert (gpu.attention_backend, gpu.cuda_graphs, gpu.extra_blocks) == ("triton", True, 1)
    assert "CUDA default" in gpu.reasons["attention_backend"]  # a choice the user did not make, and why
    off = plan_execution(EngineConfig(enforce_eager=True), torch.device("cuda"))
    assert (off.attention_backend, off.cuda_graphs, off.extra_blocks) == ("triton", False, 0)
    cpu_graphs = plan_execution(EngineConfig(enforce_eager=False), CPU)
    assert (cpu_graphs.attention_backend, cpu_graphs.cuda_graphs) == ("triton", True)  # the interpreted GPU path
    bf16 = plan_execution(EngineConfig(), CPU, torch.bfloat16)
    assert bf16.attention_backend == "gather" and "fp32 only" in bf16.reasons["attention_backend"]
    for backend in ("gather", "cpp"):  # graphs replay the triton backend only: refused, with the way out
        with pytest.raises(ValueError, match="enforce_eager=True"):
            plan_execution(EngineConfig(enforce_eager=False, attention_backend=backend), CPU)


@pytest.mark.parametrize("bad", [dict(enforce_eager="yes"), dict(attention_backend="flex"),
                                 dict(cudagraph_capture_sizes=[0]), dict(cudagraph_capture_sizes=[])])
def test_config_rejects_bad_fast_path_options(bad: dict) -> None:
    with pytest.raises(ValueError):
        EngineConfig(**bad)


def _tiny_model():
    cfg = dict(architectures=["LlamaForCausalLM"], vocab_size=64, hidden_size=32, intermediate_size=64,
               num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    return build_random_model(cfg, device="cpu", dtype=torch.float32, seed=0, std=0.2)


@needs_triton
def test_graph_runner_pads_to_the_bucket_and_matches_the_reference() -> None:
    model = _tiny_model()
    c, bs, nb = model.config, 4, 24
    caches = [(torch.randn(nb, bs, c.num_key_value_heads, c.head_dim),
               torch.randn(nb, bs, c.num_key_value_heads, c.head_dim)) for _ in range(c.num_hidden_layers)]
    ref_caches = [(k.clone(), v.clone()) for k, v in caches]
    graph_backend = EagerReplayBackend()
    runner = DecodeGraphRunner(model, caches, sizes=[1, 2, 4], max_blocks_per_seq=4, pad_block=nb - 1,
                               attn_backend=TritonBackend(), graph_backend=graph_backend, device=CPU)
    assert graph_backend.num_captures == 3 and sorted(runner.graphs) == [1, 2, 4]
    tables, lens = [[3, 7, 1], [10], [4, 5]], [11, 2, 6]
    ids = [5, 9, 60]
    inputs = DecodeInputs(ids, [s - 1 for s in lens], [t[(s - 1) // bs] * bs + (s - 1) % bs
                                                         for t, s in zip(tables, lens, strict=True)], tables, lens)
    before = {n: graph_backend.num_replays for n in runner.graphs}
    hidden = runner.run(inputs)
    assert runner.replays == {1: 0, 2: 0, 4: 1}  # 3 decodes ran in the size-4 graph
    assert graph_backend.num_replays == before[1] + 1
    assert hidden.shape == (3, c.hidden_size)
    # the padding row is a dummy that writes only the scratch block
    assert runner.input_ids[3].item() == 0 and runner.slot_mapping[3].item() == (nb - 1) * bs
    assert runner.block_tables[3].tolist() == [nb - 1] * 4 and runner.seq_lens[3].item() == 1

    meta = AttentionMetadata.build([1, 1, 1], lens, tables, bs)
    with torch.inference_mode():
        expected = model(torch.tensor(ids), torch.tensor(inputs.positions), meta, ref_caches)
    torch.testing.assert_close(hidden, expected, rtol=1e-5, atol=1e-5)
    for (k, _), (rk, _) in zip(caches, ref_caches, strict=True):  # same K written, nothing else touched
        torch.testing.assert_close(k[: nb - 1], rk[: nb - 1])
    with pytest.raises(ValueError, match="largest captured"):
        runner.load(DecodeInputs([1] * 5, [0] * 5, [0] * 5, [[0]] * 5, [1] * 5))


# ---- the whole engine: the same greedy tokens with the fast path on ----
def _prompts(n: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, 512) for _ in range(3 + 7 * i)] for i in range(n)]


@pytest.mark.parametrize("family", ["llama", "mistral", "qwen3"])
def test_cpu_gather_is_the_reference_path(hf_model_dir, family: str) -> None:
    llm = LLM(hf_model_dir(family), attention_backend="gather")
    runner, engine = llm.llm_engine.model_runner, llm.llm_engine
    assert runner.graph_runner is None and runner.attention_backend == "gather"
    assert engine.kv_cache.kv_caches[0][0].shape[0] == engine.kv_cache.num_blocks  # no scratch block


@pytest.mark.parametrize("family", ["llama", "mistral", "qwen3"])
@needs_triton
@pytest.mark.parametrize("options", [dict(enforce_eager=False, attention_backend="triton"),
                                     dict(enforce_eager=True, attention_backend="triton")],
                         ids=["graphs-triton", "eager-triton"])
def test_fast_path_gives_the_reference_greedy_tokens(hf_model_dir, family: str, options: dict) -> None:
    prompts = _prompts(5)
    common = dict(max_num_seqs=4, max_num_batched_tokens=32, max_model_len=128)  # chunked, mixed steps
    ref = LLM(hf_model_dir(family), attention_backend="gather", **common).generate(prompts, GREEDY, use_tqdm=False)
    fast_llm = LLM(hf_model_dir(family), cudagraph_capture_sizes=[1, 2, 4], **common, **options)
    fast = fast_llm.generate(prompts, GREEDY, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in fast] == [o.outputs[0].token_ids for o in ref]
    runner = fast_llm.llm_engine.model_runner
    records = list(fast_llm.llm_engine.step_records)
    assert all(r.t_prepare > 0 and r.t_forward > 0 for r in records)  # graph steps are timed as well
    assert runner.timing_method.startswith("perf_counter")  # on CUDA: synchronize before each read
    assert {r.timing for r in records} == {runner.timing_method}  # every step record says how it was timed
    if options["enforce_eager"]:
        assert runner.graph_runner is None
    else:
        assert runner.num_graph_steps > 0 and sum(runner.graph_runner.replays.values()) == runner.num_graph_steps


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (benchmarks/gpu_check.py runs it)")
def test_cuda_graphs_and_triton_match_the_reference_on_gpu(hf_model_dir) -> None:
    prompts = _prompts(6)
    path = hf_model_dir("qwen3")
    ref = LLM(path, dtype="float32", enforce_eager=True, attention_backend="gather").generate(
        prompts, GREEDY, use_tqdm=False)
    fast_llm = LLM(path, dtype="float32")
    fast = fast_llm.generate(prompts, GREEDY, use_tqdm=False)
    assert fast_llm.llm_engine.model_runner.num_graph_steps > 0
    assert [o.outputs[0].token_ids for o in fast] == [o.outputs[0].token_ids for o in ref]


@needs_triton
def test_fast_path_survives_preemption_and_prefix_hits(hf_model_dir) -> None:
    """A cache too small for the batch (requests preempted and recomputed) and prompts sharing a prefix
    (prefix-cache hits: blocks shared between rows of one decode batch): still the reference tokens."""
    rng = random.Random(5)
    prefix = [rng.randrange(3, 512) for _ in range(24)]
    prompts = [prefix + [rng.randrange(3, 512) for _ in range(3 + 5 * i)] for i in range(6)]
    common = dict(max_num_seqs=6, max_num_batched_tokens=64, max_model_len=96, block_size=4, num_blocks=40)
    params = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
    path = hf_model_dir("qwen3")
    ref_llm = LLM(path, attention_backend="gather", **common)
    ref = ref_llm.generate(prompts, params, use_tqdm=False)
    fast_llm = LLM(path, enforce_eager=False, attention_backend="triton", cudagraph_capture_sizes=[2, 4, 8],
                   **common)
    fast = fast_llm.generate(prompts, params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in fast] == [o.outputs[0].token_ids for o in ref]
    engine = fast_llm.llm_engine
    assert engine.num_preemptions > 0 and engine.prefix_cache_stats["hits"] > 0
    assert engine.model_runner.num_graph_steps > 0
    assert engine.kv_cache.kv_caches[0][0].shape[0] == 41  # the scheduler's 40 blocks + the scratch block


def test_decode_rows_are_packed_rows_not_sequence_indices() -> None:
    """A running request's prompt chunk can come before a decode in a step: the decodes' rows in the
    packed batch are then not their sequence indices (a 32-request chunked run caught this)."""
    meta = CppBackend().build_metadata([5, 1, 3, 1], [9, 6, 3, 2], [[0, 1, 2], [3, 4], [5], [6]], 4, CPU)
    assert meta.decode_batch is not None
    assert meta.decode_batch.rows.tolist() == [5, 9]  # after the 5-token chunk and the 3-token prompt
    assert meta.decode_batch.seq_lens[:2].tolist() == [6, 2]
