"""The GPU fast path, in the parts a CPU can check: batch-size buckets and padding, graph-replay
bookkeeping (``EagerReplayBackend`` stands in for CUDA graphs over the same static buffers), the
in-place paged decode attention (flex_attention run eagerly in fp32, and the static gather) against
the reference gather path, and whole-engine greedy equivalence with the fast path switched on.
On a CPU, ``attention_backend="gather"`` is the reference path, byte for byte (no scratch block, no
graphs); the CPU's default C++ kernel is tested in ``test_cpu_kernels.py``.
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
    plan_fast_path,
)
from minengine.engine.llm import LLM
from minengine.models.attention import AttentionMetadata, paged_attention
from minengine.models.loader import build_random_model
from minengine.models.paged_decode import build_decode_batch, flex_decode, gather_decode

pytestmark = pytest.mark.usefixtures("torch_one_thread")
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
    cpu = plan_fast_path(EngineConfig(attention_backend="gather"), CPU)
    assert (cpu.attention_backend, cpu.cuda_graphs, cpu.extra_blocks) == ("gather", False, 0)
    gpu = plan_fast_path(EngineConfig(), torch.device("cuda"))  # a device object needs no GPU
    assert (gpu.attention_backend, gpu.cuda_graphs, gpu.extra_blocks) == ("flex", True, 1)
    off = plan_fast_path(EngineConfig(enforce_eager=True, attention_backend="gather"), torch.device("cuda"))
    assert not off.enabled
    gather = plan_fast_path(EngineConfig(attention_backend="gather"), torch.device("cuda"))
    assert not gather.cuda_graphs  # a static gather of the longest context per row: only when asked for
    cpu_graphs = plan_fast_path(EngineConfig(enforce_eager=False), CPU)
    assert (cpu_graphs.attention_backend, cpu_graphs.cuda_graphs) == ("gather", True)  # eager replay


@pytest.mark.parametrize("bad", [dict(enforce_eager="yes"), dict(attention_backend="triton"),
                                 dict(cudagraph_capture_sizes=[0]), dict(cudagraph_capture_sizes=[])])
def test_config_rejects_bad_fast_path_options(bad: dict) -> None:
    with pytest.raises(ValueError):
        EngineConfig(**bad)


# ---- the in-place decode attention against the reference gather path ----
def _random_cache(num_blocks: int, bs: int, h_kv: int, d: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    shape = (num_blocks, bs, h_kv, d)
    return torch.randn(shape, generator=g), torch.randn(shape, generator=g)


def _decode_case(window: int | None):
    """Six decodes with shuffled, partly shared (prefix-cached) blocks, lengths 1..37, block size 4."""
    rng = random.Random(3)
    bs, num_blocks = 4, 40
    free = list(range(num_blocks - 1))  # the last block is the scratch block
    rng.shuffle(free)
    shared = [free.pop(), free.pop()]
    lens = [37, 1, 9, 16, 4, 23]
    tables = []
    for i, s in enumerate(lens):
        need = -(-s // bs)
        own = shared[: min(2, need)] if i % 2 == 0 and s > 8 else []
        tables.append(own + [free.pop() for _ in range(need - len(own))])
    k_cache, v_cache = _random_cache(num_blocks, bs, 2, 8, seed=1)
    q = torch.randn(len(lens), 4, 8, generator=torch.Generator().manual_seed(2))
    return bs, num_blocks, tables, lens, k_cache, v_cache, q, window


def _reference(bs, tables, lens, k_cache, v_cache, q, window):
    """The reference path: write nothing new (k/v = what is already in the new token's slot), attend."""
    meta = AttentionMetadata.build([1] * len(lens), lens, tables, bs)
    k_flat, v_flat = k_cache.view(-1, 2, 8), v_cache.view(-1, 2, 8)
    k_new, v_new = k_flat[meta.slot_mapping].clone(), v_flat[meta.slot_mapping].clone()
    return paged_attention(q, k_new, v_new, (k_cache.clone(), v_cache.clone()), meta, 8**-0.5, window)


@pytest.mark.parametrize("window", [None, 6])
@pytest.mark.parametrize("fn", [flex_decode, gather_decode], ids=["flex", "gather"])
def test_in_place_decode_matches_the_gather_path(fn, window) -> None:
    bs, nb, tables, lens, k_cache, v_cache, q, window = _decode_case(window)
    expected = _reference(bs, tables, lens, k_cache, v_cache, q, window)
    backend = "flex" if fn is flex_decode else "gather"
    # padded to 8 rows and to the width of the longest allowed sequence, as a graph would see it
    batch = build_decode_batch(tables, lens, bs, nb, backend=backend, width=12, pad_to=8, pad_block=nb - 1)
    out = batch.attend(q, k_cache, v_cache, 8**-0.5, window)
    assert out.shape == q.shape
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)


