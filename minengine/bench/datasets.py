"""Workloads for the bench client: random lengths (vLLM's ``random`` dataset), a shared prefix, or JSONL.

Random prompts are drawn from the tokenizer's vocabulary (special tokens left out), decoded to text and
re-tokenized, then trimmed or topped up until the text encodes to exactly the requested number of tokens:
a token-salad prompt costs the server the same prefill as real text of that length, and the lengths are
what the benchmark is about. Lengths follow vLLM's ``--random-range-ratio``: uniform integers in
``[len * (1 - r), len * (1 + r)]``. With ``prefix_len`` every prompt starts with the same random text of
that many tokens (vLLM's ``--random-prefix-len``), which the server's prefix cache can reuse.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np


@dataclass
class SampleRequest:
    prompt: str
    prompt_len: int  # tokens by the client's tokenizer (0 when unknown: the server's usage tells)
    expected_output_len: int  # sent as max_tokens


def length_range(length: int, range_ratio: float) -> tuple[int, int]:
    """The inclusive range of lengths for ``--range-ratio`` (vLLM's rule)."""
    if not 0 <= range_ratio < 1:
        raise ValueError(f"range_ratio must be in [0, 1), got {range_ratio}")
    return max(1, math.floor(length * (1 - range_ratio))), math.ceil(length * (1 + range_ratio))


def random_requests(
    tokenizer: Any,
    num_prompts: int,
    input_len: int,
    output_len: int,
    range_ratio: float = 0.0,
    prefix_len: int = 0,
    seed: int = 0,
) -> list[SampleRequest]:
    """``num_prompts`` prompts of ~``input_len`` tokens (+ ``prefix_len`` shared), ~``output_len`` out."""
    for name, value, low in (
        ("num_prompts", num_prompts, 1),
        ("input_len", input_len, 1),
        ("output_len", output_len, 1),
        ("prefix_len", prefix_len, 0),
    ):
        if value < low:
            raise ValueError(f"{name} must be >= {low}, got {value}")
    rng = np.random.default_rng(seed)
    vocab = _plain_token_ids(tokenizer)
    lo_in, hi_in = length_range(input_len, range_ratio)
    lo_out, hi_out = length_range(output_len, range_ratio)
    input_lens = rng.integers(lo_in, hi_in + 1, size=num_prompts)
    output_lens = rng.integers(lo_out, hi_out + 1, size=num_prompts)
    prefix = _text_of_length(tokenizer, vocab, prefix_len, rng) if prefix_len else ""
    out = []
    for n_in, n_out in zip(input_lens, output_lens, strict=True):
        body = _text_of_length(tokenizer, vocab, int(n_in), rng)
        prompt = prefix + body
        out.append(SampleRequest(prompt, len(_encode(tokenizer, prompt)), int(n_out)))
    return out


def jsonl_requests(
    path: str | Path, num_prompts: int | None = None, tokenizer: Any = None, default_output_len: int = 128
) -> list[SampleRequest]:
    """Lines ``{"prompt": ..., "output_len": ...}`` (``output_len`` optional); repeated to ``num_prompts``."""
    rows = []
    for i, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}:{i}: not JSON ({e.msg})") from None
        if not isinstance(row, dict) or not isinstance(row.get("prompt"), str) or not row["prompt"]:
            raise ValueError(f"{path}:{i}: expected an object with a non-empty string 'prompt'")
        n_out = row.get("output_len", default_output_len)
        if isinstance(n_out, bool) or not isinstance(n_out, int) or n_out < 1:
            raise ValueError(f"{path}:{i}: output_len must be a positive integer, got {n_out!r}")
        n_in = len(_encode(tokenizer, row["prompt"])) if tokenizer is not None else 0
        rows.append(SampleRequest(row["prompt"], n_in, n_out))
    if not rows:
        raise ValueError(f"{path}: no prompts")
    if num_prompts is None:
        return rows
    return [rows[i % len(rows)] for i in range(num_prompts)]


def _encode(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer.encode(text, add_special_tokens=False))


def _plain_token_ids(tokenizer: Any) -> np.ndarray:
    special = set(getattr(tokenizer, "all_special_ids", []) or [])
    ids = [i for i in range(len(tokenizer)) if i not in special]
    if not ids:
        raise ValueError("the tokenizer has no ordinary tokens to build prompts from")
    return np.array(ids)


def _text_of_length(tokenizer: Any, vocab: np.ndarray, n: int, rng: np.random.Generator) -> str:
    """Random text that re-encodes to exactly ``n`` tokens (or as close as 10 rounds get)."""
    ids = [int(t) for t in rng.choice(vocab, size=n)]
    text = ""
    for _ in range(10):
        text = tokenizer.decode(ids)
        got = _encode(tokenizer, text)
        if len(got) == n:
            return text
        ids = got[:n] if len(got) > n else got + [int(t) for t in rng.choice(vocab, size=n - len(got))]
    return text
