"""What speculative decoding buys, from the roofline: a verify step against the decode steps it replaces.

A verify step computes each request's last token plus its k drafts: a chunk of k + 1 tokens over the
cached context, with k + 1 LM-head rows. While a decode step is bound by reading the weights, those extra
rows ride along almost free, so every accepted draft is a step saved. As the batch grows the step moves
toward the ridge, the extra rows start to cost compute, and past some batch the verify step costs more
than the tokens it wins: speculation turns into a slowdown.

Accepted drafts: when each draft is accepted with probability ``alpha``, independently, a verify step
yields ``1 + alpha + ... + alpha^k = (1 - alpha^(k+1)) / (1 - alpha)`` tokens on average (Leviathan et
al., 2023, eq. 1): the accepted run, plus the target's own token at the first rejection (or the bonus).
Real acceptance need not be independent, so read ``alpha`` as the rate that gives the measured mean
accepted length (not the share of drafts kept, which is lower: drafts after the first miss are dropped).
Lesson 10 compares the model with the engine's steps.

Torch-free, for the lessons' GPU-scale what-ifs; the engine's own verify steps are measured, not modelled.
"""

from __future__ import annotations

from dataclasses import dataclass

from minengine.perf.roofline import CostModel


def expected_tokens_per_step(acceptance_rate: float, num_speculative_tokens: int) -> float:
    """Mean tokens a request gains per verify step: (1 - a^(k+1)) / (1 - a), from 1 (a = 0) to k + 1."""
    a, k = acceptance_rate, num_speculative_tokens
    if not 0.0 <= a <= 1.0:
        raise ValueError(f"acceptance_rate must be in [0, 1], got {a!r}")
    if isinstance(k, bool) or not isinstance(k, int) or k < 0:
        raise ValueError(f"num_speculative_tokens must be an int >= 0, got {k!r}")
    return float(k + 1) if a == 1.0 else (1.0 - a ** (k + 1)) / (1.0 - a)


@dataclass(frozen=True)
class SpeculativeEstimate:
    """One batch's decode step against its verify step (seconds), and the resulting speedup."""

    batch_size: int
    num_speculative_tokens: int
    acceptance_rate: float
    decode_time: float  # one ordinary decode step: one token per request
    verify_time: float  # one verify step (plus drafting, when a draft model runs)
    tokens_per_step: float  # per request, on average

    @property
    def speedup(self) -> float:
        """Output tokens per second with speculation over without (below 1: a slowdown)."""
        return self.tokens_per_step * self.decode_time / self.verify_time


def estimate(cost_model: CostModel, batch_size: int, context_len: int, num_speculative_tokens: int,
             acceptance_rate: float, draft_model: CostModel | None = None) -> SpeculativeEstimate:
    """Speculative decoding for ``batch_size`` requests with ``context_len`` tokens of KV each.

    ``draft_model``: the cost model of a draft model, which then runs k decode steps per verify step; None
    for drafting that costs no GPU time (n-gram lookup)."""
    k = num_speculative_tokens
    decode = cost_model.decode_cost(batch_size, context_len).time
    verify = cost_model.step_cost([(k + 1, context_len - 1)] * batch_size, num_sampled=batch_size * (k + 1))
    drafting = 0.0
    if draft_model is not None:
        drafting = sum(draft_model.decode_cost(batch_size, context_len + i).time for i in range(k))
    return SpeculativeEstimate(batch_size, k, acceptance_rate, decode, verify.time + drafting,
                               expected_tokens_per_step(acceptance_rate, k))


def breakeven_batch(cost_model: CostModel, context_len: int, num_speculative_tokens: int,
                    acceptance_rate: float, draft_model: CostModel | None = None,
                    max_batch: int = 4096) -> int | None:
    """The smallest batch (a power of two) at which speculation no longer pays (speedup < 1), or None."""
    batch = 1
    while batch <= max_batch:
        if estimate(cost_model, batch, context_len, num_speculative_tokens, acceptance_rate,
                    draft_model).speedup < 1.0:
            return batch
        batch *= 2
    return None
