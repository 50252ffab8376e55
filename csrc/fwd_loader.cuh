// The stage loader of the tensor-core forward: the producer that walks (item, tile) ahead of the
// consumer and fills the STAGES-deep ring of document tiles (cp.async, or TMA boxes on the wgmma
// tile), plus the query tile and the per-row flags and scales the epilogue reads.
#pragma once
#include "fwd_block.cuh"

namespace maxsim {

template <typename B>
struct StageLoader {
  using T = typename B::T;
  using DT = typename B::DT;
  using DElem = typename B::DElem;
  static constexpr int BM = B::BM, BN = B::BN, STAGES = B::STAGES, kThreads = B::kThreads;
  static constexpr bool kWg = B::kWg, kWgT = B::kWgT, kCodes = B::kCodes, kScaled = B::kScaled;
  // Single-TF32 queries are rounded once, as they are stored (through registers, not cp.async),
  // instead of in every product.
  static constexpr bool kRoundedQuery = B::kTf32Products == 1;
  // Split TF32 on wgmma: the query tile is stored as its values' TF32 parts and remainders.
  static constexpr bool kSplitQuery = B::kQueryParts == 2;

  B& b;
  // Each thread copies one 16-byte column chunk of every `row_step`-th row of a tile.
  const int chunks_p2, my_chunk, row_step;
  const bool copies;
  // A padded document's first tile is requested before anything is looked up: its rows below
  // pad_len are the document's own (padding past its length only reaches masked columns), so
  // the copies need no length, and its latency overlaps the length and query loads.
  const bool early;
  bool first_tma = false;  // the first tile or the query came by TMA: the first step waits for it
  // The producer's position: item, its segment, tile.
  int p_item, p_tile;
  Segment p_seg;
  // The mask bytes (and code scales) of a tile are loaded into registers when the tile is issued
  // and stored to shared memory one iteration later, so their latency hides behind a tile of
  // work. The loaded values are only stored (and combined with `in_reg`) in stage_mask, never in
  // `issue`: any use there makes the warp wait for the loads at once.
  bool in_reg = false, mask_reg = true;
  float scale_reg = 0.f;
  int mask_stage = -1;

  __device__ __forceinline__ explicit StageLoader(B& blk)
      : b(blk), chunks_p2(blk.d_chunks() <= 8 ? 8 : blk.d_chunks() <= 16 ? 16 : blk.d_chunks() <= 32 ? 32 : 64),
        my_chunk(blk.tid % chunks_p2), row_step(kThreads / chunks_p2),
        copies(my_chunk < blk.d_chunks()), early((!kWg || kWgT) && blk.p.d.offsets == nullptr) {}

