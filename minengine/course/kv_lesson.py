"""Lesson 04's measurements of what the KV cache buys: generation with it and without it (recompute).

Why a module: the no-cache loop drives the model directly (one full forward of the whole sequence per new
token), which is too much code for a notebook cell, and a test checks that it produces the very tokens
the engine does, so the timing compares two ways of computing the *same* answer.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from minengine.core.sampling_params import SamplingParams
from minengine.models.attention import AttentionMetadata


@dataclass
class RecomputeTiming:
    """Forward time of each generated token, at each context length, with and without the cache."""

    context: list[int]  # tokens the step's new token attends to (prompt + tokens so far)
    no_cache_s: list[float]  # a forward over the whole sequence, every step
    cached_s: list[float]  # the engine: prefill once, then one token per step (its StepRecords)
    no_cache_tokens: list[int]
    cached_tokens: list[int]

    @property
    def same_tokens(self) -> bool:
        return self.no_cache_tokens == self.cached_tokens

    @property
    def speedup(self) -> float:
        """Total forward time without the cache over total time with it."""
        return float(np.sum(self.no_cache_s) / np.sum(self.cached_s))


@torch.inference_mode()
def generate_without_cache(model: Any, prompt: Sequence[int], new_tokens: int,
                           progress: bool = False) -> tuple[list[int], list[float]]:
    """Greedy decoding that recomputes every key and value each step: the whole sequence, every time.

    Returns the new tokens and each step's forward time (seconds).
    """
    ids = list(prompt)
    out, times = [], []
    device = model.device
    for _ in tqdm(range(new_tokens), desc="no cache", disable=not progress):
        inputs = torch.tensor(ids, dtype=torch.long, device=device)
        meta = AttentionMetadata.for_prefill([len(ids)])
        positions = meta.positions(device)
        _sync(device)
        start = time.perf_counter()
        hidden = model(inputs, positions, meta)  # no kv_caches: every layer recomputes K and V for all
        token = int(model.compute_logits(hidden[-1:]).float().argmax(dim=-1))
        _sync(device)
        times.append(time.perf_counter() - start)
        ids.append(token)
        out.append(token)
    return out, times


def recompute_vs_cache(llm: Any, prompt: Sequence[int], new_tokens: int,
                       progress: bool = True) -> RecomputeTiming:
    """Generate ``new_tokens`` greedily both ways from ``prompt``; the engine's step records time the
    cache."""
    params = SamplingParams(temperature=0, max_tokens=new_tokens, ignore_eos=True)
    out = llm.generate([{"prompt_token_ids": list(prompt)}], params, use_tqdm=False)[0]
    cached_s = [s.t_forward for s in llm.step_records]  # this call's steps: the prefill, then decodes
    tokens, no_cache_s = generate_without_cache(llm.llm_engine.model, prompt, new_tokens, progress)
    context = [len(prompt) + i for i in range(new_tokens)]
    return RecomputeTiming(context, no_cache_s, cached_s, tokens, list(out.outputs[0].token_ids))


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
