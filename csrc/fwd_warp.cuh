// Streaming forward of 8-bit document codes against one short query, every warp on its own.
//
// The block's documents are cut into tiles of 32 tokens, numbered one after another, and each of
// the W warps takes an equal run of them. A warp copies its own tiles (cp.async into a ring of S
// private stages), multiplies the query (32 rows, shared by the block) by each of them with
// mma.sync (codes turned into fp16 / bf16 operands in registers, codes.cuh) and keeps a running
// max per query row while its tiles stay in one document; where the document changes it merges
// that max into the document's row maxima in shared memory (an atomic max on order-preserving
// integer keys). No block barrier runs per tile: one before the tiles and one after, when each
// warp sums the row maxima of some documents into their scores. A document spends at most 31
// rows of products past its end, and the block's tiles split evenly over its warps whatever the
// lengths. Why this beats the barrier-paced tiles of fwd_tc.cuh on these rows: their time went
// with the number of tiles (a partial tile cost a full one, and every tile paid a barrier and
// the block's bookkeeping), while here a warp's tile costs only its own instructions.
#pragma once
#include "codes.cuh"
#include "launch.h"
#include "layout.cuh"
#include "mma.cuh"

namespace maxsim {

template <int W, int S>
struct WarpStream {
  static constexpr int kRows = 32, kCols = 32, kDim = 128;
  static constexpr int kLdq = kDim + 8;  // halves per query row: conflict-free ldmatrix
  static constexpr int kMaxDocs = 32;    // documents per block: a lane of every warp each
  static constexpr int kThreads = W * 32;
  static constexpr int kTileBytes = kCols * kDim;
  static constexpr size_t kQ = 0;
  static constexpr size_t kD = kQ + size_t(kRows) * kLdq * 2;
  static constexpr size_t kScale = kD + size_t(W) * S * kTileBytes;
  static constexpr size_t kBits = kScale + size_t(W) * S * kCols * 4;
  static constexpr size_t kSlot = kBits + size_t(W) * S * 4;
  static constexpr size_t kRowScale = kSlot + size_t(kMaxDocs) * kRows * 4;
  static constexpr size_t kRowOk = kRowScale + kRows * 4;
  static constexpr size_t kBytes = kRowOk + kRows;
  static_assert(kD % 128 == 0, "stage alignment");
};

// Signed-integer keys that order like the floats they encode, NaN above everything (max_nan's
// rule); -inf's key means that no valid token was seen.
__device__ __forceinline__ int max_key(float v) {
  const int u = __float_as_int(v);
  return v != v ? 0x7fffffff : u >= 0 ? u : u ^ 0x7fffffff;
}
__device__ __forceinline__ float key_value(int k) { return __int_as_float(k >= 0 ? k : k ^ 0x7fffffff); }

// Blocks per SM that the H100's shared memory holds (the register budget is sized for them).
template <int W, int S>
constexpr int kWarpStreamBlocks = int((227 * 1024) / (WarpStream<W, S>::kBytes + 1024));

// One warp's product of the 32 query rows (q_s, codes' dim order) by a tile of 32 tokens of
// codes: query rows mi * 16 + h * 8 + g against tile columns ni * 8 + 2t + e (g = lane / 4,
// t = lane % 4). `tile` is the lane's first byte (b_off); b_swz its rows' unit swizzle.
template <typename T, typename DT, int kLdq>
__device__ __forceinline__ void warp_tile_product(const uint8_t* tile, const T* a_base, int b_swz,
                                                  float (&acc)[2][4][4]) {
  constexpr bool kBf16 = MmaType<T>::kBf16;
#pragma unroll
  for (int mi = 0; mi < 2; ++mi)
#pragma unroll
    for (int ni = 0; ni < 4; ++ni)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[mi][ni][e] = 0.f;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    uint2 w[4];
#pragma unroll
    for (int ni = 0; ni < 4; ++ni) w[ni] = *reinterpret_cast<const uint2*>(tile + ni * 1024 + ((j ^ b_swz) << 5));
#pragma unroll
    for (int s = 0; s < 2; ++s) {
      uint32_t a[2][4];
#pragma unroll
      for (int mi = 0; mi < 2; ++mi) ldmatrix_x4(a[mi], a_base + mi * 16 * kLdq + 32 * j + s * 16);
#pragma unroll
      for (int ni = 0; ni < 4; ++ni) {
        uint32_t b0, b1;
        codes_to_pairs<DT, T>(s ? w[ni].y : w[ni].x, b0, b1);
#pragma unroll
        for (int mi = 0; mi < 2; ++mi) mma_16816<kBf16>(acc[mi][ni], a[mi], b0, b1);
      }
    }
  }
}

