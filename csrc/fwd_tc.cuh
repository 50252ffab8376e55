// Fused MaxSim forward on tensor cores (sm_80+ mma.sync m16n8k16, fp16 / bf16 inputs).
//
// A block owns a tile of BM query rows (one query, a slice of a long query, or several short
// queries of an all-pairs batch) kept in shared memory, and streams the token tiles of a list of
// documents through a STAGES-deep cp.async pipeline. Each warp multiplies its rows by its slice
// of the document tile and keeps a running max (and argmax) per row in registers; at the end of a
// document the block merges the warps' maxima, sums them per query and writes one score. The
// [Lq, Ld] similarity tile never leaves registers.
#pragma once
#include "layout.cuh"
#include "mma.cuh"

namespace maxsim {

// Which rows a block owns and which documents it scores them against.
struct FwdGrid {
  int q_tiles;        // row tiles along the query side
  int m_tiles;        // row tiles per query (> 1 when Lq > BM)
  int qpb;            // queries per row tile (> 1 only for short padded queries, all-pairs)
  int docs_per_block; // documents (or pairs) per block
  int splits;         // column slices per document (> 1: one slice per block, docs_per_block 1);
                      // each writes its rows' maxima to p.partial and a second kernel merges them
};

// A block's share of one document: tiles [begin, end), columns below `cols` valid. An empty
// slice still runs one tile with no valid column, so that its (empty) maxima get written.
struct TileSpan {
  int begin, end, cols;
};

template <typename T, int BM, int BN, int WM, int WN, int STAGES, bool kArgmax>
struct FwdTC {
  static constexpr int kThreads = WM * WN * 32;
  static constexpr int kWarpRows = BM / WM, kWarpCols = BN / WN;
  static constexpr int MT = kWarpRows / 16, NT = kWarpCols / 8;
  // Only the 4-warp streaming tiles cut documents into column slices (FwdGrid::splits); the
  // 8-warp compute tile never does, and its registers have no room for the slice bookkeeping.
  static constexpr bool kSliced = WM * WN == 4;
  static_assert(MT >= 1 && NT >= 2 && NT % 2 == 0, "warp tile must be >= 16 x 16");

