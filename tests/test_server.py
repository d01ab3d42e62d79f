"""The OpenAI-compatible server: the official SDK, the SSE wire format, errors, metrics, schemathesis.

One server per module (uvicorn in a background thread, 127.0.0.1, a port the OS picks) on the shipped
model with max_model_len 512, so an over-long prompt is cheap to build. It requires an API key, so every
client here sends it.
"""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import subprocess
import sys
import time
from unittest.mock import ANY

import httpx
import pytest
from proc_utils import free_port

from minengine.server import ServerThread, create_app

pytestmark = pytest.mark.usefixtures("torch_one_thread")

KEY = "test-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
MODEL = "tinystories-4m"
MAX_MODEL_LEN = 512


@pytest.fixture(scope="module")
def server(torch_one_thread):
    app = create_app(model=MODEL, max_model_len=MAX_MODEL_LEN, api_key=KEY)
    with ServerThread(app) as srv:
        yield srv


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.url, headers=AUTH, timeout=60) as client:
        yield client


@pytest.fixture(scope="module")
def openai_client(server):
    openai = pytest.importorskip("openai")
    return openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0)


def sse_events(text: str) -> list[str]:
    """The data payloads of an SSE body, checking the framing on the way."""
    assert text.endswith("\n\n"), "every event ends with a blank line"
    events = []
    for block in text.split("\n\n")[:-1]:
        lines = [line for line in block.split("\n") if not line.startswith(":")]  # comments (pings)
        assert len(lines) == 1 and lines[0].startswith("data: "), block
        events.append(lines[0][len("data: ") :])
    return events


def assert_error(response: httpx.Response, status: int) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["code"] == status and error["message"] and error["type"].endswith("Error")
    return error


