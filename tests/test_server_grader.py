"""Lab 3's grading machinery: the runner, its teardown and the black-box checks, on real servers.

The checks must pass the reference server itself (``minengine.server``, graded as if it were an answer)
and fail planted servers for the right reason: one planted app misbehaves on request (a prompt with
BUFFER is sent all at the end, NODONE ends without ``[DONE]``, IGNORE keeps running after the client
left, HANG never answers, STRICT refuses a request that fills the KV budget exactly, and bad input
raises, so FastAPI answers 500), so a single subprocess covers
them. Servers that cannot be graded at all (an import error, no ``build_app``, one that serves itself
on its own port and never returns from import, one that uses the reference) must fail with a message
that says why, and nothing they started may survive: no process, no listening port.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from minengine.course import server_checks as sc
from minengine.course import server_grader as sg
from minengine.course.sandbox import sandbox_problem, sandboxed_command

PLANTED = '''
import asyncio
import json

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from sse_starlette import EventSourceResponse

from minengine import SamplingParams


BLOCKS = 40  # the KV budget per request, in blocks


def build_app(llm, model_name):
    app = FastAPI()
    tok = llm.engine.tokenizer
    tasks = set()

    def over_budget(prompt_text, ids, max_tokens):
        budget = BLOCKS * llm.engine.config.block_size - ("STRICT" in prompt_text)
        if len(ids) + max_tokens <= budget:
            return None
        return JSONResponse({"error": {"message": "over the KV budget", "type": "BadRequestError",
                                       "param": "max_tokens", "code": 400}}, status_code=400)

    def stream(prompt_text, ids, max_tokens, chat):
        params = SamplingParams(temperature=0, max_tokens=max_tokens)
        source = llm.generate({"prompt_token_ids": ids}, params)
        if "IGNORE" in prompt_text:  # a background task runs the request to its end, whatever the client does
            queue = asyncio.Queue()

            async def pump(gen=source):
                async for out in gen:
                    await queue.put(out)
                await queue.put(None)

            task = asyncio.get_running_loop().create_task(pump())
            tasks.add(task)

            async def queued():
                while (out := await queue.get()) is not None:
                    yield out

            source = queued()

        async def events():
            outs = source
            if "BUFFER" in prompt_text:
                everything = [out async for out in source]

                async def replay():
                    for out in everything:
                        yield out

                outs = replay()
            first = True
            async for out in outs:
                c = out.outputs[0]
                if not c.delta_text and not out.finished:
                    continue
                if chat:
                    delta = ({"role": "assistant", "content": c.delta_text} if first
                             else {"content": c.delta_text})
                    choice = {"index": 0, "delta": delta, "finish_reason": c.finish_reason}
                else:
                    choice = {"index": 0, "text": c.delta_text, "finish_reason": c.finish_reason}
                first = False
                kind = "chat.completion.chunk" if chat else "text_completion"
                yield {"data": json.dumps({"id": "x", "object": kind, "choices": [choice]})}
            yield {"data": json.dumps({"id": "x", "choices": [], "usage": {"prompt_tokens": len(ids),
                   "completion_tokens": 99, "total_tokens": len(ids) + 99}})}
            if "NODONE" not in prompt_text:
                yield {"data": "[DONE]"}

        return EventSourceResponse(events(), sep="\\n")

    @app.post("/v1/completions")
    async def completions(request: Request):
        body = await request.json()
        if "HANG" in body["prompt"]:
            await asyncio.Event().wait()
        ids = tok.encode(body["prompt"])
        return (over_budget(body["prompt"], ids, body["max_tokens"])
                or stream(body["prompt"], ids, body["max_tokens"], False))

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        body = await request.json()
        text = tok.apply_chat_template(body["messages"], tokenize=False, add_generation_prompt=True)
        ids = tok.encode(text, add_special_tokens=False)
        return (over_budget(body["messages"][-1]["content"], ids, body["max_tokens"])
                or stream(body["messages"][-1]["content"], ids, body["max_tokens"], True))

    return app
'''


def start(tmp_path: Path, source: str, name: str = "planted.py", limit: float = sg.STARTUP_LIMIT_S
          ) -> sg.ServerProcess:
    path = tmp_path / name
    path.write_text(source)
    return sg.ServerProcess(path, (sg.TINY,), startup_limit_s=limit).start()


def assert_nothing_left(pid: int, port: int | None = None) -> None:
    """The runner's process group is gone and its port (if it had one) no longer accepts connections."""
    with pytest.raises(ProcessLookupError):
        os.killpg(pid, 0)
    if port is not None:
        with socket.socket() as s, pytest.raises(OSError):
            s.settimeout(1)
            s.connect(("127.0.0.1", port))


