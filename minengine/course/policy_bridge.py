"""Lab 2's policy decides in the student's kernel; every check of it runs in the grader.

Why: lab 2's test cells used to run in the student's kernel, after the student's cells, so an answer cell
that replaced the harness's checks with no-ops passed them with a placeholder policy. Lab 1's cure
(``grader_side_tests``: the cell runs in the grader, each call of a student's function is a message to the
kernel) costs a few milliseconds a call, and a graded policy's ``order()`` runs about 15,000 times over the
four simulated workloads. So lab 2's cells run in the grader the same way, and the policy itself is served
from the kernel over a Unix socket in the kernel's private folder (which the sandbox shares with the
grader): about 0.3 ms more per ``order()`` call than in one process (the views' updates included), so the
largest graded workload simulates in about 2.3 s instead of 0.6 s (``benchmarks/policy_bridge.py``). The
scheduler asks ``num_new_tokens`` for prompt work only, so a policy that sizes chunks adds a few calls a
step, not one per running request.

The split of what each side holds:

* The grader runs the scheduler, the simulator, the real engine and every check; ``MyPolicy`` in the
  test cell is a :class:`RemotePolicyFactory`, and each policy it makes is a :class:`RemotePolicy` that
  asks the kernel to decide.
* The kernel (:func:`serve_policies`) holds the student's policy objects and sees each request as a
  :class:`RequestView`: exactly what the lab says a scheduler sees (id, arrival time, sizes, progress,
  preemptions, block count, ``max_tokens``). Never the true output length, never token ids, never the
  grader's objects: a policy that searched the call stack for the hidden lengths finds nothing there.

What the kernel sends back are request ids, checked in the grader against the requests it was shown.
Whatever the student's code does in its own kernel (patch the harness, rewrite modules), it can only
change its own decisions, which is what the lab grades.

A call that has not answered after :data:`CALL_WALL_S` seconds, or a run whose calls add up to
:data:`RUN_WALL_S`, fails as an infinite loop would in the kernel; the grader interrupts the kernel once
the cell is done.
"""

from __future__ import annotations

import builtins
import contextlib
import json
import socket
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from minengine.core.policies import SchedulingPolicy
from minengine.core.request import RequestStatus
from minengine.course.policy_failure import PolicyFailure

SOCKET_NAME = "policy-bridge.sock"
CALL_WALL_S = 2.0  # one order() takes well under a millisecond; two seconds of waiting is a loop
RUN_WALL_S = 60.0  # all the calls of one run together
CONNECT_S = 10.0  # an idle kernel starts serving at once; one that does not, fails every policy cell
MAX_LINE = 1 << 22  # bytes in one message; a run's biggest order() is a few kilobytes

# Row of a request as sent to the kernel, in this order (RequestView's fields).
ROW = ("arrival_time", "num_prompt_tokens", "max_tokens", "num_computed_tokens", "num_tokens",
       "num_preemptions", "num_blocks", "status")


_STATUS = {s.value: s for s in RequestStatus}


class BridgeError(AssertionError):
    """The kernel's side of the bridge did not answer as it must (a broken or replaced server)."""


# ------------------------------------------------------------------------------------------ kernel side
class SamplingView:
    """A request's sampling parameters as a scheduler may use them: only ``max_tokens``."""

    __slots__ = ("max_tokens",)

    def __init__(self, max_tokens: int | None) -> None:
        self.max_tokens = max_tokens

    def __repr__(self) -> str:
        return f"SamplingParams(max_tokens={self.max_tokens})"


