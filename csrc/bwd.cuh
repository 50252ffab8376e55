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
constexpr int kBwdWarps = kBwdThreads / 32;
constexpr int kBatch = 8;  // independent row gathers in flight per warp

// Loads 4 consecutive values (one lane's share of a 128-wide column chunk) as fp32; one 8-byte
// (16-bit types) or 16-byte (fp32) load when the whole group is in range and aligned.
template <typename T>
__device__ __forceinline__ void load4(const T* src, int c, int dim, float (&v)[4]) {
  const T* at = src + c;
  if (c + 4 <= dim && reinterpret_cast<uintptr_t>(at) % (4 * sizeof(T)) == 0) {
    if constexpr (sizeof(T) == 2) {
      const uint2 raw = *reinterpret_cast<const uint2*>(at);
      const T* h = reinterpret_cast<const T*>(&raw);
#pragma unroll
      for (int e = 0; e < 4; ++e) v[e] = to_f32(h[e]);
    } else {
      const float4 raw = *reinterpret_cast<const float4*>(at);
      v[0] = raw.x; v[1] = raw.y; v[2] = raw.z; v[3] = raw.w;
    }
    return;
  }
#pragma unroll
  for (int e = 0; e < 4; ++e) v[e] = c + e < dim ? to_f32(at[e]) : 0.f;
}

// One warp per query token row; each lane owns 4 consecutive columns of every 128.
template <typename T>
__global__ void __launch_bounds__(kBwdThreads) bwd_dq_kernel(const BwdParams p, int row_blocks) {
  const int i = blockIdx.x / row_blocks;
  const int t = (blockIdx.x % row_blocks) * kBwdWarps + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const Segment gq = segment_of(p.q, i);
  if (t >= gq.rows || t >= p.max_lq) return;
  const T* dg = static_cast<const T*>(p.d.data);
  T* out = static_cast<T*>(p.dq) + row_elem(p.q, i, gq.first_row, t);
  const PairRange r = pairs_of_query(p, i);
  for (int c0 = 0; c0 < p.dim; c0 += 128) {
    const int c = c0 + lane * 4;
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
      for (int b = 0; b < kBatch; ++b) {
        if (rows[b] != nullptr) load4(rows[b], c, p.dim, v[b]);
        else v[b][0] = v[b][1] = v[b][2] = v[b][3] = 0.f;
      }
#pragma unroll
      for (int b = 0; b < kBatch; ++b)  // fixed order: deterministic
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[e] = fmaf(g[b], v[b][e], acc[e]);
    }
#pragma unroll
    for (int e = 0; e < 4; ++e)
      if (c + e < p.dim) out[c + e] = from_f32<T>(acc[e]);
  }
}

// One block per run of `rows` consecutive document rows (possibly spanning several documents).
// Warp w owns the rows with (row - r0) % warps == w and walks every (pair, query token) of the
// documents it touches in a fixed order, lanes over query tokens; each hit on one of its rows
// adds g * q_row into an fp32 shared-memory accumulator, lanes over columns. One writer per row
// and a fixed order: deterministic without atomics.
template <typename T>
__global__ void __launch_bounds__(kBwdThreads)
bwd_dd_kernel(const BwdParams p, int64_t total_rows, int rows) {
  extern __shared__ float acc[];  // [rows, dim]
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int64_t r0 = int64_t(blockIdx.x) * rows;
  const int64_t r1 = min(total_rows, r0 + rows);
  for (int x = tid; x < rows * p.dim; x += kBwdThreads) acc[x] = 0.f;
  __syncthreads();

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
  const int j_last = doc_of_row(r1 - 1);
  for (int j = doc_of_row(r0); j <= j_last; ++j) {
    const Segment gd = segment_of(p.d, j);
    if (gd.len == 0) continue;
    const PairRange pr = pairs_of_doc(p, j);
    const int t_chunks = (p.max_lq + 31) / 32;
    const int64_t steps = (pr.end - pr.begin) * t_chunks;  // (pair, 32-token chunk) steps
    constexpr int kAhead = 8;  // argmax loads in flight per warp
    for (int64_t s0 = 0; s0 < steps; s0 += kAhead) {
      int a_pre[kAhead];
      int64_t o_pre[kAhead];
#pragma unroll
      for (int u = 0; u < kAhead; ++u) {
        a_pre[u] = -1;
        o_pre[u] = 0;
        const int64_t s = s0 + u;
        if (s < steps) {
          o_pre[u] = doc_pair_out(p, j, pr.begin + s / t_chunks);
          const int t = static_cast<int>(s % t_chunks) * 32 + lane;
          if (t < p.max_lq) a_pre[u] = p.argmax[o_pre[u] * p.max_lq + t];
        }
      }
#pragma unroll 1
      for (int u = 0; u < kAhead && s0 + u < steps; ++u) {
        const int64_t o = o_pre[u];
        const int t0 = static_cast<int>((s0 + u) % t_chunks) * 32;
        const int a = a_pre[u];
        const int64_t rr = gd.first_row + a - r0;
        const bool mine = a >= 0 && rr >= 0 && rr < r1 - r0 && rr % kBwdWarps == warp;
        unsigned hits = __ballot_sync(0xffffffffu, mine);
        if (!hits) continue;
        const float g = p.grad[o];
        const int qi = pair_query(p.pairs, p.d.count, static_cast<int>(o));
        const T* qbase = qg + row_elem(p.q, qi, segment_of(p.q, qi).first_row, 0);
        while (hits) {  // in token order
          const T* src[kBatch];
          int dst[kBatch];
#pragma unroll
          for (int b = 0; b < kBatch; ++b) {
            src[b] = nullptr;
            dst[b] = 0;
            if (hits) {
              const int from = __ffs(hits) - 1;
              hits &= hits - 1;
              dst[b] = __shfl_sync(0xffffffffu, static_cast<int>(rr), from);
              src[b] = qbase + int64_t(t0 + from) * p.q.row_stride;
            }
          }
          for (int c0 = 0; c0 < p.dim; c0 += 128) {
            const int c = c0 + lane * 4;
            float v[kBatch][4];
#pragma unroll
            for (int b = 0; b < kBatch; ++b)
              if (src[b] != nullptr) load4(src[b], c, p.dim, v[b]);
#pragma unroll
            for (int b = 0; b < kBatch; ++b) {
              if (src[b] == nullptr) continue;
              float* ar = acc + dst[b] * p.dim;
#pragma unroll
              for (int e = 0; e < 4; ++e)
                if (c + e < p.dim) ar[c + e] = fmaf(g, v[b][e], ar[c + e]);
            }
          }
        }
      }
    }
  }
  __syncthreads();
  T* dd = static_cast<T*>(p.dd);
  for (int64_t x = tid; x < (r1 - r0) * p.dim; x += kBwdThreads)
    dd[r0 * p.dim + x] = from_f32<T>(acc[x]);
}

}  // namespace maxsim
