"""What the engine writes down as it runs: one RequestRecord per request, one StepRecord per step.

Every metric in the course (TTFT, ITL, TPOT, E2E, queue time, throughput, goodput, KV usage) is computed
from these records and nothing else, so the real engine, the simulator and the HTTP bench client can
share one set of summaries. Times are seconds on one monotonic clock (``time.perf_counter()`` in the
engine, the simulated clock in the simulator).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class RequestRecord:
    """The life of one request, stamped by the engine (or by a client for over-the-wire measurements).

    ``arrival_time`` is when the request reached the engine (or was sent, for a client);
    ``token_times[i]`` is when output token (or streamed chunk) ``i`` became available, so
    ``token_times[0]`` is the first token and TTFT = token_times[0] - arrival_time.
    """

    request_id: str
    arrival_time: float
    num_prompt_tokens: int = 0
    first_scheduled_time: float | None = None
    token_times: list[float] = field(default_factory=list)
    finish_time: float | None = None
    num_output_tokens: int = 0
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache
    num_preemptions: int = 0
    finish_reason: str | None = None  # "stop" | "length" | "abort" | None while running
    num_draft_tokens: int = 0  # speculative decoding: tokens drafted for it and verified
    num_accepted_tokens: int = 0  # of which the target model kept

    @property
    def first_token_time(self) -> float | None:
        return self.token_times[0] if self.token_times else None

    @property
    def ttft(self) -> float | None:
        """Time to first token: arrival (or send) -> first generated token."""
        t = self.first_token_time
        return None if t is None else t - self.arrival_time

    @property
    def e2e(self) -> float | None:
        """End-to-end latency: arrival -> last token (finish for requests that stopped early)."""
        end = self.token_times[-1] if self.token_times else self.finish_time
        return None if end is None else end - self.arrival_time

    @property
    def queue_time(self) -> float | None:
        """Arrival -> first scheduled (waiting for a slot in a batch)."""
        return None if self.first_scheduled_time is None else self.first_scheduled_time - self.arrival_time

    @property
    def itls(self) -> list[float]:
        """Gaps between consecutive output tokens (inter-token latencies)."""
        t = self.token_times
        return [b - a for a, b in zip(t, t[1:], strict=False)]

    @property
    def tpot(self) -> float | None:
        """Time per output token after the first: (E2E - TTFT) / (output tokens - 1), as vLLM reports it.

        Uses ``num_output_tokens`` when set (a streamed chunk may carry several tokens), else the stamps.
        """
        n = self.num_output_tokens or len(self.token_times)
        if n < 2 or not self.token_times:
            return None
        return (self.token_times[-1] - self.token_times[0]) / (n - 1)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class StepRecord:
    """One engine step: what was batched, what the KV cache looked like, and where the time went.

    ``t_schedule + t_prepare + t_forward + t_sample`` is the step's busy time; ``end - start`` also
    counts bookkeeping (appending tokens, stop checks, freeing blocks).
    """

    step: int
    start: float
    end: float
    num_prefill_tokens: int = 0  # prompt tokens computed this step (all prefill chunks together)
    num_decode_tokens: int = 0  # one per decoding sequence, plus its drafts under speculative decoding
    num_prefill_seqs: int = 0
    num_decode_seqs: int = 0
    num_running: int = 0  # after scheduling
    num_waiting: int = 0  # after scheduling
    num_preempted: int = 0  # preemptions in this step
    kv_blocks_used: int = 0
    kv_blocks_total: int = 0
    prefix_cache_queries: int = 0  # prompt tokens looked up in the prefix cache this step
    prefix_cache_hits: int = 0  # of which found cached
    num_draft_tokens: int = 0  # speculative decoding: drafts verified this step (in num_decode_tokens)
    num_accepted_tokens: int = 0  # of which the target model kept
    t_schedule: float = 0.0
    t_prepare: float = 0.0
    t_forward: float = 0.0
    t_sample: float = 0.0
    t_all_reduce: float = 0.0  # tensor parallelism: rank 0's time in all-reduces (part of t_forward)
    # decode KV lengths / prefill (chunk, context) pairs, for cost models and roofline fits
    decode_context_lens: list[int] = field(default_factory=list)
    prefill_chunks: list[tuple[int, int]] = field(default_factory=list)  # (chunk tokens, context before it)
    # How the times were taken: a GPU runs asynchronously, so a clock read without a synchronize times
    # the kernel *launches*; "predicted" marks a simulator's step (ModelRunner.timing_method says which).
    timing: str = ""

    @property
    def duration(self) -> float:
        return self.end - self.start

    @property
    def num_tokens(self) -> int:
        return self.num_prefill_tokens + self.num_decode_tokens

    @property
    def kv_usage(self) -> float:
        """Fraction of KV blocks in use (0-1), like vLLM's kv_cache_usage_perc gauge."""
        return self.kv_blocks_used / self.kv_blocks_total if self.kv_blocks_total else 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
