"""Workloads for the simulator: when requests arrive, how long their prompts and outputs are, what they share.

A workload is a list of ``RequestSpec`` (arrival time, prompt length, output length, optional shared
prefix). The simulator needs no text: it builds token ids from a spec (``prompt_token_ids``) so that
requests sharing a prefix really share token ids (the prefix cache hashes them) and nothing else does.

Arrivals follow vLLM's benchmark client (``vllm bench serve --request-rate R --burstiness b``): gaps
between requests are Gamma-distributed with shape ``b`` and scale ``1 / (R x b)``, so the mean rate is R
for every b; b = 1 is a Poisson process, b < 1 is burstier, b > 1 more regular. Rate ``inf`` sends
everything at time 0 (an offline batch).

Traces (``load_trace``): CSV with a header, JSON lines or a JSON array, one request per row, with an
arrival time (seconds; column ``arrival_time``, ``timestamp`` or ``time``), a prompt length (``prompt_len``,
``input_len``, ``prompt_tokens`` or ``num_prompt_tokens``) and an output length (``output_len``,
``output_tokens``, ``max_tokens`` or ``num_output_tokens``). Arrival times are shifted to start at 0.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

# Token ids of generated prompts: a unique id per request right after the shared prefix makes every
# later block hash unique (the hash chains through parent blocks), so only the intended prefix is shared.
FILLER_TOKEN = 2
UNIQUE_TOKEN_BASE = 1_000_000
PREFIX_TOKEN_RANGE = (3, 32_000)


@dataclass(frozen=True)
class RequestSpec:
    """One request of a workload: ``prompt_len`` counts the shared prefix (``prefix_len`` tokens) too.

    ``max_tokens`` is what the client asks for, the only length a scheduler sees; ``output_len`` is how
    many tokens the request really generates (it stops there, as at an EOS). None (the default) means
    the benchmark client's way, ``ignore_eos`` with ``max_tokens = output_len``: then a policy could
    read the true length off the request, so scheduling studies should set ``max_tokens``.
    """

    arrival_time: float
    prompt_len: int
    output_len: int
    prefix_id: int | None = None
    prefix_len: int = 0
    max_tokens: int | None = None

    def __post_init__(self) -> None:
        if self.prompt_len < 1 or self.output_len < 1:
            raise ValueError(f"prompt and output lengths must be >= 1, got {self.prompt_len}, "
                             f"{self.output_len}")
        if self.prefix_len and self.prefix_len >= self.prompt_len:
            raise ValueError(f"shared prefix ({self.prefix_len}) must be shorter than the prompt "
                             f"({self.prompt_len})")
        if not math.isfinite(self.arrival_time) or self.arrival_time < 0:
            raise ValueError(f"arrival time must be a finite number >= 0, got {self.arrival_time}")
        if self.max_tokens is not None and self.max_tokens < self.output_len:
            raise ValueError(f"max_tokens ({self.max_tokens}) must be >= output_len ({self.output_len})")

    @property
    def max_output_len(self) -> int:
        """The output budget the client asks for (and the scheduler sees)."""
        return self.output_len if self.max_tokens is None else self.max_tokens


# ------------------------------------------------------------------------------------- length laws
class LengthDist:
    """A distribution of token counts. ``sample(rng, n)`` returns ints >= 1."""

    mean: float

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        raise NotImplementedError


@dataclass(frozen=True)
class Fixed(LengthDist):
    value: int

    @property
    def mean(self) -> float:  # type: ignore[override]
        return float(self.value)

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return np.full(n, self.value, dtype=np.int64)


@dataclass(frozen=True)
class Uniform(LengthDist):
    """Integers uniform in [low, high], both included (nano-vllm's benchmark: 100..1024)."""

    low: int
    high: int

    @property
    def mean(self) -> float:  # type: ignore[override]
        return (self.low + self.high) / 2

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return rng.integers(self.low, self.high + 1, size=n)


@dataclass(frozen=True)
class LogNormal(LengthDist):
    """Long-tailed lengths (chat traces look like this): given the mean and sigma of log(length).

    ``mean`` is the mean length before clipping to [1, ``max_len``]; the log-space mean is derived from
    it (mu = ln(mean) - sigma^2 / 2), so changing sigma changes the tail and not the average.
    """

    mean: float  # type: ignore[misc]
    sigma: float = 1.0
    max_len: int | None = None

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        mu = math.log(self.mean) - self.sigma**2 / 2
        values = np.maximum(1, np.rint(rng.lognormal(mu, self.sigma, size=n))).astype(np.int64)
        return np.minimum(values, self.max_len) if self.max_len else values


def as_length_dist(value: int | LengthDist) -> LengthDist:
    if isinstance(value, LengthDist):
        return value
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"a length must be a positive int or a LengthDist, got {value!r}")
    return Fixed(int(value))


