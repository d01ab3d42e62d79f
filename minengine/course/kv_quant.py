"""Fake-quantised KV cache: what int8 and int4 keys and values cost in accuracy, measured on a real model.

Why *fake* quantisation: a real int8 cache stores small integers plus a scale and dequantises them when
attention reads them. What attention then computes with are the values ``round(x / scale) * scale``. We
store exactly those values (in the model's own dtype) and leave the bytes alone, so the accuracy effect is
the real one while the engine stays untouched; the bytes a real cache would save are computed
(:func:`kv_bytes_per_token`), not realised.

Where the rounding happens: keys are rounded *after* RoPE and values after ``v_proj`` -- the tensors
attention writes into the cache -- by forward hooks that :func:`quantized_kv_cache` adds and removes. With
no hooks installed (the default) nothing changes. Every cached token gets its own absmax scale, computed
when it is written (a decode step writes one token, so a scale shared over tokens would need a
calibration pass first): ``per-head`` keeps one scale per token and KV head (over ``head_dim`` values),
``per-token`` one per token over all its KV heads (fewer scales, coarser).
"""

from __future__ import annotations

import importlib.util
import math
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from minengine.models.attention import AttentionMetadata

SCHEMES = ("per-head", "per-token")
SCALE_BYTES = 2  # one fp16 scale per group, as int8/int4 cache formats keep them
HELDOUT_SEED = 1235  # scripts/train_tiny_model.py's held-out stories: seed + 1 of the training seed 1234


def qmax(bits: int) -> int:
    """Largest magnitude of a symmetric signed ``bits``-bit integer grid: 127 for int8, 7 for int4."""
    if bits not in (2, 3, 4, 5, 6, 7, 8):
        raise ValueError(f"bits must be between 2 and 8, got {bits!r}")
    return 2 ** (bits - 1) - 1


def fake_quantize(x: torch.Tensor, bits: int, scheme: str = "per-head") -> torch.Tensor:
    """Round ``x`` [tokens, kv_heads, head_dim] to a ``bits``-bit absmax grid and back (same shape, dtype).

    ``per-head``: one scale per token and head (max |x| over head_dim); ``per-token``: one per token over
    all heads. A group of zeros stays zero. Values already on the grid come back exactly.
    """
    if x.dim() != 3:
        raise ValueError(f"expected [tokens, kv_heads, head_dim], got shape {tuple(x.shape)}")
    if scheme not in SCHEMES:
        raise ValueError(f"scheme must be one of {SCHEMES}, got {scheme!r}")
    q = qmax(bits)
    xf = x.float()
    dims = (-1,) if scheme == "per-head" else (-2, -1)
    amax = xf.abs().amax(dim=dims, keepdim=True)
    scale = torch.where(amax > 0, amax / q, torch.ones_like(amax))
    return (torch.clamp(torch.round(xf / scale), -q, q) * scale).to(x.dtype)


def kv_bytes_per_token(config: Any, bits: int | None, scheme: str = "per-head",
                       dtype_bytes: int = 2) -> float:
    """Cache bytes per token: ``2 x layers x kv_heads x head_dim`` elements of ``bits`` bits, plus scales.

    ``bits=None`` is the unquantised cache at ``dtype_bytes`` per element (2: bf16/fp16, 4: fp32).
    """
    layers, heads, dim = config.num_hidden_layers, config.num_key_value_heads, config.head_dim
    if bits is None:
        return 2 * layers * heads * dim * dtype_bytes
    scales = heads if scheme == "per-head" else 1
    return 2 * layers * (heads * dim * bits / 8 + scales * SCALE_BYTES)


def _decoder(model: Any) -> Any:
    """The ``LlamaModel`` inside an ``LLM``, an ``LLMEngine``, a ``LlamaForCausalLM`` or itself."""
    engine = getattr(model, "llm_engine", model)
    module = getattr(engine, "model", engine)  # LLMEngine.model -> LlamaForCausalLM
    return getattr(module, "model", module)  # LlamaForCausalLM.model -> LlamaModel


@contextmanager
def quantized_kv_cache(model: Any, bits: int | None, scheme: str = "per-head") -> Iterator[None]:
    """Inside this block, every key and value the model writes to its cache is fake-quantised.

    ``model`` is an ``LLM``, ``LLMEngine`` or minengine Llama. ``bits=None`` changes nothing (the
    reference run). The hooks are removed on exit, even after an error.
    """
    if bits is None:
        yield
        return
    qmax(bits)  # validate before installing anything
    if scheme not in SCHEMES:
        raise ValueError(f"scheme must be one of {SCHEMES}, got {scheme!r}")
    decoder = _decoder(model)
    kv_heads = decoder.layers[0].self_attn.num_kv_heads

    def on_rope(_module: Any, _args: Any, output: tuple[torch.Tensor, torch.Tensor]) -> Any:
        q, k = output  # RoPE has rotated the keys: these are what the cache stores
        return q, fake_quantize(k, bits, scheme)

    def on_values(_module: Any, _args: Any, v: torch.Tensor) -> torch.Tensor:
        n = v.shape[0]
        return fake_quantize(v.view(n, kv_heads, -1), bits, scheme).view(n, -1)

    handles = [decoder.rotary_emb.register_forward_hook(on_rope)]
    handles += [layer.self_attn.v_proj.register_forward_hook(on_values) for layer in decoder.layers]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


