// Host entry points of the kernels; the torch binding fills the params and owns the memory.
#pragma once
#include <cuda_runtime.h>
#include <cstddef>
#include "params.h"

namespace maxsim {

// What the forward runs, named by mechanism (shapes and why: fwd_tile.cuh; the choice: fwd.cu).
enum class Tile {
  kSimt,             // CUDA cores: tiny fp32 calls, or where no tensor-core tile applies (fwd_simt.cuh)
  kMmaStream,        // mma.sync, 1 x 4 warps over one short query, documents streamed
  kMmaSplit,         // mma.sync, 2 x 2 warps over 64 query rows
  kMmaBlock,         // mma.sync, 2 x 4 warps over 128 query rows x 128 tokens
  kWgmmaBlock,       // wgmma, two warpgroups over 128 x 128 (16-bit rows, int8 pairs)
  kWgmmaConverted,   // transposed wgmma over 128 query rows, documents converted into the register
                     // operand (8-bit codes; fp32 rows as split or rounded TF32)
  kWgmmaStream,      // transposed wgmma, one warpgroup, one short query, two stages
  kWgmmaDeepStream,  // kWgmmaStream with four stages, for long padded documents
  kMmaCodeStream,    // mma.sync, 1 x 4 warps over 128-token tiles of 8-bit codes
  kWarpStream,       // warps with private stages, no block barrier per tile (fwd_warp.cuh)
  kWarpStreamFine,   // kWarpStream in blocks of four warps: twice the blocks, for long ragged documents
};

// The tiles of fwd_warp.cuh.
__host__ __device__ constexpr bool warp_stream(Tile t) {
  return t == Tile::kWarpStream || t == Tile::kWarpStreamFine;
}

// The tiles whose blocks own 128 query rows: the compute-bound ones, sized by waves of blocks, and
// the only ones that may pack several short queries into their rows (FwdGrid::qpb).
__host__ __device__ constexpr bool block_tile(Tile t) {
  return t == Tile::kMmaBlock || t == Tile::kWgmmaBlock || t == Tile::kWgmmaConverted;
}

// What the forward runs for one call, planned once (with p.argmax already set, as the resident
// block count depends on it) and then launched.
struct FwdPlan {
  Tile tile = Tile::kSimt;
  FwdGrid grid{1, 1, 1, 1};
  int blocks = 0;
  size_t workspace_floats = 0;  // p.partial: long queries' partial scores per row tile, then
                                // the documents' mask extents (int32) where extents_at >= 0
  int64_t extents_at = -1;      // offset (in floats) of the mask extents in p.partial
  int64_t parts_at = -1;        // offset of fp32 rows' fp16 parts (kWgmmaBlock), 128-byte aligned
};
FwdPlan plan_fwd(const FwdParams& p, DType dtype, const DeviceInfo& dev);
// Dynamic shared memory per block of a plan's tensor-core tile (0 for the CUDA-core kernel).
size_t plan_smem(const FwdParams& p, const FwdPlan& plan, DType dtype);
// fp32 inputs take split-TF32 tiles (fp32 accuracy; p.tf32: one TF32 product), on Hopper's
// all-pairs tile fp16 parts written into p.partial first (plan.parts_at), or, for tiny calls and
// where no tile applies, the CUDA-core kernel. Documents stored as 8-bit codes (p.codes) need a
// tensor-core plan (sm_80+, fp16 / bf16 queries, dim a multiple of 16 up to 256, 16-byte rows).
void launch_fwd(const FwdParams& p, const FwdPlan& plan, DType dtype, const DeviceInfo& dev,
                cudaStream_t stream);
void launch_bwd(const BwdParams& p, DType dtype, const DeviceInfo& dev, cudaStream_t stream);
// Whether dD goes by document row (packed documents, padded ones up to kSortMaxRows rows): the
// binding then provides dd_sorted, dd_start and dd_count (int32 scratch: argmax.numel(), d.rows,
// d.rows).
bool bwd_sorts_rows(const BwdParams& p);
void launch_ce(const CeParams& p, cudaStream_t stream);
// int64 index tensors of one call (lengths, offsets, pair ids) into int32 ones, saturating at the
// int32 range: one launch for all of them (index32.cu).
struct Int32Copies {
  static constexpr int kMax = 4;  // a call's index tensors: one per token set, two pair-id lists
  const int64_t* in[kMax] = {};
  int* out[kMax] = {};
  int64_t n[kMax] = {};
  int count = 0;
};
void launch_saturate_int32(const Int32Copies& copies, cudaStream_t stream);
// Whether the training step's backward can compute the loss itself (p.ce) for scores of `cols`
// columns: the dQ kernel and the dD row kernel then do the work of launch_ce's two kernels, which
// a small step pays for in launches. Every dQ block re-reads its query's scores, so only up to
// kCeFusedCols columns.
constexpr int kCeFusedCols = 1024;
bool bwd_fuses_ce(const BwdParams& p, int cols);

// Raises a kernel's dynamic shared-memory limit to `bytes` on the current device. The attribute
// is a driver call on every launch otherwise; each kernel (template argument) remembers, per
// device, the largest limit already set.
template <auto kKernel>
void allow_smem(size_t bytes) {
  constexpr int kMaxDevices = 64;
  static size_t raised[kMaxDevices] = {};
  int device = 0;
  cudaGetDevice(&device);
  if (device < kMaxDevices && raised[device] >= bytes) return;
  cudaFuncSetAttribute(kKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes));
  if (device < kMaxDevices) raised[device] = bytes;
}

}  // namespace maxsim
