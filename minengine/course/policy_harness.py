"""Lab 2's grading machinery: run a learner's scheduling policy under limits and check its properties.
Generic on purpose: no reference policy and no hidden workload lives here
(the lab's ``params.py`` draws those per course seed); this module only knows how to run and measure.

Why each piece:

* ``guard`` wraps a policy so that a broken one fails *this* check with a clear message instead of
  hanging the grader: a CPU-time alarm stops an infinite loop, a step limit stops a policy that never
  lets the work finish, and what it returns is checked (requests it was shown; a victim among the
  candidates). The scheduler itself raises ``PolicyError`` for a chunk over the step's budget.
* ``run_core`` drives the real ``Scheduler`` + ``EngineCore`` step by step (no model, no clock) with
  requests that stop at a hidden length, the way an EOS ends a real request: the properties
  (limits, liveness, starvation, determinism) are checked on its trace.
* ``check_properties`` draws workloads with hypothesis (a per-course seed) for those checks;
  ``engine_tokens`` runs the policy in the real engine (the shipped tiny model) for the correctness check.
The simulator side, the own-code check, the results JSON and the leaderboard: ``policy_scoring``.
"""

from __future__ import annotations

import contextlib
import random
import signal
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from minengine.core.policies import SchedulingPolicy, make_policy
from minengine.core.request import Request
from minengine.course.policy_bridge import CALL_WALL_S
from minengine.course.policy_failure import PolicyFailure
from minengine.utils import cdiv

RESULTS_FILE = "lab2_results.json"


# ---------------------------------------------------------------------------------------------- guard
def _raise_timeout(signum: int, frame: Any) -> None:
    raise PolicyFailure("__timeout__")


@contextlib.contextmanager
def cpu_limit(seconds: float, wall_seconds: float | None = None) -> Iterator[None]:
    """Interrupt the block after ``seconds`` of CPU time (or ``wall_seconds`` of wall time): an infinite
    loop in a policy becomes a PolicyFailure. CPU time, so a busy machine does not trip it. Main thread
    only."""
    if not hasattr(signal, "setitimer") or sys.platform == "win32":
        yield
        return
    old = {s: signal.signal(s, _raise_timeout) for s in (signal.SIGPROF, signal.SIGALRM)}
    signal.setitimer(signal.ITIMER_PROF, seconds)
    signal.setitimer(signal.ITIMER_REAL, wall_seconds or 20 * seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0)
        signal.setitimer(signal.ITIMER_REAL, 0)
        for s, handler in old.items():
            signal.signal(s, handler)


CALL_CPU_S = 1.0  # one call of order() or select_victim() takes microseconds; a second means a loop


@contextlib.contextmanager
def _call_limit(seconds: float) -> Iterator[None]:
    """Inside ``cpu_limit``: fire sooner if this one call runs ``seconds`` of CPU, then give the run's
    alarm back what is left of it (so a looping policy costs one second, not the whole run's budget)."""
    left = signal.getitimer(signal.ITIMER_PROF)[0] if hasattr(signal, "getitimer") else 0.0
    if left <= 0:  # no run-level alarm armed: nothing to shorten
        yield
        return
    start = time.process_time()
    signal.setitimer(signal.ITIMER_PROF, min(left, seconds))
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_PROF, max(left - (time.process_time() - start), 1e-3))


