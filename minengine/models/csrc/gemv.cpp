// A batch-1 linear layer (y = W x + b) for the CPU, written to run at the memory bus's speed.
//
// At one row a linear layer is a matrix-vector product: every weight is read once and used once, so its
// time is the weight bytes over the read bandwidth, if the kernel keeps every core streaming. The
// libraries PyTorch calls are tuned for matrices: on an AMD EPYC MKL's product stayed on one core
// (~13 GB/s of ~29) and oneDNN's reached ~20 GB/s on a decode step's smaller matrices. Here the output
// features are split between the threads; each walks its rows of W front to back (the hardware
// prefetcher's favourite pattern) against x, which stays in the L1 cache.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <vector>

namespace {

// 16 floats as one value (GCC/Clang vector extensions: AVX-512 here, two or four registers elsewhere).
// Keeping the running sums in such values keeps them in registers; written as scalar reductions, gcc
// kept four of them on the stack and the loop ran at a third of the bus's speed.
typedef float vfloat __attribute__((vector_size(64)));

inline vfloat load(const float* p) {
  vfloat v;
  __builtin_memcpy(&v, p, sizeof v);  // an unaligned load
  return v;
}

inline float hsum(vfloat v) {
  float s = 0.f;
  for (int i = 0; i < 16; ++i) s += v[i];
  return s;
}

// How far ahead of its reads the loop asks for weights, in floats (4 KB), and with which hint. Every weight
// is used once per decode step, so caching it only evicts what the step does reuse: the activations, the
// KV cache's recent rows, the interpreter's and the dispatcher's own data for the small ops between two
// GEMVs. A non-temporal prefetch (`__builtin_prefetch(p, 0, 0)`: PREFETCHNTA) tells the CPU the line will
// not be needed again. Paired in one process (benchmarks/kernel_ab.py, AMD EPYC family 26, 30-40 pairs
// each, 2026-12-02), whole decode steps took 0.955x, 0.987x and 0.982x the time at 4 KB ahead (three runs),
// 0.972x at 2 KB, 0.987x at 3 KB and at 8 KB; the same prefetch with the ordinary hint (kept in every
// cache level) made them 1.038x. A small gain, but on the same side in every run.
constexpr int64_t kPrefetchAhead = 1024;

// dot(w, x) over k floats: four running sums, so consecutive multiply-adds do not wait on each other.
inline float dot(const float* w, const float* x, int64_t k) {
  vfloat a0{}, a1{}, a2{}, a3{};
  int64_t i = 0;
  for (; i + 64 <= k; i += 64) {
    for (int line = 0; line < 64; line += 16) __builtin_prefetch(w + i + kPrefetchAhead + line, 0, 0);
    a0 += load(w + i) * load(x + i);
    a1 += load(w + i + 16) * load(x + i + 16);
    a2 += load(w + i + 32) * load(x + i + 32);
    a3 += load(w + i + 48) * load(x + i + 48);
  }
  for (; i + 16 <= k; i += 16) a0 += load(w + i) * load(x + i);
  float s = hsum((a0 + a1) + (a2 + a3));
  for (; i < k; ++i) s += w[i] * x[i];
  return s;
}

at::Tensor gemv(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias) {
  TORCH_CHECK(x.scalar_type() == at::kFloat && weight.scalar_type() == at::kFloat, "gemv: float32 only");
  TORCH_CHECK(weight.dim() == 2 && x.size(-1) == weight.size(1) && x.numel() == weight.size(1),
              "gemv: one row of x, [..., K], against weight [N, K]");
  const at::Tensor xc = x.contiguous(), w = weight.contiguous();
  const int64_t n = w.size(0), k = w.size(1);
  std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
  shape.back() = n;
  at::Tensor y = at::empty(shape, x.options());
  const float* xp = xc.data_ptr<float>();
  const float* wp = w.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  const float* bp = nullptr;
  at::Tensor bc;
  if (bias.has_value() && bias->defined()) {
    TORCH_CHECK(bias->scalar_type() == at::kFloat && bias->numel() == n, "gemv: bias of N floats");
    bc = bias->contiguous();
    bp = bc.data_ptr<float>();
  }
  // ~64 KB of weights per task at the least, so that a small matrix is not cut into slivers
  const int64_t grain = std::max<int64_t>(4, 16384 / std::max<int64_t>(k, 1));
  // one row at a time: each thread then reads one stream, front to back (measured: 1 row at a time read
  // faster than 2, 4 or 8 interleaved rows, which split the prefetcher's attention). The bias is added in
  // a second pass: with `+ (bp ? bp[row] : 0.f)` inside this loop gcc 12 made it 13 % slower on a
  // 4096 x 768 matrix (362 vs 314 us, AMD EPYC, 2026-12-02), the step's GEMVs 1.16x the floor, not ~1.02x.
  at::parallel_for(0, n, grain, [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row) yp[row] = dot(wp + row * k, xp, k);
    if (bp != nullptr) {
      for (int64_t row = begin; row < end; ++row) yp[row] += bp[row];
    }
  });
  return y;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(minengine, m) { m.def("gemv(Tensor x, Tensor weight, Tensor? bias) -> Tensor"); }

TORCH_LIBRARY_IMPL(minengine, CPU, m) { m.impl("gemv", &gemv); }
