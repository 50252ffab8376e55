// Backward MaxSim as two gathers, without atomics: every output row sums its own list of
// contributions in list order, so gradients are bit-identical run after run.
//
// maxsim/metal.py lists, for every row of dQ, the (pair, query token) entries whose max it won
// (weight grad[pair], source row: the winning document token), and for every row of dD the entries
// it won (source row: the query token), each list in a stable order. One thread per (row, dim).
#include "maxsim_common.h"

template <typename T>
kernel void maxsim_gather_rows(device const T* src [[buffer(0)]],
                               device const int* row_entries [[buffer(1)]],
                               device const int* entry_row [[buffer(2)]],
                               device const float* entry_weight [[buffer(3)]],
                               device float* out [[buffer(4)]], constant long& H [[buffer(5)]],
                               constant long& src_rows [[buffer(6)]],
                               constant long& out_rows [[buffer(7)]],
                               constant long& entries [[buffer(8)]],
                               uint3 group_id [[threadgroup_position_in_grid]],
                               uint lane [[thread_index_in_threadgroup]]) {
  const long h = long(group_id.x) * 32 + lane, row = group_id.y;
  if (h >= H || row >= out_rows) return;
  const long begin = max_long(0, row_entries[row]), end = min_long(entries, row_entries[row + 1]);
  float acc = 0.0f;
  for (long e = begin; e < end; ++e) {
    const long s = entry_row[e];
    if (s >= 0 && s < src_rows) acc += entry_weight[e] * to_float(src[s * H + h]);  // fp32
  }
  out[row * H + h] = acc;
}

MS_KERNEL_INSTANCE(maxsim_gather_rows_float, maxsim_gather_rows, float)
MS_KERNEL_INSTANCE(maxsim_gather_rows_half, maxsim_gather_rows, half)
MS_KERNEL_INSTANCE(maxsim_gather_rows_bfloat, maxsim_gather_rows, bf16_bits)