# ------------------------------------------------------------------------------------- measuring
def heldout_stories(num_docs: int = 12) -> list[str]:
    """The first ``num_docs`` stories of the shipped model's held-out set (never trained on).

    They come from the repository's ``scripts/story_corpus.py`` with the seed the training script used
    for its held-out split, so the text is from the training grammar but no story was seen in training.
    """
    path = Path(__file__).resolve().parents[2] / "scripts" / "story_corpus.py"
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing: the held-out stories come from the course repository's "
                                "scripts/story_corpus.py")
    spec = importlib.util.spec_from_file_location("_minengine_story_corpus", path)
    assert spec is not None and spec.loader is not None
    module = sys.modules.get(spec.name)
    if module is None:  # dataclasses in the module look themselves up in sys.modules
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
    return list(module.generate_corpus(num_docs, seed=HELDOUT_SEED))


@torch.inference_mode()
def perplexity(model: Any, token_ids: Sequence[int], window: int = 512) -> float:
    """exp(mean next-token loss) over ``token_ids``, in windows of ``window`` tokens (teacher forcing).

    Each window runs as one prefill with no cache, so its keys and values pass through any installed
    quantisation hooks exactly as they would on their way into the cache.
    """
    net = getattr(getattr(model, "llm_engine", model), "model", model)  # the LlamaForCausalLM
    ids = torch.tensor(list(token_ids), dtype=torch.long, device=net.device)
    total, count = 0.0, 0
    for start in range(0, len(ids) - 1, window):
        chunk = ids[start:start + window + 1]
        if len(chunk) < 2:
            break
        inputs, targets = chunk[:-1], chunk[1:]
        meta = AttentionMetadata.for_prefill([len(inputs)])
        logits = net.compute_logits(net(inputs, meta.positions(net.device), meta)).float()
        total += float(torch.nn.functional.cross_entropy(logits, targets, reduction="sum"))
        count += len(targets)
    if count == 0:
        raise ValueError("perplexity needs at least two tokens")
    return math.exp(total / count)


def greedy_tokens(llm: Any, prompts: Sequence[Sequence[int]], max_tokens: int) -> list[list[int]]:
    """Greedy continuations (``ignore_eos``: every run has the same length) from the engine."""
    from minengine.core.sampling_params import SamplingParams

    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    outs = llm.generate([{"prompt_token_ids": list(p)} for p in prompts], params, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outs]


def agreement(reference: Sequence[Sequence[int]], other: Sequence[Sequence[int]]) -> tuple[float, float]:
    """(share of positions with the same token, mean length of the common prefix as a share).

    After the first different token a greedy run follows its own text, so the common prefix is the
    stricter number; the position-wise share also counts where the two runs fall back into step.
    """
    same = prefix = total = 0
    for ref, got in zip(reference, other, strict=True):
        n = min(len(ref), len(got))
        same += sum(a == b for a, b in zip(ref[:n], got[:n], strict=True))
        prefix += next((i for i in range(n) if ref[i] != got[i]), n)
        total += max(len(ref), 1)
    return same / total, prefix / total


@dataclass(frozen=True)
class QuantResult:
    """One cache format, measured: bytes per token, greedy agreement with fp32, held-out perplexity."""

    label: str
    bits: int | None
    scheme: str
    bytes_per_token: float
    token_agreement: float
    prefix_agreement: float
    perplexity: float


def compare_formats(llm: Any, prompts: Sequence[Sequence[int]], text_ids: Sequence[int], max_tokens: int = 48,
                    formats: Sequence[tuple[int | None, str]] = ((None, "per-head"), (8, "per-head"),
                                                                  (8, "per-token"), (4, "per-head"),
                                                                  (4, "per-token")),
                    progress: bool = True) -> list[QuantResult]:
    """Greedy agreement and perplexity for each (bits, scheme), the first being the reference.

    Bytes are for a bf16 model (the usual serving dtype) so the saving reads as on a GPU; the shipped
    model computes in fp32 here, which only changes the reference row (4 bytes instead of 2).
    """
    model_config = getattr(getattr(llm, "llm_engine", llm), "model", llm).config
    results, reference = [], None
    for bits, scheme in tqdm(formats, desc="KV formats", disable=not progress):
        with quantized_kv_cache(llm, bits, scheme):
            tokens = greedy_tokens(llm, prompts, max_tokens)
            ppl = perplexity(llm, text_ids)
        if reference is None:
            reference = tokens
        token_share, prefix_share = agreement(reference, tokens)
        label = "unquantised" if bits is None else f"int{bits} {scheme}"
        results.append(QuantResult(label, bits, scheme, kv_bytes_per_token(model_config, bits, scheme),
                                   token_share, prefix_share, ppl))
    return results
