// dD for padded documents, by document row. Two kernels:
//   1. per document, a stable counting sort of its argmax entries by winning row (one pass to
//      count, a scan, one pass to place; the placing pass is a single warp walking the entries
//      in order, so every row's list stays in entry order);
//   2. a warp per document row gathers its entries' query rows, kDdBatch in flight, and sums
//      g * q_row in fp32 in list order.
// Each row is touched by one warp and only by its own entries: no atomics on values, no scans of
// other rows' entries, and the same order (hence bits) as any other deterministic pass.
#pragma once
#include "bwd.cuh"

namespace maxsim {

constexpr int kSortThreads = 256;
constexpr int kSortChunk = 4096;     // entries staged in shared memory at a time
constexpr int kSortMaxRows = 8192;   // padded length up to which the row counters fit in smem

// Where document j's entries start in dd_sorted (documents laid out one after the other).
__device__ __forceinline__ int64_t doc_entry_base(const BwdParams& p, int j, const PairRange& pr) {
  switch (p.pairs.layout) {
    case kAllPairs: return int64_t(j) * p.q.count * p.max_lq;
    case kGrouped: return int64_t(j) * p.max_lq;
    default: return pr.begin * p.max_lq;
  }
}

__global__ void __launch_bounds__(kSortThreads) bwd_dd_sort_kernel(const BwdParams p) {
  extern __shared__ int cnt[];  // [pad_len]: counts, then cursors
  __shared__ int staged[kSortChunk];
  const int j = blockIdx.x, tid = threadIdx.x, lane = tid % 32;
  const int rows = p.d.pad_len;
  const PairRange pr = pairs_of_doc(p, j);
  const int entries = static_cast<int>((pr.end - pr.begin) * p.max_lq);
  const int64_t base = doc_entry_base(p, j, pr);
  const int64_t first_row = int64_t(j) * rows;
  for (int s = tid; s < rows; s += kSortThreads) cnt[s] = 0;

  auto stage = [&](int from, int n) {
    for (int x = tid; x < n; x += kSortThreads) {
      const int e = from + x;
      const int kk = e / p.max_lq;
      const int64_t o = doc_pair_out(p, j, pr.begin + kk);
      staged[x] = p.argmax[o * p.max_lq + (e - kk * p.max_lq)];
    }
  };
  // 1. counts per row
  for (int from = 0; from < entries; from += kSortChunk) {
    const int n = min(kSortChunk, entries - from);
    __syncthreads();
    stage(from, n);
    __syncthreads();
    for (int x = tid; x < n; x += kSortThreads)
      if (staged[x] >= 0) atomicAdd(&cnt[staged[x]], 1);  // integer counts: order-free
  }
  __syncthreads();
  // 2. exclusive scan (warp 0, 32 rows at a time); counts and starts go out, cursors stay
  if (tid < 32) {
    int carry = 0;
    for (int s0 = 0; s0 < rows; s0 += 32) {
      const int s = s0 + lane;
      const int c = s < rows ? cnt[s] : 0;
      int incl = c;
#pragma unroll
      for (int off = 1; off < 32; off <<= 1) {
        const int v = __shfl_up_sync(0xffffffffu, incl, off);
        if (lane >= off) incl += v;
      }
      if (s < rows) {
        cnt[s] = carry + incl - c;
        p.dd_start[first_row + s] = static_cast<int>(base) + carry + incl - c;
        p.dd_count[first_row + s] = c;
      }
      carry += __shfl_sync(0xffffffffu, incl, 31);
    }
  }
  // 3. placement in entry order by warp 0; equal rows within a step ranked by lane
  for (int from = 0; from < entries; from += kSortChunk) {
    const int n = min(kSortChunk, entries - from);
    __syncthreads();
    stage(from, n);
    __syncthreads();
    if (tid >= 32) continue;
    for (int x0 = 0; x0 < n; x0 += 32) {
      const int x = x0 + lane;
      const int a = x < n ? staged[x] : -1;
      const unsigned peers = __match_any_sync(0xffffffffu, a >= 0 ? a : -1 - lane);
      const int rank = __popc(peers & ((1u << lane) - 1));
      int pos = 0;
      if (a >= 0) pos = cnt[a] + rank;
      __syncwarp();
      if (a >= 0) {
        p.dd_sorted[base + pos] = from + x;
        if (rank == 0) cnt[a] = pos + __popc(peers);
      }
      __syncwarp();
    }
  }
}

// Four resident blocks (16 warps) per SM: the gathers need many warps in flight.
template <typename T>
__global__ void __launch_bounds__(kBwdThreads, 4) bwd_dd_rows_kernel(const BwdParams p) {
  const int lane = threadIdx.x % 32;
  const int64_t row = int64_t(blockIdx.x) * kBwdWarps + threadIdx.x / 32;
  if (row >= p.d.rows) return;
  const int j = static_cast<int>(row / p.d.pad_len);
  const PairRange pr = pairs_of_doc(p, j);
  const int start = p.dd_start[row], count = p.dd_count[row];
  const T* qg = static_cast<const T*>(p.q.data);
  T* out = static_cast<T*>(p.dd) + row * p.dim;
  for (int c0 = 0; c0 < p.dim; c0 += 128) {  // lanes own 4 of every 128 columns
    const int c = c0 + lane * 4;
    float acc[4] = {};
    for (int h0 = 0; h0 < count; h0 += 32) {
      const T* my_src = nullptr;
      float my_g = 0.f;
      if (h0 + lane < count) {
        const int e = p.dd_sorted[start + h0 + lane];
        const int kk = e / p.max_lq;
        const int64_t o = doc_pair_out(p, j, pr.begin + kk);
        const int qi = pair_query(p.pairs, p.d.count, static_cast<int>(o));
        my_src = qg + row_elem(p.q, qi, segment_of(p.q, qi).first_row, e - kk * p.max_lq);
        my_g = p.grad[o];
      }
      const int n = min(32, count - h0);
      for (int b0 = 0; b0 < n; b0 += kDdBatch) {
        const T* src[kDdBatch];
        float g[kDdBatch];
        float v[kDdBatch][4];
#pragma unroll
        for (int b = 0; b < kDdBatch; ++b) {
          g[b] = __shfl_sync(0xffffffffu, my_g, (b0 + b) & 31);
          src[b] = reinterpret_cast<const T*>(
              __shfl_sync(0xffffffffu, reinterpret_cast<uintptr_t>(my_src), (b0 + b) & 31));
          if (b0 + b >= n) src[b] = nullptr;
          if (src[b] != nullptr) load4(src[b], c, p.dim, v[b]);
        }
#pragma unroll
        for (int b = 0; b < kDdBatch; ++b)  // list order: deterministic
          if (src[b] != nullptr)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[e] = fmaf(g[b], v[b][e], acc[e]);
      }
    }
#pragma unroll
    for (int e = 0; e < 4; ++e)
      if (c + e < p.dim) out[c + e] = from_f32<T>(acc[e]);
  }
}

}  // namespace maxsim