# ------------------------------------------------------------------------------------------ arrivals
def arrival_times(rate: float, num_requests: int, burstiness: float = 1.0,
                  rng: np.random.Generator | int | None = 0) -> np.ndarray:
    """Arrival times (s) of ``num_requests`` requests: Gamma gaps with shape = burstiness, scale =
    1 / (rate x burstiness) (vLLM's ``--burstiness``; 1 = Poisson). The first request arrives at 0."""
    if not rate > 0:
        raise ValueError(f"request rate must be > 0 (or inf), got {rate}")
    if not burstiness > 0:
        raise ValueError(f"burstiness must be > 0, got {burstiness}")
    if math.isinf(rate) or num_requests == 0:
        return np.zeros(num_requests)
    rng = rng if isinstance(rng, np.random.Generator) else np.random.default_rng(rng)
    gaps = rng.gamma(shape=burstiness, scale=1.0 / (rate * burstiness), size=num_requests)
    gaps[0] = 0.0
    return np.cumsum(gaps)


def synthetic_workload(num_requests: int, rate: float = math.inf, input_len: int | LengthDist = 512,
                       output_len: int | LengthDist = 128, *, burstiness: float = 1.0, prefix_len: int = 0,
                       num_prefixes: int = 1, prefix_fraction: float = 1.0, seed: int = 0
                       ) -> list[RequestSpec]:
    """Requests with the given arrival process and length laws, seeded (same seed, same workload).

    With ``prefix_len`` > 0, a ``prefix_fraction`` of requests start with one of ``num_prefixes`` shared
    prefixes (a system prompt, a few-shot template); their prompts are lengthened to at least
    ``prefix_len + 1`` tokens so that something follows the prefix.
    """
    if num_requests < 1:
        raise ValueError(f"num_requests must be >= 1, got {num_requests}")
    if prefix_len < 0 or num_prefixes < 1 or not 0 <= prefix_fraction <= 1:
        raise ValueError("prefix_len must be >= 0, num_prefixes >= 1 and prefix_fraction in [0, 1]")
    rng = np.random.default_rng(seed)
    times = arrival_times(rate, num_requests, burstiness, rng)
    prompts = as_length_dist(input_len).sample(rng, num_requests)
    outputs = as_length_dist(output_len).sample(rng, num_requests)
    shared = rng.random(num_requests) < prefix_fraction if prefix_len else np.zeros(num_requests, bool)
    which = rng.integers(0, num_prefixes, size=num_requests)
    specs = []
    for i in range(num_requests):
        if shared[i]:
            specs.append(RequestSpec(float(times[i]), max(int(prompts[i]), prefix_len + 1), int(outputs[i]),
                                     int(which[i]), prefix_len))
        else:
            specs.append(RequestSpec(float(times[i]), int(prompts[i]), int(outputs[i])))
    return specs


def with_rate(specs: Sequence[RequestSpec], rate: float, burstiness: float = 1.0, seed: int = 0
              ) -> list[RequestSpec]:
    """The same requests re-timed to another arrival rate (for sweeps over one set of lengths)."""
    times = arrival_times(rate, len(specs), burstiness, seed)
    return [RequestSpec(float(t), s.prompt_len, s.output_len, s.prefix_id, s.prefix_len, s.max_tokens)
            for t, s in zip(times, specs, strict=True)]


# --------------------------------------------------------------------------------------- token ids
_prefix_cache: dict[tuple[int, int], list[int]] = {}


