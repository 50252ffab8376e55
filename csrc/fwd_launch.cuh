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

// kWarpStream: warps with private stages over their own runs of the block's documents, eight a
// block; kWarpStreamFine four. with_warp_stream calls f with the tile's warp count.
constexpr int kWarpStreamStages = 2;
template <typename F>
void with_warp_stream(Tile tile, F&& f) {
  if (tile == Tile::kWarpStreamFine) f(std::integral_constant<int, 4>{});
  else f(std::integral_constant<int, 8>{});
}

using Plan = FwdPlan;

// The embedding dim with a fully unrolled k loop: ColBERT / ColPali's 128, which int8 x int8 rows
// see as 64 fp16 pairs of codes and fp32 rows split into both fp16 parts as 256 halves.
template <typename DT>
constexpr int kUnrolledDim = std::is_same_v<DT, Int8x8> ? 64 : std::is_same_v<DT, SplitFp16> ? 256 : 128;

template <typename T, typename DT, Tile kTile>
using TileCfg = TileConfig<T, DT, kTile>;

template <typename T, typename DT, Tile kTile, bool kArgmax, int kDim>
constexpr auto tc_kernel() {
  return fwd_tc_kernel<T, DT, kTile, kArgmax, kDim>;
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
  else if (dtype == DType::kF32) f(float{});
  else f(__half{});
}

// Calls f with the tag of a tensor-core tile (kSimt and the warp-stream tiles have none).
template <typename F>
void with_tile(Tile tile, F&& f) {
  switch (tile) {
    case Tile::kMmaStream: f(std::integral_constant<Tile, Tile::kMmaStream>{}); break;
    case Tile::kMmaSplit: f(std::integral_constant<Tile, Tile::kMmaSplit>{}); break;
    case Tile::kMmaBlock: f(std::integral_constant<Tile, Tile::kMmaBlock>{}); break;
    case Tile::kWgmmaBlock: f(std::integral_constant<Tile, Tile::kWgmmaBlock>{}); break;
    case Tile::kWgmmaConverted: f(std::integral_constant<Tile, Tile::kWgmmaConverted>{}); break;
    case Tile::kWgmmaStream: f(std::integral_constant<Tile, Tile::kWgmmaStream>{}); break;
    case Tile::kWgmmaDeepStream: f(std::integral_constant<Tile, Tile::kWgmmaDeepStream>{}); break;
    case Tile::kMmaCodeStream: f(std::integral_constant<Tile, Tile::kMmaCodeStream>{}); break;
    default: break;
  }
}

// Calls f(T{}, tile tag) for the instance of document storage DT that runs `tile` on `dtype`
// queries, where one exists (kInstanceOf).
template <typename DT, typename F>
void with_instance(Tile tile, DType dtype, F&& f) {
  with_type(dtype, [&](auto type_tag) {
    // A named type: nvcc's front end misreads decltype of the captured tag in `if constexpr`.
    using T = decltype(type_tag);
    with_tile(tile, [&](auto tile_tag) {
      if constexpr (kInstanceOf<decltype(tile_tag)::value, DT, T>) f(type_tag, tile_tag);
    });
  });
}

// What the planner and the launcher need of one document storage DT (Plain: the query dtype).
// Out-of-line templates, so that `extern template` keeps each storage's kernels in its own
// translation unit.
template <typename DT>
int storage_resident(Tile tile, const FwdParams& p, DType dtype) {
  int blocks = 1;
  if (warp_stream(tile)) {
    if constexpr (kIsCodes<DT>)
      with_type(dtype, [&](auto type_tag) {
        with_warp_stream(tile, [&](auto warps) {
          blocks = warp_stream_resident<decltype(type_tag), DT, warps.value, kWarpStreamStages>();
        });
      });
    return blocks;
  }
  with_instance<DT>(tile, dtype, [&](auto type_tag, auto tile_tag) {
    using T = decltype(type_tag);
    constexpr Tile kTile = decltype(tile_tag)::value;
    constexpr int kFixed = kUnrolledDim<DT>;
    const bool fixed = p.dim == kFixed;
    if (p.argmax != nullptr) {
      if constexpr (kArgmaxInstanceOf<kTile, DT>)
        blocks = fixed ? resident_blocks<T, DT, kTile, true, kFixed>(p.dim) : resident_blocks<T, DT, kTile, true, 0>(p.dim);
    } else
      blocks = fixed ? resident_blocks<T, DT, kTile, false, kFixed>(p.dim) : resident_blocks<T, DT, kTile, false, 0>(p.dim);
  });
  return blocks;
}

