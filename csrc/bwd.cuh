// Deterministic MaxSim backward from the forward's argmax. Only the winning document token of
// each (pair, query token) receives gradient, so both gradients are sparse gathers:
//   dQ[i, t]  = sum over pairs p of query i    of g[p] * D[doc(p), argmax[p, t]]
//   dD[j, s]  = sum over (p, t) with doc(p) = j and argmax[p, t] = s of g[p] * Q[query(p), t]
// Every output row has exactly one writer that adds its terms in a fixed order: no atomics,
// bit-identical results run after run.
#pragma once
#include <type_traits>
#include "ce.cuh"
#include "overlap.cuh"
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

// The last segment of a packed token set that starts at or before row r (a binary search of the
// offsets; segment 0 where none does).
__device__ __forceinline__ int segment_at_or_before(const TokenSet& s, int64_t r) {
  int lo = 0, hi = s.count;
  while (hi - lo > 1) {
    const int mid = lo + (hi - lo) / 2;  // lo + hi may pass INT_MAX
    if (s.offsets[mid] <= r) lo = mid; else hi = mid;
  }
  return lo;
}

// The document whose dD row r is (the one writer of its start and count in the dD sort), or -1
// for a packed row that no well-formed document holds. Offsets out of order can make two
// in-range documents share rows: each shared row then has the one owner the search finds.
__device__ __forceinline__ int owner_of_row(const TokenSet& d, int64_t r) {
  if (d.offsets == nullptr) return static_cast<int>(r / d.pad_len);
  const int j = segment_at_or_before(d, r);
  const Segment g = segment_of(d, j);
  return g.ok && r >= g.first_row && r - g.first_row < g.len ? j : -1;
}

// Query qi's row t as an argmax entry's source, or null where the query is out of range (an id,
// length or offsets; a packed query past max_lq) or t is past its rows: that entry adds nothing.
// Padded queries of the grid layouts need no check: qi comes from the grid and t < max_lq, which
// the host holds to the padded length.
template <typename T>
__device__ __forceinline__ const T* query_row(const BwdParams& p, const T* qg, int qi, int t) {
  if (p.q.offsets == nullptr && p.pairs.layout != kPairs) return qg + row_elem(p.q, qi, 0, t);
  const Segment g = pair_segment(p.pairs, p.q, qi);
  return query_ok(p.q, g, p.max_lq) && t < g.rows ? qg + row_elem(p.q, qi, g.first_row, t) : nullptr;
}

constexpr int kBwdThreads = 128;
constexpr int kBwdWarps = kBwdThreads / 32;

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

// Row gathers of dQ and of dD by row: each half-warp takes one row, each lane a 16-byte slice of
// it (kSlice values), so a half-warp covers kSlice * 16 columns (128 for 16-bit types, 64 for
// fp32) and the two half-warps gather different rows. kVec: every slice is one aligned 16-byte
// load (16-byte aligned data, row strides and dim multiples of kSlice); otherwise element loads.
template <typename T> constexpr int kSlice = 16 / sizeof(T);
// Rows a half-warp loads before adding them (element loads hold more registers per slice).
template <bool kVec> constexpr int kGatherBatch = kVec ? 8 : 4;

// The slice at row + c, or zeros where !ok (an empty entry, or columns past dim).
template <typename T, bool kVec>
__device__ __forceinline__ uint4 load_slice(const T* row, int c, int dim, bool ok) {
  uint4 v;
  if constexpr (kVec) {
    // A predicated load into zeroed registers: written in C++ (ok ? load : 0), the compiler
    // waits for each row before issuing the next.
    asm("{\n"
        "  .reg .pred p;\n"
        "  setp.ne.b32 p, %5, 0;\n"
        "  mov.b32 %0, 0;\n"
        "  mov.b32 %1, 0;\n"
        "  mov.b32 %2, 0;\n"
        "  mov.b32 %3, 0;\n"
        "  @p ld.global.v4.u32 {%0, %1, %2, %3}, [%4];\n"
        "}\n"
        : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
        : "l"(row + c), "r"(int(ok)));
  } else {
    uint32_t w[4] = {0, 0, 0, 0};  // zero bits read as +0 in every type
    if (ok) {
      if constexpr (sizeof(T) == 2) {
        const uint16_t* h = reinterpret_cast<const uint16_t*>(row + c);
#pragma unroll
        for (int e = 0; e < 8; ++e)
          if (c + e < dim) w[e / 2] |= uint32_t(h[e]) << (16 * (e % 2));
      } else {
        const uint32_t* f = reinterpret_cast<const uint32_t*>(row + c);
#pragma unroll
        for (int e = 0; e < 4; ++e)
          if (c + e < dim) w[e] = f[e];
      }
    }
    v = make_uint4(w[0], w[1], w[2], w[3]);
  }
  return v;
}