@pytest.fixture(scope="module")
def reference():
    proc = sg.ServerProcess(None, (sg.TINY,)).start()
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def planted(tmp_path_factory: pytest.TempPathFactory):
    proc = start(tmp_path_factory.mktemp("planted"), PLANTED)
    yield proc
    proc.stop()


# ------------------------------------------------------------------------------------ own code, please
@pytest.mark.parametrize("source", [
    "from minengine.server import create_app",
    "import minengine.server.app as app",
    "from minengine import server",
    "from minengine.cli import serve",
    "from minengine.bench.client import run_benchmark",
    "from minengine.course.autocheck import quiet",
    "m = __import__('minengine.ser' + 'ver')",
    "import importlib\nm = importlib.import_module('minengine.bench')",
])
def test_an_answer_reaching_for_the_reference_is_found(source: str) -> None:
    assert sg.forbidden_imports(source)


def test_an_answer_over_async_llm_is_its_own() -> None:
    source = ("import json\nfrom fastapi import FastAPI\nfrom minengine import SamplingParams\n"
              "from minengine.engine.async_llm import AsyncLLM\nx = 'minengine.engine is fine'\n")
    assert sg.forbidden_imports(source) == []


@pytest.mark.parametrize(("source", "says"), [
    ("def build_app(llm, name):\n    llm.engine.get_num_unfinished_requests = lambda: 0\n",
     "changes llm.engine.get_num_unfinished_requests"),
    ("def build_app(llm, name):\n    engine = llm.engine\n    bm = engine.scheduler.block_manager\n"
     "    type(bm).num_used_blocks = property(lambda self: 0)\n", "changes type(bm).num_used_blocks"),
    ("from minengine.engine.llm_engine import LLMEngine as E\nE.get_num_unfinished_requests = len\n",
     "changes E.get_num_unfinished_requests"),
    ("import minengine.core.block_manager\ndel minengine.core.block_manager.BlockManager.free\n",
     "changes minengine.core.block_manager.BlockManager.free"),
    ("def build_app(llm, name):\n    (records := llm.engine.request_records).append(None)\n",
     "request_records) in place (append)"),
    ("def build_app(llm, name):\n    llm.engine.scheduler.requests.clear()\n",
     "changes llm.engine.scheduler.requests in place (clear)"),
    ("def build_app(llm, name):\n    llm.engine.scheduler.requests['x'] = None\n",
     "changes llm.engine.scheduler.requests['x']"),
    ("def build_app(llm, name):\n    setattr(llm, 'eng' + 'ine', None)\n", "uses setattr"),
    ("import sys\nsys.modules['__main__'].GraderApp = None\n", "uses sys.modules"),
    ("import gc\n", "imports gc"),
    ("from importlib import import_module\n", "imports importlib"),
    ("def f():\n    return eval('1')\n", "uses eval"),
    ("import asyncio\nfor t in asyncio.all_tasks():\n    pass\n", "uses asyncio.all_tasks"),
])
def test_an_answer_that_rewrites_the_engine_or_reaches_past_it_is_found(source: str, says: str) -> None:
    assert any(says in f for f in sg.engine_tampering(source)), sg.engine_tampering(source)