class RequestView:
    """What a scheduling policy sees of a request while graded (the fields the lab lists). Block ids are
    not shown, only how many (``len(block_table)``)."""

    __slots__ = ("request_id", "arrival_time", "num_prompt_tokens", "sampling_params", "_computed",
                 "num_tokens", "num_preemptions", "block_table", "_status")

    def __init__(self, request_id: str, row: Sequence[Any]) -> None:
        self.request_id = request_id
        self.update(row)

    def update(self, row: Sequence[Any]) -> None:
        (self.arrival_time, self.num_prompt_tokens, max_tokens, self._computed, self.num_tokens,
         self.num_preemptions, num_blocks, status) = row
        if getattr(self, "sampling_params", None) is None or self.sampling_params.max_tokens != max_tokens:
            self.sampling_params = SamplingView(max_tokens)
        if len(getattr(self, "block_table", ())) != num_blocks or num_blocks == 0:
            self.block_table = range(num_blocks)
        self._status = _STATUS[status]

    # Read-only, as the scheduler's own fields are to a policy.
    @property
    def num_computed_tokens(self) -> int:
        return self._computed

    @property
    def status(self) -> RequestStatus:
        return self._status

    @property
    def num_output_tokens(self) -> int:
        return self.num_tokens - self.num_prompt_tokens

    @property
    def is_prefill(self) -> bool:
        return self.num_computed_tokens < max(self.num_prompt_tokens, self.num_tokens - 1)

    @property
    def is_finished(self) -> bool:
        return self.status.is_finished

    def __repr__(self) -> str:
        return (f"Request({self.request_id!r}, {self.status.name}, tokens={self.num_tokens} "
                f"(prompt {self.num_prompt_tokens}), computed={self.num_computed_tokens}, "
                f"blocks={len(self.block_table)})")


def _error(exc: BaseException) -> dict[str, Any]:
    builtin = next((c.__name__ for c in type(exc).__mro__ if getattr(builtins, c.__name__, None) is c),
                   "Exception")
    return {"error": f"{type(exc).__name__}: {exc}", "exception": builtin}


class _Served:
    """One policy object in the kernel and the views of the requests it has been shown."""

    def __init__(self, policy: SchedulingPolicy) -> None:
        self.policy = policy
        self.views: dict[str, RequestView] = {}

    def shown(self, message: dict[str, Any], key: str) -> list[RequestView]:
        for rid, row in message.get("update", {}).items():
            if rid in self.views:
                self.views[rid].update(row)
            else:
                self.views[rid] = RequestView(rid, row)
        return [self.views[rid] for rid in message[key]]

    def ids(self, returned: Any, shown: Iterable[RequestView], method: str) -> list[str]:
        by_identity = {id(v): v.request_id for v in shown}
        try:
            returned = list(returned)
        except TypeError:
            raise TypeError(f"{method}() must return a list of requests, got "
                            f"{type(returned).__name__}") from None
        out = []
        for r in returned:
            if id(r) not in by_identity:
                raise ValueError(f"{method}() returned {r!r}, which is not one of the requests it was given")
            out.append(by_identity[id(r)])
        return out


def _answer(message: dict[str, Any], served: dict[int, _Served], namespace: dict[str, Any]) -> dict[str, Any]:
    op = message.get("op")
    if op == "new":
        factory = namespace.get(message["name"])
        if factory is None:
            raise NameError(f"name {message['name']!r} is not defined")
        policy = factory()
        if not isinstance(policy, SchedulingPolicy):
            return {"not_a_policy": type(policy).__name__}
        served[len(served)] = _Served(policy)
        sizes = type(policy).num_new_tokens is not SchedulingPolicy.num_new_tokens
        return {"id": len(served) - 1, "name": str(getattr(policy, "name", type(policy).__name__))[:200],
                "decode_with_prefill": bool(policy.decode_with_prefill),
                "admits_in_queue_order": bool(policy.admits_in_queue_order), "sizes": sizes}
    one = served[message["id"]]
    if op == "order":
        running, waiting = one.shown(message, "running"), one.shown(message, "waiting")
        return {"order": one.ids(one.policy.order(running, waiting), running + waiting, "order")}
    if op == "victim":
        candidates = one.shown(message, "candidates")
        return {"victim": one.ids([one.policy.select_victim(candidates)], candidates, "select_victim")[0]}
    if op == "tokens":
        (request,) = one.shown(message, "request")
        n = one.policy.num_new_tokens(request, message["num_needed"], message["budget"])
        return {"tokens": n if isinstance(n, int | float | str | None) else repr(n)}
    raise ValueError(f"unknown request {op!r}")


