"""Quantized weights, measured: what each format reads per decode step, and what it costs in quality.

Why this module: batch-1 decode streams every weight once per token, so the bytes a format stores set
the decode floor (bytes / read bandwidth), and the rounding it does sets the quality cost. Both are
measured here on a real model, with minengine's own forward pass.

What *can* be measured offline, honestly: SmolLM2-135M is installed only as its Q4_1 GGUF file, so the
"fp32" model minengine runs holds exactly the Q4_1 values (dequantized). It is the **reference**: every
other variant is a step away from it --

* ``bf16``: those values rounded to bfloat16 (8 significant bits);
* ``Q8_0`` / ``Q4_0``: the reference re-quantized with llama.cpp's recipes (``gguf.quantize_blocks``,
  byte-identical to ``llama-quantize``), then dequantized back ("fake" quantization: the values a real
  kernel would multiply by, in fp32);
* ``int3`` / ``int2``: Q4_0's recipe with fewer bits (symmetric, one fp16 scale per 32 weights) -- not
  a llama.cpp format, just the bit ladder continued, to show where the model breaks.

The original bf16 SmolLM2 weights, and so the cost of the Q4_1 step itself, are not available here. A
second 4-bit rounding (``Q4_0`` of the Q4_1 values) adds an error of about the same size as the first
and is the closest stand-in, labelled as such. Compute stays fp32 in every variant, so only the stored
weights differ (llama.cpp's Q4_1 kernels also round the *activations* to 8 bits: benchmarks measure that).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from minengine.models.attention import AttentionMetadata
from minengine.models.gguf import BLOCK_BYTES, BLOCK_SIZE, dequantize_blocks, quantize_blocks

# Bits per weight as stored: ggml blocks hold 32 weights plus fp16 scale(s) (Q4_1 also an fp16 minimum).
BITS_PER_WEIGHT = {"fp32": 32.0, "bf16": 16.0, "f16": 16.0, "Q8_0": 8.5, "Q4_1": 5.0, "Q4_0": 4.5,
                   "int3": 3.5, "int2": 2.5}
SYMMETRIC_BITS = {"int3": 3, "int2": 2}  # Q4_0's recipe (bits=4 *is* Q4_0) with fewer bits


@dataclass(frozen=True)
class WeightPlan:
    """One way to store a model: a format for the layers' matrices and one for the embedding/LM head."""

    label: str
    layers: str
    embedding: str
    note: str = ""

    def bits(self, which: str) -> float:
        return BITS_PER_WEIGHT[self.layers if which == "layers" else self.embedding]


# The shipped file's own layout is Q4_1 layers with a Q8_0 embedding (tied: it is also the LM head).
PLANS = {
    "fp32": WeightPlan("fp32", "fp32", "fp32", "the reference: the Q4_1 values, dequantized"),
    "bf16": WeightPlan("bf16", "bf16", "bf16", "the reference rounded to bfloat16"),
    "Q8_0": WeightPlan("Q8_0", "Q8_0", "Q8_0", "re-quantized: 8 bits + a scale per 32"),
    "Q4_1": WeightPlan("Q4_1 (as shipped)", "Q4_1", "Q8_0", "the file itself: the same values as fp32"),
    "Q4_0": WeightPlan("Q4_0", "Q4_0", "Q8_0", "re-quantized: a second 4-bit rounding"),
    "int3": WeightPlan("int3", "int3", "Q8_0", "Q4_0's recipe with 3 bits"),
    "int2": WeightPlan("int2", "int2", "Q8_0", "Q4_0's recipe with 2 bits"),
}


# ----------------------------------------------------------------------------------- rounding weights
def quantize_symmetric(values: np.ndarray, bits: int) -> np.ndarray:
    """Q4_0's recipe at ``bits`` bits, round trip: per 32 weights, d = (signed extreme) / -2^(bits-1),
    q = w / d rounded into 0 .. 2^bits - 1 around 2^(bits-1), w' = fp16(d) * (q - 2^(bits-1)).

    With ``bits=4`` this is exactly ggml's Q4_0 (tested against ``quantize_blocks``).
    """
    if not 2 <= bits <= 8:
        raise ValueError(f"bits must be between 2 and 8, got {bits!r}")
    x = np.ascontiguousarray(values, dtype=np.float32).reshape(-1, BLOCK_SIZE)
    half = np.float32(2 ** (bits - 1))
    extreme = np.take_along_axis(x, np.abs(x).argmax(axis=1, keepdims=True), axis=1)
    d = extreme / -half
    with np.errstate(divide="ignore"):
        inv = np.where(d == 0, np.float32(0), np.float32(1) / d).astype(np.float32)
    q = np.clip(np.trunc(x * inv + half + np.float32(0.5)), 0, 2 * half - 1)
    return (d.astype(np.float16).astype(np.float32) * (q - half)).reshape(np.shape(values))