# ---- the official SDK, unchanged ----
def test_openai_sdk_completions(openai_client):
    out = openai_client.completions.create(
        model=MODEL, prompt="Once upon a time", max_tokens=8, temperature=0
    )
    assert out.object == "text_completion" and out.model == MODEL
    assert out.choices[0].text and out.choices[0].finish_reason in ("stop", "length")
    assert out.usage.completion_tokens <= 8 and out.usage.prompt_tokens > 0

    chunks = list(
        openai_client.completions.create(
            model=MODEL,
            prompt="Once upon a time",
            max_tokens=8,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == out.choices[0].text  # greedy: streamed == whole
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == out.usage.completion_tokens


def test_openai_sdk_chat(openai_client):
    messages = [{"role": "user", "content": "Tell me a story about a cat."}]
    out = openai_client.chat.completions.create(model=MODEL, messages=messages, max_tokens=12, temperature=0)
    assert out.object == "chat.completion"
    assert out.choices[0].message.role == "assistant" and out.choices[0].message.content

    stream = openai_client.chat.completions.create(
        model=MODEL,
        messages=messages,
        max_tokens=12,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    content = [c for c in chunks if c.choices]
    assert content[0].choices[0].delta.role == "assistant" and content[0].choices[0].delta.content
    assert all(c.choices[0].delta.role is None for c in content[1:])
    assert content[-1].choices[0].finish_reason in ("stop", "length")
    assert "".join(c.choices[0].delta.content or "" for c in content) == out.choices[0].message.content
    assert chunks[-1].usage.total_tokens == out.usage.total_tokens


def test_openai_sdk_models(openai_client):
    import openai

    assert [m.id for m in openai_client.models.list()] == [MODEL]
    card = openai_client.models.retrieve(MODEL)
    assert card.id == MODEL and card.object == "model"
    with pytest.raises(openai.NotFoundError):
        openai_client.models.retrieve("gpt-9")


# ---- the wire format ----
def test_sse_wire_format_completions(http):
    body = {
        "prompt": "Once upon a time",
        "max_tokens": 6,
        "stream": True,
        "ignore_eos": True,
        "stream_options": {"include_usage": True},
    }
    r = http.post("/v1/completions", json=body)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    events = sse_events(r.text)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    *content, usage = chunks
    for c in content:
        assert set(c) == {"id", "object", "created", "model", "choices"}
        assert c["object"] == "text_completion" and c["id"] == content[0]["id"]
        (choice,) = c["choices"]
        assert {"index", "text", "logprobs", "finish_reason"} <= set(choice) and choice["logprobs"] is None
    assert [c["choices"][0]["finish_reason"] for c in content] == [None] * (len(content) - 1) + ["length"]
    assert usage["choices"] == [] and usage["usage"] == {
        "prompt_tokens": 4,
        "completion_tokens": 6,
        "total_tokens": 10,
    }


def test_sse_chat_role_travels_with_first_token(http):
    body = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, "stream": True}
    events = sse_events(http.post("/v1/chat/completions", json=body).text)
    assert events[-1] == "[DONE]" and not any('"usage"' in e for e in events)  # no usage unless asked
    first = json.loads(events[0])
    assert first["object"] == "chat.completion.chunk"
    assert first["choices"][0]["delta"]["role"] == "assistant" and first["choices"][0]["delta"]["content"]


def test_sampling_parameters_are_honoured(http):
    def complete(**kw):
        r = http.post("/v1/completions", json={"prompt": "Once upon a time", "max_tokens": 24, **kw})
        assert r.status_code == 200, r.text
        return r.json()

    a = complete(temperature=1.0, seed=7)["choices"][0]["text"]
    assert complete(temperature=1.0, seed=7)["choices"][0]["text"] == a  # seeded: reproducible
    assert complete(temperature=0)["choices"][0]["text"] == complete(top_k=1)["choices"][0]["text"]
    out = complete(temperature=0, max_tokens=40, ignore_eos=True)
    assert out["usage"]["completion_tokens"] == 40 and out["choices"][0]["finish_reason"] == "length"
    greedy = complete(temperature=0)["choices"][0]["text"]
    # extreme but valid values that overflow or vanish in float32 (found by schemathesis) behave like greedy
    assert complete(top_p=5e-324)["choices"][0]["text"] == greedy
    assert complete(temperature=1e-300)["choices"][0]["text"] == greedy
    assert complete(temperature=1e300)["usage"]["completion_tokens"] >= 1
    word = greedy.split()[2]
    stopped = complete(temperature=0, stop=[word])["choices"][0]
    assert (
        word not in stopped["text"] and stopped["finish_reason"] == "stop" and stopped["stop_reason"] == word
    )


# ---- errors: every bad input is a 4xx with an OpenAI error body ----
LONG_PROMPT = "Once upon a time there was a cat. " * 80  # > 512 tokens

BAD_COMPLETIONS = [
    ("malformed json", b'{"prompt": "x", ', 400),
    ("not an object", b"[1, 2]", 400),
    ("missing prompt", {"max_tokens": 3}, 400),
    ("mistyped max_tokens", {"prompt": "x", "max_tokens": "lots"}, 400),
    ("mistyped temperature", {"prompt": "x", "temperature": "hot"}, 400),
    ("mistyped prompt", {"prompt": 123}, 400),
    ("mistyped stream", {"prompt": "x", "stream": {"yes": 1}}, 400),
    ("negative max_tokens", {"prompt": "x", "max_tokens": -5}, 400),
    ("zero max_tokens", {"prompt": "x", "max_tokens": 0}, 400),
    ("huge max_tokens", {"prompt": "x", "max_tokens": 10**12}, 400),
    ("over-long prompt", {"prompt": LONG_PROMPT, "max_tokens": 4}, 400),
    ("unknown model", {"model": "gpt-9", "prompt": "x"}, 404),
    ("empty prompt", {"prompt": "", "max_tokens": 3}, 400),
    ("empty token list", {"prompt": [], "max_tokens": 3}, 400),
    ("token id out of vocab", {"prompt": [5, 10**6]}, 400),
    ("n=2", {"prompt": "x", "n": 2}, 400),
    ("two prompts", {"prompt": ["a", "b"]}, 400),
    ("stream_options without stream", {"prompt": "x", "stream_options": {"include_usage": True}}, 400),
    ("negative temperature", {"prompt": "x", "temperature": -1}, 400),
    ("top_p 0", {"prompt": "x", "top_p": 0}, 400),
    ("top_p > 1", {"prompt": "x", "top_p": 1.5}, 400),
    ("seed too big", {"prompt": "x", "seed": 2**70}, 400),
    ("empty stop string", {"prompt": "x", "stop": [""]}, 400),
    ("logprobs", {"prompt": "x", "logprobs": 2}, 400),
    ("echo", {"prompt": "x", "echo": True}, 400),
    ("presence_penalty", {"prompt": "x", "presence_penalty": 0.5}, 400),
    # strict types: a bool is not a token id or a count, a number is not a bool (pydantic's lax mode would
    # read [[false]] as token 0 and max_tokens: true as 1)
    ("bool token id", {"prompt": [[False]]}, 400),
    ("bool in a token list", {"prompt": [5, True]}, 400),
    ("bool max_tokens", {"prompt": "x", "max_tokens": True}, 400),
    ("number for stream", {"prompt": "x", "stream": 1}, 400),
    ("string for a bool", {"prompt": "x", "ignore_eos": "yes"}, 400),
]


@pytest.mark.parametrize("body,status", [c[1:] for c in BAD_COMPLETIONS], ids=[c[0] for c in BAD_COMPLETIONS])
def test_bad_completion_requests(http, body, status):
    if isinstance(body, bytes):
        r = http.post("/v1/completions", content=body, headers={"Content-Type": "application/json"})
    else:
        r = http.post("/v1/completions", json=body)
    error = assert_error(r, status)
    if status == 400:
        assert error["type"] == "BadRequestError"


BAD_CHATS = [
    ("missing messages", {"max_tokens": 3}, 400),
    ("empty messages", {"messages": []}, 400),
    ("messages not a list", {"messages": "hello"}, 400),
    ("message without role", {"messages": [{"content": "hi"}]}, 400),
    ("unknown role", {"messages": [{"role": "wizard", "content": "hi"}]}, 400),
    ("empty role", {"messages": [{"role": "", "content": "hi"}]}, 400),
    ("user content null", {"messages": [{"role": "user", "content": None}]}, 400),
    ("user content missing", {"messages": [{"role": "user"}]}, 400),
    (
        "number for add_generation_prompt",
        {"messages": [{"role": "user", "content": "hi"}], "add_generation_prompt": 0},
        400,
    ),
    ("logprobs", {"messages": [{"role": "user", "content": "hi"}], "logprobs": True}, 400),
    (
        "image part",
        {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
        400,
    ),
    ("over-long", {"messages": [{"role": "user", "content": LONG_PROMPT}]}, 400),
    ("tools", {"messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function"}]}, 400),
    ("unknown model", {"model": "nope", "messages": [{"role": "user", "content": "hi"}]}, 404),
]


@pytest.mark.parametrize("body,status", [c[1:] for c in BAD_CHATS], ids=[c[0] for c in BAD_CHATS])
def test_bad_chat_requests(http, body, status):
    assert_error(http.post("/v1/chat/completions", json=body), status)


def test_unknown_fields_are_ignored_with_a_warning(http, caplog):
    """Documented choice (as vLLM): unknown fields do not fail a request; the server logs them."""
    with caplog.at_level(logging.WARNING, logger="minengine.server"):
        r = http.post("/v1/completions", json={"prompt": "x", "max_tokens": 2, "frobnicate": True})
    assert r.status_code == 200
    assert any("frobnicate" in rec.getMessage() for rec in caplog.records)


def test_api_key(server):
    body = {"prompt": "x", "max_tokens": 2}
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}):
        assert_error(httpx.post(server.url + "/v1/completions", json=body, headers=headers), 401)
    assert_error(httpx.get(server.url + "/v1/models", headers={"Authorization": "Bearer wrong"}), 401)
    # a wrong key wins over a malformed body: nothing is parsed for an unauthenticated client
    assert_error(httpx.post(server.url + "/v1/completions", content=b"{", headers={}), 401)
    assert httpx.get(server.url + "/health").status_code == 200  # probes need no key
    assert httpx.get(server.url + "/metrics").status_code == 200


