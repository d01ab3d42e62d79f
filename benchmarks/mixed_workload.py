"""The mixed offline workload of ``throughput.py`` and ``throughput_breakdown.py``, and its floors.

nano-vllm's benchmark scaled to a 2-core CPU: N requests (64), prompt lengths uniform in [16, 512], output
lengths uniform in [16, 256], random token ids, greedy, ``ignore_eos`` (every request generates exactly
its output length), all sent at time 0. ``workload_flops`` is the least arithmetic it needs, and
``read_aware_floor`` adds the weights' and K/V's read per decode step: no engine can run it faster than
either divided by the machine's peak and bandwidth.
"""

from __future__ import annotations

import argparse
import random
from typing import Any

Workload = list[tuple[list[int], int]]  # (prompt token ids, output length)


def make_workload(n: int, prompt_range: tuple[int, int], output_range: tuple[int, int], vocab: int,
                  seed: int = 0) -> Workload:
    rng = random.Random(seed)
    return [([rng.randrange(3, vocab) for _ in range(rng.randint(*prompt_range))], rng.randint(*output_range))
            for _ in range(n)]


def per_token_shape(config: Any) -> tuple[int, int, int, int]:
    """(weights each token multiplies through, query width, KV width, LM-head weights) of a Llama config."""
    h, layers = config.hidden_size, config.num_hidden_layers
    head_dim = getattr(config, "head_dim", None) or h // config.num_attention_heads
    q, kv = config.num_attention_heads * head_dim, config.num_key_value_heads * head_dim
    linear = layers * (h * (q + 2 * kv) + q * h + 3 * h * config.intermediate_size)
    return linear, q, kv, h * config.vocab_size


def workload_flops(config: Any, w: Workload) -> float:
    """FLOPs the workload needs at the least: projections + MLP per computed token, causal attention per
    (query, key) pair, the LM head per output token. The last output token is sampled, never computed."""
    linear, q, _, head = per_token_shape(config)
    attention_per_pair = config.num_hidden_layers * 4 * q  # QK^T and PV, every head
    total = 0.0
    for prompt, out in w:
        n = len(prompt) + out - 1  # tokens computed
        total += 2 * linear * n + attention_per_pair * n * (n + 1) / 2 + 2 * head * out
    return total


def read_aware_floor(config: Any, w: Workload, peak_flops: float, read_bytes_per_s: float,
                     dtype_bytes: int = 4) -> float:
    """A tighter lower bound than the compute floor, in seconds: every prompt at the matmul peak, then one
    decode step per output token with every unfinished request in it, each step no faster than the larger
    of its FLOPs at the peak and its bytes (every weight once, every row's K/V) at the read bandwidth.

    Small decode batches are bound by the weights' read, which the compute floor leaves out; no engine
    can beat this either (it even assumes every prompt is done before the first decode step)."""
    linear, q, kv, head = per_token_shape(config)
    layers = config.num_hidden_layers
    weight_bytes = dtype_bytes * (linear + head * (1 if getattr(config, "tie_word_embeddings", False) else 2))
    kv_bytes_per_token = dtype_bytes * 2 * layers * kv
    prompts = sum(2 * linear * len(p) + layers * 4 * q * len(p) * (len(p) + 1) / 2 + 2 * head for p, _ in w)
    seconds = prompts / peak_flops
    for t in range(1, max(o for _, o in w)):  # decode step t computes token t of each unfinished request
        contexts = [len(p) + t for p, o in w if o > t]
        flops = sum(2 * linear + layers * 4 * q * c + 2 * head for c in contexts)
        read = weight_bytes + kv_bytes_per_token * sum(contexts)
        seconds += max(flops / peak_flops, read / read_bytes_per_s)
    return seconds


def add_args(ap: argparse.ArgumentParser) -> None:
    """The workload's and the engines' sizing options (both scripts take the same), and ``--smoke``."""
    ap.add_argument("--num-requests", type=int, default=64)
    ap.add_argument("--prompt-range", default="16,512")
    ap.add_argument("--output-range", default="16,256")
    ap.add_argument("--chunk", type=int, default=512, help="token budget per step (chunked prefill, HF CB)")
    ap.add_argument("--max-model-len", type=int, default=1024)
    ap.add_argument("--max-num-seqs", type=int, default=64)
    ap.add_argument("--kv-tokens", type=int, default=65536, help="KV cache size in tokens (every engine)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--smoke", action="store_true", help="tiny model, 6 short requests")


def apply_smoke(args: argparse.Namespace) -> None:
    """``--smoke``: a tiny model and 6 short requests, in seconds."""
    args.shape, args.num_requests, args.prompt_range, args.output_range = "llama-tiny", 6, "4,40", "2,12"
    args.chunk, args.max_model_len, args.kv_tokens = 32, 64, 2048


def from_args(args: argparse.Namespace, vocab: int) -> Workload:
    """The workload the options describe, for a vocabulary of ``vocab`` ids."""
    return make_workload(args.num_requests, _range(args.prompt_range), _range(args.output_range), vocab,
                         args.seed)


def _range(text: str) -> tuple[int, int]:
    lo, hi = (int(x) for x in text.split(","))
    return lo, hi
