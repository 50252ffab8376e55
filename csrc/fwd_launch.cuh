// Tile shapes of the tensor-core forward and the launch of one instance: shared by the planner
// (fwd.cu) and the translation units that instantiate each document storage (fwd_codes_*.cu), so
// the 8-bit variants compile in parallel with the 16-bit ones.
#pragma once
#include <algorithm>
#include <type_traits>
#include "fwd_tc.cuh"
#include "fwd_warp.cuh"
#include "launch.h"

namespace maxsim {
namespace fwd_detail {

// Tile shapes. Why each exists:
//  kSmall  32 x 64,  4 warps: one short query (Lq <= 32) against streamed documents; the
//          memory-bound reranking case. Two stages leave room for five blocks per SM (H100),
//          which hide the load latency better than three blocks of three stages.
//  kMedium 64 x 64,  4 warps: queries of 33..64 tokens (or slices of long queries, D > 128).
//  kLarge  128 x 128, 8 warps: long queries or several short queries of an all-pairs batch; the
//          compute-bound case, where a 64 x 32 warp tile keeps ldmatrix traffic low per mma;
//          2 stages fit two blocks per SM.
//  kWide   128 x 128, 8 warps as two warpgroups of 64 rows x 128 columns: kLarge's work on
//          Hopper's wgmma (sm_90a builds; the same template runs mma.sync elsewhere), for
//          D = 64 / 128 and enough document tiles to keep it streaming; two blocks per SM of
//          two stages each, so that one block's max overlaps the other's wgmma. About 1.9x
//          kLarge's speed on the H100 (kernel time, corpus and allpairs_large). 8-bit codes
//          run it as one warpgroup per block (ShapeOf): 64 document rows x 128 query rows,
//          transposed as kSlim, each warp's rows of codes converted into wgmma's register
//          operand; three blocks per SM. Against a 16-bit operand tile converted into shared
//          memory per step: kernel time, H100, ragged corpus_int8 3.02 -> 2.64 ms, corpus_fp8
//          2.93 -> 2.50, bf16 queries 3.91 -> 3.34.
//  kSlim   32 x 64, 4 warps: kSmall's work on Hopper's wgmma for 16-bit documents of D = 64 /
//          128 (sm_90a builds; a 2 x 2 warp mma.sync tile elsewhere, never planned there). The
//          product is taken transposed, document tokens x query rows (m64n32), so that the
//          tensor cores read both tiles from shared memory: no ldmatrix, and each thread keeps a
//          running max over its own two document rows per tile, merged once per document.
//  kStream kSlim with four stages (three blocks per SM), for padded documents of 512+ tokens:
//          a deeper queue per block pays where each block streams many tiles. 8-bit codes run it
//          as kSmall's 1 x 4 warps over 128-row tiles (ShapeOf): a tile of codes then holds as
//          many bytes as a 16-bit one, so the per-tile cost (barrier, copies, bookkeeping) is
//          paid per 16 KB (kernel time, H100, ragged: rerank_colpali_int8 41.1 -> 37.9 us, fp8
//          40.1 -> 35.8); on shorter documents the wider tile lost (rerank_heavy_int8 39.4 -> 42.0).
//  kWarp   8-bit codes (D = 128) against one short query on Hopper, fwd_warp.cuh: 8 warps
//          sharing the query, each streaming its own run of 32-token tiles of the block's
//          documents (two private 4 KB stages, two blocks per SM), no block barrier per tile.
//          Against kSmall / kStream's 8-bit shapes (kernel time, H100, ragged, us):
//          rerank_heavy_int8 40.2 -> 34.4, rerank_heavy_fp8 39.1 -> 33.8, rerank_colpali_int8
//          38.5 -> 36.5, rerank_colpali_fp8 36.8 -> 34.8, masked rerank_heavy_int8 50.6 -> 38.3.
//          Four warps per block (four blocks per SM) were up to 3% faster on ColPali documents
//          and 2-3% slower on shorter ones; three stages, blocks splitting a query's documents
//          by their tiles, and clusters of blocks sharing their documents' tiles through
//          distributed shared memory were slower (docs/ARCHITECTURE.md).
constexpr int kWarpStreamWarps = 8, kWarpStreamStages = 2;

template <Tile> struct TileShape;
template <> struct TileShape<Tile::kSmall> { static constexpr int BM = 32, BN = 64, WM = 1, WN = 4, STAGES = 2; };
template <> struct TileShape<Tile::kMedium> { static constexpr int BM = 64, BN = 64, WM = 2, WN = 2, STAGES = 4; };
template <> struct TileShape<Tile::kLarge> { static constexpr int BM = 128, BN = 128, WM = 2, WN = 4, STAGES = 2; };
template <> struct TileShape<Tile::kWide> { static constexpr int BM = 128, BN = 128, WM = 8, WN = 1, STAGES = 2; };
template <> struct TileShape<Tile::kSlim> { static constexpr int BM = 32, BN = 64, WM = 2, WN = 2, STAGES = 2; };
template <> struct TileShape<Tile::kStream> { static constexpr int BM = 32, BN = 64, WM = 2, WN = 2, STAGES = 4; };

using Plan = FwdPlan;

// The shape a document storage runs a tile with.
template <Tile kTile, typename DT>
struct ShapeOf : TileShape<kTile> {};
template <> struct ShapeOf<Tile::kStream, Int8Codes> { static constexpr int BM = 32, BN = 128, WM = 1, WN = 4, STAGES = 2; };
template <> struct ShapeOf<Tile::kStream, E4m3Codes> : ShapeOf<Tile::kStream, Int8Codes> {};
template <> struct ShapeOf<Tile::kWide, Int8Codes> { static constexpr int BM = 128, BN = 64, WM = 2, WN = 2, STAGES = 3; };
template <> struct ShapeOf<Tile::kWide, E4m3Codes> : ShapeOf<Tile::kWide, Int8Codes> {};

// Which instances a document storage is built for: the 32-row transposed wgmma tiles (kSlim,
// kStream) take 16-bit documents only (8-bit codes run kStream as an mma.sync shape and the
// transposed product under kWide, ShapeOf; the 32-row form lost to kSmall, 39.6 -> 46.6 us on
// ragged rerank_heavy_int8), and int8 x int8 rows are fp16 pairs of codes (no bf16 instance).
template <Tile kTile, typename DT, typename T>
constexpr bool kInstanceOf = (kTile != Tile::kSlim || std::is_same_v<DT, Plain>) &&
                             (kTile != Tile::kStream || std::is_same_v<DT, Plain> || kIsCodes<DT>) &&
                             !(std::is_same_v<DT, Int8x8> && std::is_same_v<T, __nv_bfloat16>);

// 8-bit tiles take half the shared memory: three stages for the mma.sync shapes, which leaves
// room for more resident blocks of the streaming tile (kMinBlocks). The wgmma tile keeps its
// 16-bit stage count (8-bit codes: three 8 KB stages, ShapeOf), and 8-bit kStream its own (two
// 16 KB stages, four blocks per SM: three stages, three blocks, were 2-5% slower).
template <Tile kTile, typename DT>
constexpr int kStages = kIsScaled<DT> && kTile != Tile::kWide && kTile != Tile::kStream ? 3 : ShapeOf<kTile, DT>::STAGES;

// The embedding dim with a fully unrolled k loop: ColBERT / ColPali's 128, which int8 x int8 rows
// see as 64 fp16 pairs of codes.
template <typename DT>
constexpr int kUnrolledDim = std::is_same_v<DT, Int8x8> ? 64 : 128;

template <typename T, typename DT, Tile kTile>
using TileCfg = FwdTC<T, DT, ShapeOf<kTile, DT>::BM, ShapeOf<kTile, DT>::BN, ShapeOf<kTile, DT>::WM,
                      ShapeOf<kTile, DT>::WN, kStages<kTile, DT>, false>;

template <typename T, typename DT, Tile kTile, bool kArgmax, int kDim>
constexpr auto tc_kernel() {
  using S = ShapeOf<kTile, DT>;
  return fwd_tc_kernel<T, DT, S::BM, S::BN, S::WM, S::WN, kStages<kTile, DT>, kArgmax, kDim>;
}

// Blocks of a tile kernel resident per SM (registers and shared memory), asked once per device.
template <typename T, typename DT, Tile kTile, bool kArgmax, int kDim>
int resident_blocks(int dim) {
  using Cfg = TileCfg<T, DT, kTile>;
  constexpr auto kernel = tc_kernel<T, DT, kTile, kArgmax, kDim>();
  constexpr int kMaxDevices = 64;
  static int cached[kMaxDevices] = {};
  int device = 0;
  cudaGetDevice(&device);
  if (kDim > 0 && device < kMaxDevices && cached[device] > 0) return cached[device];
  const size_t smem = Cfg::smem_bytes(dim);
  allow_smem<kernel>(smem);
  int blocks = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, Cfg::kThreads, smem) != cudaSuccess) {
    (void)cudaGetLastError();  // a planning hint only: keep the error off the launch check
    blocks = 1;
  }
  blocks = std::max(blocks, 1);
  if (kDim > 0 && device < kMaxDevices) cached[device] = blocks;
  return blocks;
}