class _Guard(SchedulingPolicy):
    """Delegates to the learner's policy, checking what it returns and counting steps."""

    def __init__(self, inner: SchedulingPolicy, max_steps: int, log: list | None) -> None:
        self.inner, self.max_steps, self.log, self.steps = inner, max_steps, log, 0
        self.name = getattr(inner, "name", type(inner).__name__)
        self.decode_with_prefill = bool(inner.decode_with_prefill)
        self.admits_in_queue_order = bool(inner.admits_in_queue_order)

    def order(self, running: Sequence[Request], waiting: Sequence[Request]) -> list[Request]:
        self.steps += 1
        if self.steps > self.max_steps:
            raise PolicyFailure(f"__stall__ after {self.max_steps} steps")
        with _call_limit(CALL_CPU_S):
            out = self.inner.order(running, waiting)
        try:
            out = list(out)
        except TypeError:
            raise PolicyFailure(f"order() must return a list of requests, got {type(out).__name__}") from None
        shown = {id(r) for r in running} | {id(r) for r in waiting}
        for r in out:
            if id(r) not in shown:
                raise PolicyFailure(f"order() returned {r!r}, which is not one of the requests it was given")
        if self.log is not None:
            self.log.append(("order", [r.request_id for r in out]))
        return out

    def select_victim(self, candidates: Sequence[Request]) -> Request:
        with _call_limit(CALL_CPU_S):
            victim = self.inner.select_victim(candidates)
        if not any(victim is c for c in candidates):
            raise PolicyFailure(f"select_victim() returned {victim!r}, not one of the candidates "
                                f"{[c.request_id for c in candidates]}")
        if self.log is not None:
            self.log.append(("victim", victim.request_id))
        return victim


class _SizingGuard(_Guard):
    def num_new_tokens(self, request: Request, num_needed: int, budget: int) -> int:
        n = self.inner.num_new_tokens(request, num_needed, budget)
        if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= min(num_needed, budget):
            raise PolicyFailure(f"{type(self.inner).__name__}.num_new_tokens gave request "
                                f"{request.request_id!r} {n!r} tokens; it needs {num_needed} and {budget} "
                                "are left in this step's budget: return an int from 0 to "
                                f"{min(num_needed, budget)}")
        if self.log is not None:
            self.log.append(("tokens", request.request_id, n))
        return n


def guard(policy: SchedulingPolicy, max_steps: int = 100_000, log: list | None = None) -> SchedulingPolicy:
    sizes = type(policy).num_new_tokens is not SchedulingPolicy.num_new_tokens
    return (_SizingGuard if sizes else _Guard)(policy, max_steps, log)


def new_policy(factory: Any) -> SchedulingPolicy:
    """A fresh policy from a class, a zero-argument factory, or a built-in name."""
    if isinstance(factory, str):
        return make_policy(factory)
    try:
        policy = factory()
    except Exception as exc:
        raise PolicyFailure(f"could not create the policy with {getattr(factory, '__name__', factory)}(): "
                            f"{type(exc).__name__}: {exc}") from None
    if not isinstance(policy, SchedulingPolicy):
        raise PolicyFailure(f"the policy must be a SchedulingPolicy subclass, got {type(policy).__name__}")
    return policy


def explain(exc: BaseException, what: str, cpu_s: float, max_steps: int) -> PolicyFailure:
    """One clear message for whatever went wrong while running a policy."""
    text = str(exc)
    if text == "__timeout__":
        return PolicyFailure(f"{what}: the policy was stopped after {CALL_CPU_S:g} s of CPU in one call "
                             f"(graded: {CALL_WALL_S:g} s waiting for it), or {cpu_s:g} s in the run (an "
                             "infinite loop in order()/select_victim()/num_new_tokens()?)")
    if "scheduled nothing" in text:
        return PolicyFailure(f"{what}: the policy left every request out while work was pending (it stalls): "
                             f"{text}")
    if text.startswith("__stall__"):
        return PolicyFailure(f"{what}: the run did not finish within {max_steps} steps: the policy leaves "
                             "some request out forever (it stalls with work pending). "
                             f"{text.replace('__stall__', '')}")
    if isinstance(exc, PolicyFailure):
        return PolicyFailure(f"{what}: {text}")
    return PolicyFailure(f"{what}: the policy raised {type(exc).__name__}: {text}")


# ------------------------------------------------------------------------------------------- core runs
@dataclass(frozen=True)
class Arrival:
    """A request of a step-indexed workload: it arrives before step ``step`` and really generates
    ``output_len`` tokens (hidden), though it asks for up to ``max_tokens``."""

    step: int
    prompt_len: int
    output_len: int
    max_tokens: int