def prefix_token_ids(prefix_id: int, length: int) -> list[int]:
    """The token ids of shared prefix ``prefix_id``: a seeded random sequence, the same every time."""
    key = (prefix_id, length)
    if key not in _prefix_cache:
        rng = np.random.default_rng([prefix_id, 7919])
        _prefix_cache[key] = rng.integers(*PREFIX_TOKEN_RANGE, size=length).tolist()
    return _prefix_cache[key]


def prompt_token_ids(spec: RequestSpec, index: int) -> list[int]:
    """Dummy prompt ids for request number ``index``: [shared prefix] + [unique id] + filler."""
    ids = prefix_token_ids(spec.prefix_id, spec.prefix_len) if spec.prefix_len else []
    rest = spec.prompt_len - len(ids)
    return [*ids, UNIQUE_TOKEN_BASE + index] + [FILLER_TOKEN] * (rest - 1)


# -------------------------------------------------------------------------------------------- traces
_TIME_KEYS = ("arrival_time", "timestamp", "time", "arrival")
_PROMPT_KEYS = ("prompt_len", "input_len", "prompt_tokens", "num_prompt_tokens", "input_length")
_OUTPUT_KEYS = ("output_len", "output_tokens", "max_tokens", "num_output_tokens", "output_length")


def _pick(row: dict[str, Any], keys: Sequence[str], what: str, where: str) -> Any:
    for key in keys:
        if key in row and row[key] not in (None, ""):
            return row[key]
    raise ValueError(f"{where}: no {what} column (expected one of {', '.join(keys)})")


def load_trace(path: str | Path) -> list[RequestSpec]:
    """Read a CSV or JSONL trace (see the module docstring for the columns), sorted by arrival."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ValueError(f"cannot read trace {path}: {exc.strerror or exc}") from None
    rows: list[dict[str, Any]]
    if text.lstrip().startswith("["):  # one JSON array of objects
        try:
            rows = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}: not valid JSON ({exc.msg})") from None
    elif path.suffix.lower() in (".jsonl", ".json", ".ndjson") or text.lstrip().startswith("{"):
        rows = []
        for n, line in enumerate(text.splitlines(), 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as exc:
                    raise ValueError(f"{path}:{n}: not valid JSON ({exc.msg})") from None
    else:
        rows = list(csv.DictReader(text.splitlines()))
    if not rows:
        raise ValueError(f"trace {path} has no requests")
    specs = []
    for n, row in enumerate(rows, 1):
        where = f"{path} row {n}"
        try:
            t = float(_pick(row, _TIME_KEYS, "arrival time", where))
            p = int(float(_pick(row, _PROMPT_KEYS, "prompt length", where)))
            o = int(float(_pick(row, _OUTPUT_KEYS, "output length", where)))
        except (TypeError, ValueError) as exc:
            raise ValueError(str(exc) if "column" in str(exc) else f"{where}: bad number ({exc})") from None
        specs.append((t, p, o, where))
    start = min(t for t, *_ in specs)
    out = []
    for t, p, o, where in sorted(specs, key=lambda s: s[0]):
        try:
            out.append(RequestSpec(t - start, p, o))
        except ValueError as exc:
            raise ValueError(f"{where}: {exc}") from None
    return out


def save_trace(specs: Sequence[RequestSpec], path: str | Path) -> None:
    """Write a workload as a trace (CSV or, for a .jsonl path, JSON lines) that ``load_trace`` reads."""
    path = Path(path)
    rows = [{"arrival_time": s.arrival_time, "prompt_len": s.prompt_len, "output_len": s.output_len}
            for s in specs]
    if path.suffix.lower() in (".jsonl", ".ndjson", ".json"):
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    else:
        with path.open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)


def describe(specs: Sequence[RequestSpec]) -> str:
    """One line: count, rate, mean lengths, shared-prefix share."""
    n = len(specs)
    span = specs[-1].arrival_time - specs[0].arrival_time if n > 1 else 0.0
    rate = f"{(n - 1) / span:.2f} req/s" if span > 0 else "all at t=0"
    shared = sum(s.prefix_len > 0 for s in specs)
    return (f"{n} requests, {rate}, prompt mean {np.mean([s.prompt_len for s in specs]):.0f}, output mean "
            f"{np.mean([s.output_len for s in specs]):.0f} tokens"
            + (f", {shared} with a shared prefix" if shared else ""))
