"""Helpers the lesson notebooks share: device-aware sizes, random-weight models and timing runs.

Why a module and not notebook code: lessons 01, 05 and 06 measure the same things (prefill time, decode
step time, a mixed workload) and the experiment widget reuses them, so the measuring code lives in one
tested place and the notebooks stay short. Every number comes from the engine's own ``StepRecord`` and
``RequestRecord`` instrumentation, never from timing around a call.
"""

from __future__ import annotations

import math
import os
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from minengine.core.records import RequestRecord, StepRecord
from minengine.core.sampling_params import SamplingParams
from minengine.course.lesson_model import (  # noqa: F401  (lessons call lu.lesson_model())
    LESSON_MODEL_ENV,
    REAL_MODEL,
    TINY_MODEL,
    LessonModel,
    lesson_model,
    real_model_installed,
)
from minengine.engine.gc_heap import gc_heap_frozen
from minengine.engine.threads import torch_threads
from minengine.models.config import ModelConfig
from minengine.models.llama import LlamaForCausalLM
from minengine.models.loader import build_random_model, resolve_device

HEADLESS_ENV = "MINENGINE_HEADLESS"
SHIPPED_VOCAB = 1753  # the shipped tokenizer's size: random models use it so its prompts stay valid


def is_headless() -> bool:
    """True under tests, CI and nbgrader: lessons then pick their smallest sizes (nothing is skipped)."""
    flag = os.environ.get(HEADLESS_ENV, "").strip().lower()
    return flag not in ("", "0", "false", "no") or bool(os.environ.get("NBGRADER_EXECUTION"))


def physical_cores() -> int:
    """Physical cores (hyper-threads share one core's arithmetic units, so they rarely help matmuls)."""
    try:
        import psutil
    except ImportError:
        return max(1, os.cpu_count() or 1)
    return max(1, psutil.cpu_count(logical=False) or os.cpu_count() or 1)


def fastest_thread_count(max_threads: int | None = None, repeats: int = 5) -> int:
    """Time one prefill-sized matmul at 1, 2, 4... threads and return the fastest count.

    Why measure instead of using every core: on a machine where other programs hold some cores, a
    thread that waits for a descheduled partner can make each operation many times slower, so the
    best count depends on how busy the machine is right now. More threads must win by 10% to be chosen.
    """
    top = max_threads or min(physical_cores(), 4)
    a, w = torch.randn(256, 768), torch.randn(768, 2048)
    best, best_t = 1, math.inf
    for n in (c for c in (1, 2, 4, 8) if c <= top):
        with torch_threads(n):
            times = []
            for _ in range(repeats + 1):  # the first call is a warm-up
                start = time.perf_counter()
                a @ w
                times.append(time.perf_counter() - start)
        if min(times[1:]) < 0.9 * best_t:
            best, best_t = n, min(times[1:])
    return best


def busy_note() -> str | None:
    """A warning when other programs keep this machine busy (timings then swing a lot), else None."""
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):  # Windows has no load average
        return None
    cores = os.cpu_count() or 1
    if load < 0.75 * cores:
        return None
    return (f"note: this machine is busy (load {load:.1f} on {cores} cores), so timings will be noisy; "
            "rerun when it is quiet for cleaner curves")