# The toy workload and limits lab 2's first cells show and its visible checks use (the test cells read
# them from here, so a kernel that redefines its own `toy` changes only what it prints).
TOY = (Arrival(0, 40, 5, 8), Arrival(0, 3, 2, 4), Arrival(1, 70, 8, 8), Arrival(2, 12, 3, 16),
       Arrival(2, 25, 1, 4), Arrival(5, 9, 6, 6))
TOY_LIMITS = {"max_num_batched_tokens": 16, "max_num_seqs": 2, "num_blocks": 12, "block_size": 8}


@dataclass
class CoreRun:
    steps: list[list[tuple[str, int]]] = field(default_factory=list)  # per step: (request id, tokens)
    preempted: list[list[str]] = field(default_factory=list)
    num_running: list[int] = field(default_factory=list)
    arrived: dict[str, int] = field(default_factory=dict)  # request id -> step it arrived at
    first_scheduled: dict[str, int] = field(default_factory=dict)
    finished: dict[str, int] = field(default_factory=dict)
    outputs: dict[str, int] = field(default_factory=dict)  # request id -> output tokens generated
    log: list = field(default_factory=list)


class _HiddenLengthExecutor:
    """Computes nothing; the token that reaches a request's true length is an EOS (id 0)."""

    def __init__(self) -> None:
        self.eos_at: dict[str, int] = {}

    def execute_model(self, out: Any) -> Any:
        from minengine.core.engine_core import ModelRunnerOutput

        sampled = {s.request_id: 0 if s.request.num_output_tokens + 1 >= self.eos_at[s.request_id] else 1
                   for s in out.scheduled if s.sample}
        return ModelRunnerOutput(sampled, elapsed=0.0)


def run_core(factory: Any, arrivals: Sequence[Arrival], *, max_num_batched_tokens: int, max_num_seqs: int,
             num_blocks: int, block_size: int = 16, enable_chunked_prefill: bool = True,
             max_steps: int = 5_000, cpu_s: float = 5.0, what: str = "a run") -> CoreRun:
    """Run the policy on the real scheduler (no model) until every request is done; PolicyFailure if not."""
    from minengine.config import EngineConfig
    from minengine.core.engine_core import EngineCore
    from minengine.core.sampling_params import SamplingParams
    from minengine.core.scheduler import Scheduler

    run = CoreRun()
    policy = guard(new_policy(factory), max_steps, run.log)
    config = EngineConfig(block_size=block_size, num_blocks=num_blocks, max_num_seqs=max_num_seqs,
                          max_num_batched_tokens=max_num_batched_tokens,
                          enable_chunked_prefill=enable_chunked_prefill, enable_prefix_caching=False,
                          policy=policy, max_model_len=max(a.prompt_len + a.max_tokens for a in arrivals) + 1)
    config = config.resolved(config.max_model_len or 1)
    step = 0
    scheduler = Scheduler(config, num_blocks, clock=lambda: float(step))
    executor = _HiddenLengthExecutor()
    core = EngineCore(scheduler, executor, max_step_records=1)
    pending = sorted(enumerate(arrivals), key=lambda ia: (ia[1].step, ia[0]))
    requests: dict[str, Request] = {}
    try:
        with cpu_limit(cpu_s):
            while pending or core.has_unfinished_requests():
                if not core.has_unfinished_requests() and pending[0][1].step > step:
                    step = pending[0][1].step  # idle until the next arrival
                while pending and pending[0][1].step <= step:
                    i, a = pending.pop(0)
                    rid = str(i)
                    req = Request(rid, [3 + i] + [2] * (a.prompt_len - 1),
                                  SamplingParams(temperature=0.0, max_tokens=a.max_tokens),
                                  arrival_time=float(step), eos_token_ids=(0,))
                    executor.eos_at[rid], run.arrived[rid], requests[rid] = a.output_len, step, req
                    core.add_request(req)
                result = core.step()
                step += 1
                if result is None:
                    continue
                out = result.scheduler_output
                run.steps.append([(s.request_id, s.num_tokens) for s in out.scheduled])
                run.preempted.append(list(out.preempted_request_ids))
                run.num_running.append(out.num_running)
                for s in out.scheduled:
                    run.first_scheduled.setdefault(s.request_id, step - 1)
                for r in result.finished:
                    run.finished[r.request_id] = step - 1
    except Exception as exc:
        raise explain(exc, what, cpu_s, max_steps) from None
    run.outputs = {rid: r.num_output_tokens for rid, r in requests.items()}
    return run