template <typename T, typename DT, Tile kTile, bool kArgmax>
void launch_tc(const FwdParams& p, const Plan& plan, cudaStream_t stream) {
  using Cfg = TileCfg<T, DT, kTile>;
  constexpr auto kFixed = tc_kernel<T, DT, kTile, kArgmax, kUnrolledDim<DT>>();
  constexpr auto kAny = tc_kernel<T, DT, kTile, kArgmax, 0>();
  const size_t smem = Cfg::smem_bytes(p.dim);
  if (p.dim == kUnrolledDim<DT>) {
    allow_smem<kFixed>(smem);
    kFixed<<<plan.blocks, Cfg::kThreads, smem, stream>>>(p, plan.grid);
  } else {
    allow_smem<kAny>(smem);
    kAny<<<plan.blocks, Cfg::kThreads, smem, stream>>>(p, plan.grid);
  }
}

template <typename F>
void with_type(DType dtype, F&& f) {
  if (dtype == DType::kBF16) f(__nv_bfloat16{});
  else f(__half{});
}

template <typename F>
void with_tile(Tile tile, F&& f) {
  switch (tile) {
    case Tile::kSmall: f(std::integral_constant<Tile, Tile::kSmall>{}); break;
    case Tile::kMedium: f(std::integral_constant<Tile, Tile::kMedium>{}); break;
    case Tile::kLarge: f(std::integral_constant<Tile, Tile::kLarge>{}); break;
    case Tile::kWide: f(std::integral_constant<Tile, Tile::kWide>{}); break;
    case Tile::kStream: f(std::integral_constant<Tile, Tile::kStream>{}); break;
    case Tile::kSlim: f(std::integral_constant<Tile, Tile::kSlim>{}); break;
    default: break;
  }
}

