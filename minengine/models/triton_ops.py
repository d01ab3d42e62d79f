"""A GPU's small ops in Triton: RMSNorm, RoPE and SiLU-and-multiply, one kernel each.

Why: in a CUDA graph a decode step of a small model is bound by the *number* of kernels, not by their
work: each costs a few microseconds on the GPU however little it does. Written as PyTorch ops, RMSNorm
is 4-6 kernels (cast, square-mean, rsqrt, multiply, cast, weight), RoPE 4 and SwiGLU's activation 2; a
Qwen3-0.6B decode step ran about 1,100 kernels and took 2.9 ms on an H200 whose memory could stream its
weights in 0.33 ms (benchmarks/RESULTS.md, gpu_check of 2026-12-04). One kernel each brings a layer
from ~40 kernels to ~14. vLLM ships the same three as CUDA kernels (``rms_norm``, ``rotary_embedding``,
``silu_and_mul``); the CPU has them as C++ (``csrc/``).

Each kernel rounds exactly where the PyTorch ops it replaces round (HF's order: the norm in fp32, cast
to the model's dtype, then the weight multiply in that dtype; each RoPE product rounded before the sum),
so in 16-bit they match the PyTorch path's bits except where a reduction's order differs by an ulp:
``tests/test_triton_ops.py`` checks that under ``TRITON_INTERPRET=1``. ``use_triton_ops(model)`` switches
a model's modules to them (the worker does,
on CUDA).
"""

from __future__ import annotations

import torch

from minengine.models.attention.triton_kernels import triton, triton_available
from minengine.utils import cdiv

if triton is not None:
    import triton.language as tl

    @triton.jit
    def rms_norm_kernel(x_ptr, w_ptr, out_ptr, stride_x_row, stride_x_head, stride_out_row, stride_out_head,
                        n_cols, eps, BLOCK: tl.constexpr):
        """Program (row, head) normalises one vector of ``n_cols``: [N, n_cols] or [N, heads, n_cols]."""
        row, head = tl.program_id(0), tl.program_id(1)
        cols = tl.arange(0, BLOCK)
        ok = cols < n_cols
        x_ptr += row.to(tl.int64) * stride_x_row + head * stride_x_head
        out_ptr += row.to(tl.int64) * stride_out_row + head * stride_out_head
        x = tl.load(x_ptr + cols, mask=ok, other=0.0).to(tl.float32)
        rstd = tl.math.rsqrt(tl.sum(x * x, 0) / n_cols + eps)
        y = (x * rstd).to(out_ptr.dtype.element_ty).to(tl.float32)  # HF: cast to the model's dtype first
        w = tl.load(w_ptr + cols, mask=ok, other=0.0).to(tl.float32)
        tl.store(out_ptr + cols, (w * y).to(out_ptr.dtype.element_ty), mask=ok)

    @triton.jit
    def rotary_kernel(qk_ptr, cos_ptr, sin_ptr, stride_token, stride_head, stride_table,
                      HEAD_DIM: tl.constexpr, BLOCK: tl.constexpr):
        """Program (token, head) rotates one head in place: out = x * cos + swap_halves(x) * sin."""
        token, head = tl.program_id(0), tl.program_id(1)
        d = tl.arange(0, BLOCK)
        ok = d < HEAD_DIM
        swapped = (d + HEAD_DIM // 2) % HEAD_DIM
        base = qk_ptr + token.to(tl.int64) * stride_token + head * stride_head
        x = tl.load(base + d, mask=ok, other=0.0)
        xs = tl.load(base + swapped, mask=ok, other=0.0)
        cos = tl.load(cos_ptr + token.to(tl.int64) * stride_table + d, mask=ok, other=0.0)
        sin = tl.load(sin_ptr + token.to(tl.int64) * stride_table + d, mask=ok, other=0.0)
        dtype = qk_ptr.dtype.element_ty
        a = (x.to(tl.float32) * cos.to(tl.float32)).to(dtype).to(tl.float32)  # each product rounded,
        b = (xs.to(tl.float32) * sin.to(tl.float32)).to(dtype).to(tl.float32)  # as PyTorch's ops round
        tl.debug_barrier()  # every lane has read its swapped partner before any lane writes
        tl.store(base + d, (a + b).to(dtype), mask=ok)

    @triton.jit
    def silu_and_mul_kernel(x_ptr, out_ptr, stride_x, stride_out, n_cols, BLOCK: tl.constexpr):
        """out[:, j] = silu(x[:, j]) * x[:, n_cols + j]: the gate and up halves of the fused projection."""
        row, block = tl.program_id(0), tl.program_id(1)
        cols = block * BLOCK + tl.arange(0, BLOCK)
        ok = cols < n_cols
        x_ptr += row.to(tl.int64) * stride_x
        gate = tl.load(x_ptr + cols, mask=ok, other=0.0).to(tl.float32)
        up = tl.load(x_ptr + n_cols + cols, mask=ok, other=0.0).to(tl.float32)
        dtype = out_ptr.dtype.element_ty
        act = (gate / (1.0 + tl.exp(-gate))).to(dtype).to(tl.float32)  # F.silu rounds, then the multiply
        tl.store(out_ptr + row.to(tl.int64) * stride_out + cols, (act * up).to(dtype), mask=ok)


def _block(n: int) -> int:
    return 1 << (n - 1).bit_length()


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float,
             out: torch.Tensor | None = None) -> torch.Tensor:
    """RMSNorm over the last dim of x ([N, C] or [N, H, C], last dim contiguous); ``out`` may be ``x``."""
    out = torch.empty_like(x) if out is None else out
    if x.numel() == 0:
        return out
    assert x.stride(-1) == 1 and out.stride(-1) == 1
    if x.dim() == 2:
        grid, strides = (x.shape[0], 1), (x.stride(0), 0, out.stride(0), 0)
    else:
        grid, strides = (x.shape[0], x.shape[1]), (x.stride(0), x.stride(1), out.stride(0), out.stride(1))
    rms_norm_kernel[grid](x, weight, out, *strides, x.shape[-1], eps, BLOCK=_block(x.shape[-1]))
    return out


