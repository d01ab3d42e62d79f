// RMSNorm as one call on the CPU (vLLM has a `rms_norm` op for the same reason on a GPU).
//
// Why: F.rms_norm on a CPU runs as about seven ATen ops (square, mean, add, rsqrt, two multiplies and
// their allocations): ~10 us for one row of 768 floats, where the arithmetic is well under one. A
// batch-1 decode step runs two norms per layer and one at the end: on a 12-layer model this call saved
// 1-3.5 % of the step (benchmarks/RESULTS.md §1, AMD EPYC, 2 threads).
//
// Same arithmetic as Hugging Face's LlamaRMSNorm in fp32: y = w * (x * rsqrt(mean(x^2) + eps)), the two
// multiplies in that order; only the order in which the squares are summed differs (float rounding).
// The kernels are built with -ffast-math, under which gcc would compute 1/sqrt with an approximate
// instruction and regroup the multiplies: this file opts out, so each step rounds as PyTorch's do.
#pragma GCC optimize("no-fast-math")
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty_like.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace {

typedef float vfloat __attribute__((vector_size(64)));  // 16 floats: one AVX-512 register

inline vfloat vload(const float* p) {
  vfloat v;
  __builtin_memcpy(&v, p, sizeof v);
  return v;
}

// Sum of squares of n floats: four running vector sums, so the multiply-adds do not wait on each other.
inline float sum_of_squares(const float* x, int64_t n) {
  vfloat a0{}, a1{}, a2{}, a3{};
  int64_t i = 0;
  for (; i + 64 <= n; i += 64) {
    const vfloat x0 = vload(x + i), x1 = vload(x + i + 16), x2 = vload(x + i + 32), x3 = vload(x + i + 48);
    a0 += x0 * x0;
    a1 += x1 * x1;
    a2 += x2 * x2;
    a3 += x3 * x3;
  }
  for (; i + 16 <= n; i += 16) {
    const vfloat v = vload(x + i);
    a0 += v * v;
  }
  const vfloat all = (a0 + a1) + (a2 + a3);
  float total = 0.f;
  for (int l = 0; l < 16; ++l) total += all[l];
  for (; i < n; ++i) total += x[i] * x[i];
  return total;
}

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  TORCH_CHECK(x.scalar_type() == at::kFloat && weight.scalar_type() == at::kFloat,
              "rms_norm: float32 only (other dtypes take F.rms_norm)");
  TORCH_CHECK(x.dim() >= 1 && weight.dim() == 1 && x.size(-1) == weight.size(0),
              "rms_norm: x [..., D] with a weight of D floats; got x ", x.sizes(), ", weight ", weight.sizes());
  const at::Tensor xc = x.contiguous(), wc = weight.contiguous();
  at::Tensor out = at::empty_like(xc);
  const int64_t dim = xc.size(-1), rows = dim == 0 ? 0 : xc.numel() / dim;
  const float* xp = xc.data_ptr<float>();
  const float* wp = wc.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const float epsilon = static_cast<float>(eps);
  // ~32 KB of rows per task at the least: a decode step's few rows stay on one thread (no wake-up cost)
  const int64_t grain = std::max<int64_t>(1, 8192 / std::max<int64_t>(dim, 1));
  at::parallel_for(0, rows, grain, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* xr = xp + r * dim;
      float* yr = op + r * dim;
      const float scale = 1.f / std::sqrt(sum_of_squares(xr, dim) / static_cast<float>(dim) + epsilon);
      for (int64_t i = 0; i < dim; ++i) yr[i] = wp[i] * (xr[i] * scale);
    }
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(minengine, m) { m.def("rms_norm(Tensor x, Tensor weight, float eps) -> Tensor"); }

TORCH_LIBRARY_IMPL(minengine, CPU, m) { m.impl("rms_norm", &rms_norm); }
