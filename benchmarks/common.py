"""Shared helpers for the benchmarks: machine info, random Llama models saved as HF folders, timing.

Why these exist: a CPU timing means little without the machine, the thread count and the load it ran
under, and minengine vs Hugging Face comparisons are only fair when both load the *same* weights from the
same folder. Every benchmark therefore builds its model here (random weights, a Llama shape, the shipped
tokenizer next to it) and prints ``machine_line()`` with its results.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from minengine.engine.threads import set_torch_threads
from minengine.perf.measure import blas_line, cpu_name

ROOT = Path(__file__).resolve().parent.parent
MODELS_DIR = ROOT / "benchmarks" / "out" / "models"  # git-ignored
TOKENIZER_DIR = ROOT / "minengine" / "assets" / "tinystories-4m"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")

# Llama shapes (HF config fields). Embeddings are tied, as in Llama 3.2 1B/3B, so every parameter is read
# once per decode step: the LM head *is* the embedding matrix. vocab 32000 is Llama 2's; the shipped
# tokenizer knows only its first 1753 ids and renders the others as nothing, which the engines ignore.
SHAPES: dict[str, dict[str, Any]] = {
    # ~100M parameters (75.5M in the 12 layers + 24.6M embedding/LM head): 400 MB in fp32, far larger
    # than the L2 caches, so a batch-1 decode step streams the weights from memory.
    "llama-100m": dict(hidden_size=768, intermediate_size=2048, num_hidden_layers=12, num_attention_heads=12,
                       num_key_value_heads=4, vocab_size=32000, max_position_embeddings=2048),
    # ~12M parameters: small enough that 64 mixed requests through seven engines fit 10 minutes.
    "llama-12m": dict(hidden_size=384, intermediate_size=1024, num_hidden_layers=6, num_attention_heads=6,
                      num_key_value_heads=2, vocab_size=8192, max_position_embeddings=2048),
    # SmolLM2-135M's shape (its config.json; tied embeddings, as here): for the Linear-layer benchmarks
    # that need only the matrices' shapes (linear_layers.py), beside the real model's own benchmarks.
    "smollm2-135m": dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                         num_key_value_heads=3, vocab_size=49152, max_position_embeddings=8192),
    # Smoke tests only: runs in milliseconds.
    "llama-tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                       num_key_value_heads=2, vocab_size=2048, max_position_embeddings=2048),
}


# ------------------------------------------------------------------------------------- machine info
def loadavg() -> tuple[float, float, float]:
    try:
        return os.getloadavg()
    except OSError:  # not available on every platform
        return (float("nan"),) * 3


def machine_info() -> dict[str, Any]:
    """What a reader needs to judge a CPU number: chip, cores, torch threads, versions, load right now."""
    import transformers

    return {
        "cpu": cpu_name(),
        "logical_cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "loadavg": [round(x, 2) for x in loadavg()],
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
    }


def machine_line(linear_shape: tuple[int, int] = (32000, 768)) -> str:
    """The run's machine, with the math library minengine's ``F.linear`` GEMVs go to (MKL, OpenBLAS...):
    the same call gets different kernels on different CPUs (lesson 02, section 3b), so it is part of the
    machine a figure belongs to; and which Linear kernels an engine picks for a matrix of
    ``linear_shape`` (the benchmark's model's largest: llama-100m's by default)."""
    m = machine_info()
    load = ", ".join(f"{x:.2f}" for x in m["loadavg"])
    return (f"machine: {m['cpu']}, {m['logical_cores']} logical cores, {m['torch_threads']} torch threads, "
            f"torch {m['torch']}, transformers {m['transformers']}, Python {m['python']}; "
            f"linear kernels: {blas_line().replace('; ', ', ')}; {_decode_attention(linear_shape)}; load "
            f"average {load}; {m['date']}")


def _decode_attention(shape: tuple[int, int]) -> str:
    """Which kernels a CPU fp32 engine runs here: decode attention (the C++ kernel, when built) and the
    Linear layers' choice for a matrix of this [out, in] shape (engines decide per shape)."""
    from minengine.models import cpu_kernels, linear_kernels

    cpu_kernels.load()
    line = cpu_kernels.describe().split(" (")[0]
    if linear_kernels.onednn_available():
        choice = linear_kernels.choose_for_shape(shape)
        choice = replace(choice, prepacked=choice.many_rows == "onednn")  # an engine's default
        line += "; " + choice.describe().replace("linear layers:",
                                                 f"linear layers ({shape[0]} x {shape[1]}):")
    return line


def command_line() -> str:
    return ".venv/bin/python " + " ".join([os.path.relpath(sys.argv[0], ROOT), *sys.argv[1:]])


def set_threads(n: int) -> int:
    """Set torch's intra-op threads (0 = leave torch's default); returns the count in use."""
    return set_torch_threads(n)


# ------------------------------------------------------------------------------------------ models
def hf_llama_config(shape: str | dict[str, Any], initializer_range: float = 0.1) -> Any:
    """A ``transformers.LlamaConfig`` of a named shape. The larger init (0.02 is HF's) keeps greedy output
    of random weights varied instead of one repeated token, as real text would be."""
    from transformers import LlamaConfig

    fields = dict(SHAPES[shape]) if isinstance(shape, str) else dict(shape)
    return LlamaConfig(**fields, tie_word_embeddings=True, rms_norm_eps=1e-5,
                       initializer_range=initializer_range, bos_token_id=0, eos_token_id=0, pad_token_id=0)


def model_dir(shape: str, dtype: str = "float32", seed: int = 0, root: Path | None = None) -> Path:
    """An HF folder (config, safetensors, the shipped tokenizer) for a random Llama of ``shape``; built
    once and reused (``benchmarks/out/models/<shape>-<dtype>-s<seed>``)."""
    from transformers import LlamaForCausalLM

    path = (root or MODELS_DIR) / f"{shape}-{dtype}-s{seed}"
    if (path / "model.safetensors").is_file() and (path / "tokenizer.json").is_file():
        return path
    torch.manual_seed(seed)
    model = LlamaForCausalLM(hf_llama_config(shape)).to(getattr(torch, dtype)).eval()
    tmp = path.with_name(path.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    for name in TOKENIZER_FILES:
        if (TOKENIZER_DIR / name).is_file():
            shutil.copy(TOKENIZER_DIR / name, tmp / name)
    shutil.rmtree(path, ignore_errors=True)
    tmp.rename(path)
    return path


def load_hf(path: Path, dtype: str = "float32", attn: str = "sdpa") -> Any:
    """The same folder loaded by transformers (eval mode, no grad)."""
    import transformers

    # transformers 5 renamed `torch_dtype=` to `dtype=`
    kw = "dtype" if int(transformers.__version__.split(".")[0]) >= 5 else "torch_dtype"
    model = transformers.AutoModelForCausalLM.from_pretrained(path, attn_implementation=attn,
                                                              **{kw: getattr(torch, dtype)})
    return model.eval().requires_grad_(False)


def weight_bytes(model: torch.nn.Module) -> int:
    """Bytes of all distinct parameters (a tied embedding/LM head counted once)."""
    seen: dict[int, int] = {}
    for p in model.parameters():
        seen[p.data_ptr()] = p.numel() * p.element_size()
    return sum(seen.values())


def num_params(model: torch.nn.Module) -> int:
    return sum({p.data_ptr(): p.numel() for p in model.parameters()}.values())


# ----------------------------------------------------------------------------------------- timing
def median(xs: Sequence[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def percentile(xs: Sequence[float], q: float) -> float:
    """numpy's default (linear) percentile, as vLLM's benchmark client reports them."""
    import numpy as np

    return float(np.percentile(np.asarray(xs, float), q)) if len(xs) else float("nan")


@dataclass
class Timed:
    """A labelled sample of seconds, with the load average seen when each sample was taken."""

    label: str
    seconds: list[float]
    loads: list[float]

    @property
    def median(self) -> float:
        return median(self.seconds)


def interleave(runs: dict[str, Callable[[], float]], rounds: int, progress: Any = None) -> dict[str, Timed]:
    """Call every run once per round, in a rotated order, so drifting machine load hits all of them alike.

    Each callable returns the number it measured (seconds); the result keeps one sample per round.
    """
    out = {name: Timed(name, [], []) for name in runs}
    names = list(runs)
    for r in range(rounds):
        for name in names[r % len(names):] + names[: r % len(names)]:
            value = runs[name]()
            out[name].seconds.append(value)
            out[name].loads.append(loadavg()[0])
            if progress is not None:
                progress.update(1)
    return out


def save_json(path: str | Path | None, data: dict[str, Any]) -> None:
    """Write a result file (if asked), with the machine and the command that made it."""
    if not path:
        return
    data = {"command": command_line(), "machine": machine_info(), **data}
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(data, indent=2, default=_jsonable) + "\n")


def _jsonable(value: Any) -> Any:
    """numpy scalars as numbers, anything else (paths, dtypes) as its text."""
    return float(value) if hasattr(value, "__float__") else str(value)


def md_table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A GitHub markdown table (what RESULTS.md holds)."""
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)