  static int ld(int dim) { return (dim + 15) / 16 * 16 + 8; }  // +8 halves: conflict-free ldmatrix
  static size_t smem_bytes(int dim) {
    return size_t(BM + STAGES * BN) * ld(dim) * sizeof(T) + size_t(WN) * BM * 8 + BM * 5 +
           STAGES * BN;
  }
};

// kDim > 0 fixes the embedding dim at compile time (fully unrolled k loop); 0 reads it from p.
template <typename T, int BM, int BN, int WM, int WN, int STAGES, bool kArgmax, int kDim>
// The 8-warp tile asks for two resident blocks per SM: one block alone cannot hide the
// pipeline's barrier and load latency.
__global__ void __launch_bounds__(WM * WN * 32, WM * WN == 8 ? 2 : 1)
fwd_tc_kernel(const FwdParams p, const FwdGrid grid) {
#if __CUDA_ARCH__ >= 800
  using Cfg = FwdTC<T, BM, BN, WM, WN, STAGES, kArgmax>;
  constexpr int MT = Cfg::MT, NT = Cfg::NT;
  constexpr bool kBf16 = MmaType<T>::kBf16;
  const int dim = kDim > 0 ? kDim : p.dim;
  const int kdim = (dim + 15) / 16 * 16;
  const int lds = kdim + 8;
  const int chunks = kdim / 8;  // 16-byte chunks per row (the tail past `dim` is zero-filled)

  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* q_s = reinterpret_cast<T*>(smem_raw);
  T* d_s = q_s + BM * lds;
  float* red_v = reinterpret_cast<float*>(d_s + STAGES * BN * lds);
  int* red_i = reinterpret_cast<int*>(red_v + WN * BM);
  float* row_val = reinterpret_cast<float*>(red_i + WN * BM);
  bool* row_ok = reinterpret_cast<bool*>(row_val + BM);
  bool* mask_s = row_ok + BM;  // [STAGES][BN] document-token mask of each staged tile

  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int warp_m = warp / WN, warp_n = warp % WN;

  // ---- what this block owns
  const int splits = Cfg::kSliced ? grid.splits : 1;
  const int qtile = blockIdx.x % grid.q_tiles;
  const int split = (blockIdx.x / grid.q_tiles) % splits;
  const int chunk = blockIdx.x / grid.q_tiles / splits;
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
  const T* dg = static_cast<const T*>(p.d.data);

  // Synchronous load of the query rows (zero rows past a segment or past the batch).
  auto load_queries = [&](int qfirst) {
    for (int r = tid; r < BM; r += Cfg::kThreads) {
      const int ql = r / rpq, t = t0 + r % rpq, qi = qfirst + ql;
      bool valid = false;
      if (ql < grid.qpb && qi < num_q) valid = row_valid(p.q, segment_of(p.q, qi), t);
      row_ok[r] = valid;
    }
    for (int c = tid; c < BM * chunks; c += Cfg::kThreads) {
      const int r = c / chunks, k = c % chunks;
      const int ql = r / rpq, t = t0 + r % rpq, qi = qfirst + ql;
      uint4 v = make_uint4(0, 0, 0, 0);
      if (ql < grid.qpb && qi < num_q && k * 8 < dim) {
        const Segment g = segment_of(p.q, qi);
        if (t < g.rows) v = *reinterpret_cast<const uint4*>(qg + row_elem(p.q, qi, g.first_row, t) + k * 8);
      }
      *reinterpret_cast<uint4*>(q_s + r * lds + k * 8) = v;
    }
  };
  load_queries(q0);

  auto span_of = [&](const Segment& g) {
    const int tiles = max(1, (g.len + BN - 1) / BN);
    if (splits == 1) return TileSpan{0, tiles, g.len};
    const int per = (tiles + splits - 1) / splits;
    const int begin = split * per, end = min(tiles, begin + per);
    return begin < end ? TileSpan{begin, end, min(g.len, end * BN)} : TileSpan{0, 1, 0};
  };

  // ---- producer: walks (item, tile) ahead of the consumer
  int p_item = item_begin;
  Segment p_seg = segment_of(p.d, item_doc(p_item));
  int p_tile = span_of(p_seg).begin;
  // Each thread copies one 16-byte column chunk of every `row_step`-th row of a tile.
  const int chunks_p2 = chunks <= 8 ? 8 : chunks <= 16 ? 16 : 32;
  const int my_chunk = tid % chunks_p2, row_step = Cfg::kThreads / chunks_p2;
  const bool copies = my_chunk < chunks;
  // The mask bytes of a tile are loaded into a register when the tile is issued and stored to
  // shared memory one iteration later, so their latency hides behind a whole tile of work.
  bool mask_reg = true;
  int mask_stage = -1;
  auto stage_mask = [&]() {
    if (mask_stage >= 0 && tid < BN) mask_s[mask_stage * BN + tid] = mask_reg;
    mask_stage = -1;
  };
  auto issue = [&](int stage) {
    if (p_item < item_end) {
      const int doc = item_doc(p_item);
      const TileSpan p_span = span_of(p_seg);  // recomputed: cheaper than a live register
      if (p.d.mask != nullptr) {
        const int s = p_tile * BN + tid;
        mask_reg = tid < BN && s < p_span.cols ? p.d.mask[p_seg.first_row + s] : false;
        mask_stage = stage;
      }
      T* dst = d_s + stage * BN * lds + my_chunk * 8;
      const int row0 = p_tile * BN;
      const T* src0 = dg + row_elem(p.d, doc, p_seg.first_row, 0) + my_chunk * 8;
      const bool col_in = copies && my_chunk * 8 < dim;
      if (copies) {
        for (int r = tid / chunks_p2; r < BN; r += row_step) {
          const int s = row0 + r;
          const bool in = col_in && s < p_span.cols;
          cp_async16(dst + r * lds, in ? src0 + int64_t(s) * p.d.row_stride : dg, in ? 16 : 0);
        }
      }
      if (++p_tile == p_span.end) {
        if (++p_item < item_end) p_seg = segment_of(p.d, item_doc(p_item));
        p_tile = span_of(p_seg).begin;
      }
    }
    cp_async_commit();  // empty groups keep the wait counts uniform
  };
#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    stage_mask();
    issue(s);
  }

