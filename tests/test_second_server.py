"""A second, independent OpenAI-compatible server on the same model: ``transformers serve``.

Two things only a second implementation can show. Correctness: Hugging Face's own server, running the
shipped model with its own code, must produce the same greedy text as minengine's for the same requests
(completions and chat, so the tokenizer, the chat template and the model all agree). Portability: the
official SDK and ``minengine bench`` must work against a server that is not ours; ``transformers serve``
ends its streams without ``data: [DONE]`` and rejects the vLLM extension ``ignore_eos``, and bench copes
with both and says so in its notes.

The server runs as a subprocess in its own process group on 127.0.0.1 (a port the OS picks), offline,
and is always stopped.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from proc_utils import free_port, stop_process_group

from minengine.bench.client import benchmark
from minengine.server import ServerThread, create_app

pytestmark = pytest.mark.usefixtures("torch_one_thread")

MODEL = "tinystories-4m"
MODEL_DIR = Path(__file__).resolve().parents[1] / "minengine" / "assets" / MODEL
CLI = Path(sys.executable).parent / "transformers"  # installed with transformers[serving] (pyproject dev)
PROMPTS = ["Once upon a time", "The little dog", "Tom and Sue went to the park. They"]
CHAT = [{"role": "user", "content": "Tell me a story about a cat."}]


@pytest.fixture(scope="module")
def hf_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    port = free_port()
    log = tmp_path_factory.mktemp("transformers-serve") / "server.log"  # a file: a full pipe would block it
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    cmd = [str(CLI), "serve", str(MODEL_DIR), "--host", "127.0.0.1", "--port", str(port), "--device", "cpu"]
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(url + "/v1/models", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"transformers serve did not come up on {url}:\n{log.read_text()[-2000:]}")
            time.sleep(0.3)
        yield url
    finally:
        stop_process_group(proc)


@pytest.fixture(scope="module")
def ours() -> Iterator[str]:
    with ServerThread(create_app(model=MODEL)) as srv:
        yield srv.url


def clients(hf_server: str, ours: str):
    import openai

    return (openai.OpenAI(base_url=hf_server + "/v1", api_key="unused", max_retries=0),
            openai.OpenAI(base_url=ours + "/v1", api_key="unused", max_retries=0))


def test_both_servers_produce_the_same_greedy_completions(hf_server: str, ours: str) -> None:
    theirs, mine = clients(hf_server, ours)
    for prompt in PROMPTS:
        a = theirs.completions.create(model=str(MODEL_DIR), prompt=prompt, max_tokens=12, temperature=0)
        b = mine.completions.create(model=MODEL, prompt=prompt, max_tokens=12, temperature=0)
        assert b.choices[0].text == a.choices[0].text, prompt
        assert b.usage.prompt_tokens == a.usage.prompt_tokens and b.usage.completion_tokens == 12


def test_both_servers_apply_the_same_chat_template(hf_server: str, ours: str) -> None:
    theirs, mine = clients(hf_server, ours)
    a = theirs.chat.completions.create(model=str(MODEL_DIR), messages=CHAT, max_tokens=12, temperature=0)
    b = mine.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=12, temperature=0)
    assert b.choices[0].message.content == a.choices[0].message.content
    assert b.usage.prompt_tokens == a.usage.prompt_tokens
    # Streamed, each server's deltas add up to the same text (the SDK copes with the missing [DONE]).
    for client, model in ((theirs, str(MODEL_DIR)), (mine, MODEL)):
        stream = client.chat.completions.create(model=model, messages=CHAT, max_tokens=12, temperature=0,
                                                stream=True)
        assert ("".join(c.choices[0].delta.content or "" for c in stream if c.choices)
                == a.choices[0].message.content)


def test_bench_runs_against_transformers_serve_and_says_how_it_adapted(hf_server: str) -> None:
    summary = benchmark(hf_server, model=str(MODEL_DIR), tokenizer=MODEL, num_prompts=4, input_len=16,
                        output_len=8, ignore_eos=True, disable_tqdm=True)
    assert summary.completed == 4 and not summary.errors
    assert summary.ttft.count == 4 and summary.total_output_tokens > 0
    assert any("rejects ignore_eos" in n for n in summary.notes), summary.notes
    assert any("without data: [DONE]" in n for n in summary.notes), summary.notes


def test_bench_against_our_server_needs_no_adapting(ours: str) -> None:
    summary = benchmark(ours, num_prompts=4, input_len=16, output_len=8, ignore_eos=True, disable_tqdm=True)
    assert summary.completed == 4 and not summary.errors and summary.notes == []
    assert summary.total_output_tokens == 4 * 8  # ignore_eos was accepted: every output ran to its length
