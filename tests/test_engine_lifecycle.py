"""An engine's end: what frees its device memory (the KV cache, graphs, the model), and when.

A notebook builds engine after engine on one GPU, and a server process freezes its start-up heap out of
the cycle collector's walks (``gc.freeze``), so an engine must be freed by reference counting alone: no
reference cycle may hold it. Checked here, with the cycle collector switched off, on the three paths
(the CPU's C++ kernel, the gather reference path, and the GPU's path: the Triton backend with decode
graphs, replayed eagerly on a CPU):

- ``del llm`` frees the engine and its KV tensors at once, and so after ``gc.freeze()``;
- ``LLM.close()`` (and ``with LLM(...)``) frees the KV tensors while the ``LLM`` object lives, and a later
  ``generate`` raises a clear error;
- ``AsyncLLM.shutdown()`` closes an engine it built, and not one it was handed;
- ``minengine serve`` says what runs in its start-up line, and closes its engine when it stops.

The KV-cache arithmetic at a GPU's sizes (no allocation) is at the end.
"""

from __future__ import annotations

import asyncio
import gc
import os
import signal
import subprocess
import sys
import time
import weakref
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import pytest
import torch
from proc_utils import free_port, stop_process_group

from minengine.config import EngineConfig
from minengine.core.sampling_params import SamplingParams
from minengine.engine.async_llm import AsyncLLM
from minengine.engine.kv_cache import (
    MAX_BLOCK_ID,
    _cuda_budget_bytes,
    _useful_bytes,
    check_kv_index_space,
    determine_num_blocks,
    kv_bytes_per_token,
)
from minengine.engine.llm import LLM
from minengine.engine.llm_engine import LLMEngine
from minengine.models import cpu_kernels
from minengine.models.attention.triton_kernels import triton_available
from minengine.models.config import ModelConfig

pytestmark = pytest.mark.usefixtures("torch_one_thread")

SMALL = dict(max_model_len=64, max_num_seqs=2)
PATHS = {
    "cpp": dict(),  # a CPU's default in fp32
    "gather": dict(attention_backend="gather"),
    "triton-graphs": dict(enforce_eager=False, cudagraph_capture_sizes=[1, 2]),  # the GPU's path
}
PARAMS = SamplingParams(temperature=0, max_tokens=3, ignore_eos=True)
PROMPTS = [[5, 6, 7, 8], [9, 10]]


def _path(name: str):
    marks = []
    if name == "triton-graphs" and triton_available() is not None:
        marks.append(pytest.mark.skip(reason=str(triton_available())))
    if name == "cpp" and not cpu_kernels.load():
        marks.append(pytest.mark.skip(reason=f"the C++ kernels are not built: {cpu_kernels.build_error()}"))
    return pytest.param(name, marks=marks, id=name)


ALL_PATHS = [_path(name) for name in PATHS]