def test_unknown_route_and_method(http):
    assert_error(http.get("/v1/nothing"), 404)
    assert_error(http.get("/v1/completions"), 405)


def test_error_after_stream_began_is_an_event_then_done(server, http, monkeypatch):
    serving = server.app.state.completions
    real = serving.metrics.observe
    calls = []

    def failing_observe(out, stats):
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("boom in the middle of the stream")
        real(out, stats)

    monkeypatch.setattr(serving.metrics, "observe", failing_observe)
    body = {"prompt": "Once upon a time", "max_tokens": 30, "ignore_eos": True, "stream": True}
    r = http.post("/v1/completions", json=body)
    monkeypatch.undo()
    assert r.status_code == 200
    events = sse_events(r.text)
    assert events[-1] == "[DONE]"
    error = json.loads(events[-2])["error"]
    assert error["code"] == 500 and "boom" in error["message"]
    assert len(events) == 4  # two content chunks, the error, [DONE]
    engine = server.app.state.llm.engine
    deadline = time.monotonic() + 10
    while engine.has_unfinished_requests() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not engine.has_unfinished_requests() and engine.kv_cache_usage == 0


# ---- models, health, metrics ----
def test_models_and_health(http):
    data = http.get("/v1/models").json()
    assert data["object"] == "list" and data["data"][0]["id"] == MODEL
    assert data["data"][0]["max_model_len"] == MAX_MODEL_LEN
    assert http.get(f"/v1/models/{MODEL}").json() == {**data["data"][0], "created": ANY}
    assert_error(http.get("/v1/models/gpt-9"), 404)
    assert http.get("/health").status_code == 200


