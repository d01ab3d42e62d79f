"""The GPU engine's path, tested on a CPU: the plan of what runs on which device, CUDA-graph bookkeeping
(buckets, padding, static buffers) with an eager-replay stand-in over the Triton attention backend (run by
Triton's interpreter: ``conftest.py`` sets ``TRITON_INTERPRET=1`` without CUDA), the static-shape decode
attention, and whole-engine greedy equivalence of the Triton paths with the reference path (chunked mixed
steps, a sliding window, preemption, prefix-cache hits). On a CPU, ``attention_backend="gather"`` is the
reference path, byte for byte (no scratch block, no graphs); the C++ kernel's own tests are in
``test_cpu_kernels.py`` and the Triton kernel's in ``test_triton_attention.py``.

The interpreter runs each Triton program in Python: a decode step of four rows of the tiny models takes
about a second on a shared 2-core machine, so the engine runs here are kept to a few steps.
"""

from __future__ import annotations

import random

import pytest
import torch

from minengine.config import EngineConfig
from minengine.core.sampling_params import SamplingParams
from minengine.engine import worker
from minengine.engine.fast_path import (
    DecodeGraphRunner,
    DecodeInputs,
    EagerReplayBackend,
    bucket_for,
    capture_sizes,
)
from minengine.engine.llm import LLM
from minengine.engine.worker import plan_execution
from minengine.models import cpu_kernels
from minengine.models.attention import AttentionMetadata, paged_attention
from minengine.models.attention.backends import CppBackend, ReferenceBackend, TritonBackend
from minengine.models.attention.triton_kernels import triton_available
from minengine.models.loader import build_random_model
from minengine.models.paged_decode import build_decode_batch

pytestmark = pytest.mark.usefixtures("torch_one_thread")
needs_triton = pytest.mark.skipif(triton_available() is not None, reason=str(triton_available()))
GREEDY = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
CPU = torch.device("cpu")
CUDA = torch.device("cuda")  # a device object needs no GPU: planning allocates nothing


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


# ---- what runs where ----
def _plan(device: torch.device, dtype: torch.dtype = torch.float32, **options) -> tuple[str, bool, int]:
    plan = plan_execution(EngineConfig(**options), device, dtype)
    return plan.attention_backend, plan.cuda_graphs, plan.extra_blocks


def test_plan_by_device_and_flags() -> None:
    # CUDA's default, fp32 or bf16: the Triton kernel, decode steps replayed from graphs, one scratch block
    for dtype in (torch.float32, torch.bfloat16):
        gpu = plan_execution(EngineConfig(), CUDA, dtype)
        assert (gpu.attention_backend, gpu.cuda_graphs, gpu.extra_blocks) == ("triton", True, 1)
        assert "CUDA default" in gpu.reasons["attention_backend"]  # a choice the user did not make, and why
        assert "CUDA default" in gpu.reasons["cuda_graphs"]
    assert _plan(CUDA, enforce_eager=True) == ("triton", False, 0)
    assert _plan(CUDA, attention_backend="gather") == ("gather", False, 0)  # graphs replay triton only

    # a CPU in fp32: the C++ decode kernel where it is built (test_cpu_kernels checks it is), no graphs
    cpu = plan_execution(EngineConfig(), CPU)
    assert (cpu.attention_backend, cpu.cuda_graphs, cpu.extra_blocks) == (
        "cpp" if cpu_kernels.load() else "gather", False, 0)
    assert _plan(CPU, attention_backend="gather") == ("gather", False, 0)
    assert "attention_backend" not in plan_execution(EngineConfig(attention_backend="gather"), CPU).reasons
    assert _plan(CPU, attention_backend="triton") == ("triton", False, 0)  # interpreted, eager
    # a CPU in bf16: the reference path, and the reason
    bf16 = plan_execution(EngineConfig(), CPU, torch.bfloat16)
    assert (bf16.attention_backend, bf16.cuda_graphs) == ("gather", False)
    assert "fp32 only" in bf16.reasons["attention_backend"]
    # graphs asked for on a CPU: the GPU path, its Triton kernel interpreted, replayed eagerly
    cpu_graphs = plan_execution(EngineConfig(enforce_eager=False), CPU)
    assert _plan(CPU, enforce_eager=False) == ("triton", True, 1)
    assert "interpreted" in cpu_graphs.reasons["attention_backend"]

    # graphs replay the triton backend only: any other is refused, with the way out
    for device, backend in ((CPU, "gather"), (CPU, "cpp"), (CUDA, "gather")):
        with pytest.raises(ValueError, match="enforce_eager=True"):
            plan_execution(EngineConfig(enforce_eager=False, attention_backend=backend), device)


