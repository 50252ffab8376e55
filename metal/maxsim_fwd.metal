// Forward MaxSim: one threadgroup (one simdgroup of 32 threads) per scored (query, document) pair.
//
// Every layout reaches this kernel as flat pairs of segments (maxsim/metal.py plans them): pair p
// scores query segment pair_q[p] against document segment pair_d[p]; a segment is `count` rows
// from row `start` of its token matrix, and row r takes part where valid[r] != 0. The pair's
// similarities S = Q D^T come from 8x8 simdgroup_matrix tiles with fp32 accumulators, 32 query
// rows x 16 document tokens at a time; lane i then folds row i of S into its running max in
// document order (ties keep the lowest index, the first NaN wins), and lane 0 sums the rows.
#include "maxsim_common.h"

constant constexpr int kQueryRows = 32;  // one query row per lane when reducing S
constant constexpr int kDocTokens = 16;  // two 8-wide column tiles per step
constant constexpr int kDims = 128;      // staged dims: Q 16 KB + D 8 KB + S 2 KB in float

// Tiles keep half tokens as half (exact, and half the threadgroup memory: more groups per core);
// bfloat16 and float tokens are staged as float.
template <typename T>
struct Staged {
  typedef float type;
};
template <>
struct Staged<half> {
  typedef half type;
};

// One query row's max over the document tokens seen so far.
struct RowMax {
  float best;
  int index;      // the first token of the best non-NaN similarity, -1 if none yet
  int nan_index;  // the first NaN similarity, -1 if none

  bool seen() const { return index >= 0 || nan_index >= 0; }  // any valid document token

  void fold(float s, int j) {
    if (is_nan_bits(s)) {
      nan_index = nan_index < 0 ? j : nan_index;
    } else if (index < 0 || s > best) {  // strict: a tie keeps the earlier token
      best = s;
      index = j;
    }
  }
};

// Rows [row0, row0 + n) x dims [h0, h0 + kDims) of a token matrix into a tile, zeros where a row
// is past the segment or outside the matrix, or a dim is past H. Lanes take consecutive dims of
// one row (coalesced reads; one 64-bit row offset per row).
template <typename T, typename S>
inline void stage_rows(threadgroup S* tile, device const T* x, long start, long row0, long n,
                       long rows, long h0, long H, int tile_rows, uint lane) {
  for (int r = 0; r < tile_rows; ++r) {
    const long row = start + row0 + r;
    const bool inside = row0 + r < n && row >= 0 && row < rows;
    device const T* src = x + (inside ? row * H : 0);
    for (int c = int(lane); c < kDims; c += 32)
      tile[r * kDims + c] = S(inside && h0 + c < H ? to_float(src[h0 + c]) : 0.0f);
  }
}

// acc[rt][ct] += Q[rt*8.., k] * D[ct*8.., k]^T over the staged dims. Loop bounds are constants
// and the tile counts only guard (uniform branches): the loops unroll and acc stays in registers.
template <typename S>
inline void multiply_tiles(thread simdgroup_float8x8 acc[4][2], threadgroup const S* q_tile,
                           threadgroup const S* d_tile, int row_tiles, int col_tiles, int dims) {
  for (int k = 0; k < dims; k += 8) {
    simdgroup_matrix<S, 8, 8> b[2];
    for (int ct = 0; ct < 2; ++ct)
      if (ct < col_tiles)
        simdgroup_load(b[ct], d_tile + ct * 8 * kDims + k, kDims, ulong2(0, 0), true);
    for (int rt = 0; rt < 4; ++rt) {
      if (rt >= row_tiles) continue;
      simdgroup_matrix<S, 8, 8> a;
      simdgroup_load(a, q_tile + rt * 8 * kDims + k, kDims, ulong2(0, 0), false);
      for (int ct = 0; ct < 2; ++ct)
        if (ct < col_tiles) simdgroup_multiply_accumulate(acc[rt][ct], a, b[ct], acc[rt][ct]);
    }
  }
}

