// The tensor-core forward's tiles as policies: each Tile (launch.h) names its main loop, its shape
// per document storage, its pipeline depth and the resident blocks its registers are sized for.
// The planner picks a Tile; the kernel reads everything from TileShape, never from sizes.
#pragma once
#include <cstddef>
#include <cstdint>
#include <type_traits>
#include "codes.cuh"
#include "launch.h"

namespace maxsim {

// How a tile multiplies: mma.sync on warp tiles (sm_80+), wgmma over warpgroups of 64 query rows
// (sm_90a), or wgmma on the transposed product, document tokens x query rows (sm_90a).
enum class MainLoop { kMmaSync, kWgmma, kWgmmaTransposed };

template <int BM_, int BN_, int WM_, int WN_, int STAGES_, MainLoop kLoop_, int kBlocks_,
          int kBlocksArgmax_ = kBlocks_>
struct Shape {
  static constexpr int BM = BM_, BN = BN_;        // query rows x document tokens per tile
  static constexpr int WM = WM_, WN = WN_;        // warps along rows x along columns
  static constexpr int STAGES = STAGES_;          // document tiles in flight
  static constexpr MainLoop kLoop = kLoop_;       // on sm_90a builds; mma.sync elsewhere
  // Resident blocks per SM the register budget is sized for (__launch_bounds__).
  static constexpr int min_blocks(bool argmax) { return argmax ? kBlocksArgmax_ : kBlocks_; }
};

// fp32 rows on the TF32 tensor cores (queries and documents float, T = float): SplitTf32 keeps
// fp32 accuracy with three products per pair of split operands (mma.cuh, split_tf32), RoundTf32
// is one product of operands rounded to TF32 (opt-in; each within 2^-11 relative).
struct SplitTf32 {};
struct RoundTf32 {};
template <typename DT>
constexpr bool kIsTf32 = std::is_same_v<DT, SplitTf32> || std::is_same_v<DT, RoundTf32>;

// Documents with one scale per token (8-bit codes, int8 pairs) stage half the bytes per tile.
template <typename DT>
constexpr bool kHalfBytes = kIsScaled<DT>;

template <Tile, typename DT>
struct TileShape;

// One short query (Lq <= 32) against streamed documents, the memory-bound case: two stages leave
// room for five blocks per SM, which hide load latency better than three of three stages. 8-bit
// tiles: three stages, five blocks (the streaming loop is latency-bound; extra warps hide it).
// fp32 rows: two stages, two blocks per SM (85 KB at D = 128, within sm_86's 99 KB).
template <typename DT>
struct TileShape<Tile::kMmaStream, DT>
    : Shape<32, 64, 1, 4, kHalfBytes<DT> ? 3 : 2, MainLoop::kMmaSync,
            kHalfBytes<DT> ? 5 : kIsTf32<DT> ? 2 : 1> {};

// Queries of 33..64 rows, or row slices of long queries (D > 128). fp32 rows: two stages (101 KB
// at D = 128, within sm_80's 163 KB).
template <typename DT>
struct TileShape<Tile::kMmaSplit, DT>
    : Shape<64, 64, 2, 2, kIsTf32<DT> ? 2 : kHalfBytes<DT> ? 3 : 4, MainLoop::kMmaSync, 1> {};

// Long queries or several short ones of an all-pairs batch, the compute-bound case: a 64 x 32 warp
// tile keeps ldmatrix traffic per mma low; two blocks per SM hide the barrier and load latency.
// fp32 rows: one block per SM (203 KB at D = 128: Hopper only, smaller GPUs step down), whose
// registers hold the split operands.
template <typename DT>
struct TileShape<Tile::kMmaBlock, DT>
    : Shape<128, 128, 2, 4, kHalfBytes<DT> ? 3 : 2, MainLoop::kMmaSync, kIsTf32<DT> ? 1 : 2> {};

// kMmaBlock's work on wgmma, two warpgroups of 64 rows x 128 columns over 128-byte-swizzled tiles
// (16-bit rows; int8 pairs on the integer wgmma): two blocks of two stages per SM, so that one
// block's max overlaps the other's wgmma. fp32 rows' fp16 parts take 96-token tiles, which
// ColBERT's 180-token documents fill to 94% (128-token tiles: 70%); both parts (twice the dim:
// 160 KB at D = 128) leave room for one block, whose registers may then hold the argmax too, the
// hi parts alone (80 KB) for two.
template <typename DT>
struct TileShape<Tile::kWgmmaBlock, DT>
    : Shape<128, kIsFp16Parts<DT> ? 96 : 128, 8, 1, 2, MainLoop::kWgmma,
            std::is_same_v<DT, SplitFp16> ? 1 : 2> {};

// kMmaBlock's work for 8-bit codes and fp32 rows: one warpgroup takes the product transposed (64
// document rows x 128 query rows), each warp converting its 16 document rows straight into
// wgmma's register operand (no 16-bit copy of the tile in shared memory); three blocks per SM
// (two with argmax). fp32 rows: two stages, one block (the split query tile's two TF32 parts
// take 128 KB at D = 128) of two warpgroups, each on 64 of the query rows, so that one splits
// its operands while the other multiplies.
template <typename DT>
struct TileShape<Tile::kWgmmaConverted, DT>
    : Shape<128, 64, 2, kIsTf32<DT> ? 4 : 2, kIsTf32<DT> ? 2 : 3, MainLoop::kWgmmaTransposed,
            kIsTf32<DT> ? 1 : 3, kIsTf32<DT> ? 1 : 2> {};

// kMmaStream's work on the transposed wgmma (16-bit documents, D = 64 / 128): both tiles read from
// shared memory (no ldmatrix), each thread keeping a running max over its own document rows.
template <typename DT>
struct TileShape<Tile::kWgmmaStream, DT> : Shape<32, 64, 2, 2, 2, MainLoop::kWgmmaTransposed, 1> {};

// kWgmmaStream with four stages for padded documents of 512+ tokens: a deeper queue pays where
// each block streams many tiles.
template <typename DT>
struct TileShape<Tile::kWgmmaDeepStream, DT>
    : Shape<32, 64, 2, 2, 4, MainLoop::kWgmmaTransposed, 1> {};

// Long documents of 8-bit codes: kMmaStream's warps over 128-token tiles, so a tile of codes holds
// as many bytes as a 16-bit one and the per-tile cost (barrier, copies) is paid per 16 KB; two
// stages, four blocks per SM.
template <typename DT>
struct TileShape<Tile::kMmaCodeStream, DT> : Shape<32, 128, 1, 4, 2, MainLoop::kMmaSync, 4> {};

// Which (tile, storage, query dtype) instances exist: the transposed 32-row tiles take 16-bit
// documents only, kWgmmaConverted 8-bit codes and fp32 rows, kMmaCodeStream 8-bit codes only,
// kWgmmaBlock 16-bit rows (fp32 rows too, as their fp16 parts), and int8 x int8 rows are fp16
// pairs of codes (no bf16 instance); fp32 rows (float queries, TF32 products) take the three
// mma.sync tiles and kWgmmaConverted.
template <Tile kTile, typename DT, typename T>
constexpr bool kInstanceOf =
    kIsTf32<DT> == std::is_same_v<T, float> &&
    (!kIsTf32<DT> || kTile == Tile::kMmaStream || kTile == Tile::kMmaSplit || kTile == Tile::kMmaBlock ||
     kTile == Tile::kWgmmaConverted) &&
    (kTile != Tile::kWgmmaStream || std::is_same_v<DT, Plain>) &&
    (kTile != Tile::kWgmmaDeepStream || std::is_same_v<DT, Plain>) &&
    (kTile != Tile::kWgmmaConverted || kIsCodes<DT> || kIsTf32<DT>) &&
    (kTile != Tile::kMmaCodeStream || kIsCodes<DT>) &&
    (kTile != Tile::kWgmmaBlock || !kIsCodes<DT>) &&
    (!kIsFp16Parts<DT> || (kTile == Tile::kWgmmaBlock && std::is_same_v<T, __half>)) &&
    !(std::is_same_v<DT, Int8x8> && std::is_same_v<T, __nv_bfloat16>);
// Which instances also exist with the argmax: all but fp32 rows on kWgmmaConverted, whose
// registers spill with it (measured slower than kMmaBlock, where hopper_tile keeps those calls).
template <Tile kTile, typename DT>
constexpr bool kArgmaxInstanceOf = !(kIsTf32<DT> && kTile == Tile::kWgmmaConverted);

// Where each part of a block's dynamic shared memory starts (bytes from the 1024-aligned base).
struct SmemLayout {
  size_t q, d, red_v, red_i, row_val, row_scale, scale, row_ok, mask, full, bytes;
};

// What one tile instance computes with: thread counts, warp tiles, row pitches, shared memory.
template <typename T, typename DT, Tile kTile>
struct TileConfig : TileShape<kTile, DT> {
  using S = TileShape<kTile, DT>;
  using S::BM, S::BN, S::WM, S::WN, S::STAGES;
  static constexpr bool kCodes = kIsCodes<DT>;
  static constexpr bool kScaled = kIsScaled<DT>, kIntDot = std::is_same_v<DT, Int8x8>;
  static constexpr bool kFp16Parts = kIsFp16Parts<DT>;
  // fp16 parts' products per pair of values: hi * lo, lo * hi, hi * hi (3) or hi * hi (1).
  static constexpr int kFp16Products = std::is_same_v<DT, SplitFp16> ? 3 : 1;
  static constexpr bool kTf32 = kIsTf32<DT>;
  // TF32 products per operand pair: 3 for split operands, 1 for rounded ones, 0 without TF32.
  static constexpr int kTf32Products = std::is_same_v<DT, SplitTf32> ? 3 : kTf32 ? 1 : 0;
  using DElem = std::conditional_t<kCodes, uint8_t, T>;  // what a document row is made of
  static constexpr int kChunkElems = 16 / sizeof(DElem);  // per 16-byte copy
  static constexpr int kQChunk = 16 / sizeof(T);          // query elements per 16-byte copy
  // k step of one operand load: codes come 8 bytes per lane, which feeds two k16 mmas; 16-bit
  // and fp32 rows 32 bytes (a k16 or two k8 mmas).
  static constexpr int kKStep = kCodes ? 32 : 32 / int(sizeof(T));
  static constexpr int kThreads = WM * WN * 32;
  static constexpr int kWarpRows = BM / WM, kWarpCols = BN / WN;
  static constexpr int MT = kWarpRows / 16, NT = kWarpCols / 8;
  // wgmma tiles sit in shared memory with the 128-byte swizzle (mma.cuh), not padded rows.
  static constexpr bool kSwizzled = S::kLoop != MainLoop::kMmaSync;
  static constexpr bool kTransposed = S::kLoop == MainLoop::kWgmmaTransposed;
  // Document rows the threads read and convert into the transposed wgmma's register operand.
  static constexpr bool kDocOperand = kTransposed && (kCodes || kTf32);
  // 16-bit rows on wgmma: with a tensor map from the host, the block tile's stages and the stream
  // tiles' first stage arrive by TMA, on stage barriers.
  static constexpr bool kTmaStages = kSwizzled && !kDocOperand;
  // Query tiles in shared memory: split TF32 on wgmma keeps each value's TF32 part and remainder.
  static constexpr int kQueryParts = kTransposed && kTf32Products == 3 ? 2 : 1;
  // The transposed tile's warpgroups split the query rows (each multiplies all document rows of
  // the tile by kWgCols of them).
  static constexpr int kColGroups = kTransposed ? WM * WN / 4 : 1;
  static constexpr int kWgCols = BM / kColGroups;
  // Slices whose maxima merge per row: a transposed warpgroup's four warps, else the column warps.
  static constexpr int kParts = kTransposed ? 4 : WN;
  static_assert(MT >= 1 && NT >= 2 && NT % 2 == 0, "warp tile must be >= 16 x 16");

