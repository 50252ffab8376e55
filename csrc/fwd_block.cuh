// What one block of the tensor-core forward works on: its tile policy, its threads, its shared
// memory carved from the tile's layout, the rows and items it owns, and the consumer's cursor
// (which document tile of which item is being multiplied, in which stage).
#pragma once
#include "fwd_pairs.cuh"
#include "fwd_tile.cuh"
#include "layout.cuh"
#include "mma.cuh"

namespace maxsim {

// A document's tiles: `tiles` of them (one for an empty document, which still runs a tile with no
// valid column so that its empty maxima get written), columns below `cols` valid.
struct TileSpan {
  int tiles, cols;  // cols < 0: the document's id, offsets or length were out of range (NaN)
  __device__ __forceinline__ bool ok() const { return cols >= 0; }
};

// What a query row of the tile contributes (TileBlock::row_ok): nothing (padding, masked or past
// the batch), its max, or NaN (its query is out of range: a bad id, length or offsets).
enum RowFlag : uint8_t { kRowSkip = 0, kRowValid = 1, kRowNaN = 2 };

template <typename T_, typename DT_, Tile kTile, bool kArgmax_, int kDim_>
struct TileBlock : TileConfig<T_, DT_, kTile> {
  using Cfg = TileConfig<T_, DT_, kTile>;
  using T = T_;
  using DT = DT_;
  using DElem = typename Cfg::DElem;
  using Cfg::BM, Cfg::BN, Cfg::WM, Cfg::WN, Cfg::STAGES, Cfg::MT, Cfg::NT, Cfg::kThreads;
  using Cfg::kCodes, Cfg::kScaled, Cfg::kIntDot;
  static constexpr bool kArgmax = kArgmax_;
  static constexpr int kDim = kDim_;  // > 0: the dim fixed at compile time (unrolled k loops)
  static constexpr bool kBf16 = MmaType<T>::kBf16;
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  static constexpr MainLoop kLoop = Cfg::kLoop;
#else
  static constexpr MainLoop kLoop = MainLoop::kMmaSync;  // wgmma needs sm_90a
#endif
  static constexpr bool kWgT = kLoop == MainLoop::kWgmmaTransposed;
  static constexpr bool kWg = kLoop != MainLoop::kMmaSync;  // swizzled tiles read by wgmma
  // Only the block tiles pack several short queries into their rows; the others hold one query's
  // rows, BM per query at compile time, so that finding a row's query takes a shift instead of a
  // division.
  static constexpr bool kOneQuery = !block_tile(kTile);

  const FwdParams& p;
  const FwdGrid grid;
  const int dim_arg;  // p.dim
  // Shared memory (Cfg::smem)
  T* q_s;
  T* q_lo_s;  // split TF32 on wgmma: the query values' remainders (q_s holds their TF32 parts)
  // Split TF32 on wgmma: some query value of the tile is +-Inf, so the documents take the split
  // that keeps Inf products as in fp32 (split_tf32_signed, mma.cuh).
  bool q_inf = false;
  DElem* d_s;
  float *red_v, *row_val, *row_scale, *scale_s;
  int* red_i;
  uint8_t* row_ok;  // RowFlag per query row
  bool* mask_s;
  uint64_t* full;  // [STAGES] mbarriers of the wgmma tile's TMA loads
  const int tid, lane, warp, warp_m, warp_n;
  const bool d_tma;  // TMA boxes of 16-bit rows (TileConfig::kTmaStages)
  // What this block owns
  const int qtile, chunk, mt, num_q, num_d;
  const int rpq;  // rows per query inside the tile
  const int t0;   // first row of the tile within its query
  const BlockItems items;
  const T* qg;
  const DElem* dg;
  // The consumer's cursor
  int c_item, stage, c_tile, loaded_q;
  TileSpan c_span;