def round_trip(weight: torch.Tensor, fmt: str) -> torch.Tensor:
    """``weight`` [rows, k] stored in ``fmt`` and read back as fp32 (blocks of 32 run along each row,
    as in a GGUF file). fp32 returns it unchanged."""
    if fmt == "fp32":
        return weight
    if fmt in ("bf16", "f16"):
        return weight.to(torch.bfloat16 if fmt == "bf16" else torch.float16).to(weight.dtype)
    if weight.dim() != 2 or weight.shape[-1] % BLOCK_SIZE:
        raise ValueError(f"{fmt} needs rows that are a multiple of {BLOCK_SIZE} long, got "
                         f"{tuple(weight.shape)}")
    x = weight.detach().float().cpu().numpy()
    if fmt in SYMMETRIC_BITS:
        out = quantize_symmetric(x, SYMMETRIC_BITS[fmt])
    elif fmt in BLOCK_BYTES:
        out = dequantize_blocks(quantize_blocks(x, fmt), fmt).reshape(x.shape)
    else:
        raise ValueError(f"unknown weight format {fmt!r}; known: {', '.join(BITS_PER_WEIGHT)}")
    return torch.from_numpy(out).to(device=weight.device, dtype=weight.dtype)


def causal_lm(model: Any) -> Any:
    """The minengine ``LlamaForCausalLM`` inside an ``LLM`` or ``LLMEngine``, or the model itself."""
    if hasattr(model, "compute_logits"):
        return model
    return getattr(model, "llm_engine", model).model


def matrices(model: Any) -> Iterator[tuple[str, torch.nn.Parameter, bool]]:
    """(name, parameter, is_embedding) for every 2-D weight, each once (a tied LM head is the embedding).

    1-D norms are not listed: GGUF files keep them in fp32 whatever the format.
    """
    net = causal_lm(model)
    seen: set[int] = set()
    for name, p in net.named_parameters():
        if p.dim() == 2 and id(p) not in seen:
            seen.add(id(p))
            yield name, p, "embed" in name or "lm_head" in name


@contextmanager
def quantized_weights(model: Any, plan: WeightPlan) -> Iterator[None]:
    """Inside this block the model's matrices hold ``plan``'s rounded values; restored exactly on exit.

    ``model`` is an ``LLM``, ``LLMEngine`` or minengine Llama. Matrices whose rows are not a multiple of
    32 (none in SmolLM2) stay as they are.
    """
    saved: list[tuple[torch.nn.Parameter, torch.Tensor]] = []
    try:
        with torch.no_grad():
            for _name, p, is_embedding in matrices(model):
                fmt = plan.embedding if is_embedding else plan.layers
                if fmt == "fp32" or (fmt not in ("bf16", "f16") and p.shape[-1] % BLOCK_SIZE):
                    continue
                saved.append((p, p.detach().clone()))
                p.copy_(round_trip(p.detach(), fmt))
        yield
    finally:
        with torch.no_grad():
            for p, original in saved:
                p.copy_(original)


def unchanged_by(model: Any, plan: WeightPlan) -> tuple[int, int]:
    """(matrices that storing in ``plan`` leaves exactly as they are, matrices): the test that a model's
    float weights are already on a quantized grid."""
    same = total = 0
    for _name, p, is_embedding in matrices(model):
        total += 1
        same += bool(torch.equal(round_trip(p.detach(), plan.embedding if is_embedding else plan.layers),
                                 p.detach()))
    return same, total


def weight_bytes(model: Any, plan: WeightPlan) -> int:
    """Bytes one batch-1 decode step reads for the weights stored as ``plan`` (norms in fp32, as GGUF)."""
    net = causal_lm(model)
    is_embedding = {id(p): emb for _n, p, emb in matrices(net)}
    total = 0.0
    for p in {id(p): p for p in net.parameters()}.values():
        if id(p) in is_embedding:
            total += p.numel() * plan.bits("embedding" if is_embedding[id(p)] else "layers") / 8
        else:
            total += p.numel() * (4 if plan.layers not in ("bf16", "f16") else 2)
    return int(total)


