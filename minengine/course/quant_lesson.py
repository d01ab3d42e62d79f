"""Lesson 04's real-model sections: KV sizes from SmolLM2's own metadata, and what a decode step reads
when weights and KV cache are stored in each format.

Why a module: the lesson reads the installed GGUF file's metadata (not a copied table), builds its chat
prompts and held-out text the same way the quantization benchmark does (``benchmarks/quantization.py``),
so the small numbers a learner measures and the benchmark's full ones come from one code path.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from minengine.course.kv_quant import heldout_stories, kv_bytes_per_token
from minengine.course.weight_quant import PLANS, weight_bytes

HELDOUT_PROSE = Path(__file__).resolve().parents[1] / "assets" / "heldout" / "prose.txt"
# Chat prompts for greedy agreement: everyday questions a small assistant answers in a few sentences.
CHAT_PROMPTS = (
    "What is the capital of France?",
    "Give me three tips for sleeping well.",
    "Explain what a CPU cache is in one paragraph.",
    "Write a short poem about the sea.",
    "How do I boil an egg?",
    "What causes rain?",
    "Suggest a name for a small bakery.",
    "Why do leaves change colour in autumn?",
    "What is the difference between a list and a tuple in Python?",
    "Describe a cat to someone who has never seen one.",
)
GGUF_KV_KEYS = ("llama.block_count", "llama.attention.head_count", "llama.attention.head_count_kv",
                "llama.rope.dimension_count", "llama.embedding_length")


def chat_prompt_ids(tokenizer: Any, prompts: Sequence[str] = CHAT_PROMPTS) -> list[list[int]]:
    """Each prompt as one user turn in the model's chat template, ready for the assistant's answer."""
    if not getattr(tokenizer, "chat_template", None):  # the tiny model has none: plain text prompts
        return [tokenizer.encode(p) for p in prompts]
    return [list(tokenizer.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True,
                                               tokenize=True, return_dict=False)) for p in prompts]


def heldout_text(model_name: str) -> str:
    """Text the model never trained on: the package's English prose for a real model; for the tiny story
    model (which knows only its story grammar) the training script's held-out stories."""
    from minengine.course.lessons import TINY_MODEL

    if model_name == TINY_MODEL:
        return "".join(heldout_stories(24))
    return HELDOUT_PROSE.read_text(encoding="utf-8")


def heldout_ids(model_name: str, tokenizer: Any) -> list[int]:
    return list(tokenizer.encode(heldout_text(model_name), add_special_tokens=False))


# ------------------------------------------------------------------------------------------ GQA facts
@dataclass(frozen=True)
class GGUFKVFacts:
    """The metadata keys that set a GGUF model's KV cache, and the calculator's spec built from them."""

    path: Path
    keys: dict[str, Any]
    spec: Any  # minengine.perf.model_spec.KVSpec


def gguf_kv_facts(path: str | Path) -> GGUFKVFacts:
    """Read a GGUF file's metadata (no weights are loaded) and build the KV calculator's spec from it."""
    from minengine.models.gguf import read_config
    from minengine.perf.model_spec import from_hf_config

    meta, config = read_config(path)
    config["torch_dtype"] = "bfloat16"  # size the cache as a bf16 server would, like the presets
    spec = from_hf_config(config, name=Path(path).stem)
    return GGUFKVFacts(Path(path), {k: meta.get(k) for k in GGUF_KV_KEYS}, spec)


@dataclass(frozen=True)
class GQARow:
    """One model's KV cache per token, as stored and as multi-head attention would need it."""

    name: str
    layers: int
    q_heads: int
    kv_heads: int
    head_dim: int
    bytes_per_token: float  # bf16
    mha_bytes_per_token: float  # the same model with one KV head per query head

    @property
    def saving(self) -> float:
        return self.mha_bytes_per_token / self.bytes_per_token


def gqa_row(name: str, spec: Any, dtype_bytes: int = 2) -> GQARow:
    """GQA arithmetic for a calculator spec (MHA, GQA or MQA models; MLA has its own formula)."""
    per_head = 2 * spec.num_layers * spec.head_dim * dtype_bytes
    return GQARow(name, spec.num_layers, spec.num_attention_heads, spec.num_kv_heads, spec.head_dim,
                  per_head * spec.num_kv_heads, per_head * spec.num_attention_heads)


# ------------------------------------------------------------------------------- bytes per decode step
# name -> (bits, bytes of an unquantised element)
KV_FORMATS = {"bf16": (None, 2), "int8": (8, 2), "int4": (4, 2)}


