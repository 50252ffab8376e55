// dD by document row, padded or packed documents. Two kernels:
//   1. per document, a stable counting sort of its argmax entries by winning row. The entries
//      are split into `ranges` contiguous ranges, one per warp; one pass counts per (range, row),
//      a scan turns the counts into each range's start within each row, and every warp then
//      places its own range in entry order. So every row's list is in entry order, as one warp
//      walking all entries would leave it, however many ranges a document takes. The counters
//      live in shared memory; a packed document (its length known only on the device) takes as
//      many ranges as fit, and one longer than the counters takes several passes of rows.
//   2. each half-warp gathers one document row's entries' query rows and sums g * q_row in fp32
//      in list order (in the training step, its first block also averages the row losses).
// Each row is touched by one half-warp and only by its own entries: no atomics on values, no
// scans of other rows' entries, and the same order (hence bits) as any other deterministic pass,
// padded or packed.
#pragma once
#include "bwd.cuh"
#include "overlap.cuh"

namespace maxsim {

constexpr int kSortThreads = 512;
constexpr int kSortWarps = kSortThreads / 32;  // at most this many ranges
constexpr int kSortMaxRows = 8192;             // the longest padded documents the sort takes
constexpr int kSortPrefetch = 4;               // entry loads in flight per lane

// Where document j's entries start in dd_sorted (documents laid out one after the other).
__device__ __forceinline__ int64_t doc_entry_base(const BwdParams& p, int j, const PairRange& pr) {
  switch (p.pairs.layout) {
    case kAllPairs: return int64_t(j) * p.q.count * p.max_lq;
    case kGrouped: return int64_t(j) * p.max_lq;
    default: return pr.begin * p.max_lq;
  }
}

// Step 2 of the sort: turns one pass's counts (n rows of cnt, `ranges` per row) into each
// (range, row)'s first position in the document's list, in (row, range) order after the `placed`
// entries of the earlier passes; returns `placed` plus the pass's entries. Each thread takes a
// contiguous piece of rows: a local exclusive scan, then the pieces' sums are scanned across the
// block.
__device__ __forceinline__ int scan_counts(int* cnt, int* warp_sums, int ranges, int n, int placed) {
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int per = (n + kSortThreads - 1) / kSortThreads;
  const int s0 = min(n, tid * per), s1 = min(n, s0 + per);
  int sum = 0;
  for (int s = s0; s < s1; ++s)
    for (int r = 0; r < ranges; ++r) {
      const int c = cnt[r * n + s];
      cnt[r * n + s] = sum;
      sum += c;
    }
  int incl = sum;
#pragma unroll
  for (int off = 1; off < 32; off <<= 1) {
    const int v = __shfl_up_sync(0xffffffffu, incl, off);
    if (lane >= off) incl += v;
  }
  if (lane == 31) warp_sums[warp] = incl;
  __syncthreads();
  int offset = placed + incl - sum, total = placed;
  for (int w = 0; w < kSortWarps; ++w) {
    offset += w < warp ? warp_sums[w] : 0;
    total += warp_sums[w];
  }
  for (int s = s0; s < s1; ++s)
    for (int r = 0; r < ranges; ++r) cnt[r * n + s] += offset;
  return total;
}

// Whether document j (well-formed, rows > 0) owns every one of its rows (owner_of_row). The
// search's answer never decreases as the row grows (each of its comparisons is monotone in the
// row), so checking the first and last rows is enough.
__device__ __forceinline__ bool owns_its_rows(const TokenSet& d, int j, const Segment& g) {
  return d.offsets == nullptr || (segment_at_or_before(d, g.first_row) == j &&
                                  segment_at_or_before(d, g.first_row + g.rows - 1) == j);
}

// Writes where each of the pass's rows starts in dd_sorted and how many entries it has (range 0's
// start is the row's; the next row's start, or the pass's end, ends it), for the rows the
// document owns (`all`: every row).
__device__ __forceinline__ void write_rows(const BwdParams& p, const int* cnt, int n, int end,
                                           int64_t base, int64_t first_row, int j, bool all) {
  for (int s = threadIdx.x; s < n; s += kSortThreads) {
    const int start = cnt[s], next = s + 1 < n ? cnt[s + 1] : end;
    const int64_t row = first_row + s;
    if (all || segment_at_or_before(p.d, row) == j) {  // one writer per row
      p.dd_start[row] = static_cast<int>(base) + start;
      p.dd_count[row] = next - start;
    }
  }
}

// Stable counting sort of document j's argmax entries by winning row, in passes of up to
// `counters` rows (one pass unless a packed document is longer): each pass counts, scans and
// places only the entries whose row it covers, after the entries of the earlier passes' rows.
// Padded documents always take one pass (the host gives them counters for pad_len rows or more).
template <bool kPacked>
__device__ __forceinline__ void sort_document_entries(const BwdParams& p, int counters) {
  extern __shared__ int cnt[];  // [ranges][chunk]: counts, then each range's cursors
  __shared__ int warp_sums[kSortWarps];
  const int j = blockIdx.x, tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  // The backward's padded documents carry no lengths: their rows are their padded rows. A
  // malformed packed document has none.
  const Segment gd = segment_at(p.d, j);
  const int rows = gd.rows;
  if (rows == 0) return;
  const int chunk = kPacked ? min(rows, counters) : rows;
  const int ranges = max(1, min(kSortWarps, counters / chunk));
  const PairRange pr = pairs_of_doc(p, j);
  const int entries = static_cast<int>((pr.end - pr.begin) * p.max_lq);
  const int span = max(1, entries / ranges + (entries % ranges != 0));  // entries per range
  const int64_t base = doc_entry_base(p, j, pr);

  // An entry's winning row, or -1 (none, or past the document's rows: no gradient).
  auto entry = [&](int e) -> int {
    const int kk = e / p.max_lq;
    const int64_t o = doc_pair_out(p, j, pr.begin + kk);
    const int a = p.argmax[o * p.max_lq + (e - kk * p.max_lq)];
    return index_below(a, rows) ? a : -1;
  };
  int placed = 0;  // entries of the earlier passes' rows
  for (int r0 = 0; r0 < rows; r0 += chunk) {
    const int n = min(chunk, rows - r0);  // rows of this pass
    __syncthreads();                      // the previous pass's cursors and sums are consumed
    for (int x = tid; x < ranges * n; x += kSortThreads) cnt[x] = 0;
    __syncthreads();
    // 1. counts per (range, row); integer counts are order-free
    for (int e0 = 0; e0 < entries; e0 += kSortPrefetch * kSortThreads) {
      int a[kSortPrefetch];
#pragma unroll
      for (int u = 0; u < kSortPrefetch; ++u) {
        const int e = e0 + u * kSortThreads + tid;
        a[u] = e < entries ? entry(e) - r0 : -1;
      }
#pragma unroll
      for (int u = 0; u < kSortPrefetch; ++u)
        if (index_below(a[u], n)) atomicAdd(&cnt[(e0 + u * kSortThreads + tid) / span * n + a[u]], 1);
    }
    __syncthreads();
    placed = scan_counts(cnt, warp_sums, ranges, n, placed);
    __syncthreads();
    write_rows(p, cnt, n, placed, base, gd.first_row + r0, j, !kPacked || owns_its_rows(p.d, j, gd));
    __syncthreads();  // range 0's cursors are read
    // 3. placement: warp w walks range w in entry order; equal rows within a step ranked by lane
    if (warp >= ranges) continue;
    int* cursor = cnt + warp * n;
    const int e_end = static_cast<int>(min(int64_t(entries), int64_t(warp + 1) * span));
    for (int e0 = warp * span; e0 < e_end; e0 += 32 * kSortPrefetch) {
      int a[kSortPrefetch];
#pragma unroll
      for (int u = 0; u < kSortPrefetch; ++u) {
        const int e = e0 + u * 32 + lane;
        a[u] = e < e_end ? entry(e) - r0 : -1;
        if (!index_below(a[u], n)) a[u] = -1;
      }
#pragma unroll
      for (int u = 0; u < kSortPrefetch; ++u) {
        const unsigned peers = __match_any_sync(0xffffffffu, a[u] >= 0 ? a[u] : -1 - lane);
        const int rank = __popc(peers & ((1u << lane) - 1));
        const int pos = a[u] >= 0 ? cursor[a[u]] + rank : 0;
        __syncwarp();
        if (a[u] >= 0) {
          p.dd_sorted[base + pos] = e0 + u * 32 + lane;
          if (rank == 0) cursor[a[u]] = pos + __popc(peers);
        }
        __syncwarp();
      }
    }
  }
}

// One block per document. Launched beside the dQ kernel where its counters are small (bwd.cu,
// overlap.cuh): the two share no output, and a small batch's documents fill few SMs.
template <bool kPacked>
__global__ void __launch_bounds__(kSortThreads) bwd_dd_sort_kernel(const BwdParams p, int counters) {
  sort_document_entries<kPacked>(p, counters);
  wait_for_prerequisite();  // the kernels queued after this one see dQ's writes too
}

// Two document rows per warp, one per half-warp (lanes over 16-byte column slices, as in dQ); the
// warp loops to the longer row's count so that it stays converged. Each half-warp decodes 16 of
// its row's entries at a time, a lane each, into shared memory (query row offset and gradient),
// then gathers 8 rows per step. Eight resident blocks (32 warps) per SM: the gathers need many in
// flight.
template <typename T, bool kVec>
__global__ void __launch_bounds__(kBwdThreads, 8) bwd_dd_rows_kernel(const BwdParams p) {
  constexpr int kCols = 16 * kSlice<T>;
  constexpr int kBatch = kGatherBatch<kVec>;
  __shared__ int64_t ent_at[kBwdWarps][32];  // [warp][half * 16 + entry]: -1 for none
  __shared__ float ent_g[kBwdWarps][32];
  const int w = threadIdx.x / 32, lane = threadIdx.x % 32, half = lane / 16, hl = lane % 16;
  if (p.ce.rows > 0 && blockIdx.x == 0) {  // the training step's loss: the row losses are written
    __shared__ float part[kMeanLanes];
    ce_mean(p.ce, part);
  }
  const int64_t row0 = (int64_t(blockIdx.x) * kBwdWarps + w) * 2;
  if (row0 >= p.d.rows) return;  // both of the warp's rows are past the end
  const int64_t row = row0 + half;
  const bool has_row = row < p.d.rows;
  // A row no document owns (a packed row outside every well-formed document) gets zeros.
  const int owner = has_row ? owner_of_row(p.d, row) : -1;
  const int j = max(owner, 0);
  const int start = owner >= 0 ? p.dd_start[row] : 0;
  const int count = owner >= 0 ? p.dd_count[row] : 0;
  const int warp_count = max(count, __shfl_xor_sync(0xffffffffu, count, 16));
  const T* qg = static_cast<const T*>(p.q.data);
  const int64_t* my_at = ent_at[w] + half * 16;
  const float* my_g = ent_g[w] + half * 16;
  for (int c0 = 0; c0 < p.dim; c0 += kCols) {
    const int c = c0 + hl * kSlice<T>;
    float acc[kSlice<T>] = {};
    for (int h0 = 0; h0 < warp_count; h0 += 16) {
      int64_t at = -1;
      float g = 0.f;
      if (h0 + hl < count) {
        const int e = p.dd_sorted[start + h0 + hl];
        const int kk = e / p.max_lq;
        const int64_t o = doc_pair_out(p, j, pairs_of_doc(p, j).begin + kk);
        const int qi = pair_query(p.pairs, p.d.count, static_cast<int>(o));
        const T* src = query_row(p, qg, qi, e - kk * p.max_lq);
        at = src != nullptr ? src - qg : -1;
        g = src != nullptr ? p.grad[o] : 0.f;  // no source: nothing added, even for a NaN g
      }
      __syncwarp();  // the previous entries are consumed
      ent_at[w][lane] = at;
      ent_g[w][lane] = g;
      __syncwarp();
      const int n = min(16, warp_count - h0);
      for (int b0 = 0; b0 < n; b0 += kBatch) {
        uint4 v[kBatch];
#pragma unroll
        for (int b = 0; b < kBatch; ++b) {
          const int64_t a = my_at[b0 + b];
          v[b] = load_slice<T, kVec>(qg + a, c, p.dim, a >= 0 && c < p.dim);
        }
#pragma unroll
        for (int b = 0; b < kBatch; ++b) fma_slice<T>(acc, my_g[b0 + b], v[b]);  // list order
      }
    }
    if (has_row && c < p.dim) store_slice<T>(static_cast<T*>(p.dd) + row * p.dim, c, p.dim, acc);
  }
}

}  // namespace maxsim