  // Rows [row0, row0 + rows_in) of document `doc` (clipped to the tile) into stage `stage`.
  __device__ __forceinline__ void copy_rows(int stage, int doc, int64_t first_row, int row0, int rows_in) {
    const FwdParams& p = b.p;
    if constexpr (kWg && !B::kDocOperand) {
      // Consecutive threads copy consecutive chunks of a row (128 swizzled bytes per 8 threads;
      // the wgmma tile's dims fill whole 64-dim atoms, so every chunk is in range). A thread's
      // rows are wg_step (a multiple of 8) apart, so its chunk's swizzled column never changes
      // and every copy is one base plus a constant. Rows past `rows_in` are zero-filled.
      const int wg_step = kThreads / b.d_chunks();
      const int r0 = b.tid / b.d_chunks(), c = b.tid % b.d_chunks(), rows_left = rows_in - r0;
      DElem* dst = b.d_s + stage * BN * b.ldd() + B::swz(r0, c, BN);
      // A running byte address: one 64-bit add per copy instead of a multiply.
      uint64_t src = reinterpret_cast<uint64_t>(b.dg + row_elem(p.d, doc, first_row, 0) + c * 8) +
                     uint64_t(row0 + r0) * p.d.row_stride * sizeof(DElem);
      const uint64_t step = uint64_t(wg_step) * p.d.row_stride * sizeof(DElem);
#pragma unroll
      for (int i = 0; i < BN / wg_step; ++i) {
        const bool in = i * wg_step < rows_left;
        cp_async16(dst + i * wg_step * 64, in ? reinterpret_cast<const DElem*>(src) : b.dg, in ? 16 : 0);
        src += step;
      }
      return;
    }
    if (!copies) return;
    // A thread's rows (r0 + i * row_step, row_step even) share one swizzled chunk (only tiles of
    // codes read as the transposed tile's register operand are swizzled).
    DElem* dst = b.d_s + stage * BN * b.ldd() + my_chunk * B::kChunkElems;
    if constexpr (kWgT && kCodes) dst = b.d_s + stage * BN * b.ldd() + b.code_chunk(b.tid / chunks_p2, my_chunk) * B::kChunkElems;
    const DElem* src0 = b.dg + row_elem(p.d, doc, first_row, 0) + my_chunk * B::kChunkElems;
    // Chunks past `dim` are zero-filled, since the query's zero dims would turn stale Inf or
    // NaN into NaN inside a valid dot product.
    const bool col_in = my_chunk * B::kChunkElems < b.dim();
    const int r0 = b.tid / chunks_p2;
    // A running source address (one add per copy, no multiply); with the dim fixed at
    // compile time the row step is too, and the loop unrolls into predicated copies.
    const DElem* src = col_in ? src0 + int64_t(row0 + r0) * p.d.row_stride : b.dg;
    const int64_t inc = col_in ? int64_t(row_step) * p.d.row_stride : 0;
#pragma unroll
    for (int i = 0; i < BN / row_step; ++i) {  // r0 < row_step: BN / row_step rows each
      if (r0 + i * row_step < rows_in) cp_async16(dst + (r0 + i * row_step) * b.ldd(), src, col_in ? 16 : 0);
      src += inc;
    }
  }

  // Which query rows count (RowFlag), and their scales: read in the epilogue only, so at the
  // start they are looked up after the first copies are issued.
  __device__ __forceinline__ void load_row_flags(int qfirst) {
    const FwdParams& p = b.p;
    for (int r = b.tid; r < BM; r += kThreads) {
      const int ql = r / b.rpq, t = b.t0 + r % b.rpq, qi = qfirst + ql;
      uint8_t flag = kRowSkip;
      float scale = 1.f;
      if (ql < b.grid.qpb && b.items.writes(qi)) {
        const Segment g = segment_of(p.q, qi);
        if (!query_ok(p.q, g, p.max_lq)) {
          flag = kRowNaN;
        } else if (row_valid(p.q, g, t)) {
          flag = kRowValid;
          if (p.q_scale != nullptr) scale = p.q_scale[g.first_row + t];
        }
      }
      b.row_ok[r] = flag;
      b.row_scale[r] = scale;
    }
  }