@dataclass(frozen=True)
class StepBytes:
    """What one decode step reads: every weight once, plus every running sequence's cached K and V."""

    weights: str
    kv: str
    batch: int
    context: int
    weight_bytes: float
    kv_bytes: float

    @property
    def total(self) -> float:
        return self.weight_bytes + self.kv_bytes

    def floor_ms(self, bandwidth: float) -> float:
        """The step can be no faster than its bytes over this machine's read bandwidth (bytes/s)."""
        return self.total / bandwidth * 1e3


def step_bytes(model: Any, config: Any, weights: Sequence[str], kv: Sequence[str], batch: int,
               context: int) -> list[StepBytes]:
    """Bytes per decode step for each (weight plan, KV format), ``batch`` sequences of ``context`` tokens.

    KV formats are fake-quantised per token and head with an fp16 scale (``kv_quant``), so int8/int4
    include their scales.
    """
    rows = []
    for w in weights:
        wb = weight_bytes(model, PLANS[w])
        for k in kv:
            bits, elem = KV_FORMATS[k]
            per_token = kv_bytes_per_token(config, bits, "per-head", elem)
            rows.append(StepBytes(PLANS[w].label, k, batch, context, wb, per_token * batch * context))
    return rows


def model_kv_spec(name: str) -> tuple[Any, GGUFKVFacts | None]:
    """A model's KV calculator spec: read from its GGUF metadata when it is a packaged GGUF model (the
    facts come back too, to print), else from its ``config.json``."""
    from minengine.models.loader import ModelPackageMissingError, packaged_model_file, resolve_model_path
    from minengine.perf.model_spec import from_hf_config

    try:
        facts = gguf_kv_facts(packaged_model_file(name))
        return facts.spec, facts
    except (ModelPackageMissingError, KeyError, ValueError):
        return from_hf_config(resolve_model_path(name), name=name), None


def format_gqa_table(rows: Sequence[GQARow]) -> str:
    lines = [f"{'model':>24} {'layers':>6} {'q heads':>7} {'KV heads':>8} {'head_dim':>8} {'KV/token':>10} "
             f"{'as MHA':>10} {'GQA saves':>9}"]
    for r in rows:
        lines.append(f"{r.name:>24} {r.layers:6d} {r.q_heads:7d} {r.kv_heads:8d} {r.head_dim:8d} "
                     f"{r.bytes_per_token / 1024:7.1f} KiB {r.mha_bytes_per_token / 1024:6.1f} KiB "
                     f"{r.saving:8.0f}x")
    return "\n".join(lines)


def format_step_table(rows: Sequence[StepBytes], bandwidth: float) -> str:
    """One line per weight format; per KV format the step's MB and its floor at ``bandwidth`` bytes/s."""
    kvs = list(dict.fromkeys(r.kv for r in rows))
    head = f"{'weights':>18} {'weights MB':>10} " + " ".join(f"{'KV ' + k + ': MB, floor':>24}" for k in kvs)
    lines = [head]
    for w in dict.fromkeys(r.weights for r in rows):
        mine = {r.kv: r for r in rows if r.weights == w}
        first = next(iter(mine.values()))
        cells = [f"{mine[k].total / 1e6:12,.0f} MB {mine[k].floor_ms(bandwidth):6.1f} ms" for k in kvs]
        lines.append(f"{w:>18} {first.weight_bytes / 1e6:10.1f} " + " ".join(f"{c:>24}" for c in cells))
    return "\n".join(lines)


def format_results(results: Sequence[Any], bandwidth: float) -> str:
    """``weight_quant.compare_plans`` results as a table: bytes, floor, perplexity and agreement."""
    ref = results[0].perplexity
    lines = [f"{'weights':>18} {'MB/step':>8} {'floor':>8} {'perplexity':>10} {'vs ref':>7} "
             f"{'tokens same':>11} {'answers same':>12} {'parted at':>9}"]
    for r in results:
        a = r.agreement
        lines.append(f"{r.plan.label:>18} {r.bytes_per_step / 1e6:8.1f} "
                     f"{r.bytes_per_step / bandwidth * 1e3:5.1f} ms {r.perplexity:10.3f} "
                     f"{100 * (r.perplexity / ref - 1):+6.1f}% {100 * a.token_share:10.0f}% "
                     f"{a.identical:>5d} of {len(a.first_diffs):<3d} {a.median_first_diff:9.0f}")
    return "\n".join(lines)
