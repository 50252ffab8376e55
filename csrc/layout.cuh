// Device-side views of token sets and pair maps: where a segment starts, how long it is, which
// rows are valid, and which (query, document) a score belongs to.
#pragma once
#include "params.h"

namespace maxsim {

struct Segment {
  int64_t first_row;  // index of the segment's first row in the token set
  int len;            // valid prefix length
  int rows;           // rows the segment occupies (padded: pad_len; packed: len)
  bool ok;            // its id, offsets and length were in range (else empty: its scores are NaN)
};

// Segment n of a token set, checked against the set's extents: n outside [0, count), offsets
// outside [0, rows] or decreasing, or a length outside [0, pad_len] give an empty segment with
// ok == false, so nothing of it is read. A few compares per segment, no host sync.
__device__ __forceinline__ Segment segment_of(const TokenSet& s, int n) {
  Segment g{0, 0, 0, false};
  if (n < 0 || n >= s.count) return g;
  if (s.offsets != nullptr) {
    const int begin = s.offsets[n], end = s.offsets[n + 1];
    if (begin < 0 || begin > end || end > s.rows) return g;
    g.first_row = begin;
    g.len = g.rows = end - begin;
    g.ok = true;
  } else {
    const int len = s.lengths != nullptr ? s.lengths[n] : s.pad_len;
    g.first_row = static_cast<int64_t>(n) * s.pad_len;
    g.ok = len >= 0 && len <= s.pad_len;
    g.len = g.ok ? len : 0;
    g.rows = s.pad_len;
  }
  return g;
}

// Whether a query segment is scored: a packed query longer than the max_lq hint is NaN, never
// cut short (the kernels size their row tiles and argmax rows by max_lq).
__device__ __forceinline__ bool query_ok(const TokenSet& q, const Segment& g, int max_lq) {
  return g.ok && (q.offsets == nullptr || g.len <= max_lq);
}

// Element offset of row `r` of the token set (rows are uniformly strided within a segment).
__device__ __forceinline__ int64_t row_elem(const TokenSet& s, int n, int64_t first_row, int t) {
  if (s.offsets != nullptr) return (first_row + t) * s.row_stride;
  return static_cast<int64_t>(n) * s.seg_stride + static_cast<int64_t>(t) * s.row_stride;
}

__device__ __forceinline__ bool row_valid(const TokenSet& s, const Segment& g, int t) {
  return t < g.len && (s.mask == nullptr || s.mask[g.first_row + t]);
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
