// Paged decode attention on the CPU: each decoding sequence's one new query against its context, read
// from the paged KV cache where it lies, through the sequence's block table (vLLM's paged_attention op,
// written plainly). Built on first use by minengine/models/cpu_kernels.py.
//
// Why a kernel: the reference path (models/attention.py) copies every context out of the cache
// (index_select) and SDPA then reads the copy, so the KV bytes cross the memory bus about three times.
// Here every K and V row is read once, which is all the roofline charges decode attention for.
//
//   q            [B, H_q, D]                       float32, one new token per sequence
//   k/v_cache    [num_blocks, block_size, H_kv, D] float32 (the engine's layout)
//   block_tables [B, W] int32, seq_lens [B] int64 (tokens including the new one, already written)
//
// A work item is one sequence and a run of its KV heads (all of them unless the batch is too small to
// keep every thread busy). Its tokens are visited in cache order, block by block, and each token's K
// (then V) row for those heads is read as one contiguous piece: the hardware prefetcher keeps up, where
// walking one head at a time through 1 KB rows measured 2x slower. Two passes over the context: the
// scores (then a softmax per query head), then the probability-weighted sum of the V rows.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty_like.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

namespace {

struct Item {
  const float* q;        // the item's first query head; its G * heads query heads follow
  const int32_t* table;  // the sequence's block table
  int64_t first, len;    // keys [first, len): first > 0 only under a sliding window
  float* out;
};

struct Shape {
  int64_t block_size, row_stride, heads, group;  // row_stride: floats from one slot's row to the next
  float scale;
};

// The row of cache slot `pos` of the sequence, at its first head of this item.
inline const float* row(const float* cache, const Item& it, const Shape& s, int64_t pos) {
  const int64_t block = it.table[pos / s.block_size];
  return cache + (block * s.block_size + pos % s.block_size) * s.row_stride;
}

// kD > 0: the head size is known at compile time (the loops unroll); kD == 0: taken from `dim`.
template <int kD>
void attend(const Item& it, const Shape& s, int64_t dim, const float* k_cache, const float* v_cache,
            float* scores, float* acc) {
  const int64_t d_size = kD > 0 ? kD : dim, n = it.len - it.first, nq = s.heads * s.group;
  // Pass 1: scores[i][t] = (q_i . k_t) * scale for query head i = h * G + g, which reads KV head h.
  for (int64_t t = 0; t < n; ++t) {
    const float* k = row(k_cache, it, s, it.first + t);
    for (int64_t i = 0; i < nq; ++i) {
      const float* qi = it.q + i * d_size;
      const float* kh = k + (i / s.group) * d_size;
      float dot = 0.f;
#pragma omp simd reduction(+ : dot)
      for (int64_t d = 0; d < d_size; ++d) dot += qi[d] * kh[d];
      scores[i * n + t] = dot * s.scale;
    }
  }
  // Softmax of each query head's row; the max is subtracted first so that exp cannot overflow.
  std::vector<float> inv_sum(nq);
  for (int64_t i = 0; i < nq; ++i) {
    float* si = scores + i * n;
    float top = -std::numeric_limits<float>::infinity();
    for (int64_t t = 0; t < n; ++t) top = std::max(top, si[t]);
    float sum = 0.f;
#pragma omp simd reduction(+ : sum)
    for (int64_t t = 0; t < n; ++t) {
      si[t] = std::exp(si[t] - top);
      sum += si[t];
    }
    inv_sum[i] = 1.f / sum;
  }
  // Pass 2: acc[i] = sum_t p[i][t] * v_t, then divided by the softmax's sum.
  std::fill(acc, acc + nq * d_size, 0.f);
  for (int64_t t = 0; t < n; ++t) {
    const float* v = row(v_cache, it, s, it.first + t);
    for (int64_t i = 0; i < nq; ++i) {
      const float p = scores[i * n + t];
      const float* vh = v + (i / s.group) * d_size;
      float* a = acc + i * d_size;
#pragma omp simd
      for (int64_t d = 0; d < d_size; ++d) a[d] += p * vh[d];
    }
  }
  for (int64_t i = 0; i < nq; ++i)
    for (int64_t d = 0; d < d_size; ++d) it.out[i * d_size + d] = acc[i * d_size + d] * inv_sum[i];
}

at::Tensor paged_decode_attention(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                                  const at::Tensor& block_tables, const at::Tensor& seq_lens, double scale,
                                  int64_t sliding_window) {
  TORCH_CHECK(q.dim() == 3 && k_cache.dim() == 4 && v_cache.sizes() == k_cache.sizes(),
              "paged_decode_attention: q is [B, H_q, D], the caches [num_blocks, block_size, H_kv, D]");
  TORCH_CHECK(q.scalar_type() == at::kFloat && k_cache.scalar_type() == at::kFloat &&
                  v_cache.scalar_type() == at::kFloat,
              "paged_decode_attention: float32 only (other dtypes take the reference path)");
  TORCH_CHECK(k_cache.is_contiguous() && v_cache.is_contiguous(), "paged_decode_attention: contiguous caches");
  TORCH_CHECK(block_tables.scalar_type() == at::kInt && seq_lens.scalar_type() == at::kLong,
              "paged_decode_attention: block_tables int32, seq_lens int64");
  const int64_t batch = q.size(0), num_heads = q.size(1), dim = q.size(2);
  const int64_t block_size = k_cache.size(1), num_kv_heads = k_cache.size(2);
  TORCH_CHECK(k_cache.size(3) == dim && num_heads % num_kv_heads == 0,
              "paged_decode_attention: query and cache head sizes disagree");
  TORCH_CHECK(block_tables.dim() == 2 && block_tables.size(0) == batch && seq_lens.numel() == batch,
              "paged_decode_attention: one block-table row and one length per query");
  const at::Tensor qc = q.contiguous(), tables = block_tables.contiguous(), lens = seq_lens.contiguous();
  at::Tensor out = at::empty_like(qc);
  const int64_t width = tables.size(1), group = num_heads / num_kv_heads;
  const int64_t num_blocks = k_cache.size(0);
  const int64_t* len_ptr = lens.data_ptr<int64_t>();
  const int32_t* table_ptr = tables.data_ptr<int32_t>();
  int64_t longest = 0;
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t len = len_ptr[b];
    TORCH_CHECK(len >= 1 && len <= width * block_size, "paged_decode_attention: seq_len ", len,
                " does not fit its block table (", width, " blocks of ", block_size, ")");
    for (int64_t j = 0; j < (len + block_size - 1) / block_size; ++j)
      TORCH_CHECK(table_ptr[b * width + j] >= 0 && table_ptr[b * width + j] < num_blocks,
                  "paged_decode_attention: block id ", table_ptr[b * width + j], " outside the cache");
    longest = std::max(longest, len);
  }
  // Split each sequence's heads only as far as needed for ~4 items per thread (batch 1 still uses all).
  int64_t heads = num_kv_heads;
  while (heads % 2 == 0 && batch * (num_kv_heads / heads) < 4 * at::get_num_threads()) heads /= 2;
  const int64_t chunks = num_kv_heads / heads;
  const Shape shape{block_size, num_kv_heads * dim, heads, group, static_cast<float>(scale)};
  const float* q_ptr = qc.data_ptr<float>();
  const float* k_ptr = k_cache.data_ptr<float>();
  const float* v_ptr = v_cache.data_ptr<float>();
  float* out_ptr = out.data_ptr<float>();
  at::parallel_for(0, batch * chunks, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scores(heads * group * longest), acc(heads * group * dim);
    for (int64_t index = begin; index < end; ++index) {
      const int64_t b = index / chunks, h0 = (index % chunks) * heads, len = len_ptr[b];
      const int64_t first = sliding_window > 0 ? std::max<int64_t>(0, len - sliding_window) : 0;
      const int64_t head = (b * num_heads + h0 * group) * dim;  // offset of the item's first query head
      const Item it{q_ptr + head, table_ptr + b * width, first, len, out_ptr + head};
      const float *k = k_ptr + h0 * dim, *v = v_ptr + h0 * dim;
      if (dim == 32)
        attend<32>(it, shape, dim, k, v, scores.data(), acc.data());
      else if (dim == 64)
        attend<64>(it, shape, dim, k, v, scores.data(), acc.data());
      else if (dim == 128)
        attend<128>(it, shape, dim, k, v, scores.data(), acc.data());
      else
        attend<0>(it, shape, dim, k, v, scores.data(), acc.data());
    }
  });
  return out;
}

}  // namespace

TORCH_LIBRARY(minengine, m) {
  m.def("paged_decode_attention(Tensor q, Tensor k_cache, Tensor v_cache, Tensor block_tables, "
        "Tensor seq_lens, float scale, int sliding_window=0) -> Tensor");
}

TORCH_LIBRARY_IMPL(minengine, CPU, m) { m.impl("paged_decode_attention", &paged_decode_attention); }