template <typename T>
kernel void maxsim_fwd(device const T* q [[buffer(0)]], device const T* d [[buffer(1)]],
                       device const int* q_start [[buffer(2)]],
                       device const int* q_count [[buffer(3)]],
                       device const uchar* q_valid [[buffer(4)]],
                       device const int* d_start [[buffer(5)]],
                       device const int* d_count [[buffer(6)]],
                       device const uchar* d_valid [[buffer(7)]],
                       device const int* pair_q [[buffer(8)]],
                       device const int* pair_d [[buffer(9)]], device float* scores [[buffer(10)]],
                       device int* argmax [[buffer(11)]], constant long& H [[buffer(12)]],
                       constant long& q_rows [[buffer(13)]], constant long& d_rows [[buffer(14)]],
                       constant long& n_q [[buffer(15)]], constant long& n_d [[buffer(16)]],
                       constant long& max_lq [[buffer(17)]],
                       constant long& with_argmax [[buffer(18)]],
                       uint3 group_id [[threadgroup_position_in_grid]],
                       uint lane [[thread_index_in_threadgroup]]) {
  typedef typename Staged<T>::type S;
  MS_THREADGROUP_ARRAY(S, q_tile, kQueryRows * kDims);
  MS_THREADGROUP_ARRAY(S, d_tile, kDocTokens * kDims);
  MS_THREADGROUP_ARRAY(float, s_tile, kQueryRows * kDocTokens);
  MS_THREADGROUP_ARRAY(float, row_values, kQueryRows);
  const long p = group_id.x;
  const long qi = pair_q[p], dj = pair_d[p];
  device int* out_argmax = argmax + p * max_lq;
  if (qi < 0 || qi >= n_q || dj < 0 || dj >= n_d) {  // an id out of range scores NaN
    for (long i = lane; with_argmax != 0 && i < max_lq; i += 32) out_argmax[i] = -1;
    if (lane == 0) scores[p] = NAN;
    return;
  }
  const long qs = q_start[qi], ds = d_start[dj];
  const long lq = min_long(q_count[qi], max_lq), ld = d_count[dj];
  const bool q_resident = H <= kDims;  // Q staged once per pass, not once per document tile
  float total = 0.0f;
  for (long q0 = 0; q0 < lq; q0 += kQueryRows) {
    const int row_tiles = int((min_long(lq - q0, kQueryRows) + 7) / 8);
    RowMax row = {-INFINITY, -1, -1};
    if (q_resident) stage_rows(q_tile, q, qs, q0, lq, q_rows, 0, H, kQueryRows, lane);
    for (long j0 = 0; j0 < ld; j0 += kDocTokens) {
      const int col_tiles = int((min_long(ld - j0, kDocTokens) + 7) / 8);
      simdgroup_float8x8 acc[4][2];
      for (int rt = 0; rt < 4; ++rt)
        for (int ct = 0; ct < 2; ++ct)
          acc[rt][ct] = make_filled_simdgroup_matrix<float, 8, 8>(0.0f);
      for (long h0 = 0; h0 < H; h0 += kDims) {
        if (!q_resident) stage_rows(q_tile, q, qs, q0, lq, q_rows, h0, H, kQueryRows, lane);
        stage_rows(d_tile, d, ds, j0, ld, d_rows, h0, H, kDocTokens, lane);
        threadgroup_barrier(mem_flags::mem_threadgroup);  // staged tiles visible to all lanes
        multiply_tiles(acc, q_tile, d_tile, row_tiles, col_tiles, int(min_long(H - h0, kDims)));
        if (!q_resident) threadgroup_barrier(mem_flags::mem_threadgroup);  // before restaging
      }
      for (int rt = 0; rt < 4; ++rt)
        for (int ct = 0; ct < 2; ++ct)
          if (rt < row_tiles && ct < col_tiles)
            simdgroup_store(acc[rt][ct], s_tile + rt * 8 * kDocTokens + ct * 8, kDocTokens);
      threadgroup_barrier(mem_flags::mem_threadgroup);  // S complete before lanes read rows
      for (int j = 0; j < kDocTokens && j0 + j < ld; ++j) {
        const long r = ds + j0 + j;
        if (r >= 0 && r < d_rows && d_valid[r] != 0)
          row.fold(s_tile[lane * kDocTokens + j], int(j0 + j));
      }
    }
    const long i = q0 + lane, r = qs + i;
    const bool counts = i < lq && r >= 0 && r < q_rows && q_valid[r] != 0 && row.seen();
    const int index = !counts ? -1 : row.nan_index >= 0 ? row.nan_index : row.index;
    if (with_argmax != 0 && i < lq) out_argmax[i] = index;
    row_values[lane] = !counts ? 0.0f : row.nan_index >= 0 ? NAN : row.best;
    threadgroup_barrier(mem_flags::mem_threadgroup);  // every row's value published
    if (lane == 0)
      for (int k = 0; k < kQueryRows; ++k) total += row_values[k];  // rows in order
    threadgroup_barrier(mem_flags::mem_threadgroup);  // read before the next pass overwrites
  }
  for (long i = max_long(lq, 0) + lane; with_argmax != 0 && i < max_lq; i += 32) out_argmax[i] = -1;
  if (lane == 0) scores[p] = total;
}

MS_KERNEL_INSTANCE(maxsim_fwd_float, maxsim_fwd, float)
MS_KERNEL_INSTANCE(maxsim_fwd_half, maxsim_fwd, half)
MS_KERNEL_INSTANCE(maxsim_fwd_bfloat, maxsim_fwd, bf16_bits)
