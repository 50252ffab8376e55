// Softmax cross-entropy over the rows of a score matrix: the contrastive loss of a training batch
// (query i against every document, target document t[i], diagonal by default), with its gradient
// with respect to the scores. Two launches, no atomics: a warp per row writes the row's loss and
// gradient, then one block sums the row losses in a fixed order (ce.cuh).
#include "ce.cuh"
#include "launch.h"

namespace maxsim {
namespace {

constexpr int kCeThreads = 256;

__global__ void ce_rows_kernel(CeParams p) {
  const int lane = threadIdx.x % 32;
  const int row = blockIdx.x * (kCeThreads / 32) + threadIdx.x / 32;
  if (row >= p.rows) return;
  ce_write_row(p, row, lane, ce_row(p, row, lane));
}

__global__ void ce_mean_kernel(CeParams p) {
  __shared__ float part[kMeanLanes];
  ce_mean(p, part);
}

}  // namespace

void launch_ce(const CeParams& p, cudaStream_t stream) {
  if (p.rows == 0) return;
  const int rows_per_block = kCeThreads / 32;
  ce_rows_kernel<<<(p.rows + rows_per_block - 1) / rows_per_block, kCeThreads, 0, stream>>>(p);
  ce_mean_kernel<<<1, kCeThreads, 0, stream>>>(p);
}

}  // namespace maxsim
