// Fused MaxSim forward on tensor cores (sm_80+ mma.sync m16n8k16, sm_90a wgmma; fp16 / bf16).
//
// A block owns a tile of BM query rows (one query, a slice of a long query, or several short
// queries of an all-pairs batch) kept in shared memory, and streams the token tiles of a list of
// documents through a STAGES-deep cp.async pipeline. Each warp multiplies its rows by its slice
// of the document tile and keeps a running max (and argmax) per row in registers; at the end of a
// document the block merges the warps' maxima, sums them per query and writes one score. The
// [Lq, Ld] similarity tile never leaves registers.
//
// Documents stored as 8-bit codes (DT = Int8Codes / E4m3Codes, codes.cuh) stream at half the
// bytes: they are staged as bytes, turned into T operands in registers, and each dot product is
// multiplied by its token's scale before the max. Queries may carry a per-row scale too (p.q_scale,
// quantized queries passed as exact codes), applied to the row's maximum. Int8 queries against
// int8 documents (DT = Int8x8) come as fp16 pairs of codes: the 16-bit path copies and addresses
// them unchanged, and the integer mma (int32 accumulators, exact) replaces the fp16 one.
//
// On Hopper the 128-row compute tile (kWide: two warpgroups of 64 rows x 128 columns) runs on
// wgmma: query and document tiles are stored with the 128-byte swizzle and read through shared-
// memory descriptors. Two blocks per SM with two stages each: one block's max runs while the
// other's wgmma does. The 32-row streaming tile of 16-bit documents (kWgSlim) runs on wgmma too,
// transposed: S^T = D_tile * Q^T, one warpgroup of 64 document tokens x 32 query rows per tile.
// 8-bit codes take kWide's place with the same transposed product over 128 query rows: each warp
// converts its 16 document rows of codes straight into wgmma's register operand (A), so no 16-bit
// copy of the tile is written to shared memory and read back.
#pragma once
#include "codes.cuh"
#include "layout.cuh"
#include "mma.cuh"

namespace maxsim {

// A document's tiles: `tiles` of them (one for an empty document, which still runs a tile with no
// valid column so that its empty maxima get written), columns below `cols` valid.
struct TileSpan {
  int tiles, cols;
};

template <typename T, typename DT, int BM, int BN, int WM, int WN, int STAGES, bool kArgmax>
struct FwdTC {
  static constexpr bool kCodes = kIsCodes<DT>;
  static constexpr bool kScaled = kIsScaled<DT>, kIntDot = std::is_same_v<DT, Int8x8>;
  using DElem = std::conditional_t<kCodes, uint8_t, T>;  // what a document row is made of
  static constexpr int kChunkElems = 16 / sizeof(DElem);  // per 16-byte copy
  // k step of one operand load: codes come 8 bytes per lane, which feeds two k16 mmas.
  static constexpr int kKStep = kCodes ? 32 : 16;
  static constexpr int kThreads = WM * WN * 32;
  static constexpr int kWarpRows = BM / WM, kWarpCols = BN / WN;
  static constexpr int MT = kWarpRows / 16, NT = kWarpCols / 8;
  // Two warpgroups over 64 rows each and every column: on sm_90a the tile runs on wgmma, its
  // shared-memory tiles stored with the 128-byte swizzle (mma.cuh) instead of padded rows.
  static constexpr bool kWide = WM == 8 && WN == 1;
  // The 2 x 2 warp layout over 64 document rows (TileShape<kSlim>, <kStream>: 32 query rows of
  // 16-bit documents; ShapeOf<kWide, codes>: 128 query rows of 8-bit codes): on sm_90a one
  // warpgroup takes the product transposed (document tokens x query rows, m64n32 / m64n128), each
  // of its four warps holding 16 document rows (codes: in registers, as the A operand); the warps'
  // maxima merge over kParts slices.
  static constexpr bool kSlim = BN == 64 && WM == 2 && WN == 2 && BM == (kCodes ? 128 : 32);
  static constexpr int kParts = kSlim ? 4 : WN;
  static_assert(MT >= 1 && NT >= 2 && NT % 2 == 0, "warp tile must be >= 16 x 16");

