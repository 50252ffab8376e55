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

// One warp per query token row, kBwdWarps consecutive rows of one query per block; each lane owns
// 4 consecutive columns of every 128. The block first stages the argmax entries and score
// indices of a few hundred pairs in shared memory (one pass, many loads in flight), so that each
// warp's loop only waits on its batches of row gathers.
constexpr int kDqStagedPairs = 512;

template <typename T>
__global__ void __launch_bounds__(kBwdThreads) bwd_dq_kernel(const BwdParams p, int row_blocks) {
  __shared__ int staged_a[kDqStagedPairs][kBwdWarps];
  __shared__ int64_t staged_o[kDqStagedPairs];
  const int i = blockIdx.x / row_blocks;
  const int t_base = (blockIdx.x % row_blocks) * kBwdWarps;
  const int t = t_base + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const Segment gq = segment_of(p.q, i);
  const int t_end = min(gq.rows, p.max_lq);
  if (t_base >= t_end) return;  // the whole block is past the query
  const bool active = t < t_end;
  const T* dg = static_cast<const T*>(p.d.data);
  const PairRange r = pairs_of_query(p, i);
  T* out = static_cast<T*>(p.dq) + row_elem(p.q, i, gq.first_row, t);
  for (int cbase = 0; cbase < p.dim; cbase += 512) {  // 512 columns per pass (4 chunks of 128)
    float acc[4][4] = {};
    const int chunks = min(4, (p.dim - cbase + 127) / 128);
    for (int64_t k0 = r.begin; k0 < r.end; k0 += kDqStagedPairs) {
      const int n = static_cast<int>(r.end - k0 < kDqStagedPairs ? r.end - k0 : kDqStagedPairs);
      __syncthreads();
      for (int x = threadIdx.x; x < n * kBwdWarps; x += kBwdThreads) {
        const int kk = x / kBwdWarps, w = x % kBwdWarps;
        const int64_t o = query_pair_out(p, i, k0 + kk);
        const int tt = t_base + w;
        staged_a[kk][w] = tt < t_end ? p.argmax[o * p.max_lq + tt] : -1;
        if (w == 0) staged_o[kk] = o;
      }
      __syncthreads();
      if (!active) continue;
      for (int kk0 = 0; kk0 < n; kk0 += kBatch) {
        const T* rows[kBatch];
        float g[kBatch];
#pragma unroll
        for (int b = 0; b < kBatch; ++b) {
          rows[b] = nullptr;
          g[b] = 0.f;
          const int kk = kk0 + b;
          const int a = kk < n ? staged_a[kk][t - t_base] : -1;
          if (a >= 0) {
            const int64_t o = staged_o[kk];
            const int j = pair_doc(p.pairs, p.d.count, static_cast<int>(o));
            rows[b] = dg + row_elem(p.d, j, segment_of(p.d, j).first_row, a);
            g[b] = p.grad[o];
          }
        }
#pragma unroll
        for (int ch = 0; ch < 4; ++ch) {
          if (ch >= chunks) break;
          const int c = cbase + ch * 128 + lane * 4;
          float v[kBatch][4];
#pragma unroll
          for (int b = 0; b < kBatch; ++b) {
            if (rows[b] != nullptr) load4(rows[b], c, p.dim, v[b]);
            else v[b][0] = v[b][1] = v[b][2] = v[b][3] = 0.f;
          }
#pragma unroll
          for (int b = 0; b < kBatch; ++b)  // fixed order: deterministic
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[ch][e] = fmaf(g[b], v[b][e], acc[ch][e]);
        }
      }
    }
    if (active) {
#pragma unroll
      for (int ch = 0; ch < 4; ++ch) {
        const int c = cbase + ch * 128 + lane * 4;
#pragma unroll
        for (int e = 0; e < 4; ++e)
          if (ch < chunks && c + e < p.dim) out[c + e] = from_f32<T>(acc[ch][e]);
      }
    }
  }
}

// One block per run of `rows` consecutive document rows (possibly spanning several documents).
// The block stages the argmax entries of the documents it touches in shared memory, a few
// thousand at a time (one coalesced pass, many loads in flight). Warp w owns the rows with
// (row - r0) % warps == w and walks the staged entries in order, lanes over entries, queueing its
// hits; every 32 hits it gathers their query rows kDdBatch at a time and adds g * q_row into an
// fp32 shared-memory accumulator, lanes over columns. Queueing keeps many gathers in flight even
// when hits are sparse. One writer per row and a fixed order: deterministic without atomics.
constexpr int kStagedEntries = 4096;
constexpr int kDdBatch = 16;