def test_assistant_content_may_be_null(http):
    """OpenAI allows a null assistant content (it stands for a tool call); the template sees ''."""
    messages = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": None},
        {"role": "user", "content": "and then?"},
    ]
    assert http.post("/v1/chat/completions", json={"messages": messages, "max_tokens": 2}).status_code == 200


def test_metrics_names_and_counts(http):
    def scrape() -> dict[str, float]:
        out = {}
        for line in http.get("/metrics").text.splitlines():
            if line and not line.startswith("#"):
                name, value = line.rsplit(" ", 1)
                out[name] = float(value)
        return out

    label = '{model_name="tinystories-4m"}'
    before = scrape()
    r = http.post("/v1/completions", json={"prompt": "Once upon a time", "max_tokens": 5, "ignore_eos": True})
    assert r.status_code == 200
    after = scrape()
    for suffix in [
        "time_to_first_token_seconds",
        "inter_token_latency_seconds",
        "e2e_request_latency_seconds",
        "request_time_per_output_token_seconds",
        "request_queue_time_seconds",
    ]:
        assert after[f"minengine:{suffix}_count{label}"] == before[f"minengine:{suffix}_count{label}"] + (
            4 if suffix == "inter_token_latency_seconds" else 1
        )
    assert (
        after[f"minengine:generation_tokens_total{label}"]
        - before[f"minengine:generation_tokens_total{label}"]
        == 5
    )
    assert (
        after[f"minengine:prompt_tokens_total{label}"] - before[f"minengine:prompt_tokens_total{label}"] == 4
    )
    success = 'minengine:request_success_total{finished_reason="length",model_name="tinystories-4m"}'
    assert after[success] == before[success] + 1
    for gauge in ["num_requests_running", "num_requests_waiting", "kv_cache_usage_perc"]:
        assert after[f"minengine:{gauge}{label}"] == 0
    for counter in ["num_preemptions_total", "prefix_cache_queries_total", "prefix_cache_hits_total"]:
        assert f"minengine:{counter}{label}" in after
    assert after[f"minengine:iteration_tokens_total_count{label}"] > before.get(
        f"minengine:iteration_tokens_total_count{label}", 0
    )


def test_vllm_metric_prefix_and_separate_registries(server):
    """A second app in the same process (own registry) with vLLM's exact names, on the same engine."""
    app = create_app(server.app.state.llm, metrics_prefix="vllm")
    text = app.state.metrics.render().decode()
    assert "vllm:time_to_first_token_seconds_bucket" in text and "vllm:kv_cache_usage_perc" in text
    assert "minengine:" not in text