  __host__ __device__ static int kdim(int dim) { return (dim + kKStep - 1) / kKStep * kKStep; }
  // +16 bytes: conflict-free ldmatrix. The wgmma tiles are swizzled instead, so not padded.
  __host__ __device__ static int ldq(int dim) { return kdim(dim) + (kSwizzled ? 0 : kQChunk); }
  // Code rows: 8-byte lane loads of 8 rows are conflict-free when rows sit 8 or 24 banks apart.
  // The transposed tile's register operand loads 16 bytes per lane: unpadded rows whose 16-byte
  // chunks are XOR-swizzled instead (TileBlock::code_chunk); fp32 rows are padded by 16 bytes
  // for ldmatrix, as the mma.sync tiles' are.
  __host__ __device__ static int ldd(int dim) {
    if constexpr (kCodes && kTransposed) return kdim(dim);
    if constexpr (kTf32 && kTransposed) return kdim(dim) + kQChunk;
    if constexpr (kCodes) return kdim(dim) % 64 == 0 ? kdim(dim) + 32 : kdim(dim);
    return ldq(dim);
  }
  // The one description of the shared memory: the host sizes it, the kernel carves it.
  __host__ __device__ static SmemLayout smem(int dim) {
    SmemLayout s;
    size_t at = 0;
    auto take = [&](size_t& field, size_t bytes) { field = at; at += bytes; };
    take(s.q, size_t(kQueryParts) * BM * ldq(dim) * sizeof(T));  // query tile(s)
    take(s.d, size_t(STAGES) * BN * ldd(dim) * sizeof(DElem));   // document stages
    take(s.red_v, size_t(kParts) * BM * sizeof(float));          // slices' row maxima
    take(s.red_i, size_t(kParts) * BM * sizeof(int));            // and their argmax
    take(s.row_val, size_t(BM) * sizeof(float));                 // rows' terms of the sum
    take(s.row_scale, size_t(BM) * sizeof(float));               // rows' scales (1 without)
    take(s.scale, kScaled ? size_t(STAGES) * BN * sizeof(float) : 0);  // tokens' scales
    take(s.row_ok, size_t(BM) * sizeof(uint8_t));                // rows that count (RowFlag)
    take(s.mask, size_t(STAGES) * BN * sizeof(bool));            // tokens that count
    at = (at + 7) / 8 * 8;                                       // mbarriers are 8-byte aligned
    take(s.full, kTmaStages ? size_t(STAGES) * 8 : 0);          // TMA stage barriers
    s.bytes = at;
    return s;
  }
  static size_t smem_bytes(int dim) { return smem(dim).bytes; }
};

}  // namespace maxsim