  // Load of the query rows (zero rows past a segment or past the batch). `async`: 16-bit tiles
  // copy the rows with cp.async, joined to the first document stage's group, so that the query's
  // latency overlaps the first tile's instead of preceding it.
  __device__ __forceinline__ void load_queries(int qfirst, bool async) {
    const FwdParams& p = b.p;
    T* q_s = b.q_s;
    constexpr int kQc = B::kQChunk;  // elements per 16-byte chunk: 8, or 4 of fp32
    bool inf = false;                // split queries: a value of this thread's is +-Inf
    for (int c = b.tid; c < BM * b.chunks(); c += kThreads) {
      const int r = c / b.chunks(), k = c % b.chunks();
      const int ql = r / b.rpq, t = b.t0 + r % b.rpq, qi = qfirst + ql;
      const T* src = nullptr;  // this chunk's elements, or none (zeros)
      if (ql < b.grid.qpb && index_below(qi, b.num_q) && k * kQc < b.dim()) {
        const Segment g = segment_at(p.q, qi);
        if (t < g.rows) src = b.qg + row_elem(p.q, qi, g.first_row, t) + k * kQc;
      }
      if constexpr ((!kWg || kWgT) && !kCodes && !kRoundedQuery && !kSplitQuery) {
        if (async) {
          T* dst = kWg ? q_s + B::swz(r, k, BM) : q_s + r * b.lds() + k * kQc;
          cp_async16(dst, src != nullptr ? src : b.qg, src != nullptr ? 16 : 0);
          continue;
        }
      }
      uint4 v = src != nullptr ? *reinterpret_cast<const uint4*>(src) : make_uint4(0, 0, 0, 0);
      if constexpr (kRoundedQuery) v = make_uint4(tf32_of(v.x), tf32_of(v.y), tf32_of(v.z), tf32_of(v.w));
      if constexpr (kSplitQuery) {
        // TF32 parts into q_s, remainders into q_lo_s (an Inf's remainder 0, as split_tf32's)
        uint32_t* w = reinterpret_cast<uint32_t*>(&v);
        uint4 lo;
        uint32_t* l = reinterpret_cast<uint32_t*>(&lo);
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const SplitTf32x s = split_tf32(w[e]);
          inf |= s.cross != s.hi;
          w[e] = s.hi;
          l[e] = s.lo;
        }
        *reinterpret_cast<uint4*>(q_s + B::swz(r, k, BM)) = v;
        *reinterpret_cast<uint4*>(b.q_lo_s + B::swz(r, k, BM)) = lo;
      } else if constexpr (kWgT && kCodes) {
        // The transposed tile's register operand: a lane converts 4 codes (dims 4i .. 4i+3) per
        // k16 step into its k pairs (2c, 2c+1) and (2c+8, 2c+9), c = lane % 4, taking codes
        // 16c .. 16c+15 of each 64-dim group over four steps; the query columns are stored in
        // that order.
        const uint32_t* w = reinterpret_cast<const uint32_t*>(&v);
#pragma unroll
        for (int m = 0; m < 4; ++m) {
          const int d0 = k * 8 + m * 2;  // dims d0, d0 + 1 -> logical column kk, kk + 1
          const int kk = 16 * (4 * (d0 / 64) + (d0 % 16) / 4) + 8 * ((d0 % 4) / 2) + 2 * ((d0 % 64) / 16);
          *reinterpret_cast<uint32_t*>(q_s + B::swz(r, kk / 8, BM) + kk % 8) = w[m];
        }
      } else if constexpr (kWg) {
        *reinterpret_cast<uint4*>(q_s + B::swz(r, k, BM)) = v;
      } else if constexpr (kCodes) {
        store_query_chunk_for_codes(q_s + r * b.lds(), k, v);  // the order of the mma loop's codes
      } else {
        *reinterpret_cast<uint4*>(q_s + r * b.lds() + k * kQc) = v;
      }
    }
    if constexpr (kSplitQuery) b.q_inf = __syncthreads_or(inf);
  }

  // Stores the mask bytes and scales loaded for the last issued tile.
  __device__ __forceinline__ void stage_mask() {
    if (mask_stage >= 0 && b.tid < BN) {
      b.mask_s[mask_stage * BN + b.tid] = in_reg && mask_reg;
      if constexpr (kScaled) b.scale_s[mask_stage * BN + b.tid] = in_reg ? scale_reg * kCodeFold<DT, T> : 0.f;
    }
    mask_stage = -1;
  }

  // The stream tiles' early first tile and query rows as TMA boxes, where the host built tensor
  // maps (padded documents that fill a tile, padded queries): one thread's few instructions
  // instead of every thread's copies and lookups, issued first (swizzled the way wgmma reads
  // them). The first step then waits on stage 0's barrier. Query rows past the query's own come
  // from the next query or as zeros past the tensor: their columns are skipped (row_ok).
  __device__ __forceinline__ void request_first_by_tma(bool tile, bool query, int doc) {
    first_tma = tile || query;
    if (b.tid != 0 || !first_tma) return;
    const FwdParams& p = b.p;
    mbar_init(b.full, 1);
    mbar_init_fence();
    const uint32_t tile_bytes = BN * b.kdim() * sizeof(DElem), query_bytes = BM * b.kdim() * sizeof(T);
    mbar_expect_tx(b.full, (tile ? tile_bytes : 0u) + (query ? query_bytes : 0u));
    // Row indices fit an int: the host checked each tensor's rows (the document's only where
    // its id is in range, which `tile` implies).
    const int d_row = tile ? doc * p.d.pad_len : 0, q_row = b.items.q0 * p.q.pad_len + b.t0;
    for (int atom = 0; atom < b.kdim() / 64; ++atom) {
      if (tile) tma_load_2d(b.d_s + atom * BN * 64, p.d_tmap, atom * 64, d_row, b.full);
      if (query) tma_load_2d(b.q_s + atom * BM * 64, p.q_tmap, atom * 64, q_row, b.full);
    }
  }