  // ---- consumer state
  float best_v[MT][2];
  int best_i[MT][2];
  auto reset = [&]() {
#pragma unroll
    for (int mi = 0; mi < MT; ++mi)
#pragma unroll
      for (int h = 0; h < 2; ++h) { best_v[mi][h] = -INFINITY; best_i[mi][h] = -1; }
  };
  reset();

  int c_item = item_begin, stage = 0;
  TileSpan c_span = span_of(segment_of(p.d, item_doc(c_item)));
  int c_tile = c_span.begin;
  int loaded_q = q0;
  while (c_item < item_end) {
    stage_mask();
    cp_async_wait<STAGES - 2>();
    __syncthreads();
    issue((stage + STAGES - 1) % STAGES);

    if (pm.layout == kPairs && c_tile == c_span.begin) {
      const int qi = pm.pair_q[c_item];
      if (qi != loaded_q) {  // pairs sorted by query reload rarely
        __syncthreads();
        load_queries(qi);
        loaded_q = qi;
        __syncthreads();
      }
    }

    // Column validity first: its mask loads are then in flight during the MMAs.
    const int col0 = c_tile * BN + warp_n * Cfg::kWarpCols + (lane % 4) * 2;
    const bool full = (c_tile + 1) * BN <= c_span.cols && p.d.mask == nullptr;
    bool ok[NT][2];
#pragma unroll
    for (int ni = 0; ni < NT; ++ni)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int col = col0 + ni * 8 + e;
        ok[ni][e] = full || (col < c_span.cols &&
                             (p.d.mask == nullptr || mask_s[stage * BN + col - c_tile * BN]));
      }
    // S = Q_tile * D_tile^T for this warp's rows and columns.
    float acc[MT][NT][4];
#pragma unroll
    for (int mi = 0; mi < MT; ++mi)
#pragma unroll
      for (int ni = 0; ni < NT; ++ni)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[mi][ni][e] = 0.f;
    const T* a_base = q_s + (warp_m * Cfg::kWarpRows + (lane % 16)) * lds + (lane / 16) * 8;
    const T* b_base = d_s + stage * BN * lds +
                      (warp_n * Cfg::kWarpCols + (lane / 16) * 8 + (lane % 8)) * lds +
                      ((lane / 8) % 2) * 8;
#pragma unroll
    for (int k0 = 0; k0 < kdim; k0 += 16) {
      uint32_t a[MT][4], b[NT / 2][4];
#pragma unroll
      for (int mi = 0; mi < MT; ++mi) ldmatrix_x4(a[mi], a_base + mi * 16 * lds + k0);
#pragma unroll
      for (int nj = 0; nj < NT / 2; ++nj) ldmatrix_x4(b[nj], b_base + nj * 16 * lds + k0);
#pragma unroll
      for (int mi = 0; mi < MT; ++mi)
#pragma unroll
        for (int ni = 0; ni < NT; ++ni)
          mma_16816<kBf16>(acc[mi][ni], a[mi], b[ni / 2][(ni % 2) * 2], b[ni / 2][(ni % 2) * 2 + 1]);
    }

