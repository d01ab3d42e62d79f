"""Verify drafted tokens so that speculative decoding samples exactly what the target model would.

The target model scores the k drafted tokens of a request in one forward pass, which gives its
distribution at every draft position plus one more. Each draft ``x`` drawn with probability ``q(x)`` is
kept with probability ``min(1, p(x) / q(x))``, where ``p`` is the target's distribution there; the first
rejected one is replaced by a draw from the leftover ``max(0, p - q)`` (renormalised), and the rest are
dropped. When every draft is kept, the extra position gives a bonus token. Each emitted token then
follows ``p`` exactly, at any temperature (Leviathan et al., 2023, "Fast Inference from Transformers via
Speculative Decoding", Theorem 1; Chen et al., 2023): speculation changes the speed, never the text's
distribution. vLLM's ``RejectionSampler`` (``vllm/v1/sample/rejection_sampler.py``) does the same.

An n-gram draft is a fixed guess, not a draw: ``q`` is one-hot, so a draft is kept with probability
``p(x)`` and a rejection draws from ``p`` with ``x`` removed. Greedy decoding is the limit where ``p`` is
one-hot too: keep drafts while they equal the target's argmax, then emit the argmax.

Each request returns between 1 and k + 1 tokens: the accepted drafts and one token of the target's own.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def greedy_verify(draft_token_ids: Sequence[int], target_logits: torch.Tensor) -> list[int]:
    """Greedy decoding: ``target_logits`` [k + 1, vocab] at the k draft positions and one more; keep the
    drafts that equal the target's argmax, then emit the argmax where they first differ (or the bonus)."""
    best = target_logits.argmax(dim=-1).tolist()
    emitted = []
    for draft, target in zip(draft_token_ids, best, strict=False):
        emitted.append(target)
        if draft != target:
            return emitted
    emitted.append(best[len(draft_token_ids)])
    return emitted


def rejection_sample(draft_token_ids: Sequence[int], target_probs: torch.Tensor,
                     draft_probs: torch.Tensor | None = None,
                     generator: torch.Generator | None = None) -> list[int]:
    """Sampling: ``target_probs`` [k + 1, vocab], the target's distribution (after temperature, top-k,
    top-p) at the k draft positions and one more; ``draft_probs`` [k, vocab], the distribution each draft
    was drawn from, or None when the drafts are fixed guesses (n-gram lookup). Returns the emitted tokens."""
    k = len(draft_token_ids)
    if target_probs.shape[0] != k + 1:
        raise ValueError(f"target_probs has {target_probs.shape[0]} rows for {k} drafts; it needs k + 1")
    emitted = []
    for i, draft in enumerate(draft_token_ids):
        p = target_probs[i]
        q_draft = 1.0 if draft_probs is None else float(draft_probs[i, draft])
        u = float(torch.rand((), generator=generator, device=p.device))
        if u * q_draft < float(p[draft]):  # kept with probability min(1, p(x) / q(x))
            emitted.append(draft)
            continue
        if draft_probs is None:
            leftover = p.clone()
            leftover[draft] = 0.0
        else:
            leftover = (p - draft_probs[i]).clamp_min(0.0)
        if float(leftover.sum()) <= 0.0:  # only rounding gets here: p and q agree to float precision
            leftover = p
        emitted.append(int(torch.multinomial(leftover, 1, generator=generator)))
        return emitted
    emitted.append(int(torch.multinomial(target_probs[k], 1, generator=generator)))  # every draft kept
    return emitted