  __host__ __device__ static int kdim(int dim) { return (dim + kKStep - 1) / kKStep * kKStep; }
  // +8 halves: conflict-free ldmatrix. The wgmma tiles are swizzled instead, so not padded.
  __host__ __device__ static int ldq(int dim) { return kdim(dim) + (kWide || kSlim ? 0 : 8); }
  // Code rows: 8-byte lane loads of 8 rows are conflict-free when rows sit 8 or 24 banks apart.
  // kSlim's register operand (Hopper) loads 16 bytes per lane: unpadded rows whose 16-byte chunks
  // are XOR-swizzled instead (code_chunk).
  __host__ __device__ static int ldd(int dim) {
    if constexpr (kCodes && kSlim) return kdim(dim);
    if constexpr (kCodes) return kdim(dim) % 64 == 0 ? kdim(dim) + 32 : kdim(dim);
    return ldq(dim);
  }
  static size_t smem_bytes(int dim) {
    return size_t(BM) * ldq(dim) * sizeof(T) +
           size_t(STAGES) * BN * ldd(dim) * sizeof(DElem) +
           size_t(kParts) * BM * 8 + BM * 10 + STAGES * BN * (kScaled ? 5 : 1) +
           (kWide ? 8 + STAGES * 8 : 0);  // the TMA loads' mbarriers, 8-byte aligned
  }
};

// Resident blocks per SM the register budget is sized for. The 8-warp tile asks for two: one
// block alone cannot hide the pipeline's barrier and load latency. The 32-row tile streaming
// 8-bit codes fits five (its stages take half the shared memory): the streaming loop is
// latency-bound, and the extra warps hide it (measured on the H100: 9-27% faster than three);
// with 128-row tiles of codes (BN 128, twice the accumulators) its shared memory fits four.
// The wgmma tile asks for two as well: one block per SM with two accumulator sets (tile t's max
// overlapping tile t+1's wgmma within the block) and four stages was 11-20% slower (H100).
// The transposed 128-row tile of codes (one warpgroup, BM 128) asks for three (168 registers, a
// few bytes spilled; two with argmax): ragged corpus_int8 with bf16 queries took 4.16 ms at two
// resident blocks, 3.34 ms at three (H100).
template <typename DT, int kWarps, int BM, int BN, bool kArgmax>
constexpr int kMinBlocks = kWarps == 8 ? 2
                           : kIsCodes<DT> && BM == 128 ? (kArgmax ? 2 : 3)
                           : kIsScaled<DT> && BM == 32 ? (BN == 128 ? 4 : 5) : 1;

// kDim > 0 fixes the embedding dim at compile time (fully unrolled k loop); 0 reads it from p.
template <typename T, typename DT, int BM, int BN, int WM, int WN, int STAGES, bool kArgmax,
          int kDim>
__global__ void __launch_bounds__(WM * WN * 32, (kMinBlocks<DT, WM * WN, BM, BN, kArgmax>))
fwd_tc_kernel(const __grid_constant__ FwdParams p, const FwdGrid grid) {
#if __CUDA_ARCH__ >= 800
  using Cfg = FwdTC<T, DT, BM, BN, WM, WN, STAGES, kArgmax>;
  using DElem = typename Cfg::DElem;
  constexpr int MT = Cfg::MT, NT = Cfg::NT;
  constexpr bool kBf16 = MmaType<T>::kBf16, kCodes = Cfg::kCodes, kScaled = Cfg::kScaled;
  constexpr bool kIntDot = Cfg::kIntDot;
  const int dim = kDim > 0 ? kDim : p.dim;
  const int kdim = Cfg::kdim(dim);
  const int lds = Cfg::ldq(dim), ldd = Cfg::ldd(dim);
  const int chunks = kdim / 8;  // 16-byte query chunks per row (the tail past `dim` is zero-filled)
  const int d_chunks = kdim / Cfg::kChunkElems;

  extern __shared__ __align__(1024) unsigned char smem_raw[];  // 1024: the wgmma swizzle atoms
  T* q_s = reinterpret_cast<T*>(smem_raw);
  DElem* d_s = reinterpret_cast<DElem*>(q_s + BM * lds);
  float* red_v = reinterpret_cast<float*>(d_s + STAGES * BN * ldd);
  int* red_i = reinterpret_cast<int*>(red_v + Cfg::kParts * BM);
  float* row_val = reinterpret_cast<float*>(red_i + Cfg::kParts * BM);
  float* row_scale = row_val + BM;                 // each query row's scale (1 without q_scale)
  float* scale_s = row_scale + BM;                 // [STAGES][BN] token scales (kScaled only)
  bool* row_ok = reinterpret_cast<bool*>(scale_s + (Cfg::kScaled ? STAGES * BN : 0));
  bool* mask_s = row_ok + BM;  // [STAGES][BN] document-token mask of each staged tile
  // [STAGES] mbarriers of the wgmma tile's TMA loads (kWide only: smem_bytes leaves room)
  uint64_t* full = reinterpret_cast<uint64_t*>((reinterpret_cast<uintptr_t>(mask_s + STAGES * BN) + 7) & ~uintptr_t(7));

  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int warp_m = warp / WN, warp_n = warp % WN;
  const bool d_tma = p.d_tma;  // TMA boxes of 16-bit rows (kWide)
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr bool kWgSlim = Cfg::kSlim;
  constexpr bool kWg = Cfg::kWide || kWgSlim;  // swizzled tiles read by wgmma
#else
  constexpr bool kWgSlim = false, kWg = false;
#endif
  // Element offset of (row r, 16-byte chunk c) in a wgmma tile of `rows` rows (kWg): K-major in
  // 64-dim atoms, each row's eight 16-byte chunks XOR-swizzled by row % 8 (the 128-byte swizzle).
  auto swz = [](int r, int c, int rows) { return (c / 8) * rows * 64 + r * 64 + ((c % 8) ^ (r % 8)) * 8; };
  // Tiles of codes read by kWgSlim's register operand: chunk c of an odd row of 128 codes sits at
  // c ^ 4, so that one 16-byte load of eight lanes (chunks 0..3 or 4..7 of two rows) hits every
  // bank once.
  auto code_chunk = [&](int r, int c) { return kWgSlim && kCodes && d_chunks == 8 ? c ^ ((r & 1) * 4) : c; };

  // ---- what this block owns
  const int qtile = blockIdx.x % grid.q_tiles;
  const int chunk = blockIdx.x / grid.q_tiles;
  const int mt = qtile % grid.m_tiles;
  const int num_q = p.q.count, num_d = p.d.count;
  const PairMap& pm = p.pairs;
  const int rpq = grid.qpb > 1 ? p.q.pad_len : BM;  // rows per query inside the tile
  const int t0 = mt * BM;
  int q0;            // first query of the tile (kPairs: the query of the current item)
  int item_begin, item_end;
  if (pm.layout == kAllPairs) {
    q0 = (qtile / grid.m_tiles) * grid.qpb;
    item_begin = chunk * grid.docs_per_block;
    item_end = min(num_d, item_begin + grid.docs_per_block);
  } else if (pm.layout == kGrouped) {
    q0 = qtile / grid.m_tiles;
    item_begin = chunk * grid.docs_per_block;
    item_end = min(pm.group, item_begin + grid.docs_per_block);
  } else {
    item_begin = chunk * grid.docs_per_block;
    item_end = min(pm.num_pairs, item_begin + grid.docs_per_block);
    q0 = item_begin < item_end ? pm.pair_q[item_begin] : 0;
  }
  if (item_begin >= item_end) return;

  auto item_doc = [&](int it) {
    if (pm.layout == kAllPairs) return it;
    if (pm.layout == kGrouped) return q0 * pm.group + it;
    return pm.pair_d[it];
  };
  auto item_out = [&](int it, int qi) {
    if (pm.layout == kAllPairs) return static_cast<int64_t>(qi) * num_d + it;
    if (pm.layout == kGrouped) return static_cast<int64_t>(qi) * pm.group + it;
    return static_cast<int64_t>(it);
  };

  const T* qg = static_cast<const T*>(p.q.data);
  const DElem* dg = static_cast<const DElem*>(p.d.data);

  auto span_of = [](const Segment& g) { return TileSpan{max(1, (g.len + BN - 1) / BN), g.len}; };

  // Each thread copies one 16-byte column chunk of every `row_step`-th row of a tile.
  const int chunks_p2 = d_chunks <= 8 ? 8 : d_chunks <= 16 ? 16 : 32;
  const int my_chunk = tid % chunks_p2, row_step = Cfg::kThreads / chunks_p2;
  const bool copies = my_chunk < d_chunks;
  // Rows [row0, row0 + rows_in) of document `doc` (clipped to the tile) into stage `stage`.
  auto copy_rows = [&](int stage, int doc, int64_t first_row, int row0, int rows_in) {
    if constexpr (kWg && !kCodes) {
      // Consecutive threads copy consecutive chunks of a row (128 swizzled bytes per 8 threads;
      // the wgmma tile's dims fill whole 64-dim atoms, so every chunk is in range). A thread's
      // rows are wg_step (a multiple of 8) apart, so its chunk's swizzled column never changes
      // and every copy is one base plus a constant. Rows past `rows_in` are zero-filled.
      const int wg_step = Cfg::kThreads / d_chunks;
      const int r0 = tid / d_chunks, c = tid % d_chunks, rows_left = rows_in - r0;
      DElem* dst = d_s + stage * BN * ldd + swz(r0, c, BN);
      // A running byte address: one 64-bit add per copy instead of a multiply.
      uint64_t src = reinterpret_cast<uint64_t>(dg + row_elem(p.d, doc, first_row, 0) + c * 8) +
                     uint64_t(row0 + r0) * p.d.row_stride * sizeof(DElem);
      const uint64_t step = uint64_t(wg_step) * p.d.row_stride * sizeof(DElem);
#pragma unroll
      for (int i = 0; i < BN / wg_step; ++i) {
        const bool in = i * wg_step < rows_left;
        cp_async16(dst + i * wg_step * 64, in ? reinterpret_cast<const DElem*>(src) : dg, in ? 16 : 0);
        src += step;
      }
      return;
    }
    if (!copies) return;
    // A thread's rows (r0 + i * row_step, row_step even) share one swizzled chunk (only tiles of
    // codes read as kWgSlim's register operand are swizzled; the others keep their code as is).
    DElem* dst = d_s + stage * BN * ldd + my_chunk * Cfg::kChunkElems;
    if constexpr (kWgSlim && kCodes) dst = d_s + stage * BN * ldd + code_chunk(tid / chunks_p2, my_chunk) * Cfg::kChunkElems;
    const DElem* src0 = dg + row_elem(p.d, doc, first_row, 0) + my_chunk * Cfg::kChunkElems;
    // Chunks past `dim` are zero-filled, since the query's zero dims would turn stale Inf or
    // NaN into NaN inside a valid dot product.
    const bool col_in = my_chunk * Cfg::kChunkElems < dim;
    const int r0 = tid / chunks_p2;
    // A running source address (one add per copy, no multiply); with the dim fixed at
    // compile time the row step is too, and the loop unrolls into predicated copies.
    const DElem* src = col_in ? src0 + int64_t(row0 + r0) * p.d.row_stride : dg;
    const int64_t inc = col_in ? int64_t(row_step) * p.d.row_stride : 0;
#pragma unroll
    for (int i = 0; i < BN / row_step; ++i) {  // r0 < row_step: BN / row_step rows each
      if (r0 + i * row_step < rows_in) cp_async16(dst + (r0 + i * row_step) * ldd, src, col_in ? 16 : 0);
      src += inc;
    }
  };
  // A padded document's first tile is requested before anything is looked up: its rows below
  // pad_len are the document's own (padding past its length only reaches masked columns), so
  // the copies need no length, and its latency overlaps the length and query loads.
  const bool early = (!kWg || kWgSlim) && p.d.offsets == nullptr;
  if (early) copy_rows(0, item_doc(item_begin), 0, 0, p.d.pad_len);

  // ---- producer: walks (item, tile) ahead of the consumer
  int p_item = item_begin;
  Segment p_seg = segment_of(p.d, item_doc(p_item));
  int p_tile = 0;

  // Which query rows count, and their scales: read in the epilogue only, so at the start they
  // are looked up after the first copies are issued.
  auto load_row_flags = [&](int qfirst) {
    for (int r = tid; r < BM; r += Cfg::kThreads) {
      const int ql = r / rpq, t = t0 + r % rpq, qi = qfirst + ql;
      bool valid = false;
      float scale = 1.f;
      if (ql < grid.qpb && qi < num_q) {
        const Segment g = segment_of(p.q, qi);
        valid = row_valid(p.q, g, t);
        if (valid && p.q_scale != nullptr) scale = p.q_scale[g.first_row + t];
      }
      row_ok[r] = valid;
      row_scale[r] = scale;
    }
  };
  // Load of the query rows (zero rows past a segment or past the batch). `async`: 16-bit tiles
  // copy the rows with cp.async, joined to the first document stage's group, so that the query's
  // latency overlaps the first tile's instead of preceding it.
  auto load_queries = [&](int qfirst, bool async) {
    for (int c = tid; c < BM * chunks; c += Cfg::kThreads) {
      const int r = c / chunks, k = c % chunks;
      const int ql = r / rpq, t = t0 + r % rpq, qi = qfirst + ql;
      const T* src = nullptr;  // this chunk's 8 elements, or none (zeros)
      if (ql < grid.qpb && qi < num_q && k * 8 < dim) {
        const Segment g = segment_of(p.q, qi);
        if (t < g.rows) src = qg + row_elem(p.q, qi, g.first_row, t) + k * 8;
      }
      if constexpr ((!kWg || kWgSlim) && !kCodes) {
        if (async) {
          T* dst = kWg ? q_s + swz(r, k, BM) : q_s + r * lds + k * 8;
          cp_async16(dst, src != nullptr ? src : qg, src != nullptr ? 16 : 0);
          continue;
        }
      }
      const uint4 v = src != nullptr ? *reinterpret_cast<const uint4*>(src) : make_uint4(0, 0, 0, 0);
      if constexpr (kWgSlim && kCodes) {
        // kWgSlim's register operand: a lane converts 4 codes (dims 4i .. 4i+3) per k16 step into
        // its k pairs (2c, 2c+1) and (2c+8, 2c+9), c = lane % 4, taking codes 16c .. 16c+15 of
        // each 64-dim group over four steps; the query columns are stored in that order.
        const uint32_t* w = reinterpret_cast<const uint32_t*>(&v);
#pragma unroll
        for (int m = 0; m < 4; ++m) {
          const int d0 = k * 8 + m * 2;  // dims d0, d0 + 1 -> logical column kk, kk + 1
          const int kk = 16 * (4 * (d0 / 64) + (d0 % 16) / 4) + 8 * ((d0 % 4) / 2) + 2 * ((d0 % 64) / 16);
          *reinterpret_cast<uint32_t*>(q_s + swz(r, kk / 8, BM) + kk % 8) = w[m];
        }
      } else if constexpr (kWg) {
        *reinterpret_cast<uint4*>(q_s + swz(r, k, BM)) = v;
      } else if constexpr (kCodes) {
        store_query_chunk_for_codes(q_s + r * lds, k, v);  // the order of the mma loop's codes
      } else {
        *reinterpret_cast<uint4*>(q_s + r * lds + k * 8) = v;
      }
    }
  };
  // The first query rows are copied after the first document's segment is looked up (its
  // length load then runs alongside) and before the first stage is requested (same group).
  load_queries(q0, true);
  if constexpr (kWg) fence_proxy_async();  // the query tile's stores, then wgmma's reads
  // The mask bytes (and code scales) of a tile are loaded into registers when the tile is issued
  // and stored to shared memory one iteration later, so their latency hides behind a tile of work.
  // The loaded values are only stored (and combined with `in_reg`) here, never in `issue`: any
  // use there makes the warp wait for the loads at once (a select on a loaded scale made ragged
  // rerank_colpali_int8 take 48.9 instead of 42.7 us of kernel time on the H100).
  bool in_reg = false, mask_reg = true;
  float scale_reg = 0.f;
  int mask_stage = -1;
  auto stage_mask = [&]() {
    if (mask_stage >= 0 && tid < BN) {
      mask_s[mask_stage * BN + tid] = in_reg && mask_reg;
      if constexpr (kScaled) scale_s[mask_stage * BN + tid] = in_reg ? scale_reg * kCodeFold<DT, T> : 0.f;
    }
    mask_stage = -1;
  };
  // `copied`: the tile's rows are already requested (the early first tile).
  auto issue = [&](int stage, bool copied) {
    if (p_item < item_end) {
      const int doc = item_doc(p_item);
      const TileSpan p_span = span_of(p_seg);  // recomputed: cheaper than a live register
      if (p.d.mask != nullptr || kScaled) {
        const int s = p_tile * BN + tid;
        in_reg = tid < BN && s < p_span.cols;
        // Predicated loads: a column out of range keeps stale values, which in_reg discards.
        if (in_reg && p.d.mask != nullptr) mask_reg = p.d.mask[p_seg.first_row + s];
        if constexpr (kScaled) {
          if (in_reg) scale_reg = p.d_scale[p_seg.first_row + s];
        }
        mask_stage = stage;
      }
      const int row0 = p_tile * BN;
      if (kWg && d_tma) {
        // One thread loads the tile as 64-dim boxes (the tensor map swizzles them the way wgmma
        // reads); rows past this document are masked by `cols`, past the tensor zero-filled.
        if (tid == 0) {
          DElem* tile = d_s + stage * BN * ldd;
          const int grow = static_cast<int>(p_seg.first_row) + row0;
          mbar_expect_tx(full + stage, uint32_t(BN * kdim * sizeof(DElem)));
          for (int atom = 0; atom < kdim / 64; ++atom)
            tma_load_2d(tile + atom * BN * 64, p.d_tmap, atom * 64, grow, full + stage);
        }
      } else if (!copied) {
        // Rows past the document's valid columns are not copied (the wgmma tiles zero-fill
        // them): their stale contents only reach masked columns (valid_cols).
        copy_rows(stage, doc, p_seg.first_row, row0, p_span.cols - row0);
      }
      if (++p_tile == p_span.tiles) {
        if (++p_item < item_end) p_seg = segment_of(p.d, item_doc(p_item));
        p_tile = 0;
      }
    }
    cp_async_commit();  // empty groups keep the wait counts uniform
  };
  if (kWg && p.d_tma && tid == 0) {
    for (int s = 0; s < STAGES; ++s) mbar_init(full + s, 1);
    mbar_init_fence();
  }
#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    stage_mask();
    issue(s, s == 0 && early);
  }
  load_row_flags(q0);
  // The TMA barriers' initialisation must be visible to every thread before the first step.
  if (kWg && d_tma) __syncthreads();