def test_a_cpu_without_the_kernels_plans_the_reference_path_and_says_why(monkeypatch) -> None:
    monkeypatch.setattr(worker, "_cpp_kernel_usable", lambda device, dtype: False)
    plan = plan_execution(EngineConfig(), CPU)
    assert plan.attention_backend == "gather" and "not built" in plan.reasons["attention_backend"]
    with pytest.raises(ValueError, match="not in use"):  # asked for: no silent fallback
        plan_execution(EngineConfig(attention_backend="cpp"), CPU)


@pytest.mark.parametrize("bad", [dict(enforce_eager="yes"), dict(attention_backend="flex"),
                                 dict(attention_backend="sdpa"), dict(cudagraph_capture_sizes=[0]),
                                 dict(cudagraph_capture_sizes=[])])
def test_config_rejects_bad_fast_path_options(bad: dict) -> None:
    with pytest.raises(ValueError):
        EngineConfig(**bad)


# ---- the static-shape decode attention against the reference gather path ----
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
    g = torch.Generator().manual_seed(1)
    k_cache, v_cache = (torch.randn(num_blocks, bs, 2, 8, generator=g) for _ in range(2))
    q = torch.randn(len(lens), 4, 8, generator=torch.Generator().manual_seed(2))
    return bs, num_blocks, tables, lens, k_cache, v_cache, q, window


def _reference(bs, tables, lens, k_cache, v_cache, q, window):
    """The reference path: write nothing new (k/v = what is already in the new token's slot), attend."""
    meta = AttentionMetadata.build([1] * len(lens), lens, tables, bs)
    k_flat, v_flat = k_cache.view(-1, 2, 8), v_cache.view(-1, 2, 8)
    k_new, v_new = k_flat[meta.slot_mapping].clone(), v_flat[meta.slot_mapping].clone()
    return paged_attention(q, k_new, v_new, (k_cache.clone(), v_cache.clone()), meta, 8**-0.5, window)


@pytest.mark.parametrize("window", [None, 6])
@pytest.mark.parametrize("backend", ["gather", "cpp"])
def test_in_place_decode_matches_the_gather_path(backend: str, window) -> None:
    if backend == "cpp" and not cpu_kernels.load():
        pytest.skip(f"the C++ kernels are not built: {cpu_kernels.build_error()}")
    bs, nb, tables, lens, k_cache, v_cache, q, window = _decode_case(window)
    expected = _reference(bs, tables, lens, k_cache, v_cache, q, window)
    # padded to 8 rows and to the width of the longest allowed sequence, as a graph would see it
    batch = build_decode_batch(tables, lens, bs, nb, backend=backend, width=12, pad_to=8, pad_block=nb - 1)
    out = batch.attend(q, k_cache, v_cache, 8**-0.5, window)
    assert out.shape == q.shape
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)


def test_padding_needs_a_scratch_block() -> None:
    with pytest.raises(ValueError, match="pad_block"):
        build_decode_batch([[0]], [1], 4, 8, pad_to=2)
    with pytest.raises(ValueError, match="unknown decode backend"):  # flex is gone
        build_decode_batch([[0]], [1], 4, 8, backend="flex")


