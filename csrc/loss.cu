// Softmax cross-entropy over the rows of a score matrix: the contrastive loss of a training batch
// (query i against every document, target document t[i], diagonal by default), with its gradient
// with respect to the scores. Two launches, no atomics: a warp per row writes the row's loss and
// gradient, then one block sums the row losses in a fixed order.
#include <cmath>
#include "launch.h"

namespace maxsim {
namespace {

constexpr int kCeThreads = 256;

__global__ void ce_rows_kernel(CeParams p) {
  const int lane = threadIdx.x % 32;
  const int row = blockIdx.x * (kCeThreads / 32) + threadIdx.x / 32;
  if (row >= p.rows) return;
  const float* s = p.scores + int64_t(row) * p.cols;
  float m = -INFINITY;
  for (int j = lane; j < p.cols; j += 32) m = fmaxf(m, s[j] * p.scale);
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
  float sum = 0.f;  // a NaN score makes the sum, the loss and the gradient NaN
  for (int j = lane; j < p.cols; j += 32) sum += expf(s[j] * p.scale - m);
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
  const float lse = m + logf(sum);
  const int64_t t = p.targets ? p.targets[row] : row;
  const bool t_ok = t >= 0 && t < p.cols;
  if (lane == 0) p.row_loss[row] = t_ok ? lse - s[t] * p.scale : NAN;
  const float g = p.scale / p.rows;
  float* d = p.grad + int64_t(row) * p.cols;
  for (int j = lane; j < p.cols; j += 32)
    d[j] = t_ok ? (expf(s[j] * p.scale - lse) - (j == t ? 1.f : 0.f)) * g : NAN;
}

__global__ void ce_mean_kernel(const float* row_loss, int rows, float* loss) {
  __shared__ float part[kCeThreads];
  float acc = 0.f;
  for (int r = threadIdx.x; r < rows; r += kCeThreads) acc += row_loss[r];
  part[threadIdx.x] = acc;
  __syncthreads();
  for (int w = kCeThreads / 2; w > 0; w >>= 1) {
    if (threadIdx.x < w) part[threadIdx.x] += part[threadIdx.x + w];
    __syncthreads();
  }
  if (threadIdx.x == 0) *loss = part[0] / rows;
}

}  // namespace

void launch_ce(const CeParams& p, cudaStream_t stream) {
  if (p.rows == 0) return;
  const int rows_per_block = kCeThreads / 32;
  ce_rows_kernel<<<(p.rows + rows_per_block - 1) / rows_per_block, kCeThreads, 0, stream>>>(p);
  ce_mean_kernel<<<1, kCeThreads, 0, stream>>>(p.row_loss, p.rows, p.loss);
}

}  // namespace maxsim