  // ---- consumer state: per row tile and column parity (kWgSlim: per query column block j of
  // the transposed product and parity h, over this thread's document rows)
  constexpr int kBestRows = kWgSlim ? BM / 8 : MT;
  float best_v[kBestRows][2];
  int best_i[kBestRows][2];
  auto reset = [&]() {
#pragma unroll
    for (int mi = 0; mi < kBestRows; ++mi)
#pragma unroll
      for (int h = 0; h < 2; ++h) { best_v[mi][h] = -INFINITY; best_i[mi][h] = -1; }
  };
  reset();

  int c_item = item_begin, stage = 0;
  TileSpan c_span = span_of(segment_of(p.d, item_doc(c_item)));
  int c_tile = 0;
  int loaded_q = q0;

  // Which of this thread's columns of the consumer's tile are valid: bit 2 * ni + e for column
  // col0 + ni * 8 + e. Full tiles without a mask skip the per-column tests.
  constexpr uint32_t kAllCols = NT * 2 == 32 ? ~0u : (1u << (NT * 2)) - 1;
  auto valid_cols = [&](int col0) {
    if ((c_tile + 1) * BN <= c_span.cols && p.d.mask == nullptr) return kAllCols;
    uint32_t ok = 0;
#pragma unroll
    for (int ni = 0; ni < NT; ++ni)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int col = col0 + ni * 8 + e;
        if (col < c_span.cols && (p.d.mask == nullptr || mask_s[stage * BN + col - c_tile * BN]))
          ok |= 1u << (ni * 2 + e);
      }
    return ok;
  };

  // Running max over a tile's valid columns (`ok`, from valid_cols). With argmax, the tile's max
  // is found first (one max per element); only when it beats the running best is the row
  // rescanned for the lowest column holding it, so the common path costs the same as without.
  auto tile_max = [&](const float (&acc)[MT][NT][4], uint32_t ok, int col0) {
    const bool all = ok == kAllCols;  // full tiles without a mask: no per-column selects
    // Every row's tile max first, with the test of `all` outside the loops: the rows' max trees
    // then interleave (one basic block), which hides the max latency. Full tiles keep the max of
    // each column pair (columns ni * 8 + 0 / 1) for the argmax rescan.
    float tmax[MT][2], pair_max[MT][2][NT];
    if (all) {
#pragma unroll
      for (int mi = 0; mi < MT; ++mi)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          float r[NT];
#pragma unroll
          for (int ni = 0; ni < NT; ++ni)
            r[ni] = pair_max[mi][h][ni] = max_nan(acc[mi][ni][h * 2], acc[mi][ni][h * 2 + 1]);
#pragma unroll
          for (int w = 1; w < NT; w *= 2)
#pragma unroll
            for (int ni = 0; ni + w < NT; ni += 2 * w) r[ni] = max_nan(r[ni], r[ni + w]);
          tmax[mi][h] = r[0];
        }
    } else {
#pragma unroll
      for (int mi = 0; mi < MT; ++mi)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          float m2[2] = {-INFINITY, -INFINITY};
#pragma unroll
          for (int ni = 0; ni < NT; ++ni)
#pragma unroll
            for (int e = 0; e < 2; ++e)
              m2[e] = max_nan(m2[e], ((ok >> (ni * 2 + e)) & 1u) ? acc[mi][ni][h * 2 + e] : -INFINITY);
          tmax[mi][h] = max_nan(m2[0], m2[1]);
        }
    }