// The tile's products times their tokens' scales, then into the running row maxima `best` over
// the tokens whose bit is set in `bits`.
__device__ __forceinline__ void warp_tile_max(float (&acc)[2][4][4], const float* scale, uint32_t bits,
                                              int t, float (&best)[2][2]) {
#pragma unroll
  for (int ni = 0; ni < 4; ++ni) {
    const float2 sc = *reinterpret_cast<const float2*>(scale + ni * 8 + 2 * t);
#pragma unroll
    for (int mi = 0; mi < 2; ++mi)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[mi][ni][e] *= e % 2 ? sc.y : sc.x;
  }
  if (bits == 0xffffffffu) {
#pragma unroll
    for (int mi = 0; mi < 2; ++mi)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float m0 = max_nan(acc[mi][0][2 * h], acc[mi][0][2 * h + 1]);
        float m1 = max_nan(acc[mi][1][2 * h], acc[mi][1][2 * h + 1]);
        float m2 = max_nan(acc[mi][2][2 * h], acc[mi][2][2 * h + 1]);
        float m3 = max_nan(acc[mi][3][2 * h], acc[mi][3][2 * h + 1]);
        best[mi][h] = max_nan(best[mi][h], max_nan(max_nan(m0, m1), max_nan(m2, m3)));
      }
  } else {
#pragma unroll
    for (int mi = 0; mi < 2; ++mi)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float m = best[mi][h];
#pragma unroll
        for (int ni = 0; ni < 4; ++ni)
#pragma unroll
          for (int e = 0; e < 2; ++e)
            m = max_nan(m, (bits >> (ni * 8 + 2 * t + e)) & 1u ? acc[mi][ni][2 * h + e] : -INFINITY);
        best[mi][h] = m;
      }
  }
}

// The query rows (32 of them) in the order the codes' fragments take their dims, zero past the
// query; its row flags and scales. Returns whether the query is in range (else its scores are NaN).
template <typename T, int kLdq, int kThreads>
__device__ __forceinline__ bool warp_load_query(const FwdParams& p, int q0, T* q_s, bool* row_ok,
                                                float* row_scale) {
  const T* qg = static_cast<const T*>(p.q.data);
  const Segment qseg = segment_of(p.q, q0);
  for (int c = threadIdx.x; c < 32 * 16; c += kThreads) {
    const int r = c / 16, k = c % 16;
    uint4 v = make_uint4(0, 0, 0, 0);
    if (r < qseg.rows) v = *reinterpret_cast<const uint4*>(qg + row_elem(p.q, q0, qseg.first_row, r) + k * 8);
    store_query_chunk_for_codes(q_s + r * kLdq, k, v);
  }
  const int tid = threadIdx.x;
  if (tid < 32) {
    const bool valid = row_valid(p.q, qseg, tid);
    row_ok[tid] = valid;
    row_scale[tid] = valid && p.q_scale != nullptr ? p.q_scale[qseg.first_row + tid] : 1.f;
  }
  return query_ok(p.q, qseg, p.max_lq);
}

// A document's row maxima from this warp's tiles joined to its slots (slot[row]) in shared memory.
__device__ __forceinline__ void warp_publish(const float (&best)[2][2], int* slot, int t) {
#pragma unroll
  for (int mi = 0; mi < 2; ++mi)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float v = best[mi][h];
      v = max_nan(v, __shfl_xor_sync(0xffffffffu, v, 1));
      v = max_nan(v, __shfl_xor_sync(0xffffffffu, v, 2));
      if (t == 0) atomicMax(slot + mi * 16 + h * 8, max_key(v));
    }
}

// Each document's score: its row maxima times the row scales, summed over the valid query rows;
// one warp per document. A row maximum of -inf is a zero term where the document has no valid
// column, and -inf where it has one (every valid similarity -inf): a mask is scanned only then.
// NaN where the query or the document is out of range. Lane i holds document i's doc_ok, its
// valid prefix (doc_len) and first row.
template <int W>
__device__ __forceinline__ void warp_write_scores(const FwdParams& p, const int* slot, const bool* row_ok,
                                                  const float* row_scale, int q0, int item_begin, int n_docs,
                                                  bool q_ok, bool doc_ok, int doc_len, int64_t doc_first) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const PairMap& pm = p.pairs;
  const bool grouped = pm.layout == kGrouped;
  for (int i = warp; i < n_docs; i += W) {
    const float v = key_value(slot[i * 32 + lane]);
    const int cols = __shfl_sync(0xffffffffu, doc_len, i);
    const int64_t first_row = __shfl_sync(0xffffffffu, doc_first, i);
    bool has_col = cols > 0;
    if (p.d.mask != nullptr && __any_sync(0xffffffffu, row_ok[lane] && v == -INFINITY) && has_col)
      has_col = warp_first_set(p.d.mask + first_row, cols, lane) >= 0;
    float s = row_ok[lane] && (v != -INFINITY || has_col) ? v * row_scale[lane] : 0.f;
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) s += __shfl_xor_sync(0xffffffffu, s, off);
    const bool ok = q_ok && __shfl_sync(0xffffffffu, doc_ok, i);
    if (lane == 0) {
      const int it = item_begin + i;
      if (!ok) s = NAN;
      p.scores[grouped ? int64_t(q0) * pm.group + it : int64_t(q0) * p.d.count + it] = s;
    }
  }
}

