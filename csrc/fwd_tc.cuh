// Fused MaxSim forward on tensor cores (sm_80+ mma.sync m16n8k16, sm_90a wgmma; fp16 / bf16).
//
// A block owns a tile of BM query rows (one query, a slice of a long query, or several short
// queries of an all-pairs batch) kept in shared memory, and streams the token tiles of a list of
// documents through a STAGES-deep pipeline. Each warp multiplies its rows by its slice of the
// document tile and keeps a running max (and argmax) per row in registers; at the end of a
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
// The kernel is composed of named parts:
//   TileShape / TileConfig (fwd_tile.cuh)   the tile policy the planner picked, shared memory
//   TileBlock (fwd_block.cuh)               the block's rows, items (fwd_pairs.cuh) and cursor
//   StageLoader (fwd_loader.cuh)            producer: document stages, query tile, row flags
//   MmaSyncLoop / WgmmaLoop / WgmmaTransposedLoop (fwd_loop_*.cuh)   one main loop per MMA family
//   RowMax (fwd_rowmax.cuh)                 running row max and argmax
//   Epilogue (fwd_epilogue.cuh)             per document: merge, mask, scale, sum, write
#pragma once
#include "fwd_loop_mma.cuh"
#include "fwd_loop_wgmma.cuh"
#include "fwd_loop_wgmma_t.cuh"

namespace maxsim {

// The main loop of a block's tile on the device being compiled for.
template <typename B>
using MainLoopOf = std::conditional_t<
    B::kLoop == MainLoop::kWgmma, WgmmaLoop<B>,
    std::conditional_t<B::kLoop == MainLoop::kWgmmaTransposed, WgmmaTransposedLoop<B>, MmaSyncLoop<B>>>;

// kDim > 0 fixes the embedding dim at compile time (fully unrolled k loop); 0 reads it from p.
template <typename T, typename DT, Tile kTile, bool kArgmax, int kDim>
__global__ void __launch_bounds__(TileConfig<T, DT, kTile>::kThreads,
                                  TileShape<kTile, DT>::min_blocks(kArgmax))
fwd_tc_kernel(const __grid_constant__ FwdParams p, const FwdGrid grid) {
#if __CUDA_ARCH__ >= 800
  using B = TileBlock<T, DT, kTile, kArgmax, kDim>;
  extern __shared__ __align__(1024) unsigned char smem_raw[];  // 1024: the wgmma swizzle atoms
  B b(p, grid, smem_raw);
  if (b.items.empty()) return;
  StageLoader<B> loader(b);
  loader.start();
  RowMax<B> row_max(b);
  row_max.reset();
  b.start_cursor();
  Epilogue<B> epilogue(b, row_max);
  MainLoopOf<B>::run(b, loader, row_max, epilogue);
  cp_async_wait<0>();
#endif
}

}  // namespace maxsim