def test_physical_to_logical_ignores_unused_table_entries() -> None:
    # Row 0 uses blocks [5, 2]; its unused entries hold 5 again (a stale id): they must not overwrite 0.
    batch = build_decode_batch([[5, 2, 5]], [6], 4, 8, backend="flex", width=3)
    batch.block_tables[0, 2] = 5
    batch.refresh()
    p2l = batch.physical_to_logical
    assert p2l is not None
    assert p2l[0].tolist() == [-1, -1, 1, -1, -1, 0, -1, -1]


def test_padding_needs_a_scratch_block() -> None:
    with pytest.raises(ValueError, match="pad_block"):
        build_decode_batch([[0]], [1], 4, 8, pad_to=2)


# ---- graph bookkeeping with the eager-replay backend ----
def _tiny_model():
    cfg = dict(architectures=["LlamaForCausalLM"], vocab_size=64, hidden_size=32, intermediate_size=64,
               num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    return build_random_model(cfg, device="cpu", dtype=torch.float32, seed=0, std=0.2)


@pytest.mark.parametrize("backend", ["gather", "flex"])
def test_graph_runner_pads_to_the_bucket_and_matches_the_reference(backend: str) -> None:
    model = _tiny_model()
    c, bs, nb = model.config, 4, 24
    caches = [(torch.randn(nb, bs, c.num_key_value_heads, c.head_dim),
               torch.randn(nb, bs, c.num_key_value_heads, c.head_dim)) for _ in range(c.num_hidden_layers)]
    ref_caches = [(k.clone(), v.clone()) for k, v in caches]
    graph_backend = EagerReplayBackend()
    runner = DecodeGraphRunner(model, caches, sizes=[1, 2, 4], max_blocks_per_seq=4, pad_block=nb - 1,
                               backend=backend, graph_backend=graph_backend, device=CPU)
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
@pytest.mark.parametrize("options", [dict(enforce_eager=False, attention_backend="gather"),
                                     dict(enforce_eager=False, attention_backend="flex"),
                                     dict(enforce_eager=True, attention_backend="flex")],
                         ids=["graphs-gather", "graphs-flex", "eager-flex"])
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
def test_cuda_graphs_and_flex_match_the_reference_on_gpu(hf_model_dir) -> None:
    prompts = _prompts(6)
    path = hf_model_dir("qwen3")
    ref = LLM(path, dtype="float32", enforce_eager=True, attention_backend="gather").generate(
        prompts, GREEDY, use_tqdm=False)
    fast_llm = LLM(path, dtype="float32")
    fast = fast_llm.generate(prompts, GREEDY, use_tqdm=False)
    assert fast_llm.llm_engine.model_runner.num_graph_steps > 0
    assert [o.outputs[0].token_ids for o in fast] == [o.outputs[0].token_ids for o in ref]


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
    fast_llm = LLM(path, enforce_eager=False, attention_backend="flex", cudagraph_capture_sizes=[2, 4, 8],
                   **common)
    fast = fast_llm.generate(prompts, params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in fast] == [o.outputs[0].token_ids for o in ref]
    engine = fast_llm.llm_engine
    assert engine.num_preemptions > 0 and engine.prefix_cache_stats["hits"] > 0
    assert engine.model_runner.num_graph_steps > 0
    assert engine.kv_cache.kv_caches[0][0].shape[0] == 41  # the scheduler's 40 blocks + the scratch block


@pytest.mark.parametrize("backend", ["flex", "cpp"])
def test_decode_rows_are_packed_rows_not_sequence_indices(backend: str) -> None:
    """A running request's prompt chunk can come before a decode in a step: the decodes' rows in the
    packed batch are then not their sequence indices (a 32-request chunked run caught this)."""
    from types import SimpleNamespace

    from minengine.engine.model_runner import ModelRunner

    bs = 4
    meta = AttentionMetadata.build([5, 1, 3, 1], [9, 6, 3, 2], [[0, 1, 2], [3, 4], [5], [6]], bs)
    cache = torch.zeros(8, bs, 2, 8)
    runner = SimpleNamespace(pad_block=None, attention_backend=backend, max_blocks_per_seq=4, device=CPU,
                             kv_cache=SimpleNamespace(kv_caches=[(cache, cache)]))
    ModelRunner._attach_decode_batch(runner, meta)
    assert meta.decode_batch is not None
    assert meta.decode_batch.rows.tolist() == [5, 9]  # after the 5-token chunk and the 3-token prompt
    assert meta.decode_batch.seq_lens[:2].tolist() == [6, 2]