#pragma unroll
    for (int mi = 0; mi < MT; ++mi)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        if constexpr (kArgmax) {
          const float b = best_v[mi][h], t = tmax[mi][h];
          if (t > b || (t != t && b == b)) {
            int idx = -1;
            if (all && t == t && MT == 1) {
              // Every column valid and no NaN: the lowest column pair holding the max, then which
              // of its two columns; one compare and two selects per pair (the rescan runs in
              // nearly every tile, since some lane of the warp nearly always improves). Only
              // where the pair maxima fit in registers (one row tile per warp: the wgmma tile).
              int off = 0;
              float first = 0.f;  // the lower column of that pair
#pragma unroll
              for (int ni = NT - 1; ni >= 0; --ni) {
                const bool hit = pair_max[mi][h][ni] == t;
                off = hit ? ni * 8 : off;
                first = hit ? acc[mi][ni][h * 2] : first;
              }
              idx = col0 + off + (first == t ? 0 : 1);
            } else if (all && t == t) {  // one compare and one select per value
              int off = 0;
#pragma unroll
              for (int ni = NT - 1; ni >= 0; --ni)
#pragma unroll
                for (int e = 1; e >= 0; --e) off = acc[mi][ni][h * 2 + e] == t ? ni * 8 + e : off;
              idx = col0 + off;
            } else {
#pragma unroll
              for (int ni = NT - 1; ni >= 0; --ni)
#pragma unroll
                for (int e = 1; e >= 0; --e) {
                  const float v = acc[mi][ni][h * 2 + e];
                  if (((ok >> (ni * 2 + e)) & 1u) && (v == t || (v != v && t != t)))
                    idx = col0 + ni * 8 + e;
                }
            }
            best_v[mi][h] = t;
            best_i[mi][h] = idx;
          }
        } else {
          best_v[mi][h] = max_nan(best_v[mi][h], tmax[mi][h]);
        }
      }
  };

  // kScaled: each dot product times its document token's scale (fp32), before the max. Int8x8's
  // int32 sums (held in acc's registers) become floats first, exactly: |sum| <= 127^2 * 256 < 2^24.
  auto scale_cols = [&](float (&acc)[MT][NT][4], int col0) {
#pragma unroll
    for (int ni = 0; ni < NT; ++ni) {
      const float2 sc = *reinterpret_cast<const float2*>(scale_s + stage * BN + col0 - c_tile * BN + ni * 8);
#pragma unroll
      for (int mi = 0; mi < MT; ++mi)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          float v = acc[mi][ni][e];
          if constexpr (kIntDot) v = __int2float_rn(__float_as_int(v));
          acc[mi][ni][e] = v * (e % 2 ? sc.y : sc.x);
        }
    }
  };

  // (v, i) merged with the lanes whose index differs from this one's in the bits [first, last):
  // a butterfly, so that every one of them ends with the best.
  auto merge_lanes = [&](float& v, int& i, int first, int last) {
#pragma unroll
    for (int off = first; off < last; off <<= 1) {
      const float ov = __shfl_xor_sync(0xffffffffu, v, off);
      if constexpr (kArgmax) {
        const int oi = __shfl_xor_sync(0xffffffffu, i, off);
        if (beats(ov, oi, Best{v, i})) { v = ov; i = oi; }
      } else {
        v = max_nan(v, ov);
      }
    }
  };
  // End of a document: merge lanes, then warps, then sum rows per query.
  auto end_doc = [&](int item) {
    if constexpr (kWgSlim) {
      // Query row 8j + 2 (lane % 4) + h: the eight lanes of equal lane % 4 hold the warp's 16
      // document rows of every tile; lanes 0..3 publish the warp's best.
#pragma unroll
      for (int j = 0; j < BM / 8; ++j)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          float v = best_v[j][h];
          int i = best_i[j][h];
          merge_lanes(v, i, 4, 32);
          if (lane < 4) {
            red_v[warp * BM + 8 * j + 2 * lane + h] = v;
            red_i[warp * BM + 8 * j + 2 * lane + h] = i;
          }
        }
    } else {
#pragma unroll
      for (int mi = 0; mi < MT; ++mi)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          float v = best_v[mi][h];
          int i = best_i[mi][h];
          merge_lanes(v, i, 1, 4);
          if (lane % 4 == 0) {
            const int r = warp_m * Cfg::kWarpRows + mi * 16 + h * 8 + lane / 4;
            red_v[warp_n * BM + r] = v;
            red_i[warp_n * BM + r] = i;
          }
        }
    }
    reset();
    __syncthreads();
    const int qfirst = pm.layout == kPairs ? loaded_q : q0;
    // Row r's best over the warps' column slices (in warp order: ties keep the lowest column).
    auto merged = [&](int r, float& v, int& i) {
      v = red_v[r];
      i = red_i[r];
#pragma unroll
      for (int w = 1; w < Cfg::kParts; ++w) {
        const float ov = red_v[w * BM + r];
        if constexpr (kArgmax) {
          const int oi = red_i[w * BM + r];
          if (beats(ov, oi, Best{v, i})) { v = ov; i = oi; }
        } else {
          v = max_nan(v, ov);
        }
      }
    };
    // Row r's term of its query's sum (0 for padding and rows with no valid column); writes
    // its argmax when asked.
    auto row_term = [&](int r, bool in_q, int qi, int t, float v, int i) {
      const bool valid = row_ok[r];
      if constexpr (kArgmax) {
        if (in_q && qi < num_q && t < p.max_lq) p.argmax[item_out(item, qi) * p.max_lq + t] = valid ? i : -1;
      }
      const bool found = kArgmax ? i >= 0 : v != -INFINITY;
      return valid && found ? v * row_scale[r] : 0.f;
    };
    // A warp's per-lane terms summed (butterfly) and written once for query qi.
    auto write_sum = [&](int qi, float s) {
#pragma unroll
      for (int off = 16; off > 0; off >>= 1) s += __shfl_xor_sync(0xffffffffu, s, off);
      if (lane == 0 && qi < num_q) {
        const int64_t out = item_out(item, qi);
        if (grid.m_tiles > 1) p.partial[int64_t(mt) * pm.num_pairs + out] = s;
        else p.scores[out] = s;
      }
    };
    if (BM == 32 && grid.qpb == 1) {
      // One query's 32 rows, one per lane of warp 0: the sum stays in registers, in the order
      // of the general path below, with no second barrier (red_v is next written after the
      // main loop's barrier).
      if (warp == 0) {
        float v;
        int i;
        merged(lane, v, i);
        write_sum(qfirst, row_term(lane, true, qfirst, t0 + lane, v, i));
      }
      return;
    }
    for (int r = tid; r < BM; r += Cfg::kThreads) {
      float v;
      int i;
      merged(r, v, i);
      const int ql = r / rpq;
      row_val[r] = row_term(r, ql < grid.qpb, qfirst + ql, t0 + r % rpq, v, i);
    }
    __syncthreads();
    for (int ql = warp; ql < grid.qpb; ql += WM * WN) {
      float s = 0.f;
      for (int r = ql * rpq + lane; r < min(BM, (ql + 1) * rpq); r += 32) s += row_val[r];
      write_sum(qfirst + ql, s);
    }
  };

  // Descriptor offset (16-byte units) of k16 step k in a swizzled wgmma tile of `rows` rows: a
  // k step or a stage moves the start address only (its field holds address / 16, no carry out).
  auto k_off = [](int k, int rows) { return uint64_t(((k / 4) * rows * 64 + (k % 4) * 16) * sizeof(T) / 16); };
  if constexpr (kWgSlim) {
    // Hopper, 32-row tile: S^T = D_tile * Q^T (m64n32: document tokens x query rows), both tiles
    // read from swizzled shared memory. Thread (warp, lane) holds document rows my_row and
    // my_row + 8 of the tile against query rows 8j + 2 (lane % 4) + h (d[4j + h], d[4j + 2 + h]).
    const uint64_t q_desc = smem_desc_sw128(q_s);
    const uint64_t d_desc = smem_desc_sw128(reinterpret_cast<const T*>(d_s));
    const int my_row = warp * 16 + lane / 4;
    // 8-bit codes: the warp's 16 document rows of stage `stage` (G 64-dim groups) as the register
    // operand, converted right before the product: per group each lane loads 16 codes of rows
    // my_row and my_row + 8 and turns them into four k steps' fragments.
    auto codes_product = [&](float (&d)[BM / 2], auto groups, auto&& in_shadow) {
      constexpr int G = decltype(groups)::value;
      // fp16: group g + 1 is converted while group g's products run. bf16's longer conversion
      // needs the registers (one resident block fewer): all groups first.
      constexpr bool kOverlap = !kBf16;
      const uint8_t* row = reinterpret_cast<const uint8_t*>(d_s) + stage * BN * ldd + my_row * ldd;
      uint32_t a[4 * G][4];
#pragma unroll
      for (int g = 0; g < G; ++g) {
        const int off = code_chunk(my_row, 4 * g + lane % 4) * 16;  // rows my_row, my_row + 8 alike
        const uint4 r0 = *reinterpret_cast<const uint4*>(row + off);
        const uint4 r1 = *reinterpret_cast<const uint4*>(row + 8 * ldd + off);
        const uint32_t w0[4] = {r0.x, r0.y, r0.z, r0.w}, w1[4] = {r1.x, r1.y, r1.z, r1.w};
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          codes_to_pairs<DT, T>(w0[j], a[4 * g + j][0], a[4 * g + j][2]);
          codes_to_pairs<DT, T>(w1[j], a[4 * g + j][1], a[4 * g + j][3]);
        }
        if (kOverlap || g == G - 1) {
          wgmma_fence();
#pragma unroll
          for (int k = kOverlap ? 4 * g : 0; k < 4 * g + 4; ++k)
            wgmma_m64n128k16_rs<kBf16>(d, a[k], q_desc + k_off(k, BM), k > 0);
        }
      }
      wgmma_commit();
      in_shadow();  // work that does not touch the operands, while the products run
      wgmma_wait<0>();
#pragma unroll
      for (int k = 0; k < 4 * G; ++k)
#pragma unroll
        for (int i = 0; i < 4; ++i) wgmma_keep(a[k][i]);
#pragma unroll
      for (int i = 0; i < BM / 2; ++i) wgmma_keep(d[i]);
    };
    while (c_item < item_end) {
      stage_mask();
      cp_async_wait<STAGES - 2>();
      // This thread's copies, then wgmma's reads (codes are read by the threads themselves).
      if constexpr (!kCodes) fence_proxy_async();
      __syncthreads();
      // The next stage's copies: 8-bit codes issue them while this tile's products run.
      auto refill = [&]() { issue((stage + STAGES - 1) % STAGES, false); };
      if constexpr (!kCodes) refill();
      if (pm.layout == kPairs && c_tile == 0) {
        const int qi = pm.pair_q[c_item];
        if (qi != loaded_q) {  // every warp passed its last wgmma's wait before the barrier above
          load_queries(qi, false);
          load_row_flags(qi);
          loaded_q = qi;
          fence_proxy_async();
          __syncthreads();
        }
      }
      float d[BM / 2];
      const int col = c_tile * BN + my_row;  // document token of d[4j + h]; d[4j + 2 + h]: col + 8
      bool ok0, ok1;
      auto rows_ok = [&]() {
        ok0 = col < c_span.cols && (p.d.mask == nullptr || mask_s[stage * BN + my_row]);
        ok1 = col + 8 < c_span.cols && (p.d.mask == nullptr || mask_s[stage * BN + my_row + 8]);
      };
      if constexpr (kCodes) {
        rows_ok();
        const float s0 = scale_s[stage * BN + my_row], s1 = scale_s[stage * BN + my_row + 8];
        if constexpr (kDim > 0) codes_product(d, std::integral_constant<int, kDim / 64>{}, refill);
        else if (kdim == 128) codes_product(d, std::integral_constant<int, 2>{}, refill);
        else codes_product(d, std::integral_constant<int, 1>{}, refill);
#pragma unroll
        for (int j = 0; j < BM / 8; ++j)
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            d[4 * j + h] *= s0;
            d[4 * j + 2 + h] *= s1;
          }
      } else {
        const uint64_t d_stage = d_desc + uint64_t(stage) * (BN * ldd * sizeof(T) / 16);
        wgmma_fence();
#pragma unroll
        for (int k = 0; k < kdim / 16; ++k)
          wgmma_m64n32k16<kBf16>(d, d_stage + k_off(k, BN), q_desc + k_off(k, BM), k > 0);
        wgmma_commit();
        rows_ok();
        wgmma_wait<0>();
      }
      if (kCodes && !kArgmax && ok0 && ok1) {  // both rows valid: no selects (compute-bound)
#pragma unroll
        for (int j = 0; j < BM / 8; ++j)
#pragma unroll
          for (int h = 0; h < 2; ++h) best_v[j][h] = max_nan(best_v[j][h], max_nan(d[4 * j + h], d[4 * j + 2 + h]));
      } else {
#pragma unroll
        for (int j = 0; j < BM / 8; ++j)
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const float v0 = ok0 ? d[4 * j + h] : -INFINITY, v1 = ok1 ? d[4 * j + 2 + h] : -INFINITY;
            if constexpr (kArgmax) {
              // The lower row wins ties; the first NaN wins (as tile_max).
              const bool second = v1 > v0 || (v1 != v1 && v0 == v0);
              const float t = second ? v1 : v0, b = best_v[j][h];
              if (t > b || (t != t && b == b)) {
                best_v[j][h] = t;
                best_i[j][h] = second ? col + 8 : col;
              }
            } else {
              best_v[j][h] = max_nan(best_v[j][h], max_nan(v0, v1));
            }
          }
      }
      if (++c_tile == c_span.tiles) {
        end_doc(c_item);
        if (++c_item < item_end) c_span = span_of(segment_of(p.d, item_doc(c_item)));
        c_tile = 0;
      }
      stage = (stage + 1) % STAGES;
    }
  } else if constexpr (kWg) {
    // Hopper: one accumulator set per thread (64 values), so that two blocks share an SM and
    // one's max runs while the other's wgmma does (all-pairs and grouped layouts: the query tile
    // never changes).
    float acc[MT][NT][4];
    // Descriptors of this warpgroup's 64 query rows and of stage 0, first k step (k_off above).
    const uint64_t a_desc = smem_desc_sw128(q_s + (warp / 4) * 64 * 64);
    const uint64_t b_desc = smem_desc_sw128(reinterpret_cast<const T*>(d_s));
    int steps = 0;  // tiles consumed: stage `stage` holds its (steps / STAGES)-th load
    while (c_item < item_end) {
      stage_mask();
      if (d_tma) {
        mbar_wait(full + stage, (steps / STAGES) & 1);
      } else {
        cp_async_wait<STAGES - 2>();
        fence_proxy_async();  // this thread's copies, then wgmma's reads
        __syncthreads();
        issue((stage + STAGES - 1) % STAGES, false);
      }
      ++steps;
      const uint64_t b_stage = b_desc + uint64_t(stage) * (BN * ldd * sizeof(T) / 16);
      float(&d)[MT * NT * 4] = reinterpret_cast<float(&)[MT * NT * 4]>(acc);
      wgmma_fence();
#pragma unroll
      for (int k = 0; k < kdim / 16; ++k) {
        if constexpr (kIntDot)
          wgmma_m64n128k32_s8(reinterpret_cast<int(&)[MT * NT * 4]>(d), a_desc + k_off(k, BM), b_stage + k_off(k, BN), k > 0);
        else
          wgmma_m64n128k16<kBf16>(d, a_desc + k_off(k, BM), b_stage + k_off(k, BN), k > 0);
      }
      wgmma_commit();
      if (d_tma) {
        // The previous tile's stage is free once every warp has waited for its wgmma: with TMA
        // the barrier and the refill run while this tile's wgmma does.
        __syncthreads();
        issue((stage + STAGES - 1) % STAGES, false);
      }
      // After the step's barrier: this tile's mask bytes were stored at the start of the step
      // (two stages leave no earlier barrier between that store and these reads).
      const int col0 = c_tile * BN + (lane % 4) * 2;
      const uint32_t ok = valid_cols(col0);
      wgmma_wait<0>();
      if constexpr (kScaled) scale_cols(acc, col0);
      tile_max(acc, ok, col0);
      if (++c_tile == c_span.tiles) {
        end_doc(c_item);
        if (++c_item < item_end) c_span = span_of(segment_of(p.d, item_doc(c_item)));
        c_tile = 0;
      }
      stage = (stage + 1) % STAGES;
    }
  } else {
    while (c_item < item_end) {
      stage_mask();
      cp_async_wait<STAGES - 2>();
      __syncthreads();
      issue((stage + STAGES - 1) % STAGES, false);

      if (pm.layout == kPairs && c_tile == 0) {
        const int qi = pm.pair_q[c_item];
        if (qi != loaded_q) {  // pairs sorted by query reload rarely
          __syncthreads();
          load_queries(qi, false);
          load_row_flags(qi);
          loaded_q = qi;
          __syncthreads();
        }
      }

      // Column validity first: its mask loads are then in flight during the MMAs.
      const int col0 = c_tile * BN + warp_n * Cfg::kWarpCols + (lane % 4) * 2;
      const uint32_t ok = valid_cols(col0);
      // S = Q_tile * D_tile^T for this warp's rows and columns.
      float acc[MT][NT][4];
#pragma unroll
      for (int mi = 0; mi < MT; ++mi)
#pragma unroll
        for (int ni = 0; ni < NT; ++ni)
#pragma unroll
          for (int e = 0; e < 4; ++e) acc[mi][ni][e] = 0.f;
      if constexpr (kCodes) {
        const T* a_base = q_s + (warp_m * Cfg::kWarpRows + (lane % 16)) * lds + (lane / 16) * 8;
        // Lane (g = lane / 4, c = lane % 4) loads 8 codes of its column g: dims 8c .. 8c+7 of each
        // 32-dim step. An mma reads B elements (k = 2c, 2c+1, 2c+8, 2c+9): codes 0,1,2,3 feed the
        // first k16 step and 4,5,6,7 the second; q_s holds the query dims in the matching order.
        const uint8_t* b_base = d_s + stage * BN * ldd + (warp_n * Cfg::kWarpCols + lane / 4) * ldd + (lane % 4) * 8;
        // The 8-warp tile's registers have no room for a second step in flight: not unrolled.
        constexpr int kUnroll = WM * WN == 8 ? 1 : 8;
#pragma unroll kUnroll
        for (int k0 = 0; k0 < kdim; k0 += 32) {
#pragma unroll
          for (int s = 0; s < 2; ++s) {
            uint32_t a[MT][4], w[NT];
#pragma unroll
            for (int ni = 0; ni < NT; ++ni) w[ni] = *reinterpret_cast<const uint32_t*>(b_base + ni * 8 * ldd + k0 + s * 4);
#pragma unroll
            for (int mi = 0; mi < MT; ++mi) ldmatrix_x4(a[mi], a_base + mi * 16 * lds + k0 + s * 16);
#pragma unroll
            for (int ni = 0; ni < NT; ++ni) {
              uint32_t b0, b1;
              codes_to_pairs<DT, T>(w[ni], b0, b1);
#pragma unroll
              for (int mi = 0; mi < MT; ++mi) mma_16816<kBf16>(acc[mi][ni], a[mi], b0, b1);
            }
          }
        }
      } else {
        const T* a_row = q_s + (warp_m * Cfg::kWarpRows + (lane % 16)) * lds;
        const T* b_row = d_s + stage * BN * ldd + (warp_n * Cfg::kWarpCols + (lane / 16) * 8 + (lane % 8)) * ldd;
#pragma unroll
        for (int k0 = 0; k0 < kdim; k0 += 16) {
          uint32_t a[MT][4], b[NT / 2][4];
          const int a_col = k0 + (lane / 16) * 8, b_col = k0 + ((lane / 8) % 2) * 8;
#pragma unroll
          for (int mi = 0; mi < MT; ++mi) ldmatrix_x4(a[mi], a_row + mi * 16 * lds + a_col);
#pragma unroll
          for (int nj = 0; nj < NT / 2; ++nj) ldmatrix_x4(b[nj], b_row + nj * 16 * ldd + b_col);
#pragma unroll
          for (int mi = 0; mi < MT; ++mi)
#pragma unroll
            for (int ni = 0; ni < NT; ++ni) {
              if constexpr (kIntDot)
                mma_s8_16832(reinterpret_cast<int(&)[4]>(acc[mi][ni]), a[mi], b[ni / 2][(ni % 2) * 2], b[ni / 2][(ni % 2) * 2 + 1]);
              else
                mma_16816<kBf16>(acc[mi][ni], a[mi], b[ni / 2][(ni % 2) * 2], b[ni / 2][(ni % 2) * 2 + 1]);
            }
        }
      }
      if constexpr (kScaled) scale_cols(acc, col0);

      tile_max(acc, ok, col0);
      if (++c_tile == c_span.tiles) {
        end_doc(c_item);
        if (++c_item < item_end) c_span = span_of(segment_of(p.d, item_doc(c_item)));
        c_tile = 0;
      }
      stage = (stage + 1) % STAGES;
    }
  }
  cp_async_wait<0>();
#endif
}

}  // namespace maxsim
