"""Lesson 06's reading of one scenario: one long prompt joins a batch of decoding streams; what do they feel?

The scenario runs on the real engine (the notebook's ``interference`` loop, in sight) and in the simulator
(``sim_interference``), and both are read by one function (``measure_interference``) from the records
alone: the decoding streams' inter-token gaps while the long prompt is prefilled (the spike), the long
prompt's TTFT, and the engine time its prefill cost. So a CPU measurement and an H100 prediction are
the same numbers computed the same way. ``budget_engine`` builds the engines the loop runs on.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from minengine.core.records import RequestRecord, StepRecord

SIM_MODEL = "llama-3.1-8b"
SIM_MAX_LEN = 32_768


@dataclass
class Interference:
    """What the streams and the long prompt saw (times in seconds)."""

    label: str
    streams: list[RequestRecord]
    long: RequestRecord
    steps: list[StepRecord]
    window_end: float  # the measured window: the long prompt's arrival -> a few steps after its first token

    @property
    def arrival(self) -> float:
        return self.long.arrival_time

    @property
    def long_ttft(self) -> float:
        assert self.long.ttft is not None
        return self.long.ttft

    def _gaps(self, lo: float, hi: float) -> np.ndarray:
        gaps = [b - a for r in self.streams for a, b in zip(r.token_times, r.token_times[1:], strict=False)
                if lo < b <= hi]
        return np.array(gaps, float)

    @property
    def window_gaps(self) -> np.ndarray:
        """The streams' inter-token gaps that ended in the window."""
        return self._gaps(self.arrival, self.window_end)

    @property
    def baseline_itl(self) -> float:
        """Median gap before the long prompt arrived: the streams' normal rhythm."""
        before = self._gaps(-math.inf, self.arrival)
        return float(np.median(before)) if len(before) else math.nan

    @property
    def spike(self) -> float:
        """The longest gap any stream saw in the window."""
        return float(self.window_gaps.max())

    @property
    def typical_gap(self) -> float:
        """Median gap that ended while the prompt was prefilled (or at its first token): what the streams
        felt during the prefill, robust to one step that another program happened to slow down.

        The window opens when the first step that could take the prompt starts, not at its arrival: a
        prompt that arrives in the middle of a decode step waits for it, and that step's ordinary gap
        would otherwise halve the median when the whole prompt runs in one step (no chunking)."""
        first = self.long.first_token_time
        assert first is not None
        steps = self.prefill_steps
        opens = steps[0].start if steps else self.arrival
        gaps = self._gaps(opens, first + 1e-9)  # a step stamps all its tokens with one time
        return float(np.median(gaps)) if len(gaps) else math.nan

    @property
    def itl_p99(self) -> float:
        return float(np.percentile(self.window_gaps, 99))

    @property
    def prefill_steps(self) -> list[StepRecord]:
        """Steps from the long prompt's arrival to its first token: where its chunks ran."""
        first = self.long.first_token_time
        assert first is not None
        return [s for s in self.steps if self.arrival <= s.start < first]

    @property
    def prefill_busy_s(self) -> float:
        return sum(s.duration for s in self.prefill_steps)

    @property
    def prompt_tokens_computed(self) -> int:
        return sum(s.num_prefill_tokens for s in self.prefill_steps)

    @property
    def prompt_cost_s(self) -> float:
        """Engine time the prompt itself cost: busy time of its steps minus what the same number of plain
        decode steps would have taken (the streams' baseline rhythm)."""
        return self.prefill_busy_s - len(self.prefill_steps) * self.baseline_itl


def measure_interference(label: str, streams: Sequence[RequestRecord], long: RequestRecord,
                         steps: Sequence[StepRecord], tail_steps: int = 8) -> Interference:
    """Read one run: the window ends ``tail_steps`` steps after the long prompt's first token."""
    first = long.first_token_time
    if first is None:
        raise ValueError("the long prompt never produced a token: run longer")
    after = [s for s in steps if s.end > first + 1e-9]
    end = after[min(tail_steps, len(after)) - 1].end if after else first
    return Interference(label, list(streams), long, list(steps), end)