def test_an_answer_that_only_calls_the_engine_is_left_alone() -> None:
    """The planted test server and the lab's own solution read llm.engine (tokenizer, config) and keep
    objects of their own (an app, a task set, SamplingParams they fill in)."""
    import json

    nb = json.loads((Path(__file__).resolve().parents[1] / "labs" / "lab3_streaming_server"
                     / "lab3_streaming_server.ipynb").read_text())
    (cell,) = [c for c in nb["cells"] if c["metadata"].get("nbgrader", {}).get("grade_id") == "answer_server"]
    solution = "\n".join(ln for ln in "".join(cell["source"]).splitlines()[1:] if "### " not in ln)
    assert sg.engine_tampering(solution.replace("@@kv_blocks_per_request@@", "40")) == []
    assert sg.engine_tampering(PLANTED) == []
    own = ("from minengine import SamplingParams\n\ndef build_app(llm, name):\n"
           "    params = SamplingParams(max_tokens=4)\n    params.max_tokens = 8\n    tasks = set()\n"
           "    tasks.add(llm.generate)\n    tok = llm.engine.tokenizer\n    return tok.decode([1])\n")
    assert sg.engine_tampering(own) == []


def test_the_grader_reads_the_engine_it_was_given_whatever_the_answer_replaces(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A rewrite that slipped past the source reading (here done by the test itself) changes what the
    engine answers to its own methods, not what GraderApp reports: it took its probes, and the engine's
    own objects, before the answer ran."""
    import asyncio
    from types import SimpleNamespace

    import httpx

    from minengine import SamplingParams
    from minengine.engine.llm_engine import LLMEngine

    llm = SimpleNamespace(engine=LLMEngine(model=sg.TINY))  # what GraderApp reads of an AsyncLLM
    try:
        grader = sg.GraderApp(llm, {"delay": 0.0}, sg.EngineProbes.take())
        llm.engine.add_request("r1", "Once upon a time", SamplingParams(max_tokens=8))
        llm.engine.step()  # the prompt's blocks are allocated
        monkeypatch.setattr(llm.engine, "get_num_unfinished_requests", lambda: 0)
        manager = type(llm.engine.scheduler.block_manager)
        monkeypatch.setattr(manager, "num_used_blocks", property(lambda s: 0))
        assert llm.engine.get_num_unfinished_requests() == 0  # the rewrite took

        async def state() -> dict:
            transport = httpx.ASGITransport(app=grader)
            async with httpx.AsyncClient(transport=transport, base_url="http://grader") as client:
                return (await client.get("/__grader__/state")).json()

        seen = asyncio.run(state())
        assert seen["unfinished"] == 1 and seen["used_blocks"] >= 1, seen
    finally:
        llm.engine.close()


# ----------------------------------------------------------------------------- the reference passes
def test_the_reference_server_passes_every_check_against_itself(reference: sg.ServerProcess) -> None:
    sc.check_completions(reference, reference, ["Once upon a time"], max_tokens=12)
    sc.check_chat(reference, reference, ["Tell me a story."], max_tokens=12)
    sc.check_sse_framing(reference, "Once upon a time")
    sc.check_no_buffering(reference, "Once upon a time")
    sc.check_concurrency(reference, reference, [f"Story {i}: one day" for i in range(32)], max_tokens=8)
    sc.check_disconnect(reference, "Once upon a time")
    sc.check_bad_input(reference, [
        {"path": "/v1/completions", "raw": "{nope", "why": "bad JSON"},
        {"path": "/v1/completions", "body": {"model": sg.TINY, "prompt": "hi", "max_tokens": 0},
         "why": "0 tokens"},
        {"path": "/v1/chat/completions", "body": {"model": sg.TINY, "messages": []}, "why": "no messages"},
    ])
    state = reference.control("state")
    assert state["unfinished"] == 0 and state["used_blocks"] == 0 and state["delay"] == 0


def test_a_streaming_client_agrees_with_the_records_and_a_waiting_one_does_not(
        reference: sg.ServerProcess) -> None:
    import httpx

    def streaming(base_url: str, model: str, prompt: str, max_tokens: int) -> dict:
        body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True}
        times = []
        start = time.perf_counter()
        with httpx.stream("POST", base_url + "/v1/completions", json=body, timeout=30) as r:
            for line in r.iter_lines():
                if line.startswith("data: {") and '"text":""' not in line.replace(" ", ""):
                    times.append(time.perf_counter())
        return {"ttft_s": times[0] - start, "itl_s": [b - a for a, b in zip(times, times[1:], strict=False)]}

    def waiting(base_url: str, model: str, prompt: str, max_tokens: int) -> dict:
        start = time.perf_counter()
        r = httpx.post(base_url + "/v1/completions", timeout=30,
                       json={"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0})
        return {"ttft_s": time.perf_counter() - start,
                "itl_s": [0.0] * (r.json()["usage"]["completion_tokens"] - 1)}

    sc.check_client(streaming, reference, "Once upon a time", max_tokens=16)
    with pytest.raises(AssertionError, match="your TTFT is"):
        sc.check_client(waiting, reference, "Once upon a time", max_tokens=16)


# ------------------------------------------------------------------------ planted servers fail right
def test_planted_misbehaviour_fails_the_check_that_looks_for_it(planted: sg.ServerProcess) -> None:
    planted.url()
    sc.check_no_buffering(planted, "Once upon a time")  # the same server streams what it should stream
    with pytest.raises(AssertionError, match="buffered"):
        sc.check_no_buffering(planted, "Once upon a time BUFFER")
    sc.check_sse_framing(planted, "Tell me a story.")
    with pytest.raises(AssertionError, match=r"\[DONE\]"):
        sc.check_sse_framing(planted, "Tell me a story. NODONE")
    sc.check_disconnect(planted, "Once upon a time")
    with pytest.raises(AssertionError, match="still runs 1 request"):
        sc.check_disconnect(planted, "Once upon a time IGNORE")
    with pytest.raises(AssertionError, match="HTTP 500"):
        sc.check_bad_input(planted, [{"path": "/v1/completions", "raw": "{nope", "why": "bad JSON"}])
    start_t = time.monotonic()
    with pytest.raises(AssertionError, match="no answer within 8 s"):
        sc.check_bad_input(planted, [{"path": "/v1/completions", "body": {"prompt": "HANG"},
                                      "why": "a hang"}])
    assert time.monotonic() - start_t < 12


def test_the_kv_budget_check_wants_the_exact_boundary_and_the_reference_has_no_budget(
        planted: sg.ServerProcess, reference: sg.ServerProcess) -> None:
    sc.check_kv_budget(planted, reference, "Once upon a time", blocks=40)
    with pytest.raises(AssertionError, match="fills exactly 40 blocks, which the budget"):
        sc.check_kv_budget(planted, reference, "Once upon a time STRICT", blocks=40)
    with pytest.raises(AssertionError, match="HTTP 200, expected 400"):
        sc.check_kv_budget(planted, reference, "Once upon a time", blocks=39)  # another class's budget
    with pytest.raises(AssertionError, match="HTTP 200, expected 400"):  # the package's server: context only
        sc.check_kv_budget(reference, reference, "Once upon a time", blocks=40)
    assert _settles(planted)  # the stream at the boundary was left after its first event: aborted


def _settles(proc: sg.ServerProcess) -> bool:
    deadline = time.monotonic() + 5
    while proc.control("state")["unfinished"] and time.monotonic() < deadline:
        time.sleep(0.05)
    return proc.control("state")["unfinished"] == 0


def test_a_server_that_always_streams_fails_the_sdk_check_with_a_clear_message(
        planted: sg.ServerProcess, reference: sg.ServerProcess) -> None:
    with pytest.raises(AssertionError, match="without stream, the answer is one JSON body"):
        sc.check_completions(planted, reference, ["Once upon a time"], max_tokens=8)


# ----------------------------------------------------------------- servers that cannot be graded
@pytest.mark.parametrize(("source", "message"), [
    ("from fastapi import FastAPi\n", "did not start: ImportError"),
    ("x = 1\n", "defines no build_app"),
    ("def build_app(llm, model_name):\n    raise NotImplementedError('replace this line')\n",
     "build_app.*raised NotImplementedError"),
])
def test_a_server_that_does_not_start_says_why_at_once(tmp_path: Path, source: str, message: str) -> None:
    proc = start(tmp_path, source)
    pid, begun = proc.proc.pid, time.monotonic()
    with pytest.raises(sg.ServerProblem, match=message):
        proc.url()
    assert time.monotonic() - begun < 30
    with pytest.raises(sg.ServerProblem, match=message):  # later cells get the same answer at once
        proc.url()
    assert_nothing_left(pid)


def test_a_server_on_its_own_port_is_stopped_and_leaves_nothing(tmp_path: Path) -> None:
    source = ("import uvicorn\nfrom fastapi import FastAPI\napp = FastAPI()\n"
              "uvicorn.run(app, host='127.0.0.1', port=0)  "
              "# never returns: the grader's port is never served\n")
    proc = start(tmp_path, source, limit=20)
    pid = proc.proc.pid
    with pytest.raises(sg.ServerProblem, match="stuck while importing the answer.*uvicorn.run"):
        proc.url()
    assert proc.proc is None
    assert_nothing_left(pid)


def test_an_answer_using_the_reference_scores_nothing(tmp_path: Path) -> None:
    source = ("from minengine.server import create_app\n\n"
              "def build_app(llm, model_name):\n    return create_app(llm, served_model_name=model_name)\n")
    proc = start(tmp_path, source)
    try:
        proc.url()
        with pytest.raises(sg.ServerProblem, match="reference server"):
            proc.check_own_code()
    finally:
        pid, port = proc.proc.pid, int(proc.url().rsplit(":", 1)[1])
        proc.stop()
    assert_nothing_left(pid, port)


def test_a_runner_does_not_outlive_the_kernel_that_started_it(tmp_path: Path) -> None:
    """The kernel dies without stopping its server (SIGKILL, say): the runner notices and exits."""
    script = ("import os, sys\nfrom minengine.course import server_grader as sg\n"
              "p = sg.ServerProcess(None, (sg.TINY,)).start()\nprint(p.proc.pid, p.workdir, flush=True)\n"
              "os._exit(0)\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                         check=True)
    pid, workdir = out.stdout.split()
    pid = int(pid)
    leftover = Path(workdir)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            os.killpg(pid, 0)
        except ProcessLookupError:
            shutil.rmtree(leftover, ignore_errors=True)  # nobody stopped it, so nobody tidied up
            return
        time.sleep(0.1)
    os.killpg(pid, 9)
    raise AssertionError("the runner outlived its parent by 20 s")


# ------------------------------------------------------------------- while autograding: the grader's side
needs_sandbox = pytest.mark.skipif(sandbox_problem() is not None, reason=str(sandbox_problem()))


@pytest.fixture
def grading_session():
    """Lab 3 as autograde runs it: servers in this process on Unix sockets, the answer sandboxed; the
    'kernel' relays are opened here (serve_relay), as the learner's kernel opens them while grading. The
    kernel's folder is short, like a real kernel's: a Unix socket's path has at most 107 bytes."""
    kernel_dir = Path(tempfile.mkdtemp(prefix="minengine-kernel-"))
    opened: list[str] = []

    def open_relay(path: str) -> int:
        opened.append(path)
        return sg.serve_relay(path)

    sg.begin_grading(sg.GradingSession(kernel_dir, open_relay,
                                       sandboxed_command if sandbox_problem() is None else None,
                                       remove_kernel_dir=True))
    yield opened
    sg.end_grading()
    assert not kernel_dir.exists()


@needs_sandbox
def test_while_grading_the_answer_runs_sandboxed_on_a_unix_socket_and_passes_the_checks(
        tmp_path: Path, grading_session: list[str]) -> None:
    (tmp_path / "lab3_server.py").write_text(PLANTED)
    sg.launch(tmp_path / "lab3_server.py", models=(sg.TINY,))  # the tiny model only: quicker to start
    srv, ref = sg.server(tmp_path / "lab3_server.py"), sg.reference()
    assert "bwrap" in srv.proc.args and "bwrap" not in ref.proc.args  # only the answer is sandboxed
    assert srv.url().endswith(".lab3") and isinstance(srv.status()["ports"][sg.TINY], str)  # no TCP port
    sc.check_sse_framing(srv, "Tell me a story.")
    sc.check_disconnect(srv, "Once upon a time")
    with pytest.raises(AssertionError, match="still runs 1 request"):
        sc.check_disconnect(srv, "Once upon a time IGNORE")
    pids = [p.proc.pid for p in (srv, ref)]
    sg.end_grading()  # the notebook is done: nothing of it is left
    for pid in pids:
        assert_nothing_left(pid)


@needs_sandbox
def test_while_grading_the_answer_cannot_reach_the_reference_however_it_imports_it(
        tmp_path: Path, grading_session: list[str]) -> None:
    """The source reading does not see this import (the import function looked up through a string), so
    it is the sandbox that stops it: minengine's server package is an empty folder there."""
    (tmp_path / "lab3_server.py").write_text(
        "imp = vars(__builtins__)['__imp' + 'ort__'] if not isinstance(__builtins__, dict) "
        "else __builtins__['__imp' + 'ort__']\n"
        "mod = imp('minengine.ser' + 'ver', fromlist=['create_app'])\n\n"
        "def build_app(llm, model_name):\n    return mod.create_app(llm, served_model_name=model_name)\n")
    assert sg.forbidden_imports((tmp_path / "lab3_server.py").read_text()) == []
    sg.launch(tmp_path / "lab3_server.py", models=(sg.TINY,))
    with pytest.raises(sg.ServerProblem, match="has no attribute 'create_app'"):
        sg.server(tmp_path / "lab3_server.py")


def test_while_grading_the_client_is_given_a_relay_to_the_bare_reference(
        grading_session: list[str]) -> None:
    """The learner's client gets a plain http:// URL on 'its kernel's' loopback, relayed to the reference's
    app without the grader's routes; a client that makes up its numbers without asking is found out."""
    import httpx

    ref = sg.reference((sg.TINY,))
    url = ref.client_url()
    assert url.startswith("http://127.0.0.1:") and grading_session == [
        str(ref.public_dir / sg.public_socket_name(sg.TINY))]
    assert httpx.get(url + "/__grader__/state", timeout=10).status_code == 404  # control stays private
    body = {"model": sg.TINY, "prompt": "Once upon a time", "max_tokens": 4, "temperature": 0}
    answer = httpx.post(url + "/v1/completions", json=body, timeout=30).json()
    assert answer["usage"]["completion_tokens"] == 4

    def invented(base_url: str, model: str, prompt: str, max_tokens: int) -> dict:
        return {"ttft_s": 0.06, "itl_s": [0.05] * (max_tokens - 1)}

    with pytest.raises(AssertionError, match="0 request"):
        sc.check_client(invented, ref, "Once upon a time", max_tokens=8)


def test_a_load_clients_itl_may_sit_low_only_by_its_late_first_tokens() -> None:
    """Three streams of 11 tokens, the engine's 60 ms apart. A client whose first tokens arrived 300 ms
    late (and its last ones on time) sees each stream's span 300 ms shorter, its 10 gaps 30 ms shorter
    each: accepted. The same short gaps with punctual first tokens, or gaps too long, are a wrong
    measurement."""
    server_gaps, server_ttfts = [0.060] * 30, [0.10, 0.12, 0.14]
    late_ttfts = [t + 0.3 for t in server_ttfts]
    short = [0.060 - 0.3 / 10] * 30  # each stream's span shorter by the 0.3 s its first token lost
    assert sc.mean_itl_disagrees(late_ttfts, server_ttfts, short, server_gaps, 0.2) is None
    assert "your mean ITL is 30.0 ms, the engine's 60.0 ms" in sc.mean_itl_disagrees(
        server_ttfts, server_ttfts, short, server_gaps, 0.2)
    assert sc.mean_itl_disagrees(late_ttfts, server_ttfts, [0.090] * 30, server_gaps, 0.2) is not None
    assert sc.mean_itl_disagrees(server_ttfts, server_ttfts, [0.065] * 30, server_gaps, 0.2) is None