def rotary_(qk: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate qk [N, H, D] in place with the step's tables cos/sin [N, 1, D] (``RotaryEmbedding.tables``)."""
    n, heads, d = qk.shape
    if n:
        assert qk.stride(2) == 1 and cos.stride(-1) == 1 and cos.stride() == sin.stride()
        rotary_kernel[(n, heads)](qk, cos, sin, qk.stride(0), qk.stride(1), cos.stride(0),
                                  HEAD_DIM=d, BLOCK=_block(d))
    return qk


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """[N, 2I] -> [N, I]: silu(gate) * up, in x's dtype."""
    n, width = x.shape
    out = torch.empty((n, width // 2), dtype=x.dtype, device=x.device)
    if n:
        assert x.stride(1) == 1
        block = min(1024, _block(width // 2))
        silu_and_mul_kernel[(n, cdiv(width // 2, block))](x, out, x.stride(0), out.stride(0), width // 2,
                                                              BLOCK=block)
    return out


def use_triton_ops(model: torch.nn.Module, on: bool = True) -> bool:
    """Switch the model's RMSNorm, RoPE and SwiGLU modules to these kernels (or back); returns ``on``.
    Raises with the reason when Triton cannot run here. Every module with a ``use_triton`` flag takes
    part (llama.py's RMSNorm, RotaryEmbedding and LlamaMLP), so this module need not import the model's."""
    if on and triton_available() is not None:
        raise RuntimeError(f"the Triton small ops cannot run here: {triton_available()}")
    for module in model.modules():
        if hasattr(module, "use_triton"):
            module.use_triton = on
    return on