def test_decode_rows_are_packed_rows_not_sequence_indices() -> None:
    """A running request's prompt chunk can come before a decode in a step: the decodes' rows in the
    packed batch are then not their sequence indices (a 32-request chunked run caught this)."""
    if not cpu_kernels.load():
        pytest.skip(f"the C++ kernels are not built: {cpu_kernels.build_error()}")
    # chunks longer than SHORT_CHUNK_TOKENS (shorter ones are kernel rows too: test_cpu_kernels.py)
    query_lens, seq_lens, bs = [10, 1, 9, 1], [13, 6, 9, 2], 4
    tables = [[0, 1, 2, 7], [3, 4], [5, 8, 9], [6]]
    meta = CppBackend().build_metadata(query_lens, seq_lens, tables, bs, CPU)
    assert meta.decode_batch is not None
    assert meta.decode_batch.rows.tolist() == [10, 20]  # after the 10-token chunk and the 9-token prompt
    assert meta.decode_batch.seq_lens[:2].tolist() == [6, 2]
    # and the mixed step attends as the reference does: each decode's output lands in its own row
    g = torch.Generator().manual_seed(4)
    n = sum(query_lens)
    q, k, v = (torch.randn(n, h, 8, generator=g) for h in (4, 2, 2))
    cache = torch.randn(10, bs, 2, 8, generator=g), torch.randn(10, bs, 2, 8, generator=g)
    ref_meta = ReferenceBackend().build_metadata(query_lens, seq_lens, tables, bs, CPU)
    assert ref_meta.decode_batch is None
    expected = ReferenceBackend().forward(q, k, v, tuple(c.clone() for c in cache), ref_meta, 8**-0.5, None)
    out = CppBackend().forward(q, k, v, tuple(c.clone() for c in cache), meta, 8**-0.5, None)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)