# ---------------------------------------------------------------------------------------- measuring
@torch.inference_mode()
def chunked_perplexity(model: Any, token_ids: Sequence[int], n_ctx: int = 512,
                       max_chunks: int | None = None) -> float:
    """Perplexity the way ``llama-perplexity`` computes it, so the two engines' numbers compare.

    The text is cut into chunks of ``n_ctx`` tokens, each run as one prefill with no cache; only the
    second half of each chunk is scored (every scored token has at least ``n_ctx / 2`` tokens of
    context): the logits at positions n_ctx/2 .. n_ctx-2 predict the tokens after them.
    """
    net = causal_lm(model)
    ids = list(token_ids)
    chunks = len(ids) // n_ctx if max_chunks is None else min(max_chunks, len(ids) // n_ctx)
    if chunks < 1:
        raise ValueError(f"perplexity needs at least {n_ctx} tokens, got {len(ids)}")
    first, total, count = n_ctx // 2, 0.0, 0
    for c in range(chunks):
        chunk = torch.tensor(ids[c * n_ctx:(c + 1) * n_ctx], dtype=torch.long, device=net.device)
        meta = AttentionMetadata.for_prefill([n_ctx])
        hidden = net(chunk, meta.positions(net.device), meta)
        logits = net.compute_logits(hidden[first:-1]).float()
        total += float(torch.nn.functional.cross_entropy(logits, chunk[first + 1:], reduction="sum"))
        count += n_ctx - 1 - first
    return math.exp(total / count)


def greedy_tokens(llm: Any, prompts: Sequence[Sequence[int]], max_tokens: int) -> list[list[int]]:
    """Greedy continuations of every prompt, all ``max_tokens`` long (``ignore_eos``)."""
    from minengine.core.sampling_params import SamplingParams

    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    outs = llm.generate([{"prompt_token_ids": list(p)} for p in prompts], params, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outs]


def first_divergence(reference: Sequence[int], other: Sequence[int]) -> int:
    """Index of the first token where two greedy runs differ (their common length when none does)."""
    n = min(len(reference), len(other))
    return next((i for i in range(n) if reference[i] != other[i]), n)


@dataclass(frozen=True)
class Agreement:
    """How far a variant's greedy answers stay with the reference's."""

    token_share: float  # positions holding the same token, over all prompts
    identical: int  # prompts whose whole answer is the same
    first_diffs: tuple[int, ...]  # per prompt: where the answers part (= length when they never do)

    @property
    def median_first_diff(self) -> float:
        return float(np.median(self.first_diffs))


def agreement(reference: Sequence[Sequence[int]], other: Sequence[Sequence[int]]) -> Agreement:
    same = total = identical = 0
    diffs = []
    for ref, got in zip(reference, other, strict=True):
        n = min(len(ref), len(got))
        same += sum(a == b for a, b in zip(ref[:n], got[:n], strict=True))
        total += max(len(ref), 1)
        diffs.append(first_divergence(ref, got))
        identical += list(ref) == list(got)
    return Agreement(same / total, identical, tuple(diffs))


@dataclass(frozen=True)
class WeightResult:
    """One storage plan, measured on this run: bytes per step, perplexity, greedy agreement."""

    key: str
    plan: WeightPlan
    bytes_per_step: int
    perplexity: float
    agreement: Agreement
    tokens: list[list[int]]


def compare_plans(llm: Any, prompts: Sequence[Sequence[int]], text_ids: Sequence[int],
                  keys: Sequence[str | WeightPlan] = ("fp32", "bf16", "Q8_0", "Q4_0", "int3"),
                  max_tokens: int = 64, n_ctx: int = 512, max_chunks: int | None = None,
                  progress: bool = True) -> list[WeightResult]:
    """Perplexity and greedy agreement of each plan (a key of ``PLANS`` or a ``WeightPlan`` of your own);
    the first is the reference.

    Run it on an fp32 engine: each plan rounds the engine's own weights in place, then restores them.
    """
    results: list[WeightResult] = []
    reference: list[list[int]] | None = None
    for key in tqdm(keys, desc="weight formats", disable=not progress):
        plan = key if isinstance(key, WeightPlan) else PLANS[key]
        key = plan.label if isinstance(key, WeightPlan) else key
        for fmt in (plan.layers, plan.embedding):
            if fmt not in BITS_PER_WEIGHT:
                raise ValueError(f"unknown weight format {fmt!r}; known: {', '.join(BITS_PER_WEIGHT)}")
        with quantized_weights(llm, plan):
            tokens = greedy_tokens(llm, prompts, max_tokens)
            ppl = chunked_perplexity(llm, text_ids, n_ctx, max_chunks)
        reference = reference or tokens
        results.append(WeightResult(key, plan, weight_bytes(llm, plan), ppl, agreement(reference, tokens),
                                    tokens))
    return results