// acc[e] += g * slice[e], in element order.
template <typename T>
__device__ __forceinline__ void fma_slice(float (&acc)[kSlice<T>], float g, const uint4& raw) {
  const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    if constexpr (std::is_same_v<T, float>) {
      acc[k] = fmaf(g, __uint_as_float(w[k]), acc[k]);
    } else {
      float lo, hi;
      if constexpr (std::is_same_v<T, __half>) {
        lo = __half2float(__ushort_as_half(static_cast<unsigned short>(w[k] & 0xffffu)));
        hi = __half2float(__ushort_as_half(static_cast<unsigned short>(w[k] >> 16)));
      } else {  // bf16 -> fp32 is exact: the bits move to the top half
        lo = __uint_as_float(w[k] << 16);
        hi = __uint_as_float(w[k] & 0xffff0000u);
      }
      acc[2 * k] = fmaf(g, lo, acc[2 * k]);
      acc[2 * k + 1] = fmaf(g, hi, acc[2 * k + 1]);
    }
  }
}

template <typename T> __device__ __forceinline__ uint32_t bits_of(float x) {
  if constexpr (std::is_same_v<T, float>) return __float_as_uint(x);
  else if constexpr (std::is_same_v<T, __half>) return __half_as_ushort(__float2half_rn(x));
  else return __bfloat16_as_ushort(__float2bfloat16_rn(x));
}

// Writes a lane's slice of an output row (one 16-byte store when aligned and whole).
template <typename T>
__device__ __forceinline__ void store_slice(T* row, int c, int dim, const float (&acc)[kSlice<T>]) {
  constexpr int n = kSlice<T>;
  uint32_t w[4];
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    if constexpr (n == 4) w[k] = bits_of<T>(acc[k]);
    else w[k] = bits_of<T>(acc[2 * k]) | bits_of<T>(acc[2 * k + 1]) << 16;
  }
  if (c + n <= dim && reinterpret_cast<uintptr_t>(row + c) % 16 == 0) {
    *reinterpret_cast<uint4*>(row + c) = make_uint4(w[0], w[1], w[2], w[3]);
    return;
  }
#pragma unroll
  for (int e = 0; e < n; ++e)
    if (c + e < dim) row[c + e] = from_f32<T>(acc[e]);
}

// One warp per query token row, kBwdWarps consecutive rows of one query per block. The block
// first stages, for up to kDqStagedPairs pairs, everything a gather needs: each warp's document
// row (element offset, -1 for none) and gradient (0 for none). A warp's loop is then smem reads,
// 8 independent 16-byte row loads per lane (16 rows per warp) and FMAs. Half-warp h adds the
// pairs k with k % 2 == h in order; the two sums are added at the end (a + b == b + a): a fixed
// order, deterministic. kCe (the training step): the pairs' gradients are the cross-entropy's,
// computed here from the scores (warp 0 finds the query's log-sum-exp first); the query's first
// block also writes them and the row's loss for the dD kernels (ce.cuh: the same bits as `ce`).
constexpr int kDqStagedPairs = 256;
constexpr int kDqStep = 16;  // staged pairs are padded to whole warp steps (2 * kGatherBatch)
constexpr int kPairsPerPass = kBwdThreads / kBwdWarps;  // pairs one staging pass of the block covers
constexpr int kStageBatch = 4;