# ------------------------------------------------------------------------------------------ properties
def check_limits(run: CoreRun, max_num_batched_tokens: int, max_num_seqs: int) -> None:
    for i, (scheduled, running) in enumerate(zip(run.steps, run.num_running, strict=True)):
        tokens = sum(n for _, n in scheduled)
        if tokens > max_num_batched_tokens:
            raise PolicyFailure(f"step {i}: {tokens} tokens scheduled, over max_num_batched_tokens "
                                f"{max_num_batched_tokens}")
        if len(scheduled) > max_num_seqs or running > max_num_seqs:
            raise PolicyFailure(f"step {i}: {max(len(scheduled), running)} requests running, over "
                                f"max_num_seqs {max_num_seqs}")


def check_finished(run: CoreRun, arrivals: Sequence[Arrival]) -> None:
    for i, a in enumerate(arrivals):
        rid = str(i)
        if rid not in run.finished:
            raise PolicyFailure(f"request {rid} (prompt {a.prompt_len}) never finished")
        if run.outputs[rid] != a.output_len:
            raise PolicyFailure(f"request {rid} generated {run.outputs[rid]} tokens instead of "
                                f"{a.output_len}: a policy must never change what a request produces")


def most_overtaken(run: CoreRun) -> tuple[int, str]:
    """The most requests that arrived after one request and were admitted before it, and whose count."""
    arrived, first = run.arrived, run.first_scheduled
    return max((sum(arrived[q] > arrived[r] and first[q] < first[r] for q in arrived), r) for r in arrived)


def check_no_starvation(factory: Any, arrivals: Sequence[Arrival], **limits: Any) -> dict[str, int]:
    """Under a steady stream that keeps short requests waiting, no request is overtaken by more than
    half the stream (FCFS: by none; shortest-first without aging: by nearly all of it)."""
    run = run_core(factory, arrivals, what="the steady stream", **limits)
    check_finished(run, arrivals)
    count, rid = most_overtaken(run)
    bound = len(arrivals) // 2
    if count > bound:
        a = arrivals[int(rid)]
        raise PolicyFailure(f"request {rid} (prompt {a.prompt_len}, max_tokens {a.max_tokens}) arrived at "
                            f"step {a.step} and waited {run.first_scheduled[rid] - a.step} steps while "
                            f"{count} requests that came after it were admitted first (at most {bound} "
                            "allowed): it starves. Give waiting requests priority as they age")
    return {"most_overtaken": count, "bound": bound}


def check_deterministic(factory: Any, arrivals: Sequence[Arrival], **limits: Any) -> None:
    first = run_core(factory, arrivals, what="a first run", **limits)
    second = run_core(factory, arrivals, what="a second run", **limits)
    for i, (a, b) in enumerate(zip(first.steps, second.steps, strict=False)):
        if a != b:
            raise PolicyFailure(f"two runs of the same workload differ at step {i}: {a[:6]} vs {b[:6]}: "
                                "the policy is not deterministic (random numbers? the wall clock? a set's "
                                "order?)")
    if [first.steps, first.preempted, first.log] != [second.steps, second.preempted, second.log]:
        raise PolicyFailure("two runs of the same workload made different decisions: the policy is not "
                            "deterministic")