// Dynamic shared memory of a tile for one document storage at p.dim; 0 where no instance exists.
template <typename DT>
size_t storage_smem(Tile tile, const FwdParams& p, DType dtype) {
  size_t bytes = 0;
  if (warp_stream(tile)) {
    if constexpr (kIsCodes<DT>)
      with_warp_stream(tile, [&](auto warps) { bytes = WarpStream<warps.value, kWarpStreamStages>::kBytes; });
    return bytes;
  }
  with_instance<DT>(tile, dtype, [&](auto type_tag, auto tile_tag) {
    bytes = TileCfg<decltype(type_tag), DT, decltype(tile_tag)::value>::smem_bytes(p.dim);
  });
  return bytes;
}

template <typename DT>
void storage_launch(const FwdParams& p, const Plan& plan, DType dtype, cudaStream_t stream) {
  if (warp_stream(plan.tile)) {
    if constexpr (kIsCodes<DT>)
      with_type(dtype, [&](auto type_tag) {
        with_warp_stream(plan.tile, [&](auto warps) {
          warp_stream_launch<decltype(type_tag), DT, warps.value, kWarpStreamStages>(p, plan.blocks, plan.grid,
                                                                                    stream);
        });
      });
    return;
  }
  with_instance<DT>(plan.tile, dtype, [&](auto type_tag, auto tile_tag) {
    using T = decltype(type_tag);
    constexpr Tile kTile = decltype(tile_tag)::value;
    if (p.argmax != nullptr) {
      if constexpr (kArgmaxInstanceOf<kTile, DT>) launch_tc<T, DT, kTile, true>(p, plan, stream);
    } else {
      launch_tc<T, DT, kTile, false>(p, plan, stream);
    }
  });
}

// Instantiated in their own translation units (fwd_codes_int8.cu, fwd_codes_e4m3.cu, fwd_int8x8.cu,
// fwd_tf32_split.cu, fwd_tf32_round.cu, fwd_split_fp16.cu).
#define MAXSIM_CODE_STORAGE(EXTERN, DT)                                                      \
  EXTERN template int storage_resident<DT>(Tile, const FwdParams&, DType);                  \
  EXTERN template size_t storage_smem<DT>(Tile, const FwdParams&, DType);                    \
  EXTERN template void storage_launch<DT>(const FwdParams&, const Plan&, DType, cudaStream_t);
MAXSIM_CODE_STORAGE(extern, Int8Codes)
MAXSIM_CODE_STORAGE(extern, E4m3Codes)
MAXSIM_CODE_STORAGE(extern, Int8x8)
MAXSIM_CODE_STORAGE(extern, SplitTf32)
MAXSIM_CODE_STORAGE(extern, RoundTf32)
MAXSIM_CODE_STORAGE(extern, SplitFp16)
MAXSIM_CODE_STORAGE(extern, RoundFp16)

// fp32 rows as fp16 parts (fwd_split_fp16.cu): the dim the tile sees (16-bit rows of 2 * dim, or
// of the dim's hi halves alone with p.tf32), the scratch floats a call's split copies take,
// and the kernels that fill them, returning the params that read them (per-row scales in
// q_scale / d_scale).
FwdParams as_fp16_parts(const FwdParams& p);
size_t split_fp16_floats(const FwdParams& p);
FwdParams split_fp16_inputs(const FwdParams& p, float* scratch, cudaStream_t stream);

}  // namespace fwd_detail
}  // namespace maxsim
