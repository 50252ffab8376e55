// Deterministic MaxSim backward from the forward's argmax. Only the winning document token of
// each (pair, query token) receives gradient, so both gradients are sparse gathers:
//   dQ[i, t]  = sum over pairs p of query i    of g[p] * D[doc(p), argmax[p, t]]
//   dD[j, s]  = sum over (p, t) with doc(p) = j and argmax[p, t] = s of g[p] * Q[query(p), t]
// Every output row has exactly one writer that adds its terms in a fixed order: no atomics,
// bit-identical results run after run.
#pragma once
#include "fwd_simt.cuh"

namespace maxsim {

template <typename T> __device__ __forceinline__ T from_f32(float x) { return static_cast<T>(x); }
template <> __device__ __forceinline__ __half from_f32(float x) { return __float2half_rn(x); }
template <> __device__ __forceinline__ __nv_bfloat16 from_f32(float x) { return __float2bfloat16_rn(x); }

// Pairs of a query (or of a document) in a fixed order; `out` is the score index.
struct PairRange {
  int64_t begin, end;
};
__device__ __forceinline__ PairRange pairs_of_query(const BwdParams& p, int i) {
  switch (p.pairs.layout) {
    case kAllPairs: return {0, p.d.count};
    case kGrouped: return {0, p.pairs.group};
    default: return {p.q_ptr[i], p.q_ptr[i + 1]};
  }
}
__device__ __forceinline__ int64_t query_pair_out(const BwdParams& p, int i, int64_t k) {
  switch (p.pairs.layout) {
    case kAllPairs: return int64_t(i) * p.d.count + k;
    case kGrouped: return int64_t(i) * p.pairs.group + k;
    default: return p.by_q[k];
  }
}
__device__ __forceinline__ PairRange pairs_of_doc(const BwdParams& p, int j) {
  switch (p.pairs.layout) {
    case kAllPairs: return {0, p.q.count};
    case kGrouped: return {0, 1};
    default: return {p.d_ptr[j], p.d_ptr[j + 1]};
  }
}
__device__ __forceinline__ int64_t doc_pair_out(const BwdParams& p, int j, int64_t k) {
  switch (p.pairs.layout) {
    case kAllPairs: return k * p.d.count + j;
    case kGrouped: return j;
    default: return p.by_d[k];
  }
}

constexpr int kBwdThreads = 128;

// One warp per query token row; lanes split the embedding dim.
template <typename T>
__global__ void __launch_bounds__(kBwdThreads) bwd_dq_kernel(const BwdParams p, int row_blocks) {
  const int warps = kBwdThreads / 32;
  const int i = blockIdx.x / row_blocks;
  const int t = (blockIdx.x % row_blocks) * warps + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const Segment gq = segment_of(p.q, i);
  if (t >= gq.rows || t >= p.max_lq) return;
  const T* dg = static_cast<const T*>(p.d.data);
  T* out = static_cast<T*>(p.dq) + row_elem(p.q, i, gq.first_row, t);
  const PairRange r = pairs_of_query(p, i);
  constexpr int kBatch = 8;  // independent gathers in flight per warp
  for (int c0 = 0; c0 < p.dim; c0 += 32 * 4) {
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
    for (int64_t k0 = r.begin; k0 < r.end; k0 += kBatch) {
      const T* rows[kBatch];
      float g[kBatch];
#pragma unroll
      for (int b = 0; b < kBatch; ++b) {
        rows[b] = nullptr;
        g[b] = 0.f;
        if (k0 + b < r.end) {
          const int64_t o = query_pair_out(p, i, k0 + b);
          const int a = p.argmax[o * p.max_lq + t];
          if (a >= 0) {
            const int j = pair_doc(p.pairs, p.d.count, static_cast<int>(o));
            rows[b] = dg + row_elem(p.d, j, segment_of(p.d, j).first_row, a);
            g[b] = p.grad[o];
          }
        }
      }
      float v[kBatch][4];
#pragma unroll
      for (int b = 0; b < kBatch; ++b)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int c = c0 + e * 32 + lane;
          v[b][e] = rows[b] != nullptr && c < p.dim ? to_f32(rows[b][c]) : 0.f;
        }
#pragma unroll
      for (int b = 0; b < kBatch; ++b)  // fixed order: deterministic
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[e] = fmaf(g[b], v[b][e], acc[e]);
    }
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int c = c0 + e * 32 + lane;
      if (c < p.dim) out[c] = from_f32<T>(acc[e]);
    }
  }
}