  // Requests the producer's next tile into `stage`. `copied`: its rows are already requested
  // (the early first tile).
  __device__ __forceinline__ void issue(int stage, bool copied) {
    const FwdParams& p = b.p;
    if (p_item < b.items.end) {
      const int doc = b.items.doc(p_item);
      const TileSpan p_span = B::span_of(p_seg);  // recomputed: cheaper than a live register
      if (p.d.mask != nullptr || kScaled) {
        const int s = p_tile * BN + b.tid;
        in_reg = b.tid < BN && s < p_span.cols;
        // Predicated loads: a column out of range keeps stale values, which in_reg discards.
        if (in_reg && p.d.mask != nullptr) mask_reg = p.d.mask[p_seg.first_row + s];
        if constexpr (kScaled) {
          if (in_reg) scale_reg = p.d_scale[p_seg.first_row + s];
        }
        mask_stage = stage;
      }
      const int row0 = p_tile * BN;
      if (kWg && b.d_tma && !kWgT) {
        // One thread loads the tile as 64-dim boxes (the tensor map swizzles them the way wgmma
        // reads); rows past this document are masked by `cols`, past the tensor zero-filled.
        if (b.tid == 0) {
          DElem* tile = b.d_s + stage * BN * b.ldd();
          const int grow = static_cast<int>(p_seg.first_row) + row0;
          mbar_expect_tx(b.full + stage, uint32_t(BN * b.kdim() * sizeof(DElem)));
          for (int atom = 0; atom < b.kdim() / 64; ++atom)
            tma_load_2d(tile + atom * BN * 64, p.d_tmap, atom * 64, grow, b.full + stage);
        }
      } else if (!copied) {
        // Rows past the document's valid columns are not copied (the wgmma tiles zero-fill
        // them): their stale contents only reach masked columns (valid_cols).
        copy_rows(stage, doc, p_seg.first_row, row0, p_span.cols - row0);
      }
      if (++p_tile == p_span.tiles) {
        if (++p_item < b.items.end) p_seg = b.items.doc_segment(p.d, b.items.doc(p_item));
        p_tile = 0;
      }
    }
    cp_async_commit();  // empty groups keep the wait counts uniform
  }

  // The pipeline's start: the early first tile, the query tile, the TMA barriers, the first
  // STAGES - 1 tiles, then the row flags.
  __device__ __forceinline__ void start() {
    const FwdParams& p = b.p;
    const int doc0 = b.items.doc(b.items.begin);
    // Only an id in range: its padded rows are the document's own, whatever its length (another
    // id's first stage is left as it is: its columns are masked).
    const bool early_in = early && index_below(doc0, p.d.count);
    const bool tile_tma = early_in && kWgT && b.d_tma && p.d.pad_len >= BN, query_tma = kWgT && p.q_tma;
    request_first_by_tma(tile_tma, query_tma, doc0);
    if (early_in && !tile_tma) copy_rows(0, doc0, 0, 0, p.d.pad_len);
    p_item = b.items.begin;
    p_seg = b.items.doc_segment(p.d, doc0);
    p_tile = 0;
    // The first query rows are copied after the first document's segment is looked up (its
    // length load then runs alongside) and before the first stage is requested (same group).
    if (!query_tma) load_queries(b.items.q0, true);
    if constexpr (kWg) fence_proxy_async();  // the query tile's stores, then wgmma's reads
    if (kWg && !kWgT && p.d_tma && b.tid == 0) {
      for (int s = 0; s < STAGES; ++s) mbar_init(b.full + s, 1);
      mbar_init_fence();
    }
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
      stage_mask();
      issue(s, s == 0 && early);
    }
    load_row_flags(b.items.q0);
    // The TMA barriers' initialisation must be visible to every thread before the first step.
    if (kWg && (b.d_tma || p.q_tma)) __syncthreads();
  }
};

}  // namespace maxsim