def serve_policies(connect_to: str | socket.socket, namespace: dict[str, Any] | None = None) -> None:
    """Kernel side: answer the grader's policy calls on ``connect_to`` (a socket path or a connected
    socket) until it closes the connection. ``namespace``: where the policy classes are (the kernel's)."""
    if namespace is None:
        import __main__

        namespace = vars(__main__)
    if isinstance(connect_to, str):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(connect_to)
    else:
        sock = connect_to
    served: dict[int, _Served] = {}
    with contextlib.suppress(OSError), sock, sock.makefile("rb") as rfile, sock.makefile("wb") as wfile:
        for line in rfile:  # OSError: the grader closed its end (it gave up on a call): done
            try:
                reply = _answer(json.loads(line), served, namespace)
            except Exception as exc:  # noqa: BLE001 - the policy's own error goes back to the grader
                reply = _error(exc)
            try:
                data = json.dumps(reply)
            except (TypeError, ValueError) as exc:
                data = json.dumps(_error(exc))
            wfile.write(data.encode() + b"\n")
            wfile.flush()


def serve_code(path: str) -> str:
    """What the grader asks the kernel to run while a test cell needs its policy."""
    return f"import minengine.course.policy_bridge as _bridge\n_bridge.serve_policies({path!r})\n"


# ------------------------------------------------------------------------------------------ grader side
class Connection:
    """The grader's end of one cell's bridge: one JSON line out, one back, each within CALL_WALL_S."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.sock.settimeout(CALL_WALL_S)
        self.rfile = sock.makefile("rb")
        self.broken: str | None = None

    def call(self, message: dict[str, Any]) -> tuple[dict[str, Any], float]:
        """The reply and the seconds it took; a silent, closed or garbled kernel raises."""
        if self.broken:
            raise PolicyFailure(self.broken)
        start = time.monotonic()
        try:
            self.sock.sendall(json.dumps(message).encode() + b"\n")
            line = self.rfile.readline(MAX_LINE)
        except TimeoutError:
            self.broken = "__timeout__"
            raise PolicyFailure(self.broken) from None
        except OSError as exc:
            line, self.broken = b"", f"the connection to your kernel broke ({exc})"
        if not line.endswith(b"\n"):
            self.broken = self.broken or ("your kernel stopped answering the grader's calls (did your code "
                                          "replace or stop minengine.course.policy_bridge?)")
            raise PolicyFailure(self.broken)
        try:
            reply = json.loads(line)
        except json.JSONDecodeError:
            reply = None
        if not isinstance(reply, dict):
            raise PolicyFailure("an unreadable reply from your kernel")
        return reply, time.monotonic() - start

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.rfile.close()
            self.sock.close()


def _row(r: Any) -> list[Any]:
    return [r.arrival_time, r.num_prompt_tokens, r.sampling_params.max_tokens, r.num_computed_tokens,
            r.num_tokens, r.num_preemptions, len(r.block_table), r.status.value]


class RemotePolicy(SchedulingPolicy):
    """A policy that lives in the student's kernel: each method sends the requests' rows that changed
    since it last showed them, and maps the ids that come back to the grader's own requests."""

    def __init__(self, connection: Connection, info: dict[str, Any]) -> None:
        self.connection = connection
        self.remote_id = info["id"]
        self.name = str(info.get("name", "custom"))
        self.decode_with_prefill = bool(info.get("decode_with_prefill", True))
        self.admits_in_queue_order = bool(info.get("admits_in_queue_order", False))
        self._sent: dict[str, list[Any]] = {}
        self.waited_s = 0.0

    def _ask(self, op: str, requests: Iterable[Any], **fields: Any) -> dict[str, Any]:
        update = {}
        for r in requests:
            row = _row(r)
            if self._sent.get(r.request_id) != row:
                update[r.request_id] = self._sent[r.request_id] = row
        reply, took = self.connection.call({"op": op, "id": self.remote_id, "update": update, **fields})
        self.waited_s += took
        if self.waited_s > RUN_WALL_S:
            raise PolicyFailure("__timeout__")
        if "error" in reply:
            kind = getattr(builtins, str(reply.get("exception")), None)
            if not (isinstance(kind, type) and issubclass(kind, Exception)):
                kind = PolicyFailure
            raise kind(str(reply["error"]).split(": ", 1)[-1][:500])
        return reply

    def _pick(self, rid: Any, shown: dict[str, Any], method: str) -> Any:
        if not isinstance(rid, str) or rid not in shown:
            raise PolicyFailure(f"{method}() returned {str(rid)[:60]!r}, which is not one of the requests it "
                                "was given")
        return shown[rid]

    def order(self, running: Sequence[Any], waiting: Sequence[Any]) -> list[Any]:
        shown = {r.request_id: r for r in (*running, *waiting)}
        reply = self._ask("order", shown.values(), running=[r.request_id for r in running],
                          waiting=[r.request_id for r in waiting])
        out = reply.get("order")
        if not isinstance(out, list):
            raise TypeError("order() must return a list of requests")
        return [self._pick(rid, shown, "order") for rid in out]

    def select_victim(self, candidates: Sequence[Any]) -> Any:
        shown = {r.request_id: r for r in candidates}
        reply = self._ask("victim", candidates, candidates=list(shown))
        return self._pick(reply.get("victim"), shown, "select_victim")


