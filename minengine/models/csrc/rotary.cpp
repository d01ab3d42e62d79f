// RoPE as one in-place call on the CPU: the rotate-half rotation of q and k (vLLM's `rotary_embedding` op
// does the same on a GPU, also in place).
//
// Why: in PyTorch the rotation is four ops per layer (x * cos, the halves swapped by a cat, that times
// sin, the sum), each writing a fresh tensor of all q and k heads. At batch 1 that is four dispatches of a
// few microseconds around a few hundred multiplies; at a 512-token prompt chunk, four passes over 2 MB.
// Here the heads are rotated where the fused qkv projection left them, in one pass.
//
//   qk   [N, H, D] float32 (q's heads then k's); rows may have any stride (qk is a view of the projection's
//        output, whose rows also hold v), each row's H x D floats contiguous. Rotated in place.
//   cos  [N, 1, D] or [N, D], the full-width rows of RotaryEmbedding.tables: (cos, cos)
//   sin  the same shape: (-sin, sin), so that  y = x * cos + swap_halves(x) * sin
//
// The same arithmetic as those four ops, bit for bit: each product is rounded before the sum. This file
// opts out of the kernels' -ffast-math and of multiply-add contraction, which would fuse x * cos + ... into
// one FMA and round once (greedy tokens would then move only where two logits tie, but the test can be
// an exact one).
#pragma GCC optimize("no-fast-math", "fp-contract=off")
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>

namespace {

void rotate_head(float* __restrict x, const float* __restrict c, const float* __restrict s, int64_t half) {
  for (int64_t i = 0; i < half; ++i) {
    const float x1 = x[i], x2 = x[i + half];
    const float lo = x1 * c[i], lo_swapped = x2 * s[i];
    const float hi = x2 * c[i + half], hi_swapped = x1 * s[i + half];
    x[i] = lo + lo_swapped;
    x[i + half] = hi + hi_swapped;
  }
}

void rotary_embedding_(at::Tensor qk, const at::Tensor& cos, const at::Tensor& sin) {
  TORCH_CHECK(qk.scalar_type() == at::kFloat && cos.scalar_type() == at::kFloat && sin.scalar_type() == at::kFloat,
              "rotary_embedding_: float32 only (other dtypes take RotaryEmbedding's PyTorch ops)");
  TORCH_CHECK(qk.dim() == 3 && qk.size(2) % 2 == 0, "rotary_embedding_: qk [N, H, D] with D even, got ", qk.sizes());
  const int64_t rows = qk.size(0), heads = qk.size(1), dim = qk.size(2);
  TORCH_CHECK(qk.stride(2) == 1 && (heads <= 1 || qk.stride(1) == dim),
              "rotary_embedding_: each row's heads must be contiguous, got strides ", qk.strides());
  TORCH_CHECK(cos.is_contiguous() && sin.is_contiguous() && cos.numel() == rows * dim && sin.numel() == rows * dim,
              "rotary_embedding_: cos and sin need one contiguous row of ", dim, " floats per token; got ",
              cos.sizes(), " and ", sin.sizes(), " for ", rows, " tokens");
  float* base = qk.data_ptr<float>();
  const int64_t row_stride = qk.stride(0), half = dim / 2;
  const float* cp = cos.data_ptr<float>();
  const float* sp = sin.data_ptr<float>();
  // ~32 KB of heads per task at the least: a decode step's few rows stay on one thread (no wake-up cost)
  const int64_t grain = std::max<int64_t>(1, 8192 / std::max<int64_t>(heads * dim, 1));
  at::parallel_for(0, rows, grain, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      float* row = base + r * row_stride;
      for (int64_t h = 0; h < heads; ++h) rotate_head(row + h * dim, cp + r * dim, sp + r * dim, half);
    }
  });
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(minengine, m) { m.def("rotary_embedding_(Tensor(a!) qk, Tensor cos, Tensor sin) -> ()"); }

TORCH_LIBRARY_IMPL(minengine, CPU, m) { m.impl("rotary_embedding_", &rotary_embedding_); }