    // Running max over this tile's valid columns. With argmax, the tile's max is found first
    // (one max per element); only when it beats the running best is the row rescanned for the
    // lowest column holding it, so the common path costs the same as without argmax.
#pragma unroll
    for (int mi = 0; mi < MT; ++mi)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float tmax = -INFINITY;
#pragma unroll
        for (int ni = 0; ni < NT; ++ni)
#pragma unroll
          for (int e = 0; e < 2; ++e) tmax = max_nan(tmax, ok[ni][e] ? acc[mi][ni][h * 2 + e] : -INFINITY);
        if constexpr (kArgmax) {
          const float b = best_v[mi][h];
          if (tmax > b || (tmax != tmax && b == b)) {
            int idx = -1;
#pragma unroll
            for (int ni = NT - 1; ni >= 0; --ni)
#pragma unroll
              for (int e = 1; e >= 0; --e) {
                const float v = acc[mi][ni][h * 2 + e];
                if (ok[ni][e] && (v == tmax || (v != v && tmax != tmax))) idx = col0 + ni * 8 + e;
              }
            best_v[mi][h] = tmax;
            best_i[mi][h] = idx;
          }
        } else {
          best_v[mi][h] = max_nan(best_v[mi][h], tmax);
        }
      }

    if (++c_tile == c_span.end) {
      // ---- end of a document: merge lanes, then warps, then sum rows per query.
#pragma unroll
      for (int mi = 0; mi < MT; ++mi)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          float v = best_v[mi][h];
          int i = best_i[mi][h];
#pragma unroll
          for (int off = 1; off < 4; off <<= 1) {
            const float ov = __shfl_xor_sync(0xffffffffu, v, off);
            if constexpr (kArgmax) {
              const int oi = __shfl_xor_sync(0xffffffffu, i, off);
              if (beats(ov, oi, Best{v, i})) { v = ov; i = oi; }
            } else {
              v = max_nan(v, ov);
            }
          }
          if (lane % 4 == 0) {
            const int r = warp_m * Cfg::kWarpRows + mi * 16 + h * 8 + lane / 4;
            red_v[warp_n * BM + r] = v;
            red_i[warp_n * BM + r] = i;
          }
        }
      reset();
      __syncthreads();
      const int qfirst = pm.layout == kPairs ? loaded_q : q0;
      for (int r = tid; r < BM; r += Cfg::kThreads) {
        float v = red_v[r];
        int i = red_i[r];
#pragma unroll
        for (int w = 1; w < WN; ++w) {
          const float ov = red_v[w * BM + r];
          if constexpr (kArgmax) {
            const int oi = red_i[w * BM + r];
            if (beats(ov, oi, Best{v, i})) { v = ov; i = oi; }
          } else {
            v = max_nan(v, ov);
          }
        }
        if (splits > 1) {  // one query, whole rows: the slice's maxima go to the merge
          if (r < p.max_lq) {
            const size_t at = (size_t(item_out(c_item, qfirst)) * splits + split) * p.max_lq + r;
            p.partial[at] = v;
            if constexpr (kArgmax)
              reinterpret_cast<int*>(p.partial)[size_t(pm.num_pairs) * splits * p.max_lq + at] = i;
          }
          continue;
        }
        const int ql = r / rpq, t = t0 + r % rpq, qi = qfirst + ql;
        const bool valid = row_ok[r];
        if constexpr (kArgmax) {
          if (ql < grid.qpb && qi < num_q && t < p.max_lq)
            p.argmax[item_out(c_item, qi) * p.max_lq + t] = valid ? i : -1;
        }
        const bool found = kArgmax ? i >= 0 : v != -INFINITY;
        row_val[r] = valid && found ? v : 0.f;
      }
      __syncthreads();
      for (int ql = warp; splits == 1 && ql < grid.qpb; ql += WM * WN) {
        const int qi = qfirst + ql;
        float s = 0.f;
        for (int r = ql * rpq + lane; r < min(BM, (ql + 1) * rpq); r += 32) s += row_val[r];
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) s += __shfl_xor_sync(0xffffffffu, s, off);
        if (lane == 0 && qi < num_q) {
          const int64_t out = item_out(c_item, qi);
          if (grid.m_tiles > 1) p.partial[int64_t(mt) * pm.num_pairs + out] = s;
          else p.scores[out] = s;
        }
      }
      if (++c_item < item_end) c_span = span_of(segment_of(p.d, item_doc(c_item)));
      c_tile = c_span.begin;
    }
    stage = (stage + 1) % STAGES;
  }
  cp_async_wait<0>();
#endif
}

}  // namespace maxsim
