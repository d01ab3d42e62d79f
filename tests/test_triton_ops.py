"""The GPU's small ops in Triton (``models/triton_ops.py``) against the PyTorch ops they replace, run by
Triton's interpreter on a CPU (``conftest.py`` sets ``TRITON_INTERPRET=1`` without CUDA); and a whole
model forward with them switched on, against the same model without."""

from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F

from minengine.models import triton_ops
from minengine.models.attention.triton_kernels import triton_available

pytestmark = pytest.mark.skipif(triton_available() is not None, reason=str(triton_available()))

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def _hf_rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """transformers' LlamaRMSNorm: fp32 statistics, cast back, then the weight multiply in x's dtype."""
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return w * h.to(x.dtype)


# Triton's interpreter casts fp32 to bf16 by truncation where a GPU rounds to nearest even (numpy has no
# bf16): there, a bf16 result may sit an ulp or two from PyTorch's; fp16 (numpy's own) rounds as a GPU does.
BF16_TRUNCATED = os.environ.get("TRITON_INTERPRET") == "1"


def _close(got: torch.Tensor, want: torch.Tensor) -> None:
    """fp32: to rounding; 16-bit: the same bits except an ulp where a reduction's order differs."""
    if got.dtype == torch.float32:
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
        return
    ulp = 2.0 ** (-7 if got.dtype == torch.bfloat16 else -10)
    if got.dtype == torch.bfloat16 and BF16_TRUNCATED:
        torch.testing.assert_close(got.float(), want.float(), atol=2e-2, rtol=2 * ulp)
        return
    torch.testing.assert_close(got.float(), want.float(), atol=1e-3, rtol=ulp)
    assert (got == want).float().mean() > 0.95  # almost all bit-identical


@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm_matches_hf(dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(5, 96, generator=g) * 3).to(dtype).to(DEVICE)
    w = (torch.rand(96, generator=g) + 0.5).to(dtype).to(DEVICE)
    _close(triton_ops.rms_norm(x, w, 1e-6), _hf_rms_norm(x, w, 1e-6))


@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm_per_head_in_place_on_a_strided_view(dtype: torch.dtype) -> None:
    """Qwen3's q/k norm: heads of a [N, H, D] view with a row stride wider than H * D, in place."""
    g = torch.Generator().manual_seed(1)
    buf = torch.randn(3, 7 * 32 + 5, generator=g).to(dtype).to(DEVICE)  # 5 extra columns per row
    view = buf[:, : 7 * 32].view(3, 7, 32)
    q = view[:, :4]
    w = torch.rand(32, generator=g).to(dtype).to(DEVICE)
    want = _hf_rms_norm(q.clone(), w, 1e-6)
    untouched = buf[:, 4 * 32:].clone()
    triton_ops.rms_norm(q, w, 1e-6, out=q)
    _close(q, want)
    assert torch.equal(buf[:, 4 * 32:], untouched)


@pytest.mark.parametrize("dtype", DTYPES)
def test_rotary_matches_the_four_ops(dtype: torch.dtype) -> None:
    from minengine.models.config import ModelConfig
    from minengine.models.llama import RotaryEmbedding

    cfg = ModelConfig.from_hf(dict(architectures=["LlamaForCausalLM"], hidden_size=128, intermediate_size=256,
                                   num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
                                   vocab_size=64, max_position_embeddings=512))
    rope = RotaryEmbedding(cfg, device=DEVICE)
    positions = torch.tensor([0, 5, 77, 300], device=DEVICE)
    cos, sin = rope.tables(positions, dtype)
    qk = torch.randn(4, 6, 32, generator=torch.Generator().manual_seed(2)).to(dtype).to(DEVICE)
    x1, x2 = qk.chunk(2, -1)
    want = qk * cos + torch.cat((x2, x1), -1) * sin
    got = triton_ops.rotary_(qk.clone(), cos, sin)
    if dtype == torch.bfloat16 and BF16_TRUNCATED:
        _close(got, want)
    else:
        assert torch.equal(got, want) if dtype != torch.float32 else torch.allclose(got, want, atol=1e-6)


@pytest.mark.parametrize("dtype", DTYPES)
def test_silu_and_mul_matches_torch(dtype: torch.dtype) -> None:
    x = torch.randn(3, 2 * 1500, generator=torch.Generator().manual_seed(3)).to(dtype).to(DEVICE)
    gate, up = x.chunk(2, -1)
    want = F.silu(gate) * up
    _close(triton_ops.silu_and_mul(x), want)


def test_a_model_with_the_triton_ops_gives_the_same_logits() -> None:
    """A Qwen3-shaped model (q/k norm included) in fp32: logits with the ops on match those without."""
    from minengine.models.attention import AttentionMetadata
    from minengine.models.loader import build_random_model

    cfg = dict(architectures=["Qwen3ForCausalLM"], model_type="qwen3", hidden_size=64, intermediate_size=96,
               num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=97,
               max_position_embeddings=64)
    model = build_random_model(cfg, device=DEVICE, dtype=torch.float32, std=0.2)
    ids = torch.tensor([3, 14, 15, 92, 65, 35], device=DEVICE)
    meta = AttentionMetadata.for_prefill([4, 2])
    with torch.inference_mode():
        want = model.compute_logits(model(ids, meta.positions(DEVICE), meta))
        triton_ops.use_triton_ops(model)
        try:
            got = model.compute_logits(model(ids, meta.positions(DEVICE), meta))
        finally:
            triton_ops.use_triton_ops(model, on=False)
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    assert torch.equal(got.argmax(-1), want.argmax(-1))