// One block per run of `rows` consecutive document rows (possibly spanning several documents).
// It scans the argmax entries of each document it touches, compacts the hits into shared
// memory in entry order, then adds them into fp32 row accumulators, one column per thread.
template <typename T>
__global__ void __launch_bounds__(kBwdThreads)
bwd_dd_kernel(const BwdParams p, int64_t total_rows, int rows) {
  extern __shared__ float acc[];  // [rows, dim]
  __shared__ int hit_out[kBwdThreads], hit_t[kBwdThreads], hit_row[kBwdThreads];
  __shared__ int warp_count[kBwdThreads / 32];
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int64_t r0 = int64_t(blockIdx.x) * rows;
  const int64_t r1 = min(total_rows, r0 + rows);
  for (int x = tid; x < rows * p.dim; x += kBwdThreads) acc[x] = 0.f;

  auto doc_of_row = [&](int64_t r) -> int {
    if (p.d.offsets == nullptr) return static_cast<int>(r / p.d.pad_len);
    int lo = 0, hi = p.d.count;  // last doc whose first row is <= r
    while (hi - lo > 1) {
      const int mid = (lo + hi) / 2;
      if (p.d.offsets[mid] <= r) lo = mid; else hi = mid;
    }
    return lo;
  };
  const T* qg = static_cast<const T*>(p.q.data);
  __syncthreads();

  const int j_last = doc_of_row(r1 - 1);
  for (int j = doc_of_row(r0); j <= j_last; ++j) {
    const Segment gd = segment_of(p.d, j);
    if (gd.len == 0) continue;
    const PairRange pr = pairs_of_doc(p, j);
    const int64_t entries = (pr.end - pr.begin) * p.max_lq;
    for (int64_t base = 0; base < entries; base += kBwdThreads) {
      const int64_t e = base + tid;
      int o = 0, t = 0, row = -1;
      if (e < entries) {
        o = static_cast<int>(doc_pair_out(p, j, pr.begin + e / p.max_lq));
        t = static_cast<int>(e % p.max_lq);
        const int a = p.argmax[int64_t(o) * p.max_lq + t];
        const int64_t r = gd.first_row + a;
        if (a >= 0 && r >= r0 && r < r1) row = static_cast<int>(r - r0);
      }
      const unsigned ballot = __ballot_sync(0xffffffffu, row >= 0);
      if (lane == 0) warp_count[warp] = __popc(ballot);
      __syncthreads();
      int pos = __popc(ballot & ((1u << lane) - 1)), n_hits = 0;
      for (int w = 0; w < kBwdThreads / 32; ++w) {
        if (w < warp) pos += warp_count[w];
        n_hits += warp_count[w];
      }
      if (row >= 0) { hit_out[pos] = o; hit_t[pos] = t; hit_row[pos] = row; }
      __syncthreads();
      // Warp w adds the hits of the rows it owns (row % warps == w) in entry order; lanes split
      // the columns. Batches of loads are issued before the adds so that they overlap.
      constexpr int kBatch = 16;
      for (int h0 = 0; h0 < n_hits; h0 += kBatch) {
        const T* src[kBatch];
        float g[kBatch];
        int dst_row[kBatch];
#pragma unroll
        for (int b = 0; b < kBatch; ++b) {
          src[b] = nullptr;
          g[b] = 0.f;
          dst_row[b] = 0;
          const int h = h0 + b;
          if (h < n_hits && hit_row[h] % (kBwdThreads / 32) == warp) {
            const int ho = hit_out[h];
            const int qi = pair_query(p.pairs, p.d.count, ho);
            src[b] = qg + row_elem(p.q, qi, segment_of(p.q, qi).first_row, hit_t[h]);
            g[b] = p.grad[ho];
            dst_row[b] = hit_row[h];
          }
        }
        for (int c0 = 0; c0 < p.dim; c0 += 32 * 4) {
          float v[kBatch][4];
#pragma unroll
          for (int b = 0; b < kBatch; ++b)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              const int c = c0 + e * 32 + lane;
              v[b][e] = src[b] != nullptr && c < p.dim ? to_f32(src[b][c]) : 0.f;
            }
#pragma unroll
          for (int b = 0; b < kBatch; ++b) {
            if (src[b] == nullptr) continue;
            float* ar = acc + dst_row[b] * p.dim;
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              const int c = c0 + e * 32 + lane;
              if (c < p.dim) ar[c] = fmaf(g[b], v[b][e], ar[c]);
            }
          }
        }
      }
      __syncthreads();
    }
  }
  T* dd = static_cast<T*>(p.dd);
  for (int64_t x = tid; x < (r1 - r0) * p.dim; x += kBwdThreads)
    dd[r0 * p.dim + x] = from_f32<T>(acc[x]);
}

}  // namespace maxsim
