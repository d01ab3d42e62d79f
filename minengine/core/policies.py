"""Scheduling policies: who is offered each step's token budget first. The seam lab 2 plugs into.

A policy only *orders* requests and picks preemption victims; the ``Scheduler`` enforces the token
budget, ``max_num_seqs`` and KV memory. So a learner's policy can be slow or unfair, never unsafe, and
the same object runs unchanged in the real engine and in the simulator (both drive ``EngineCore``).
"""

from __future__ import annotations

from collections.abc import Sequence

from minengine.core.request import Request


class PolicyError(ValueError):
    """A policy broke the scheduler's rules (e.g. asked for more tokens than the step's budget)."""


def split_by_phase(requests: Sequence[Request]) -> tuple[list[Request], list[Request]]:
    """(decoding, prefilling) requests, each in the given order: one pass, one ``is_prefill`` each."""
    decodes: list[Request] = []
    prefills: list[Request] = []
    decode, prefill = decodes.append, prefills.append
    for r in requests:
        # ``r.is_prefill``, inlined: this runs for every running request at every step (``num_tokens``,
        # not ``len(token_ids)``: a graded lab 2 policy is shown requests without their token ids)
        c = r.num_computed_tokens
        if c < r.num_prompt_tokens or c < r.num_tokens - 1:
            prefill(r)
        else:
            decode(r)
    return decodes, prefills


class SchedulingPolicy:
    """Who is offered the step's token budget first. Subclass it to write your own policy.

    The interface is three methods and two flags:

    - ``order(running, waiting)`` returns the requests to offer tokens to, in order. ``running`` is in
      admission order, ``waiting`` in queue order (preempted requests at the front). Leaving a request
      out skips it for this step. Each running request gets all the tokens it needs if they fit
      (a decode: 1; an unfinished prefill: the rest of its prompt, chunked to the remaining budget);
      each waiting one is admitted if it fits, and the first that does not fit stops admissions.
    - ``select_victim(candidates)`` picks whom to preempt when a running request needs a KV block and
      none is free; ``candidates`` are the running requests not yet scheduled in this step (the needy
      request included), in admission order. Default: the last one (most recently admitted), as vLLM.
    - ``num_new_tokens(request, num_needed, budget)`` says how many of the ``num_needed`` tokens the
      request gets now (a prefill chunk's size): an int in [0, min(num_needed, budget)], where 0 skips
      it for this step. It is asked for prompt work only: a decode gets its one token (leave it out of
      ``order`` to skip it). Default: as many as fit. The scheduler raises ``PolicyError`` for anything
      else (over the step's budget, say), so a policy's mistake is loud, never an oversized batch.
      With chunked prefill off, a prompt gets all its tokens or none.
    - ``decode_with_prefill``: if False, a step that has already scheduled prompt tokens skips the
      decodes that come after them in the order (vLLM V0's default: prefill steps and decode steps).
    - ``admits_in_queue_order``: True promises that ``order`` keeps waiting requests in queue order
      (FCFS). The scheduler then shows it only the head of the queue that could be admitted this step
      (``max_num_seqs`` minus running), so a backlog of thousands costs nothing per step. Leave it
      False (the default) for a policy that looks at the whole queue, e.g. shortest-prompt-first.
    """

    name = "custom"
    decode_with_prefill: bool = True
    admits_in_queue_order: bool = False

    def order(self, running: Sequence[Request], waiting: Sequence[Request]) -> list[Request]:
        raise NotImplementedError

    def select_victim(self, candidates: Sequence[Request]) -> Request:
        return candidates[-1]

    def num_new_tokens(self, request: Request, num_needed: int, budget: int) -> int:
        return min(num_needed, budget)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{k}={v!r}' for k, v in vars(self).items())})"


class DecodeFirstPolicy(SchedulingPolicy):
    """vLLM v1 / Sarathi-Serve "stall-free" order: running decodes, then running prefill chunks, then
    new requests. Decodes are never delayed by a long prompt, which keeps inter-token latency flat."""

    name = "decode_first"
    admits_in_queue_order = True

    def order(self, running: Sequence[Request], waiting: Sequence[Request]) -> list[Request]:
        decodes, prefills = split_by_phase(running)
        return decodes + prefills + list(waiting)


class PrefillFirstPolicy(SchedulingPolicy):
    """The classic vLLM V0 order: admit waiting requests first (FCFS), then running prefill chunks, then
    decodes. With ``decode_with_prefill=False`` (default) a step that schedules any prompt tokens runs no
    decodes, so decodes only run in steps with no prefill work: new requests get their first token
    sooner (lower TTFT) and running ones stall while prompts are processed (higher ITL). With True,
    decodes fill whatever budget the prefills left in the same step."""

    name = "prefill_first"
    admits_in_queue_order = True

    def __init__(self, decode_with_prefill: bool = False) -> None:
        self.decode_with_prefill = decode_with_prefill

    def order(self, running: Sequence[Request], waiting: Sequence[Request]) -> list[Request]:
        decodes, prefills = split_by_phase(running)
        return list(waiting) + prefills + decodes


POLICIES = {"decode_first": DecodeFirstPolicy, "prefill_first": PrefillFirstPolicy}


def make_policy(policy: str | SchedulingPolicy) -> SchedulingPolicy:
    if isinstance(policy, str):
        if policy not in POLICIES:
            raise ValueError(f"unknown policy {policy!r}; use one of {', '.join(POLICIES)}")
        return POLICIES[policy]()
    return policy
