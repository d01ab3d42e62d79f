"""Per-operation efficiencies: the fraction of a datasheet peak each kind of kernel reaches.

A datasheet gives one FLOP/s peak and one bandwidth; kernels reach different fractions of them. The
per-operation roofline (``minengine.perf.roofline``) prices every operation of a step against its own
ceiling, with one of four efficiencies:

* ``gemm_compute``: large dense matmuls (QKV/O projections, MLP, LM head at prefill sizes), fraction of
  the dense tensor-core peak.
* ``weight_stream``: streaming the weights through skinny matmuls (decode GEMV at small batch), fraction
  of the HBM bandwidth.
* ``kv_stream``: streaming K/V through decode attention (PagedAttention / FlashDecoding kernels over many
  sequences), and the element-wise kernels (norms, activations, residual adds), fraction of bandwidth.
* ``attention_compute``: FlashAttention over a prefill chunk (the quadratic pairs), fraction of the
  dense peak; far below ``gemm_compute`` at the chunk sizes a server uses (512-2k tokens).

Rows are per accelerator and weight-dtype class ("16" for fp16/bf16, "8" for fp8); a lookup falls back
from (gpu, dtype) to (gpu, "16") to ``GENERIC``. Each row says where its numbers come from. A measured
machine (``measure_this_machine``) has no row: ``minengine.sim.calibrate`` fits its efficiencies.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

# Which efficiencies price each op: (compute, memory); None where the op has no FLOPs worth counting.
OP_EFFICIENCIES: dict[str, tuple[str | None, str]] = {
    "qkv_o_proj": ("gemm_compute", "weight_stream"),
    "mlp": ("gemm_compute", "weight_stream"),
    "lm_head": ("gemm_compute", "weight_stream"),
    "prefill_attention": ("attention_compute", "kv_stream"),
    "decode_attention": ("attention_compute", "kv_stream"),
    "elementwise": (None, "kv_stream"),
    "sampling": (None, "kv_stream"),
}


@dataclass(frozen=True)
class Efficiency:
    """Fractions of peak FLOP/s and bandwidth reached by each kind of operation (see module docstring)."""

    gemm_compute: float
    weight_stream: float
    kv_stream: float
    attention_compute: float
    source: str = ""

    def scaled(self, compute: float | None = None, memory: float | None = None) -> Efficiency:
        """All compute efficiencies set to ``compute`` and all memory ones to ``memory`` (where given)."""
        out = self
        if compute is not None:
            out = replace(out, gemm_compute=compute, attention_compute=compute)
        if memory is not None:
            out = replace(out, weight_stream=memory, kv_stream=memory)
        return out


# A100 figures. weight_stream: gpt-fast (PyTorch blog "Accelerating Generative AI with PyTorch II: GPT,
# Fast", 2023) decodes Llama-2-7B bf16 at batch 1 at 1,397 GB/s effective on a 2,039 GB/s A100 (0.685,
# overheads included); Vidur's A100 operator profiles (Agrawal et al., MLSys 2024), used by the
# profile-based reference in issue 14, show ~0.74 for the GEMV itself. kv_stream: those profiles show
# ~0.9 of bandwidth for the PagedAttention kernel alone at large batch; end to end, KV-heavy published runs
# (TensorRT-LLM 0.5.0 performance.md, A100 FP16, LLaMA 7B 32x128/2048; lmdeploy v0.1.0a1 A100 static
# benchmark, llama2-7b 64x128/2048) and the reference's 100-decode step fit 0.80 (block-table gathers,
# launch gaps): calibrated on those. gemm_compute: calibrated on the profiles' 512-token Llama-2-7B
# prefill (~37 ms, issue 14), i.e. ~200 TFLOP/s in cuBLAS bf16 at M = 512 (lmdeploy's 2,048-token
# first-token latency, 139 ms, suggests ~0.69 at larger M).
# attention_compute: FlashAttention-2 (Dao, 2023, Fig. 5/6: causal forward, head dim 128, A100) runs at
# roughly 100-130 TFLOP/s at 512-1k tokens (~0.35-0.4 of peak) and reaches ~0.6-0.7 only at 8k-16k.
_A100 = Efficiency(0.65, 0.74, 0.80, 0.40,
                   "A100: gpt-fast, Vidur profiles (issue 14), TRT-LLM/lmdeploy tables; FlashAttention-2 "
                   "Fig. 5")
# Hopper: no profile here. Assumed the A100 fractions (H100's larger peak is, if anything, harder to
# reach: cuBLAS bf16 runs ~600-700 of 989 TFLOP/s on big GEMMs, ~0.65); FlashAttention-2 on H100 (not
# FA-3) runs ~0.35 of peak at these lengths. fp8: GEMMs reach a lower fraction of the doubled fp8 peak
# (assumed 0.5, a round figure). Checked since: with these rows the model lands at 0.89-1.02x of
# TensorRT-LLM's published H100 FP8 peak-throughput table (v0.6.1, LLaMA 7B, four shapes) and within 10 %
# of its 2,048-token first-token latency (tests/test_roofline.py).
_HOPPER = Efficiency(0.65, 0.74, 0.80, 0.35, "Hopper: assumed A100 fractions (no profile here)")

_HOPPER_FP8 = "Hopper fp8: 0.5 of fp8 peak, checked on TensorRT-LLM v0.6.1's H100 FP8 table (0.89-1.02x)"

GENERIC = Efficiency(0.6, 0.7, 0.8, 0.35, "generic assumption: 60 % of peak FLOP/s, 70-80 % of bandwidth")

EFFICIENCIES: dict[tuple[str, str], Efficiency] = {
    ("a100-80gb", "16"): _A100,
    ("a100-40gb", "16"): _A100,
    ("h100-sxm", "16"): _HOPPER,
    ("h100-pcie", "16"): _HOPPER,
    ("h200", "16"): _HOPPER,
    ("h100-sxm", "8"): replace(_HOPPER, gemm_compute=0.5, source=_HOPPER_FP8),
    ("h200", "8"): replace(_HOPPER, gemm_compute=0.5, source=_HOPPER_FP8),
}


def efficiency_for(accelerator_key: str, weight_bytes_per_param: float) -> Efficiency:
    """The table's row for this accelerator and weight width (falls back to 16-bit, then GENERIC)."""
    dtype = "8" if weight_bytes_per_param <= 1 else "16"
    return EFFICIENCIES.get((accelerator_key, dtype)) or EFFICIENCIES.get((accelerator_key, "16")) or GENERIC