template <typename T, typename DT, int W, int S>
__global__ void __launch_bounds__(W * 32, (kWarpStreamBlocks<W, S>))
fwd_warp_codes_kernel(const __grid_constant__ FwdParams p, const FwdGrid grid) {
#if __CUDA_ARCH__ >= 800
  using Cfg = WarpStream<W, S>;
  constexpr int kLdq = Cfg::kLdq;
  extern __shared__ __align__(128) unsigned char smem[];
  T* q_s = reinterpret_cast<T*>(smem + Cfg::kQ);
  int* slot = reinterpret_cast<int*>(smem + Cfg::kSlot);
  float* row_scale = reinterpret_cast<float*>(smem + Cfg::kRowScale);
  bool* row_ok = reinterpret_cast<bool*>(smem + Cfg::kRowOk);

  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const PairMap& pm = p.pairs;
  const int q0 = blockIdx.x % grid.q_tiles, chunk = blockIdx.x / grid.q_tiles;
  const bool grouped = pm.layout == kGrouped;
  const int items = grouped ? pm.group : p.d.count;
  const int item_begin = chunk * grid.docs_per_block;
  const int n_docs = min(items, item_begin + grid.docs_per_block) - item_begin;
  if (n_docs <= 0) return;
  const uint8_t* dg = static_cast<const uint8_t*>(p.d.data);

  // Every warp reads the block's documents itself, lane i document i (where it starts, its
  // length, its first tile's number), so that its first copies go out before the block's barrier.
  int64_t doc_base = 0, doc_first = 0;
  int doc_len = 0, tiles = 0;
  bool doc_ok = true;  // lane i: document i's id, offsets and length in range
  if (lane < n_docs) {
    const int doc = grouped ? q0 * pm.group + item_begin + lane : item_begin + lane;
    const Segment g = segment_of(p.d, doc);
    doc_base = row_elem(p.d, doc, g.first_row, 0);
    doc_first = g.first_row;
    doc_len = g.len;
    doc_ok = g.ok;
    tiles = (g.len + Cfg::kCols - 1) / Cfg::kCols;
  }
  int doc_end = tiles;  // one past the document's last tile
#pragma unroll
  for (int off = 1; off < 32; off <<= 1) {
    const int v = __shfl_up_sync(0xffffffffu, doc_end, off);
    if (lane >= off) doc_end += v;
  }
  const int doc_start = doc_end - tiles;
  const int total = __shfl_sync(0xffffffffu, doc_end, 31);
  const int t_begin = int(int64_t(total) * warp / W), t_end = int(int64_t(total) * (warp + 1) / W);
  // The document holding tile tt (documents without tiles hold none).
  auto doc_of = [&](int tt) { return __ffs(__ballot_sync(0xffffffffu, doc_start <= tt && tt < doc_end)) - 1; };
  uint8_t* my_d = smem + Cfg::kD + size_t(warp) * S * Cfg::kTileBytes;
  float* my_scale = reinterpret_cast<float*>(smem + Cfg::kScale) + warp * S * Cfg::kCols;
  uint32_t* my_bits = reinterpret_cast<uint32_t*>(smem + Cfg::kBits) + warp * S;

  // ---- producer. Lane l copies 16-byte chunk l % 8 of rows l / 8 + 4i. A row's four 32-byte
  // units (one k32 step each) sit XOR-ed by row % 4, so that the fragment loads below (four rows
  // of 32 bytes per half warp) hit every bank once; row % 4 = l / 8 here, so a lane's
  // destination is one offset plus 512 per row step.
  const int cl = lane % 8, rl = lane / 8;
  const int dst_off = rl * 128 + (((cl >> 1) ^ rl) << 5) + (cl & 1) * 16;
  int p_t = t_begin;
  // A tile's scales and validity are loaded into registers when it is issued and stored one
  // step later, so that their latency hides behind a tile of work.
  bool in_reg = false, mask_reg = true;
  float scale_reg = 0.f;
  int pending = -1;
  auto store_pending = [&]() {
    if (pending >= 0) {
      my_scale[pending * Cfg::kCols + lane] = in_reg ? scale_reg * kCodeFold<DT, T> : 0.f;
      const uint32_t bits = __ballot_sync(0xffffffffu, in_reg && mask_reg);
      if (lane == 0) my_bits[pending] = bits;
    }
    pending = -1;
  };
  auto issue = [&](int stage) {
    if (p_t < t_end) {
      const int d = doc_of(p_t);
      const int r0 = (p_t - __shfl_sync(0xffffffffu, doc_start, d)) * Cfg::kCols;
      const int rows = min(Cfg::kCols, __shfl_sync(0xffffffffu, doc_len, d) - r0);
      const uint8_t* src = dg + __shfl_sync(0xffffffffu, doc_base, d) + int64_t(r0 + rl) * p.d.row_stride + cl * 16;
      uint8_t* dst = my_d + stage * Cfg::kTileBytes + dst_off;
      const int64_t step = 4 * p.d.row_stride;
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        if (rl + 4 * i < rows) cp_async16(dst + i * 512, src, 16);
        src += step;
      }
      in_reg = lane < rows;
      const int64_t row = __shfl_sync(0xffffffffu, doc_first, d) + r0 + lane;
      if (in_reg && p.d.mask != nullptr) mask_reg = p.d.mask[row];
      if (in_reg) scale_reg = p.d_scale[row];
      pending = stage;
      ++p_t;
    }
    cp_async_commit();  // empty groups keep the wait counts uniform
  };