template <typename T, bool kVec, bool kCe>
__global__ void __launch_bounds__(kBwdThreads, 8) bwd_dq_kernel(const BwdParams p, int row_blocks) {
  constexpr int kCols = 16 * kSlice<T>;  // columns per pass
  constexpr int kBatch = kGatherBatch<kVec>;
  __shared__ int64_t staged_row[kDqStagedPairs][kBwdWarps];
  __shared__ float staged_g[kDqStagedPairs][kBwdWarps];  // 0 where the row is -1
  const int i = blockIdx.x / row_blocks;
  const int t_base = (blockIdx.x % row_blocks) * kBwdWarps;
  const int w = threadIdx.x / 32, t = t_base + w;
  const int lane = threadIdx.x % 32, half = lane / 16;
  let_dependents_start();  // the dD sort, launched beside this kernel, may start
  CeRow ce{};
  if constexpr (kCe) {  // before any early return: the query's first block writes the row
    __shared__ CeRow ce_shared;
    if (w == 0) {
      ce = ce_row(p.ce, i, lane);
      if (lane == 0) ce_shared = ce;
      if (t_base == 0) ce_write_row(p.ce, i, lane, ce);
    }
    __syncthreads();
    ce = ce_shared;
  }
  const Segment gq = segment_of(p.q, i);
  const bool q_ok = query_ok(p.q, gq, p.max_lq);  // else its rows get no gradient
  const int t_end = min(gq.rows, p.max_lq);
  if (t_base >= t_end) return;  // the whole block is past the query
  const bool active = t < t_end;
  const T* dg = static_cast<const T*>(p.d.data);
  const PairRange r = pairs_of_query(p, i);
  // Every column pass reuses the staged pairs when they all fit at once.
  const bool one_round = r.end - r.begin <= kDqStagedPairs;
  T* out = static_cast<T*>(p.dq) + row_elem(p.q, i, gq.first_row, t);
  for (int c0 = 0; c0 < p.dim; c0 += kCols) {
    const int c = c0 + (lane % 16) * kSlice<T>;
    float acc[kSlice<T>] = {};
    for (int64_t k0 = r.begin; k0 < r.end; k0 += kDqStagedPairs) {
      const int n = static_cast<int>(r.end - k0 < kDqStagedPairs ? r.end - k0 : kDqStagedPairs);
      if (c0 == 0 || !one_round) {
        // Padded to whole steps with empty entries, so the gather loop needs no bounds.
        const int n_pad = (n + kDqStep - 1) / kDqStep * kDqStep;
        __syncthreads();  // the previous round's entries are consumed
        // Thread x stages warp x % kBwdWarps's entries of pairs x / kBwdWarps + 32 u: all loads
        // of a batch are issued before any is used.
        const int ww = threadIdx.x % kBwdWarps, tt = t_base + ww;
        for (int kk0 = threadIdx.x / kBwdWarps; kk0 < n_pad; kk0 += kStageBatch * kPairsPerPass) {
          int a[kStageBatch], len[kStageBatch];
          float g[kStageBatch];
          int64_t row0[kStageBatch];  // element offset of the pair's document's row 0
#pragma unroll
          for (int u = 0; u < kStageBatch; ++u) {
            const int kk = kk0 + u * kPairsPerPass;
            a[u] = -1;
            len[u] = 0;
            row0[u] = 0;
            if (kk < n && tt < t_end && q_ok) {
              const int64_t o = query_pair_out(p, i, k0 + kk);
              a[u] = p.argmax[o * p.max_lq + tt];
              // The document's length is loaded with the argmax (both need only the pair), so
              // the check below waits for no further load.
              const int j = pair_doc(p.pairs, p.d.count, static_cast<int>(o));
              const Segment gd = pair_segment(p.pairs, p.d, j);
              len[u] = gd.len;
              row0[u] = row_elem(p.d, j, gd.first_row, 0);
              if constexpr (kCe) g[u] = ce_grad(p.ce, ce, k0 + kk, p.ce.scores[o]);
              else g[u] = p.grad[o];
            }
          }
#pragma unroll
          for (int u = 0; u < kStageBatch; ++u) {
            const int kk = kk0 + u * kPairsPerPass;
            if (kk >= n_pad) break;
            // An argmax past the document's valid tokens (or a document out of range): none.
            const int64_t at = index_below(a[u], len[u]) ? row0[u] + int64_t(a[u]) * p.d.row_stride : -1;
            staged_row[kk][ww] = at;
            staged_g[kk][ww] = at >= 0 ? g[u] : 0.f;
          }
        }
        __syncthreads();
      }
      if (!active) continue;
      for (int kk0 = 0; kk0 < n; kk0 += 2 * kBatch) {
        uint4 v[kBatch];
#pragma unroll
        for (int b = 0; b < kBatch; ++b) {
          const int64_t at = staged_row[kk0 + 2 * b + half][w];
          v[b] = load_slice<T, kVec>(dg + at, c, p.dim, at >= 0 && c < p.dim);
        }
#pragma unroll
        for (int b = 0; b < kBatch; ++b) fma_slice<T>(acc, staged_g[kk0 + 2 * b + half][w], v[b]);
      }
    }
    if (active) {
#pragma unroll
      for (int e = 0; e < kSlice<T>; ++e) acc[e] += __shfl_xor_sync(0xffffffffu, acc[e], 16);
      if (half == 0 && c < p.dim) store_slice<T>(out, c, p.dim, acc);
    }
  }
}

// dD of padded documents longer than the sort takes (kSortMaxRows): one block per run of `rows`
// consecutive document rows (possibly spanning several documents).
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

  // Padded documents only: packed ones always take the sorted dD (bwd_sorts_rows).
  auto doc_of_row = [&](int64_t r) -> int { return static_cast<int>(r / p.d.pad_len); };
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
        my_src = query_row(p, qg, qi, e - kk * p.max_lq);  // null: no gradient
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
        // An argmax past the document's valid tokens adds nothing (nor to another document).
        const bool mine = index_below(a, gd.len) && rr >= 0 && rr < block_rows && rr % kBwdWarps == warp;
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