  __device__ __forceinline__ TileBlock(const FwdParams& params, const FwdGrid& g, unsigned char* raw)
      : p(params), grid(g), dim_arg(params.dim), tid(threadIdx.x), lane(tid % 32), warp(tid / 32), warp_m(warp / WN), warp_n(warp % WN),
        d_tma(params.d_tma), qtile(blockIdx.x % g.q_tiles), chunk(blockIdx.x / g.q_tiles),
        mt(qtile % g.m_tiles), num_q(params.q.count), num_d(params.d.count),
        rpq(!kOneQuery && g.qpb > 1 ? params.q.pad_len : BM), t0(mt * BM),
        items(params.pairs, params.q.count, params.d.count, g, qtile, chunk) {
    const SmemLayout s = Cfg::smem(dim());
    q_s = reinterpret_cast<T*>(raw + s.q);
    q_lo_s = q_s + BM * lds();
    d_s = reinterpret_cast<DElem*>(raw + s.d);
    red_v = reinterpret_cast<float*>(raw + s.red_v);
    red_i = reinterpret_cast<int*>(raw + s.red_i);
    row_val = reinterpret_cast<float*>(raw + s.row_val);
    row_scale = reinterpret_cast<float*>(raw + s.row_scale);
    scale_s = reinterpret_cast<float*>(raw + s.scale);
    row_ok = raw + s.row_ok;
    mask_s = reinterpret_cast<bool*>(raw + s.mask);
    full = reinterpret_cast<uint64_t*>(raw + s.full);
    qg = static_cast<const T*>(params.q.data);
    dg = static_cast<const DElem*>(params.d.data);
  }

  // The dim and the row pitches: compile-time constants where kDim fixes the dim.
  __device__ __forceinline__ int dim() const { return kDim > 0 ? kDim : dim_arg; }
  __device__ __forceinline__ int kdim() const { return Cfg::kdim(dim()); }
  __device__ __forceinline__ int lds() const { return Cfg::ldq(dim()); }
  __device__ __forceinline__ int ldd() const { return Cfg::ldd(dim()); }
  // 16-byte query chunks per row (the tail past `dim` is zero-filled), and per document row.
  __device__ __forceinline__ int chunks() const { return kdim() / Cfg::kQChunk; }
  __device__ __forceinline__ int d_chunks() const { return kdim() / Cfg::kChunkElems; }

  // Element offset of (row r, 16-byte chunk c) in a wgmma tile of `rows` rows: K-major in atoms
  // of 128-byte rows (64 16-bit dims, 32 fp32 ones), each row's eight 16-byte chunks XOR-swizzled
  // by row % 8 (the 128-byte swizzle).
  __device__ static __forceinline__ int swz(int r, int c, int rows) {
    constexpr int E = 16 / sizeof(T);  // elements per chunk
    return (c / 8) * rows * 8 * E + r * 8 * E + ((c % 8) ^ (r % 8)) * E;
  }
  // Tiles of codes read by the transposed tile's register operand: chunk c of an odd row of 128
  // codes sits at c ^ 4, so that one 16-byte load of eight lanes (chunks 0..3 or 4..7 of two
  // rows) hits every bank once.
  __device__ __forceinline__ int code_chunk(int r, int c) const {
    return kWgT && kCodes && d_chunks() == 8 ? c ^ ((r & 1) * 4) : c;
  }
  __device__ static __forceinline__ TileSpan span_of(const Segment& g) {
    return TileSpan{max(1, (g.len + BN - 1) / BN), g.ok ? g.len : -1};
  }
  __device__ __forceinline__ TileSpan doc_span(int item) const {
    return span_of(items.doc_segment(p.d, items.doc(item)));
  }
  // The first set mask flag of the current document's valid prefix, -1 where none is: the
  // argmax of a row whose every valid similarity is -inf. Whole warps call it (one warp's scan).
  __device__ __forceinline__ int first_masked_in(int item) const {
    if (c_span.cols <= 0) return -1;
    const Segment g = items.doc_segment(p.d, items.doc(item));  // the span's own segment
    return warp_first_set(p.d.mask + g.first_row, c_span.cols, lane);
  }
  // Which query the epilogue's rows belong to.
  __device__ __forceinline__ int query_of_rows() const {
    return p.pairs.layout == kPairs ? loaded_q : items.q0;
  }

  // The consumer's first tile.
  __device__ __forceinline__ void start_cursor() {
    c_item = items.begin;
    stage = 0;
    c_span = doc_span(c_item);
    c_tile = 0;
    loaded_q = items.q0;
  }
  __device__ __forceinline__ bool more() const { return c_item < items.end; }
  // After a tile: at the end of a document its epilogue runs, and the cursor moves on.
  template <typename EndDoc>
  __device__ __forceinline__ void next_tile(EndDoc&& end_doc) {
    if (++c_tile == c_span.tiles) {
      end_doc(c_item);
      if (++c_item < items.end) c_span = doc_span(c_item);
      c_tile = 0;
    }
    stage = (stage + 1) % STAGES;
  }
};

}  // namespace maxsim