#pragma unroll
  for (int s = 0; s < S - 1; ++s) {
    store_pending();
    issue(s);
  }

  const bool q_ok = warp_load_query<T, kLdq, Cfg::kThreads>(p, q0, q_s, row_ok, row_scale);
  for (int i = tid; i < n_docs * Cfg::kRows; i += Cfg::kThreads) slot[i] = max_key(-INFINITY);
  __syncthreads();

  // ---- consumer: query rows mi * 16 + h * 8 + g against tile columns ni * 8 + 2t + e.
  if (t_begin < t_end) {
    const int g = lane / 4, t = lane % 4;
    const T* a_base = q_s + (lane % 16) * kLdq + (lane / 16) * 8;
    const int b_off = g * 128 + t * 8, b_swz = g & 3;
    float best[2][2];
    auto reset = [&]() {
#pragma unroll
      for (int mi = 0; mi < 2; ++mi) best[mi][0] = best[mi][1] = -INFINITY;
    };
    reset();
    int c_doc = doc_of(t_begin), stage = 0;
    int c_end = __shfl_sync(0xffffffffu, doc_end, c_doc);
    for (int c_t = t_begin; c_t < t_end; ++c_t) {
      store_pending();
      cp_async_wait<S - 2>();
      __syncwarp();
      issue((stage + S - 1) % S);
      const uint8_t* tile = my_d + stage * Cfg::kTileBytes + b_off;
      float acc[2][4][4];
      warp_tile_product<T, DT, kLdq>(tile, a_base, b_swz, acc);
      warp_tile_max(acc, my_scale + stage * Cfg::kCols, my_bits[stage], t, best);
      // Where this warp's next tile is another document's (or it has none), its maxima join
      // the document's.
      if (c_t + 1 == t_end || c_t + 1 == c_end) {
        warp_publish(best, slot + c_doc * Cfg::kRows + g, t);
        reset();
        if (c_t + 1 < t_end) {
          c_doc = doc_of(c_t + 1);
          c_end = __shfl_sync(0xffffffffu, doc_end, c_doc);
        }
      }
      stage = (stage + 1) % S;
    }
  }
  cp_async_wait<0>();
  __syncthreads();
  warp_write_scores<W>(p, slot, row_ok, row_scale, q0, item_begin, n_docs, q_ok, doc_ok, doc_len, doc_first);
#endif
}

// Host side: resident blocks per SM (asked once per device) and the launch.
template <typename T, typename DT, int W, int S>
int warp_stream_resident() {
  constexpr auto kernel = fwd_warp_codes_kernel<T, DT, W, S>;
  constexpr int kMaxDevices = 64;
  static int cached[kMaxDevices] = {};
  int device = 0;
  cudaGetDevice(&device);
  if (device < kMaxDevices && cached[device] > 0) return cached[device];
  allow_smem<kernel>(WarpStream<W, S>::kBytes);
  int blocks = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, W * 32, WarpStream<W, S>::kBytes) != cudaSuccess) {
    (void)cudaGetLastError();
    blocks = 1;
  }
  blocks = blocks > 1 ? blocks : 1;
  if (device < kMaxDevices) cached[device] = blocks;
  return blocks;
}

template <typename T, typename DT, int W, int S>
void warp_stream_launch(const FwdParams& p, int blocks, const FwdGrid& grid, cudaStream_t stream) {
  constexpr auto kernel = fwd_warp_codes_kernel<T, DT, W, S>;
  allow_smem<kernel>(WarpStream<W, S>::kBytes);
  kernel<<<blocks, W * 32, WarpStream<W, S>::kBytes, stream>>>(p, grid);
}

}  // namespace maxsim
