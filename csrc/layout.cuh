// Device-side views of token sets and pair maps: where a segment starts, how long it is, which
// rows are valid, and which (query, document) a score belongs to.
#pragma once
#include "params.h"

namespace maxsim {

struct Segment {
  int64_t first_row;  // index of the segment's first row in the token set
  int len;            // valid prefix length
  int rows;           // rows the segment occupies (padded: pad_len; packed: len)
};

__device__ __forceinline__ Segment segment_of(const TokenSet& s, int n) {
  Segment g;
  if (s.offsets != nullptr) {
    const int begin = s.offsets[n];
    g.first_row = begin;
    g.len = s.offsets[n + 1] - begin;
    g.rows = g.len;
  } else {
    g.first_row = static_cast<int64_t>(n) * s.pad_len;
    g.len = s.lengths != nullptr ? min(max(s.lengths[n], 0), s.pad_len) : s.pad_len;
    g.rows = s.pad_len;
  }
  return g;
}

// Element offset of row `r` of the token set (rows are uniformly strided within a segment).
__device__ __forceinline__ int64_t row_elem(const TokenSet& s, int n, int64_t first_row, int t) {
  if (s.offsets != nullptr) return (first_row + t) * s.row_stride;
  return static_cast<int64_t>(n) * s.seg_stride + static_cast<int64_t>(t) * s.row_stride;
}

__device__ __forceinline__ bool row_valid(const TokenSet& s, const Segment& g, int t) {
  return t < g.len && (s.mask == nullptr || s.mask[g.first_row + t]);
}

// Query and document of score `p`.
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