// Calls f(T{}, tile tag) for the instance of document storage DT that runs `tile` on `dtype`
// queries, where one exists (kInstanceOf).
template <typename DT, typename F>
void with_instance(Tile tile, DType dtype, F&& f) {
  with_type(dtype, [&](auto type_tag) {
    with_tile(tile, [&](auto tile_tag) {
      if constexpr (kInstanceOf<decltype(tile_tag)::value, DT, decltype(type_tag)>) f(type_tag, tile_tag);
    });
  });
}

// What the planner and the launcher need of one document storage DT (Plain: the query dtype).
// Out-of-line templates, so that `extern template` keeps each storage's kernels in its own
// translation unit.
template <typename DT>
int storage_resident(Tile tile, const FwdParams& p, DType dtype) {
  int blocks = 1;
  if (tile == Tile::kWarp) {
    if constexpr (kIsCodes<DT>)
      with_type(dtype, [&](auto type_tag) {
        blocks = warp_stream_resident<decltype(type_tag), DT, kWarpStreamWarps, kWarpStreamStages>();
      });
    return blocks;
  }
  with_instance<DT>(tile, dtype, [&](auto type_tag, auto tile_tag) {
    using T = decltype(type_tag);
    constexpr Tile kTile = decltype(tile_tag)::value;
    constexpr int kFixed = kUnrolledDim<DT>;
    const bool fixed = p.dim == kFixed;
    if (p.argmax != nullptr)
      blocks = fixed ? resident_blocks<T, DT, kTile, true, kFixed>(p.dim) : resident_blocks<T, DT, kTile, true, 0>(p.dim);
    else
      blocks = fixed ? resident_blocks<T, DT, kTile, false, kFixed>(p.dim) : resident_blocks<T, DT, kTile, false, 0>(p.dim);
  });
  return blocks;
}

// Dynamic shared memory of a tile for one document storage at p.dim; 0 where no instance exists.
template <typename DT>
size_t storage_smem(Tile tile, const FwdParams& p, DType dtype) {
  size_t bytes = 0;
  if (tile == Tile::kWarp) return kIsCodes<DT> ? WarpStream<kWarpStreamWarps, kWarpStreamStages>::kBytes : 0;
  with_instance<DT>(tile, dtype, [&](auto type_tag, auto tile_tag) {
    bytes = TileCfg<decltype(type_tag), DT, decltype(tile_tag)::value>::smem_bytes(p.dim);
  });
  return bytes;
}

template <typename DT>
void storage_launch(const FwdParams& p, const Plan& plan, DType dtype, cudaStream_t stream) {
  if (plan.tile == Tile::kWarp) {
    if constexpr (kIsCodes<DT>)
      with_type(dtype, [&](auto type_tag) {
        warp_stream_launch<decltype(type_tag), DT, kWarpStreamWarps, kWarpStreamStages>(p, plan.blocks, plan.grid, stream);
      });
    return;
  }
  with_instance<DT>(plan.tile, dtype, [&](auto type_tag, auto tile_tag) {
    using T = decltype(type_tag);
    constexpr Tile kTile = decltype(tile_tag)::value;
    if (p.argmax != nullptr) launch_tc<T, DT, kTile, true>(p, plan, stream);
    else launch_tc<T, DT, kTile, false>(p, plan, stream);
  });
}

// Instantiated in their own translation units (fwd_codes_int8.cu, fwd_codes_e4m3.cu, fwd_int8x8.cu).
#define MAXSIM_CODE_STORAGE(EXTERN, DT)                                                      \
  EXTERN template int storage_resident<DT>(Tile, const FwdParams&, DType);                  \
  EXTERN template size_t storage_smem<DT>(Tile, const FwdParams&, DType);                    \
  EXTERN template void storage_launch<DT>(const FwdParams&, const Plan&, DType, cudaStream_t);
MAXSIM_CODE_STORAGE(extern, Int8Codes)
MAXSIM_CODE_STORAGE(extern, E4m3Codes)
MAXSIM_CODE_STORAGE(extern, Int8x8)

}  // namespace fwd_detail
}  // namespace maxsim