# ------------------------------------------------------------------------------------------ models
@dataclass(frozen=True)
class ModelShape:
    """The few numbers that set a Llama's size (and so its time per step); weights are random."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int = SHIPPED_VOCAB
    max_len: int = 2048

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def num_params(self) -> int:
        attn = self.hidden * self.hidden * 2 + 2 * self.hidden * self.kv_heads * self.head_dim
        mlp = 3 * self.hidden * self.intermediate
        return self.layers * (attn + mlp + 2 * self.hidden) + self.vocab * self.hidden + self.hidden

    def describe(self) -> str:
        return (f"{self.num_params / 1e6:,.0f}M parameters: {self.layers} layers, hidden {self.hidden}, "
                f"{self.heads} heads ({self.kv_heads} KV heads), MLP {self.intermediate}")


def random_llama(shape: ModelShape, device: str | torch.device | None = None,
                 dtype: torch.dtype | None = None, seed: int = 0) -> LlamaForCausalLM:
    """A Llama with random weights, built in place on the device (no files, no download).

    Timing does not depend on what the weights are, only on how many bytes and FLOPs they cost, so a
    random model of a realistic shape measures bandwidth effects the tiny shipped model cannot show.
    """
    dev = resolve_device(device)
    dtype = dtype or (torch.bfloat16 if dev.type == "cuda" else torch.float32)
    config = ModelConfig(architecture="LlamaForCausalLM", vocab_size=shape.vocab, hidden_size=shape.hidden,
                         intermediate_size=shape.intermediate, num_hidden_layers=shape.layers,
                         num_attention_heads=shape.heads, num_key_value_heads=shape.kv_heads,
                         head_dim=shape.head_dim, max_position_embeddings=shape.max_len,
                         tie_word_embeddings=True, torch_dtype=str(dtype).removeprefix("torch."))
    return build_random_model(config, device=dev, dtype=dtype, seed=seed)


def weight_bytes(model: torch.nn.Module) -> int:
    """Bytes a decode step must stream: every parameter once (tied embeddings counted once)."""
    return sum(p.nbytes for p in model.parameters())


# ------------------------------------------------------------------------------------ device profile
@dataclass(frozen=True)
class DeviceProfile:
    """Sizes for this machine: a 2-core laptop and an H100 need very different experiments."""

    device: str
    headless: bool
    threads_compute: int  # big matmuls: split across cores
    threads_small: int  # tiny shipped model: one thread avoids waking a second one for microsecond ops
    big_shape: ModelShape
    prefill_on_big_model: bool  # a GPU finishes the shipped model's prompts in launch overhead
    prefill_lengths: tuple[int, ...]
    prefill_repeats: int
    batch_sizes: tuple[int, ...]
    decode_steps: int
    workload_requests: int

    def describe(self) -> str:
        return (f"device {self.device}, {physical_cores()} physical cores, threads {self.threads_compute} "
                f"for big models / {self.threads_small} for the shipped one"
                f"{', headless (small sizes)' if self.headless else ''}")


CPU_BIG_SHAPE = ModelShape(hidden=768, layers=12, heads=12, kv_heads=4, intermediate=2048)


def device_profile(headless: bool | None = None, device: str | None = None) -> DeviceProfile:
    """Pick experiment sizes for CUDA / MPS / CPU (smaller when headless)."""
    headless = is_headless() if headless is None else headless
    dev = resolve_device(device).type
    threads = min(physical_cores(), 4)
    if dev == "cpu":  # a busy machine punishes threads that wait for each other: use one
        threads = 1 if busy_note() else fastest_thread_count(threads)
    if dev == "cuda":
        mem = torch.cuda.get_device_properties(0).total_memory / 2**30
        shape = (ModelShape(4096, 32, 32, 8, 14336, vocab=32000, max_len=8192) if mem >= 40
                 else ModelShape(2048, 16, 16, 8, 8192, vocab=32000, max_len=8192))
        return DeviceProfile(dev, headless, threads, 1, shape, True,
                             (256, 1024, 2048, 4096, 6144, 8192), 2 if headless else 3,
                             (1, 4, 16, 32, 64, 128, 256, 512), 6 if headless else 10, 24 if headless else 48)
    lengths = (32, 256, 512, 1024, 1536, 2040) if headless else (32, 128, 256, 512, 768, 1024, 1280, 1536,
                                                                1792, 2040)
    batches = (1, 2, 4, 8, 16, 32, 64) if headless else (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128)
    return DeviceProfile(dev, headless, threads, 1, CPU_BIG_SHAPE, False, lengths, 2 if headless else 3,
                         batches, 6 if headless else 8, 16 if headless else 24)


def shipped_llm(**options: Any) -> Any:
    """The shipped model with prefix caching off (a lesson's repeated prompts must not hit the cache). Its
    KV cache is the engine's default: 256 MiB on a CPU; on a GPU no more than max_num_seqs sequences of
    max_model_len tokens can use (about 0.5 GiB for this model), so other engines still fit beside it."""
    from minengine.engine.llm import LLM

    return LLM(**{"enable_prefix_caching": False, **options})


def make_engine_options(profile: DeviceProfile, max_len: int) -> dict[str, Any]:
    """Engine options for the profile's longest prompt (one step) and largest decode batch, no bigger."""
    batch = max(profile.batch_sizes)
    blocks = 2 * max(2 * batch, math.ceil(max_len / 16), 256)  # a decode request here fits in 2 blocks
    return dict(max_num_seqs=max(batch, 64), max_num_batched_tokens=max_len, num_blocks=blocks,
                enable_prefix_caching=False)


# --------------------------------------------------------------------------------------------- runs
@dataclass
class WorkRequest:
    """A request of a workload: when it arrives (seconds after the start), its prompt and its params."""

    arrival: float
    prompt: list[int]
    params: SamplingParams


@dataclass
class RunResult:
    """What a run left behind; ``wall`` is seconds from the start to the last token."""

    requests: list[RequestRecord]
    steps: list[StepRecord]
    wall: float


def random_prompt(n: int, rng: random.Random, vocab: int = SHIPPED_VOCAB) -> list[int]:
    """n random token ids (token 0 is the shipped model's EOS, so it is avoided)."""
    return [rng.randrange(1, vocab) for _ in range(n)]


def run_requests(llm: Any, work: Sequence[WorkRequest],
                 on_step: Callable[[StepRecord], None] | None = None) -> RunResult:
    """Drive the engine step by step, adding each request at its arrival time, like a client would.

    ``llm`` is an ``LLM`` or an ``LLMEngine``. Arrival times are the scheduled ones, so a request
    that waits for a busy step counts that wait in its TTFT (as a real client's clock would). The
    heap that existed before the run is kept out of garbage-collection walks while it lasts
    (``gc_heap_frozen``): the notebook's earlier records belong to the client, not to the server.
    """
    engine = getattr(llm, "llm_engine", llm)
    pending = sorted(work, key=lambda w: w.arrival)
    added: list[Any] = []
    steps: list[StepRecord] = []  # the engine's own StepRecords, in order
    with gc_heap_frozen():
        t0 = time.perf_counter()
        try:
            while pending or engine.has_unfinished_requests():
                now = time.perf_counter() - t0
                while pending and pending[0].arrival <= now:
                    w = pending.pop(0)
                    added.append(engine.add_request(None, w.prompt, w.params, arrival_time=t0 + w.arrival))
                if engine.has_unfinished_requests():
                    engine.step()
                    record = engine.last_step_record
                    if record is not None and (not steps or steps[-1] is not record):
                        steps.append(record)
                        if on_step is not None:
                            on_step(record)
                elif pending:
                    time.sleep(min(pending[0].arrival - now, 0.05))
        except BaseException:
            engine.abort_request([r.request_id for r in added if not r.is_finished])
            raise
    records = [r.record for r in added]
    return RunResult(records, steps,
                     max((r.token_times[-1] for r in records if r.token_times), default=t0) - t0)


def warm_up(llm: Any, vocab: int = SHIPPED_VOCAB) -> None:
    """One small run first: the first calls pay one-off costs (allocations, kernel selection)."""
    params, rng = SamplingParams(max_tokens=4, ignore_eos=True, temperature=0), random.Random(1)
    run_requests(llm, [WorkRequest(0.0, random_prompt(64, rng, vocab), params) for _ in range(2)])


@dataclass
class PrefillPoint:
    length: int
    seconds: float  # fastest forward time over the repeats (the least disturbed by other work)
    runs: list[float] = field(default_factory=list)


@dataclass
class DecodePoint:
    batch: int
    seconds: float  # forward time of the fastest pure decode step (the least disturbed by other work)
    step_seconds: float  # whole fastest step (schedule + prepare + forward + sample + bookkeeping)

    @property
    def tokens_per_s(self) -> float:
        return self.batch / self.step_seconds


@dataclass
class PrefillFit:
    """time(n) = a + b*n + c*n^2: fixed cost, per-token matmuls, and attention's all-pairs term."""

    a: float
    b: float
    c: float

    def predict(self, n: float | np.ndarray) -> Any:
        return self.a + self.b * np.asarray(n) + self.c * np.asarray(n) ** 2

    def quadratic_share(self, n: float) -> float:
        return float(self.c * n * n / self.predict(n))


def fit_prefill(points: Sequence[PrefillPoint]) -> PrefillFit:
    """Non-negative least squares on relative error (every subset of terms; 3 terms is 7 tries)."""
    n = np.array([p.length for p in points], float)
    t = np.array([p.seconds for p in points], float)
    cols = np.stack([np.ones_like(n), n, n * n], 1) / t[:, None]  # rows scaled: relative error
    best, best_err = np.zeros(3), math.inf
    for mask in range(1, 8):
        idx = [i for i in range(3) if mask >> i & 1]
        coef, *_ = np.linalg.lstsq(cols[:, idx], np.ones_like(t), rcond=None)
        full = np.zeros(3)
        full[idx] = coef
        err = float(np.sum((cols @ full - 1) ** 2))
        if (coef >= 0).all() and err < best_err:
            best, best_err = full, err
    return PrefillFit(*map(float, best))


@dataclass
class Knee:
    """Roofline reading of decode: a flat memory floor, then a compute line rising with the batch."""

    floor_s: float  # step time at the smallest batch: streaming the weights once
    per_token_s: float  # compute time per sequence, from the largest batch
    batch: float  # where the two lines cross
    reached: bool  # False if even the largest batch was still near the floor

    def predict(self, batch: float | np.ndarray) -> Any:
        return np.maximum(self.floor_s, self.per_token_s * np.asarray(batch, float))


def decode_knee(points: Sequence[DecodePoint]) -> Knee:
    """Cross the batch-1 floor with the per-sequence compute cost seen at the largest batch."""
    first, last = points[0], points[-1]
    per_token = last.seconds / last.batch
    reached = last.seconds > 2 * first.seconds
    return Knee(first.seconds, per_token, first.seconds / per_token, reached)


def mixed_workload(num_requests: int, seed: int = 0, rate: float = 10.0, vocab: int = SHIPPED_VOCAB,
                   long_fraction: float = 0.25, long_len: tuple[int, int] = (800, 1600),
                   short_len: tuple[int, int] = (16, 128), output_len: tuple[int, int] = (16, 64)
                   ) -> list[WorkRequest]:
    """Chat-like traffic: mostly short prompts, some long documents, Poisson arrivals at ``rate``/s."""
    rng = random.Random(seed)
    long_ones = set(rng.sample(range(num_requests), round(num_requests * long_fraction)))
    work, t = [], 0.0
    for i in range(num_requests):
        lo, hi = long_len if i in long_ones else short_len
        params = SamplingParams(max_tokens=rng.randint(*output_len), ignore_eos=True, temperature=0)
        work.append(WorkRequest(t, random_prompt(rng.randint(lo, hi), rng, vocab), params))
        t += rng.expovariate(rate)
    return work