# ---- graph bookkeeping: the Triton backend, replayed eagerly ----
def _tiny_model():
    cfg = dict(architectures=["LlamaForCausalLM"], vocab_size=64, hidden_size=32, intermediate_size=64,
               num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    return build_random_model(cfg, device="cpu", dtype=torch.float32, seed=0, std=0.2)


def _decode_inputs(ids: list[int], tables: list[list[int]], lens: list[int], bs: int) -> DecodeInputs:
    slots = [t[(s - 1) // bs] * bs + (s - 1) % bs for t, s in zip(tables, lens, strict=True)]
    return DecodeInputs(ids, [s - 1 for s in lens], slots, tables, lens)


def _reference_step(model, inputs: DecodeInputs, bs: int, caches) -> torch.Tensor:
    meta = AttentionMetadata.build([1] * len(inputs.seq_lens), inputs.seq_lens, inputs.block_tables, bs)
    with torch.inference_mode():
        return model(torch.tensor(inputs.input_ids), torch.tensor(inputs.positions), meta, caches)


@needs_triton
def test_graph_runner_pads_to_the_bucket_and_matches_the_reference() -> None:
    model = _tiny_model()
    c, bs, nb = model.config, 4, 24
    caches = [(torch.randn(nb, bs, c.num_key_value_heads, c.head_dim),
               torch.randn(nb, bs, c.num_key_value_heads, c.head_dim)) for _ in range(c.num_hidden_layers)]
    ref_caches = [(k.clone(), v.clone()) for k, v in caches]
    with pytest.raises(ValueError, match="pad_block"):  # the scratch block must be a block of the cache
        DecodeGraphRunner(model, caches, sizes=[1], max_blocks_per_seq=4, pad_block=nb,
                          attn_backend=TritonBackend(), graph_backend=EagerReplayBackend(), device=CPU)
    graph_backend = EagerReplayBackend()
    runner = DecodeGraphRunner(model, caches, sizes=[1, 2, 4], max_blocks_per_seq=4, pad_block=nb - 1,
                               attn_backend=TritonBackend(), graph_backend=graph_backend, device=CPU)
    assert graph_backend.num_captures == 3 and sorted(runner.graphs) == [1, 2, 4]

    inputs = _decode_inputs([5, 9, 60], [[3, 7, 1], [10], [4, 5]], [11, 2, 6], bs)
    replays_before = graph_backend.num_replays
    hidden = runner.run(inputs)
    assert runner.replays == {1: 0, 2: 0, 4: 1}  # 3 decodes ran in the size-4 graph
    assert graph_backend.num_replays == replays_before + 1
    assert hidden.shape == (3, c.hidden_size)
    # the padding row is a dummy that writes only the scratch block
    assert runner.input_ids[3].item() == 0 and runner.slot_mapping[3].item() == (nb - 1) * bs
    assert runner.block_tables[3].tolist() == [nb - 1] * 4 and runner.seq_lens[3].item() == 1
    torch.testing.assert_close(hidden, _reference_step(model, inputs, bs, ref_caches), rtol=1e-5, atol=1e-5)
    for (k, v), (rk, rv) in zip(caches, ref_caches, strict=True):  # same K/V written, nothing else touched
        torch.testing.assert_close(k[: nb - 1], rk[: nb - 1])
        torch.testing.assert_close(v[: nb - 1], rv[: nb - 1])

    # the next step is shorter: the longer rows' stale table columns and lengths must not leak into it
    inputs = _decode_inputs([7, 11], [[10, 2], [3, 7, 1]], [5, 12], bs)
    hidden = runner.run(inputs)
    assert runner.replays == {1: 0, 2: 1, 4: 1}
    torch.testing.assert_close(hidden, _reference_step(model, inputs, bs, ref_caches), rtol=1e-5, atol=1e-5)

    with pytest.raises(ValueError, match="largest captured"):
        runner.load(DecodeInputs([1] * 5, [0] * 5, [0] * 5, [[0]] * 5, [1] * 5))
    with pytest.raises(ValueError, match="captured"):  # a row longer than the captured width
        runner.load(_decode_inputs([1], [[0, 1, 2, 3, 4]], [17], bs))
    runner.close()  # what the engine's close does: the graphs and the model go
    assert runner.graphs == {} and runner.model is None and runner.kv_caches == []


# ---- the whole engine: the same greedy tokens on the GPU's path ----
def _prompts(n: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, 512) for _ in range(3 + 7 * i)] for i in range(n)]


@pytest.mark.parametrize("family", ["llama", "mistral", "qwen3"])
def test_cpu_gather_is_the_reference_path(hf_model_dir, family: str) -> None:
    llm = LLM(hf_model_dir(family), attention_backend="gather")
    runner, engine = llm.llm_engine.model_runner, llm.llm_engine
    assert runner.graph_runner is None and runner.attention_backend == "gather"
    assert type(runner.attn_backend) is ReferenceBackend  # not its subclass CppBackend
    assert engine.kv_cache.kv_caches[0][0].shape[0] == engine.kv_cache.num_blocks  # no scratch block
    assert (llm.runtime.attention_backend, llm.runtime.cuda_graphs) == ("gather", False)


_REFERENCE_TOKENS: dict[str, list[list[int]]] = {}


def _reference_tokens(path, family: str, prompts, common: dict) -> list[list[int]]:
    if family not in _REFERENCE_TOKENS:  # one reference run per family for this module
        with LLM(path, attention_backend="gather", **common) as ref:
            outs = ref.generate(prompts, GREEDY, use_tqdm=False)
        _REFERENCE_TOKENS[family] = [o.outputs[0].token_ids for o in outs]
    return _REFERENCE_TOKENS[family]


@needs_triton
@pytest.mark.parametrize(("family", "options"), [
    ("llama", dict(enforce_eager=False)),
    ("mistral", dict(enforce_eager=False)),  # a sliding window (24) shorter than the longer contexts
    ("qwen3", dict(enforce_eager=False)),
    ("mistral", dict(enforce_eager=True, attention_backend="triton")),
], ids=["graphs-triton-llama", "graphs-triton-mistral", "graphs-triton-qwen3", "eager-triton-mistral"])
def test_triton_paths_give_the_reference_greedy_tokens(hf_model_dir, family: str, options: dict) -> None:
    """Chunked prefill (prompt chunks and decodes in one step: the Triton kernel serves both), then decode
    steps replayed from graphs of sizes 2 and 4 (one or three decodes ride in a padded graph)."""
    prompts = _prompts(5)
    common = dict(max_num_seqs=4, max_num_batched_tokens=32, max_model_len=128)
    path = hf_model_dir(family)
    expected = _reference_tokens(path, family, prompts, common)
    with LLM(path, cudagraph_capture_sizes=[2, 4], **common, **options) as fast_llm:
        fast = fast_llm.generate(prompts, GREEDY, use_tqdm=False)
        assert [o.outputs[0].token_ids for o in fast] == expected
        engine, runner = fast_llm.llm_engine, fast_llm.llm_engine.model_runner
        records = list(engine.step_records)
        graphs = not options["enforce_eager"]
        assert runner.attention_backend == fast_llm.runtime.attention_backend == "triton"
        assert fast_llm.runtime.cuda_graphs is graphs
        assert any(r.num_prefill_tokens and r.num_decode_tokens for r in records)  # a mixed step ran
        assert all(r.t_prepare > 0 and r.t_forward > 0 for r in records)  # graph steps are timed as well
        assert runner.timing_method.startswith("perf_counter")  # on CUDA: synchronize before each read
        assert {r.timing for r in records} == {runner.timing_method}  # each step record says how it was timed
        if not graphs:
            assert runner.graph_runner is None and runner.num_graph_steps == 0
            assert engine.kv_cache.kv_caches[0][0].shape[0] == engine.kv_cache.num_blocks  # no scratch block
            return
        assert "replayed eagerly" in fast_llm.runtime.describe() and fast_llm.runtime.capture_sizes == [2, 4]
        graph_runner = runner.graph_runner
        decode_only = [r.num_decode_seqs for r in records if not r.num_prefill_tokens]
        assert runner.num_graph_steps == len(decode_only) > 0  # every decode-only step replayed a graph
        assert sum(graph_runner.replays.values()) == runner.num_graph_steps
        assert graph_runner.replays[2] == sum(n <= 2 for n in decode_only)
        assert any(n in (1, 3) for n in decode_only)  # some ran padded
        assert engine.kv_cache.kv_caches[0][0].shape[0] == engine.kv_cache.num_blocks + 1  # the scratch block


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (benchmarks/gpu_check.py)")
def test_cuda_graphs_and_triton_match_the_reference_on_gpu(hf_model_dir) -> None:
    prompts = _prompts(6)
    path = hf_model_dir("qwen3")
    with LLM(path, dtype="float32", enforce_eager=True, attention_backend="gather") as ref_llm:
        ref = ref_llm.generate(prompts, GREEDY, use_tqdm=False)
    with LLM(path, dtype="float32") as fast_llm:
        fast = fast_llm.generate(prompts, GREEDY, use_tqdm=False)
        assert fast_llm.runtime.attention_backend == "triton" and fast_llm.runtime.cuda_graphs
        assert fast_llm.llm_engine.model_runner.num_graph_steps > 0
    assert [o.outputs[0].token_ids for o in fast] == [o.outputs[0].token_ids for o in ref]


@needs_triton
def test_graphs_survive_preemption_and_prefix_hits(hf_model_dir) -> None:
    """A cache too small for the batch (requests preempted and recomputed) and prompts sharing a prefix
    (prefix-cache hits: blocks shared between rows of one decode batch): still the reference tokens."""
    rng = random.Random(5)
    prefix = [rng.randrange(3, 512) for _ in range(16)]
    prompts = [prefix + [rng.randrange(3, 512) for _ in range(2 + 3 * i)] for i in range(4)]
    common = dict(max_num_seqs=4, max_num_batched_tokens=64, max_model_len=64, block_size=4, num_blocks=20)
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    path = hf_model_dir("qwen3")
    with LLM(path, attention_backend="gather", **common) as ref_llm:
        ref = ref_llm.generate(prompts, params, use_tqdm=False)
    with LLM(path, enforce_eager=False, cudagraph_capture_sizes=[2, 4], **common) as fast_llm:
        fast = fast_llm.generate(prompts, params, use_tqdm=False)
        assert [o.outputs[0].token_ids for o in fast] == [o.outputs[0].token_ids for o in ref]
        engine = fast_llm.llm_engine
        assert engine.num_preemptions > 0 and engine.prefix_cache_stats["hits"] > 0
        assert engine.model_runner.num_graph_steps > 0
        assert engine.kv_cache.kv_caches[0][0].shape[0] == 21  # the scheduler's 20 blocks + the scratch block