# ---- fuzzing: no input makes the server fail ----
def test_schemathesis_finds_no_server_errors(server):
    schemathesis = pytest.importorskip("schemathesis")
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import strategies as st
    from schemathesis.checks import content_type_conformance, not_a_server_error, response_schema_conformance

    schema = schemathesis.openapi.from_url(server.url + "/openapi.json", headers=AUTH)
    ops = [result.ok() for result in schema.get_all_operations()]
    assert {op.path for op in ops} >= {"/v1/completions", "/v1/chat/completions", "/v1/models"}
    statuses: dict[str, set[int]] = {}

    def fuzz(op, examples: int) -> None:
        @given(case=op.as_strategy(), deep=st.booleans())
        @settings(
            max_examples=examples,
            deadline=None,
            phases=[Phase.generate],
            database=None,
            # the same cases every run: a random draw of 30 once held no valid body (no 200), a flaky red
            derandomize=True,
            suppress_health_check=list(HealthCheck),
        )
        def check(case, deep):
            if deep and isinstance(case.body, dict):  # half the cases get past the model/unsupported checks
                case.body["model"] = MODEL
                for name in UNSUPPORTED:
                    case.body.pop(name, None)
            # The schema is the truth: every response (JSON or SSE, 200 or error) is one it documents.
            checks = [not_a_server_error, response_schema_conformance, content_type_conformance]
            response = case.call_and_validate(headers=AUTH, checks=checks, timeout=30)
            statuses.setdefault(op.path, set()).add(response.status_code)

        check()

    start = time.monotonic()
    for op in ops:
        fuzz(op, 30 if op.method.upper() == "POST" else 5)
    assert time.monotonic() - start < 90
    assert 400 in statuses["/v1/completions"] and 400 in statuses["/v1/chat/completions"]
    # Past the validation too: a valid body, plain and streamed, gets a 200 that the schema documents.
    # (Whether 30 random bodies hold a valid one depends on the draw, which hash randomisation changes.)
    valid = {"/v1/completions": {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 3},
             "/v1/chat/completions": {"model": MODEL, "max_tokens": 3,
                                      "messages": [{"role": "user", "content": "Hi"}]}}
    checks = [not_a_server_error, response_schema_conformance, content_type_conformance]
    for op in ops:
        for stream in (False, True):
            if op.method.upper() == "POST" and op.path in valid:
                case = op.Case(body={**valid[op.path], "stream": stream}, media_type="application/json")
                assert case.call_and_validate(headers=AUTH, checks=checks, timeout=30).status_code == 200


UNSUPPORTED = [
    "n",
    "best_of",
    "echo",
    "logprobs",
    "top_logprobs",
    "suffix",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "logit_bias",
    "tools",
    "tool_choice",
    "response_format",
    "stream_options",
]


# ---- the CLI: a real process ----
def test_serve_cli_subprocess(tmp_path):
    port = free_port()
    cmd = [
        sys.executable,
        "-m",
        "minengine",
        "serve",
        "--model",
        MODEL,
        "--port",
        str(port),
        "--threads",
        "1",
        "--max-model-len",
        "256",
        "--log-level",
        "warning",
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 90
        while True:
            assert proc.poll() is None, proc.communicate()[1]
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "minengine serve did not come up"
            time.sleep(0.2)
        r = httpx.post(url + "/v1/completions", json={"prompt": "Once", "max_tokens": 4}, timeout=30)
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] <= 4
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            _, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
    assert proc.returncode == 0, err
    assert "serving 'tinystories-4m'" in err
    frozen = re.search(r"([\d,]+) start-up objects frozen out of GC walks", err)
    assert frozen and int(frozen.group(1).replace(",", "")) > 10_000, err  # torch alone is more
    # what runs, in one line (backend, graphs, small ops, dtype, KV layout, and why each default)
    assert re.search(r"minengine: attention '(cpp|gather)', no graphs, small ops (cpp|torch), float32 on "
                     r"cpu; KV cache 4 layers x \(K, V\) x \[\d+ blocks, 16 tokens, 2 heads, 32\] float32",
                     err), err
    assert "linear: linear layers: " in err


def test_serve_cli_bad_model_is_one_line(capsys):
    from minengine.cli.main import main

    assert main(["serve", "--model", os.path.join("no", "such", "model"), "--threads", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("minengine serve: error:") and "Traceback" not in err
