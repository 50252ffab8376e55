// Device-side views of token sets and pair maps: where a segment starts, how long it is, which
// rows are valid, and which (query, document) a score belongs to.
#pragma once
#include <climits>
#include "params.h"

namespace maxsim {

struct Segment {
  int64_t first_row;  // index of the segment's first row in the token set
  int len;            // valid prefix length
  int rows;           // rows the segment occupies (padded: pad_len; packed: len)
  bool ok;            // its id, offsets and length were in range (else empty: its scores are NaN)
};

// Whether 0 <= v < n (n >= 0): one unsigned compare, a negative v wraps past n.
__device__ __forceinline__ bool index_below(int v, int n) { return unsigned(v) < unsigned(n); }

// Segment n of a token set for an id already in [0, count) (computed from the grid, or checked):
// offsets outside [0, rows] or decreasing, or a length outside [0, pad_len] give an empty segment
// with ok == false, so nothing of it is read. Selects, no branch: the loads it feeds wait only
// for its offsets or length.
__device__ __forceinline__ Segment segment_at(const TokenSet& s, int n) {
  Segment g;
  if (s.offsets != nullptr) {
    const int begin = s.offsets[n], end = s.offsets[n + 1];
    // 0 <= begin <= end <= rows in two unsigned compares (a negative value wraps past rows;
    // the row limit depends on the parameters only, so it is computed off the loads' path).
    const unsigned row_end = unsigned(s.rows < INT_MAX ? s.rows : INT_MAX);
    g.ok = unsigned(begin) <= unsigned(end) && unsigned(end) <= row_end;
    g.first_row = g.ok ? begin : 0;
    g.len = g.rows = g.ok ? end - begin : 0;
  } else {
    const int len = s.lengths != nullptr ? s.lengths[n] : s.pad_len;
    g.first_row = static_cast<int64_t>(n) * s.pad_len;
    g.ok = unsigned(len) <= unsigned(s.pad_len);
    g.len = g.ok ? len : 0;
    g.rows = s.pad_len;
  }
  return g;
}

// Segment n for an id that may be out of range (explicit pairs, argmax entries): n outside
// [0, count) gives an empty segment with ok == false too. No host sync.
__device__ __forceinline__ Segment segment_of(const TokenSet& s, int n) {
  if (!index_below(n, s.count)) return Segment{0, 0, 0, false};
  return segment_at(s, n);
}

// Segment of a pair's query or document id (pair_query / pair_doc): checked only for explicit
// pairs, the grid layouts' ids are in range by construction (the host checks that documents ==
// queries * group for grouped pairs).
__device__ __forceinline__ Segment pair_segment(const PairMap& m, const TokenSet& s, int n) {
  return m.layout == kPairs ? segment_of(s, n) : segment_at(s, n);
}

// Whether a query segment is scored: a packed query longer than the max_lq hint is NaN, never
// cut short (the kernels size their row tiles and argmax rows by max_lq).
__device__ __forceinline__ bool query_ok(const TokenSet& q, const Segment& g, int max_lq) {
  return g.ok && (q.offsets == nullptr || g.len <= max_lq);
}

// Rows a token set's storage holds: a packed set's rows, a padded set's pad_len per segment.
__host__ __device__ __forceinline__ int64_t stored_rows(const TokenSet& s) {
  return s.offsets != nullptr ? s.rows : int64_t(s.count) * s.pad_len;
}

// Element offset of row `r` of the token set (rows are uniformly strided within a segment).
__device__ __forceinline__ int64_t row_elem(const TokenSet& s, int n, int64_t first_row, int t) {
  if (s.offsets != nullptr) return (first_row + t) * s.row_stride;
  return static_cast<int64_t>(n) * s.seg_stride + static_cast<int64_t>(t) * s.row_stride;
}

__device__ __forceinline__ bool row_valid(const TokenSet& s, const Segment& g, int t) {
  return t < g.len && (s.mask == nullptr || s.mask[g.first_row + t]);
}

// The first t < cols whose mask flag is set, or -1 where none is: a whole warp's ballot over 32
// flags per step (cols the same in every lane). Rare paths only: rows that found no column.
__device__ __forceinline__ int warp_first_set(const bool* mask, int cols, int lane) {
  for (int base = 0; base < cols; base += 32) {
    const unsigned hit = __ballot_sync(0xffffffffu, base + lane < cols && mask[base + lane]);
    if (hit != 0) return base + __ffs(hit) - 1;
  }
  return -1;
}

// Query and document of score `p`. Explicit pairs return the ids as given: segment_of checks them.
__device__ __forceinline__ int pair_query(const PairMap& m, int num_docs, int p) {
  switch (m.layout) {
    case kAllPairs: return p / num_docs;
    case kGrouped: return p / m.group;
    default: return m.pair_q[p];
  }
}
__device__ __forceinline__ int pair_doc(const PairMap& m, int num_docs, int p) {
  switch (m.layout) {
    case kAllPairs: return p % num_docs;
    case kGrouped: return p;
    default: return m.pair_d[p];
  }
}

// Running best of a max with PyTorch's rules: NaN wins (first NaN kept), then the larger value,
// then the lower index. idx < 0 means "nothing valid seen yet".
struct Best {
  float v;
  int idx;
};

__device__ __forceinline__ bool beats(float v, int i, const Best& b) {
  if (b.idx < 0) return i >= 0;
  if (i < 0) return false;
  const bool vn = v != v, bn = b.v != b.v;
  if (vn || bn) return vn && (!bn || i < b.idx);
  return v > b.v || (v == b.v && i < b.idx);
}

}  // namespace maxsim