# ------------------------------------------------------------------------------- hypothesis properties
def check_properties(factory: Any, check: str, seed: int, max_examples: int = 25) -> None:
    """Run one property (``limits`` or ``finishes``) on workloads hypothesis draws: token budgets from 8
    to 64, 1-6 sequences, caches from just big enough (preemptions) to roomy, staggered arrivals."""
    try:
        from hypothesis import HealthCheck, Phase, Verbosity, given, settings
        from hypothesis import seed as hypothesis_seed
        from hypothesis import strategies as st
    except ImportError:  # pragma: no cover - the course environment installs it
        raise PolicyFailure("the property tests need the hypothesis package: "
                            "pip install hypothesis") from None

    @st.composite
    def cases(draw: Any) -> dict[str, Any]:
        block = draw(st.sampled_from([4, 16]))
        arrivals = []
        for _ in range(draw(st.integers(1, 12))):
            prompt, cap = draw(st.integers(1, 80)), draw(st.integers(1, 24))
            arrivals.append(Arrival(draw(st.integers(0, 30)), prompt, draw(st.integers(1, cap)), cap))
        biggest = max(cdiv(a.prompt_len + a.max_tokens - 1, block) for a in arrivals)
        limits = {"max_num_batched_tokens": draw(st.sampled_from([8, 16, 32, 64])),
                  "max_num_seqs": draw(st.integers(1, 6)), "block_size": block,
                  "num_blocks": draw(st.integers(biggest, 3 * biggest))}
        return {"arrivals": arrivals, "limits": limits}

    @settings(max_examples=max_examples, deadline=None, database=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck), verbosity=Verbosity.quiet)
    @hypothesis_seed(seed)
    @given(cases())
    def prop(case: dict[str, Any]) -> None:
        arrivals, limits = case["arrivals"], case["limits"]
        where = f"{len(arrivals)} requests, {limits}"
        run = run_core(factory, arrivals, **limits, cpu_s=2.0, what=where)
        if check == "limits":
            check_limits(run, limits["max_num_batched_tokens"], limits["max_num_seqs"])
        else:
            check_finished(run, arrivals)

    prop()


def steady_stream(num_steps: int = 300, long_every: int = 30, seed: int = 0) -> list[Arrival]:
    """A short request every step, a long prompt every ``long_every``, for ``num_steps`` steps: about
    twice what 4 sequences and a 64-token budget serve, so short requests are always waiting."""
    rng = random.Random(seed)
    out = []
    for step in range(num_steps):
        if step % long_every == 1:
            out.append(Arrival(step, rng.randint(150, 250), rng.randint(4, 12), 16))
        else:
            cap = rng.choice([8, 16])
            out.append(Arrival(step, rng.randint(4, 24), rng.randint(1, cap), cap))
    return out


STREAM_LIMITS = {"max_num_batched_tokens": 64, "max_num_seqs": 4, "num_blocks": 2048, "block_size": 16}


# -------------------------------------------------------------------------------------- the real engine
def engine_tokens(factory: Any, case: dict[str, Any]) -> list[list[int]]:
    """Greedy token ids per request from the real engine (tinystories-4m on CPU) under this policy:
    random prompts of ``prompt_lens``, ``max_tokens`` each, a small paged cache (preemptions) and budget."""
    from minengine import LLM, SamplingParams
    from minengine.course.autocheck import _tiny_model, quiet
    from minengine.engine.threads import torch_threads

    model, tokenizer = _tiny_model()
    rng = random.Random(case["seed"])
    prompts = [{"prompt_token_ids": [rng.randrange(3, model.config.vocab_size) for _ in range(n)]}
               for n in case["prompt_lens"]]
    params = [SamplingParams(temperature=0.0, max_tokens=m) for m in case["max_tokens"]]
    policy = guard(new_policy(factory), 5_000)
    try:
        with quiet(), torch_threads(1), cpu_limit(30.0):
            llm = LLM(model, tokenizer=tokenizer, num_blocks=case["num_blocks"],
                      block_size=case["block_size"], max_num_seqs=case["max_num_seqs"],
                      max_num_batched_tokens=case["max_num_batched_tokens"], enable_prefix_caching=False,
                      policy=policy)
            return [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
    except Exception as exc:
        raise explain(exc, "the real engine", 30.0, 5_000) from None


def check_same_tokens(factory: Any, case: dict[str, Any]) -> None:
    want, got = engine_tokens("decode_first", case), engine_tokens(factory, case)
    for i, (w, g) in enumerate(zip(want, got, strict=True)):
        if w != g:
            raise PolicyFailure(f"request {i}: under your policy the engine generated {g[:8]}..., under "
                                f"decode-first {w[:8]}...: scheduling must never change what a request "
                                "generates")
