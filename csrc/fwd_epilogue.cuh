// The epilogue of the tensor-core forward, run at the end of each document: the warps' row maxima
// merged (lanes, then warps), masked by the query rows that count, scaled by the rows' scales,
// summed per query, and written as a score (or a row tile's partial sum) with the argmax.
#pragma once
#include "fwd_rowmax.cuh"

namespace maxsim {

template <typename B>
struct Epilogue {
  static constexpr int BM = B::BM, MT = B::MT, kThreads = B::kThreads;
  static constexpr bool kArgmax = B::kArgmax;
  using Acc = RowMax<B>;
  // Every warp takes whole rounds of the row loops: row_term's warp vote sees all 32 lanes.
  static_assert(BM % 32 == 0 && kThreads % 32 == 0, "rows in whole warps");

  B& b;
  Acc& acc;

  __device__ __forceinline__ Epilogue(B& blk, Acc& a) : b(blk), acc(a) {}

  // Each thread's bests into red_v / red_i: one slot per (slice, row).
  __device__ __forceinline__ void publish() {
    if constexpr (B::kWgT) {
      // Query row 8j + 2 (lane % 4) + h of the warpgroup's columns: the eight lanes of equal
      // lane % 4 hold the warp's 16 document rows of every tile; lanes 0..3 publish the warp's
      // best into the slot of its place in the warpgroup.
      const int slot = (b.warp % 4) * BM + (b.warp / 4) * B::kWgCols;
#pragma unroll
      for (int j = 0; j < B::kWgCols / 8; ++j)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          float v = acc.best_v[j][h];
          int i = acc.best_i[j][h];
          Acc::merge_lanes(v, i, 4, 32);
          if (b.lane < 4) {
            b.red_v[slot + 8 * j + 2 * b.lane + h] = v;
            b.red_i[slot + 8 * j + 2 * b.lane + h] = i;
          }
        }
    } else {
#pragma unroll
      for (int mi = 0; mi < MT; ++mi)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          float v = acc.best_v[mi][h];
          int i = acc.best_i[mi][h];
          Acc::merge_lanes(v, i, 1, 4);
          if (b.lane % 4 == 0) {
            const int r = b.warp_m * B::kWarpRows + mi * 16 + h * 8 + b.lane / 4;
            b.red_v[b.warp_n * BM + r] = v;
            b.red_i[b.warp_n * BM + r] = i;
          }
        }
    }
  }

  // Row r's best over the slices (in slice order: ties keep the lowest column).
  __device__ __forceinline__ void merged(int r, float& v, int& i) const {
    v = b.red_v[r];
    i = b.red_i[r];
#pragma unroll
    for (int w = 1; w < B::kParts; ++w) {
      const float ov = b.red_v[w * BM + r];
      if constexpr (kArgmax) {
        const int oi = b.red_i[w * BM + r];
        if (beats(ov, oi, Best{v, i})) { v = ov; i = oi; }
      } else {
        v = max_nan(v, ov);
      }
    }
  }

  // Row r's term of its query's sum (0 for padding and rows with no valid column, NaN for a query
  // out of range); writes its argmax (-1 for those) when asked. A document out of range has no
  // valid column (its span is empty), so its argmax is -1 here and write_sum makes its score NaN.
  // Whole warps call it.
  __device__ __forceinline__ float row_term(int item, int r, bool in_q, int qi, int t, float v, int i) const {
    const FwdParams& p = b.p;
    const uint8_t flag = b.row_ok[r];
    const bool valid = flag == kRowValid;
    // A row whose every valid similarity is -inf kept no column (the running max takes only a
    // column that beats it): its term is -inf (v still is) and its argmax the document's first
    // valid column, where it has one: 0 without a mask, else the mask's first set flag, looked
    // for only when a row of the warp needs it.
    const bool found = kArgmax ? i >= 0 : v != -INFINITY;
    bool has_col = b.c_span.cols > 0;
    int first = 0;
    if (p.d.mask != nullptr && __any_sync(0xffffffffu, valid && !found)) {
      first = b.first_masked_in(item);
      has_col = first >= 0;
    }
    if constexpr (kArgmax) {
      if (in_q && b.items.writes(qi) && t < p.max_lq)
        p.argmax[b.items.out(item, qi) * p.max_lq + t] = valid && (found || has_col) ? (found ? i : first) : -1;
    }
    const float term = valid && (found || has_col) ? v * b.row_scale[r] : 0.f;
    return flag == kRowNaN ? NAN : term;  // a select, no branch per row
  }

  // A warp's per-lane terms summed (butterfly) and written once for query qi: NaN where the
  // document is out of range (one select per score, not per row).
  __device__ __forceinline__ void write_sum(int item, int qi, float s, bool doc_ok) const {
    const FwdParams& p = b.p;
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) s += __shfl_xor_sync(0xffffffffu, s, off);
    if (b.lane == 0 && b.items.writes(qi)) {
      const int64_t out = b.items.out(item, qi);
      const float score = doc_ok ? s : NAN;
      if (b.grid.m_tiles > 1) p.partial[int64_t(b.mt) * p.pairs.num_pairs + out] = score;
      else p.scores[out] = score;
    }
  }

  // End of a document: merge lanes, then warps, then sum rows per query.
  __device__ __forceinline__ void operator()(int item) {
    publish();
    acc.reset();
    __syncthreads();
    const int qfirst = b.query_of_rows();
    const bool doc_ok = b.c_span.ok();  // the span of `item`: the cursor moves on after this
    if (BM == 32 && b.grid.qpb == 1) {
      // One query's 32 rows, one per lane of warp 0: the sum stays in registers, in the order
      // of the general path below, with no second barrier (red_v is next written after the
      // main loop's barrier).
      if (b.warp == 0) {
        float v;
        int i;
        merged(b.lane, v, i);
        write_sum(item, qfirst, row_term(item, b.lane, true, qfirst, b.t0 + b.lane, v, i), doc_ok);
      }
      return;
    }
    for (int r = b.tid; r < BM; r += kThreads) {
      float v;
      int i;
      merged(r, v, i);
      const int ql = r / b.rpq;
      b.row_val[r] = row_term(item, r, ql < b.grid.qpb, qfirst + ql, b.t0 + r % b.rpq, v, i);
    }
    __syncthreads();
    for (int ql = b.warp; ql < b.grid.qpb; ql += B::WM * B::WN) {
      float s = 0.f;
      for (int r = ql * b.rpq + b.lane; r < min(BM, (ql + 1) * b.rpq); r += 32) s += b.row_val[r];
      write_sum(item, qfirst + ql, s, doc_ok);
    }
  }
};

}  // namespace maxsim