# ------------------------------------------------------------------------------------- the engine
def interference_options(budget: int | None, policy: str = "decode_first", n_streams: int = 16,
                         max_model_len: int = 2048) -> dict[str, Any]:
    """Engine options: chunked prefill with ``budget`` tokens per step, or (None) off with a budget of
    ``max_model_len`` (the engine's rule: any prompt fits one step)."""
    if budget is not None and budget <= n_streams:
        raise ValueError(f"a budget of {budget} tokens leaves nothing for a prompt next to {n_streams} "
                         f"decodes: use more than {n_streams}")
    return dict(max_num_seqs=n_streams + 4, enable_prefix_caching=False, max_model_len=max_model_len,
                enable_chunked_prefill=budget is not None, max_num_batched_tokens=budget or max_model_len,
                policy=policy, num_blocks=n_streams * 24 + math.ceil(max_model_len / 16) + 16)


def budget_engine(model: Any, budget: int | None, policy: str = "decode_first", n_streams: int = 16) -> Any:
    """An ``LLM`` over ``model`` (loaded weights, shared) with that budget and policy."""
    from minengine.engine.llm import LLM

    return LLM(model, **interference_options(budget, policy, n_streams))


def label_of(budget: int | None) -> str:
    return "off" if budget is None else str(budget)


# ---------------------------------------------------------------------------------- the simulator
def sim_interference(gpu: str = "h100-sxm", budget: int | None = 2048, policy: str = "decode_first",
                     n_streams: int = 40, long_len: int = 8192, stream_prompt: int = 128,
                     long_at: float | None = None,
                     tail_steps: int = 8, model: str = SIM_MODEL, cost_model: Any = None,
                     config: Any = None) -> Interference:
    """The same scenario in the simulator: ``n_streams`` start at 0, the long prompt arrives at ``long_at``
    seconds (default: late enough that they all stream, even with a tiny budget). ``cost_model`` and
    ``config`` replay an engine run instead (calibration)."""
    from minengine.sim.simulator import Simulator
    from minengine.sim.workload import RequestSpec

    if config is not None:
        sim = Simulator(config=config, cost_model=cost_model)
    else:
        options = interference_options(budget, policy, n_streams, SIM_MAX_LEN)
        options.pop("num_blocks")
        sim = Simulator(model, gpu, **options)
    cfg = sim.config
    per_step = cfg.max_num_batched_tokens - n_streams if cfg.enable_chunked_prefill else long_len
    window = math.ceil(long_len / max(per_step, 1))
    # The run's own cost model prices the warm-up: a model fitted to a fast CPU steps in under a
    # millisecond, a datasheet H100 serving an 8B model in several, so fixed guesses (once "5 ms a
    # step") either run the streams dry or overflow max_model_len.
    cm = sim.cost_model
    fastest_step = cm.decode_cost(n_streams, stream_prompt + 1).time  # bounds the steps in any interval
    if long_at is None:  # 4x the warm-up priced as full-budget prefill steps, at most the old 20 ms/step rule
        warm_steps = math.ceil(n_streams * stream_prompt / cfg.max_num_batched_tokens) + 3
        full_step = cm.prefill_cost(min(cfg.max_num_batched_tokens, n_streams * stream_prompt)).time
        old_rule = max(1.0, 0.02 * (n_streams * stream_prompt / cfg.max_num_batched_tokens + n_streams))
        long_at = min(old_rule, 4 * warm_steps * full_step)
    # Outputs long enough to stream through the whole window, with room for slow (tiny-budget) windows.
    out = 4 * window + 4 * tail_steps + 400 + math.ceil(long_at / fastest_step)
    if stream_prompt + out > cfg.max_model_len:
        raise ValueError(f"the streams would need {stream_prompt + out} tokens of context, more than "
                         f"max_model_len={cfg.max_model_len}: pass a smaller long_at")
    specs = [RequestSpec(0.0, stream_prompt, out) for _ in range(n_streams)]
    specs.append(RequestSpec(long_at, long_len, tail_steps + 2))
    result = sim.run(specs)
    streams, long = result.requests[:n_streams], result.requests[n_streams]
    if any(len(r.token_times) < 3 or r.token_times[2] > long_at for r in streams):
        raise ValueError(f"the streams were not all decoding when the long prompt arrived at {long_at} s: "
                         "raise long_at or the budget")
    got = measure_interference(label_of(budget), streams, long, result.steps, tail_steps)
    if any(r.token_times[-1] < got.window_end for r in streams):
        raise ValueError("a stream finished inside the measured window")
    return got