class RemoteSizingPolicy(RemotePolicy):
    """A remote policy whose class sizes prefill chunks (it overrides ``num_new_tokens``)."""

    def num_new_tokens(self, request: Any, num_needed: int, budget: int) -> Any:
        reply = self._ask("tokens", [request], request=[request.request_id], num_needed=num_needed,
                          budget=budget)
        return reply.get("tokens")


class RemotePolicyFactory:
    """Stands for the student's policy class in a grader-side test cell: calling it makes a policy in the
    kernel. One per notebook, so the scoring caches (``cache_token``) work as they do in a kernel;
    ``grader_findings``: what ``require_own_policy`` reports, read from the answer cells' source."""

    def __init__(self, name: str, findings: list[str]) -> None:
        self.__name__ = self.__qualname__ = name
        self.grader_findings = list(findings)
        self.cache_token = uuid.uuid4().hex
        self.connection: Connection | None = None

    def __call__(self) -> RemotePolicy:
        if self.connection is None:
            raise PolicyFailure(f"{self.__name__} is used outside the test cell that received it")
        reply, _ = self.connection.call({"op": "new", "name": self.__name__})
        if "error" in reply:
            raise PolicyFailure(str(reply["error"])[:500])
        if "not_a_policy" in reply:  # as new_policy says it for a class in this process
            raise PolicyFailure(f"the policy must be a SchedulingPolicy subclass, got "
                                f"{str(reply['not_a_policy'])[:80]}")
        return (RemoteSizingPolicy if reply.get("sizes") else RemotePolicy)(self.connection, reply)

    def __repr__(self) -> str:
        return f"<your class {self.__name__}, run in your kernel>"


Connect = Callable[[], contextlib.AbstractContextManager[socket.socket]]


class PolicyBridge:
    """One notebook's bridge: its policy factories, and how a cell connects to the kernel (``connect``:
    a context manager that yields a connected socket whose far end runs :func:`serve_policies`)."""

    def __init__(self, connect: Connect, findings: dict[str, list[str]],
                 interrupt: Callable[[], None] | None = None) -> None:
        self._connect = connect
        self._interrupt = interrupt  # stops a policy still running after a call timed out
        self.findings = findings
        self.factories: dict[str, RemotePolicyFactory] = {}
        self.failed: str | None = None  # why the kernel did not connect: later cells fail at once

    def factory(self, name: str) -> RemotePolicyFactory:
        if name not in self.factories:
            self.factories[name] = RemotePolicyFactory(name, self.findings.get(name, []))
        return self.factories[name]

    @contextlib.contextmanager
    def serving(self, factories: Sequence[RemotePolicyFactory]) -> Iterator[None]:
        if not factories:
            yield
            return
        if self.failed:
            raise BridgeError(self.failed)
        try:
            with self._connect() as sock:
                connection = Connection(sock)
                for f in factories:
                    f.connection = connection
                try:
                    yield
                finally:
                    for f in factories:
                        f.connection = None
                    connection.close()
                    if connection.broken == "__timeout__" and self._interrupt is not None:
                        self._interrupt()
        except BridgeError as exc:  # only connecting raises it: the kernel will not serve this notebook
            self.failed = str(exc)
            raise