template <typename T>
__global__ void __launch_bounds__(kBwdThreads)
bwd_dd_kernel(const BwdParams p, int64_t total_rows, int rows) {
  extern __shared__ float acc[];  // [rows, dim]
  __shared__ int staged[kStagedEntries];
  __shared__ int queue[kBwdWarps][64];  // staged-entry indices of a warp's pending hits
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int64_t r0 = int64_t(blockIdx.x) * rows;
  const int64_t r1 = min(total_rows, r0 + rows);
  const int block_rows = static_cast<int>(r1 - r0);
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
  const bool vec_rows = p.dim % 4 == 0;  // accumulator rows then start 16-byte aligned
  const int j_last = doc_of_row(r1 - 1);
  int* my_queue = queue[warp];
  for (int j = doc_of_row(r0); j <= j_last; ++j) {
    const Segment gd = segment_of(p.d, j);
    if (gd.len == 0) continue;
    const PairRange pr = pairs_of_doc(p, j);
    // Entries of one document are (pair, token) with pairs * max_lq < 2^31: 32-bit index math.
    const int entries = static_cast<int>((pr.end - pr.begin) * p.max_lq);
    // Document row -> accumulator row. The document overlaps the block's rows, so the shift lies
    // in (-len, rows) and fits 32 bits.
    const int shift = static_cast<int>(gd.first_row - r0);

    // Adds the first `count` (<= 32) queued hits, in queue order.
    auto drain = [&](int base, int count) {
      const T* my_src = nullptr;
      float my_g = 0.f;
      int my_dst = 0;
      if (lane < count) {
        const int x = my_queue[lane];
        const int e = base + x;
        const int kk = e / p.max_lq;
        const int64_t o = doc_pair_out(p, j, pr.begin + kk);
        const int qi = pair_query(p.pairs, p.d.count, static_cast<int>(o));
        my_src = qg + row_elem(p.q, qi, segment_of(p.q, qi).first_row, e - kk * p.max_lq);
        my_g = p.grad[o];
        my_dst = staged[x] + shift;
      }
      for (int h0 = 0; h0 < count; h0 += kDdBatch) {
        const T* src[kDdBatch];
        float g[kDdBatch];
        int dst[kDdBatch];
#pragma unroll
        for (int b = 0; b < kDdBatch; ++b) {
          const int from = (h0 + b) & 31;
          dst[b] = __shfl_sync(0xffffffffu, my_dst, from);
          g[b] = __shfl_sync(0xffffffffu, my_g, from);
          src[b] = reinterpret_cast<const T*>(
              __shfl_sync(0xffffffffu, reinterpret_cast<uintptr_t>(my_src), from));
          if (h0 + b >= count) src[b] = nullptr;
        }
        for (int c0 = 0; c0 < p.dim; c0 += 128) {
          const int c = c0 + lane * 4;
          float v[kDdBatch][4];
#pragma unroll
          for (int b = 0; b < kDdBatch; ++b)
            if (src[b] != nullptr) load4(src[b], c, p.dim, v[b]);
#pragma unroll
          for (int b = 0; b < kDdBatch; ++b) {  // fixed order: deterministic
            if (src[b] == nullptr) continue;
            float* ar = acc + dst[b] * p.dim + c;
            if (vec_rows && c + 4 <= p.dim) {  // one 16-byte access per lane: no bank conflicts
              float4 a4 = *reinterpret_cast<float4*>(ar);
              a4.x = fmaf(g[b], v[b][0], a4.x);
              a4.y = fmaf(g[b], v[b][1], a4.y);
              a4.z = fmaf(g[b], v[b][2], a4.z);
              a4.w = fmaf(g[b], v[b][3], a4.w);
              *reinterpret_cast<float4*>(ar) = a4;
            } else {
#pragma unroll
              for (int e = 0; e < 4; ++e)
                if (c + e < p.dim) ar[e] = fmaf(g[b], v[b][e], ar[e]);
            }
          }
        }
      }
    };

    for (int base = 0; base < entries; base += kStagedEntries) {
      const int n = min(kStagedEntries, entries - base);
      __syncthreads();  // the previous round's entries are consumed
#pragma unroll 8
      for (int x = tid; x < n; x += kBwdThreads) {
        const int e = base + x;
        const int kk = e / p.max_lq;
        const int64_t o = doc_pair_out(p, j, pr.begin + kk);
        staged[x] = p.argmax[o * p.max_lq + (e - kk * p.max_lq)];
      }
      __syncthreads();
      int queued = 0;  // warp-uniform
      for (int x0 = 0; x0 < n; x0 += 32) {
        const int x = x0 + lane;
        const int a = x < n ? staged[x] : -1;
        const int rr = a + shift;
        const bool mine = a >= 0 && rr >= 0 && rr < block_rows && rr % kBwdWarps == warp;
        const unsigned hits = __ballot_sync(0xffffffffu, mine);
        if (mine) my_queue[queued + __popc(hits & ((1u << lane) - 1))] = x;
        queued += __popc(hits);
        __syncwarp();
        if (queued >= 32) {
          drain(base, 32);
          const int rest = queued - 32;
          const int moved = lane < rest ? my_queue[32 + lane] : 0;
          __syncwarp();
          if (lane < rest) my_queue[lane] = moved;
          __syncwarp();
          queued = rest;
        }
      }
      if (queued > 0) drain(base, queued);
      __syncwarp();
    }
  }
  __syncthreads();
  T* dd = static_cast<T*>(p.dd);
  for (int64_t x = tid; x < (r1 - r0) * p.dim; x += kBwdThreads)
    dd[r0 * p.dim + x] = from_f32<T>(acc[x]);
}

}  // namespace maxsim