@contextmanager
def cycle_collector_off() -> Iterator[None]:
    """Only reference counting frees anything inside the block."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _llm(path, name: str, **extra) -> LLM:
    llm = LLM(path, **SMALL, **PATHS[name], **extra)
    expected = {"cpp": "cpp", "gather": "gather", "triton-graphs": "triton"}[name]
    assert llm.runtime.attention_backend == expected  # the path this case claims is the one that runs
    assert llm.runtime.cuda_graphs is (name == "triton-graphs")
    return llm


def _refs(llm: LLM) -> tuple[weakref.ref, weakref.ref]:
    engine = llm.llm_engine
    return weakref.ref(engine), weakref.ref(engine.kv_cache.kv_caches[0][0])


# ---- del ----
@pytest.mark.parametrize("name", ALL_PATHS)
def test_del_alone_frees_the_engine_and_its_kv_cache(hf_model_dir, name: str) -> None:
    path = hf_model_dir("qwen3")
    with cycle_collector_off():
        llm = _llm(path, name)
        outputs = llm.generate(PROMPTS, PARAMS, use_tqdm=False)
        if name == "triton-graphs":
            assert llm.llm_engine.model_runner.num_graph_steps > 0  # the graphs ran, and hold nothing back
        engine, kv = _refs(llm)
        del llm
        assert engine() is None, "the engine outlived `del llm`: a reference cycle holds it"
        assert kv() is None, "the KV cache outlived `del llm`"
    assert [len(o.outputs[0].token_ids) for o in outputs] == [3, 3]  # the outputs stay, and pin nothing


@pytest.mark.parametrize("name", ALL_PATHS)
def test_del_frees_the_engine_after_the_heap_was_frozen(hf_model_dir, name: str) -> None:
    """What ``minengine serve`` does: build, ``gc.freeze()`` (vLLM's freeze_gc_heap), then serve; a frozen
    object is never visited by the cycle collector again, so only reference counting can free it."""
    path = hf_model_dir("qwen3")
    gc.collect()
    with cycle_collector_off():
        llm = _llm(path, name)
        gc.freeze()
        try:
            llm.generate(PROMPTS, PARAMS, use_tqdm=False)
            engine, kv = _refs(llm)
            del llm
            gc.collect()  # a full pass skips the frozen heap: it cannot help
            assert engine() is None, "the engine outlived `del llm` in a frozen heap"
            assert kv() is None
        finally:
            gc.unfreeze()


# ---- close ----
@pytest.mark.parametrize("name", [p for p in ALL_PATHS if p.id != "gather"])
def test_close_frees_the_kv_cache_while_the_llm_lives(hf_model_dir, name: str) -> None:
    llm = _llm(hf_model_dir("qwen3"), name)
    llm.generate(PROMPTS, PARAMS, use_tqdm=False)
    engine = llm.llm_engine
    kv = weakref.ref(engine.kv_cache.kv_caches[0][0])
    pending = engine.add_request(None, [5, 6, 7], PARAMS)  # unfinished when the engine closes: aborted
    with cycle_collector_off():
        llm.close()
        assert kv() is None, "close() left the KV cache alive"
    assert engine.closed and not engine.has_unfinished_requests()
    assert pending.is_finished and pending.finish_reason == "abort"
    assert engine.model is None and engine.model_runner is None
    with pytest.raises(RuntimeError, match="closed"):
        llm.generate(PROMPTS, PARAMS, use_tqdm=False)
    llm.close()  # twice: nothing left to do
    engine.add_request(None, [5, 6], PARAMS)  # the engine's own step loop refuses too
    with pytest.raises(RuntimeError, match="closed"):
        engine.step()


def test_a_with_block_closes_the_llm_even_when_it_raises(hf_model_dir) -> None:
    with LLM(hf_model_dir("qwen3"), **SMALL) as llm:
        kv = weakref.ref(llm.llm_engine.kv_cache.kv_caches[0][0])
        assert len(llm.generate(PROMPTS, PARAMS, use_tqdm=False)) == 2
    assert llm.llm_engine.closed and kv() is None
    with pytest.raises(ValueError, match="boom"), LLM(hf_model_dir("qwen3"), **SMALL) as llm:
        kv = weakref.ref(llm.llm_engine.kv_cache.kv_caches[0][0])
        raise ValueError("boom")
    assert llm.llm_engine.closed and kv() is None
    with pytest.raises(RuntimeError, match="closed"):
        llm.generate(PROMPTS, PARAMS, use_tqdm=False)


# ---- AsyncLLM ----
async def _stream(llm: AsyncLLM, prompt: list[int]) -> list:
    return [out async for out in llm.generate(prompt, PARAMS)]


def test_async_llm_shutdown_closes_the_engine_it_built(hf_model_dir) -> None:
    async def run() -> tuple[AsyncLLM, weakref.ref]:
        llm = AsyncLLM(hf_model_dir("qwen3"), **SMALL)
        kv = weakref.ref(llm.engine.kv_cache.kv_caches[0][0])
        outs = await _stream(llm, PROMPTS[0])
        assert outs[-1].finished and len(outs[-1].outputs[0].token_ids) == 3
        await llm.shutdown()
        return llm, kv

    llm, kv = asyncio.run(run())
    assert llm.engine.closed and kv() is None


def test_async_llm_shutdown_leaves_an_engine_it_was_handed_open(hf_model_dir) -> None:
    engine = LLMEngine(model=str(hf_model_dir("qwen3")), **SMALL)

    async def run() -> None:
        llm = AsyncLLM(engine=engine)
        outs = await _stream(llm, PROMPTS[0])
        assert outs[-1].finished
        await llm.shutdown()

    asyncio.run(run())
    assert not engine.closed  # the caller's: it still runs
    request = engine.add_request(None, PROMPTS[1], PARAMS)
    while engine.has_unfinished_requests():
        engine.step()
    assert request.is_finished and len(request.output_token_ids) == 3
    kv = weakref.ref(engine.kv_cache.kv_caches[0][0])
    engine.close()  # and the caller closes it
    assert engine.closed and kv() is None


@pytest.mark.parametrize("started", [True, False], ids=["served-then-stopped", "never-started"])
def test_a_dropped_app_lets_its_engine_go(started: bool) -> None:
    """An app from ``create_app(model=...)`` owns its engine: once the app is gone, so is the engine, whether
    its lifespan ran (served, then stopped) or not (built in a notebook and dropped). FastAPI caches every
    endpoint function it analyses for the life of the process, so a route that closed over the engine
    kept every app's engine, and on a GPU its memory, until the process exited."""
    from fastapi.testclient import TestClient

    from minengine.server.app import create_app

    app = create_app(model="tinystories-4m", **SMALL)  # the shipped model: the text API needs a tokenizer
    engine = weakref.ref(app.state.llm.engine)
    if started:
        with TestClient(app) as client:
            body = {"model": app.state.model_name, "prompt": "Once upon a time", "max_tokens": 3}
            response = client.post("/v1/completions", json=body)
            assert response.status_code == 200, response.text
            assert client.get("/v1/models").json()["data"][0]["id"] == app.state.model_name
        assert app.state.llm.engine.closed  # the lifespan shut down the engine the app built
        del client
    del app
    gc.collect()
    assert engine() is None, [type(r).__name__ for r in gc.get_referrers(engine())]


# ---- minengine serve ----
def _serve(argv: list[str], port: int) -> subprocess.Popen:
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            stdin=subprocess.DEVNULL, start_new_session=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    deadline = time.monotonic() + 120
    while True:
        if proc.poll() is not None:
            raise AssertionError(f"minengine serve exited with {proc.returncode}: {proc.communicate()[1]}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline, "minengine serve did not come up"
        time.sleep(0.2)


def _serve_args(port: int) -> list[str]:
    return ["serve", "--model", "tinystories-4m", "--host", "127.0.0.1", "--port", str(port),
            "--threads", "1", "--max-model-len", "256", "--max-num-seqs", "4", "--log-level", "info"]


def _complete(port: int) -> None:
    body = {"prompt": "Once", "max_tokens": 3}
    r = httpx.post(f"http://127.0.0.1:{port}/v1/completions", json=body, timeout=60)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] <= 3


def test_serve_says_what_runs_and_stops_cleanly_on_sigterm() -> None:
    port = free_port()
    proc = _serve([sys.executable, "-m", "minengine", *_serve_args(port)], port)
    try:
        _complete(port)
        os.killpg(proc.pid, signal.SIGTERM)  # what a service manager (and ServerProcess.stop) sends
        _, err = proc.communicate(timeout=60)
    finally:
        stop_process_group(proc)
    lines = [line for line in err.splitlines() if line.startswith("minengine: attention '")]
    assert len(lines) == 1, err  # the runtime line, once, before the serving line
    assert "float32 on cpu" in lines[0] and "KV cache 4 layers x (K, V)" in lines[0], lines[0]
    assert err.index(lines[0]) < err.index("minengine: serving 'tinystories-4m'")
    # uvicorn ran the app's shutdown (AsyncLLM.shutdown, which closes the engine) and it did not fail
    assert "Application shutdown complete" in err and "shutdown failed" not in err, err
    assert "Traceback" not in err, err
    assert proc.returncode in (0, -signal.SIGTERM)  # uvicorn re-raises the signal after shutting down


# The serve command run in a process that also watches its engine: the same ``main`` that
# ``python -m minengine`` calls, with AsyncLLM.shutdown wrapped to report what it left alive.
_PROBED_SERVE = r"""
import sys, weakref
from minengine.engine import async_llm

_shutdown, seen = async_llm.AsyncLLM.shutdown, {}

async def shutdown(self):
    seen["engine"] = weakref.ref(self.engine)
    kv = weakref.ref(self.engine.kv_cache.kv_caches[0][0])
    await _shutdown(self)
    print(f"probe: shut down, closed={self.engine.closed}, kv_freed={kv() is None}",
          file=sys.stderr, flush=True)

async_llm.AsyncLLM.shutdown = shutdown
from minengine.cli.main import main
code = main(sys.argv[1:])
engine = seen.get("engine")
print(f"probe: serve returned {code}, engine_freed={engine is not None and engine() is None}",
      file=sys.stderr, flush=True)
raise SystemExit(code)
"""


def test_serve_closes_its_engine_when_it_stops() -> None:
    """Inside the server's process: after Ctrl-C (SIGINT: uvicorn shuts the app down, then ``serve``
    returns 0), the engine it built is closed and its KV cache freed. Only what ``close()`` releases is
    checked for being gone: the engine object itself stays reachable until the process exits, from
    FastAPI's module-level caches of the route functions (``fastapi.dependencies.models``'s lru_caches
    keep each endpoint, whose closure holds the serving objects, the AsyncLLM and so the engine)."""
    port = free_port()
    proc = _serve([sys.executable, "-c", _PROBED_SERVE, *_serve_args(port)], port)
    try:
        _complete(port)
        os.killpg(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        stop_process_group(proc)
    assert "minengine: attention '" in err
    assert "probe: shut down, closed=True, kv_freed=True" in err, err
    assert "probe: serve returned 0" in err, err
    assert proc.returncode == 0, err


# ---- the KV cache at a GPU's sizes, worked out without allocating ----
def _tinystories_4m() -> ModelConfig:
    from minengine.models.loader import resolve_model_path

    return ModelConfig.from_pretrained(resolve_model_path("tinystories-4m"))


def test_an_h200_budget_passes_2_31_elements_per_layer_and_still_fits_the_block_ids() -> None:
    c = _tinystories_4m()
    assert (c.num_hidden_layers, c.num_key_value_heads, c.head_dim) == (4, 2, 32)
    per_token = kv_bytes_per_token(c, torch.bfloat16)
    assert per_token == 2 * 4 * 2 * 32 * 2  # K and V x layers x KV heads x head_dim x 2 bytes
    budget = int(0.9 * 141e9)  # an H200 at gpu_memory_utilization 0.9, if nothing capped it
    block_size = 16
    num_blocks = budget // (block_size * per_token)
    layout = check_kv_index_space(c, num_blocks, block_size, "triton", itemsize=2)
    assert layout.shape == (num_blocks, block_size, 2, 32)
    assert layout.numel > 2**31  # one layer's K tensor: past what 32-bit offsets could reach ...
    assert num_blocks - 1 <= MAX_BLOCK_ID  # ... yet every block id fits the int32 tables: accepted
    assert layout.strides == (block_size * 2 * 32, 2 * 32, 32, 1)
    assert num_blocks * layout.strides[0] == layout.numel

    # the last block id the int32 tables hold, and one past it
    assert check_kv_index_space(c, MAX_BLOCK_ID + 1, 1, "triton").num_blocks == 2**31
    with pytest.raises(ValueError, match=r"2,147,483,649 KV blocks: block ids past 2,147,483,647 .*'triton'.*"
                                         r"Raise block_size or set num_blocks / kv_cache_memory_bytes"):
        check_kv_index_space(c, 2**31 + 1, 1, "triton")


def test_a_gpu_cache_is_capped_at_what_the_scheduler_could_fill(monkeypatch: pytest.MonkeyPatch) -> None:
    c = _tinystories_4m()
    per_token = kv_bytes_per_token(c, torch.bfloat16)
    config = EngineConfig(max_num_seqs=8, max_model_len=100, block_size=16)
    config = config.resolved(c.max_position_embeddings)
    useful = _useful_bytes(config, per_token)
    assert useful == 8 * 7 * 16 * per_token  # 8 sequences of 100 tokens: 7 blocks of 16 each
    # an H200 with 141 GB, 2 GB of it in use: vLLM's rule alone would hand this tiny model ~125 GB
    total, used = 141 * 10**9, 2 * 10**9
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (total - used, total))
    cuda = torch.device("cuda")
    assert _cuda_budget_bytes(config, cuda, None, per_token) == useful
    assert determine_num_blocks(config, c, torch.bfloat16, cuda) == 8 * 7
    # where the scheduler could fill more than the GPU holds (1,024 sequences of 2,048 tokens: 2 GiB, on
    # a 4 GB GPU with 2 GB in use), the GPU's budget is the limit
    total, used = 4 * 10**9, 2 * 10**9
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (total - used, total))
    big = EngineConfig(max_num_seqs=1024, block_size=16).resolved(c.max_position_embeddings)
    rule = int(total * big.gpu_memory_utilization) - used
    assert _useful_bytes(big, per_token) == 1024 * 2048 * per_token > rule
    assert _cuda_budget_bytes(big, cuda, None, per_token) == rule
    assert determine_num_blocks(big, c, torch.bfloat16, cuda) == rule // (16 * per_token)
