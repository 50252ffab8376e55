// Softmax cross-entropy over one row of a score matrix, as device functions shared by the `ce`
// kernels (loss.cu) and the training step's fused backward (bwd.cuh): both compute every value
// with the same explicit roundings, so the step's loss and gradients equal the op's bit for bit.
#pragma once
#include <cmath>
#include "params.h"

namespace maxsim {

// What a row's gradient needs: its log-sum-exp and its target column.
struct CeRow {
  float lse;
  int64_t target;
  bool target_ok;  // in [0, cols); otherwise the row's loss is NaN and its gradient 0
};

// One warp computes row `row`'s log-sum-exp (lanes over columns, a fixed shuffle tree); every
// lane returns the same value. A NaN score makes the row NaN.
__device__ __forceinline__ CeRow ce_row(const CeParams& p, int row, int lane) {
  const float* s = p.scores + int64_t(row) * p.cols;
  float m = -INFINITY;
  for (int j = lane; j < p.cols; j += 32) m = fmaxf(m, __fmul_rn(s[j], p.scale));
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
  float sum = 0.f;
  for (int j = lane; j < p.cols; j += 32) sum = __fadd_rn(sum, expf(__fmaf_rn(s[j], p.scale, -m)));
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) sum = __fadd_rn(sum, __shfl_xor_sync(0xffffffffu, sum, off));
  const int64_t t = p.targets ? p.targets[row] : row;
  return {__fadd_rn(m, logf(sum)), t, t >= 0 && t < p.cols};
}

// d loss / d score of column j (score s) of a row: (softmax - onehot) * scale / rows.
__device__ __forceinline__ float ce_grad(const CeParams& p, const CeRow& r, int64_t j, float s) {
  const float g = __fdiv_rn(p.scale, static_cast<float>(p.rows));
  const float soft = expf(__fmaf_rn(s, p.scale, -r.lse));
  return r.target_ok ? __fmul_rn(__fsub_rn(soft, j == r.target ? 1.f : 0.f), g) : 0.f;
}

// A warp writes row `row`'s loss and gradient.
__device__ __forceinline__ void ce_write_row(const CeParams& p, int row, int lane, const CeRow& r) {
  const float* s = p.scores + int64_t(row) * p.cols;
  if (lane == 0)
    p.row_loss[row] = r.target_ok ? __fsub_rn(r.lse, __fmul_rn(s[r.target], p.scale)) : NAN;
  float* d = p.grad + int64_t(row) * p.cols;
  for (int j = lane; j < p.cols; j += 32) d[j] = ce_grad(p, r, j, s[j]);
}

// The mean of the row losses, summed in a fixed 256-wide tree whatever the block's size (any
// multiple or divisor of 256): one block's threads call it together (it holds barriers).
constexpr int kMeanLanes = 256;
__device__ __forceinline__ void ce_mean(const CeParams& p, float* part /* [kMeanLanes] */) {
  for (int v = threadIdx.x; v < kMeanLanes; v += blockDim.x) {
    float acc = 0.f;
    for (int r = v; r < p.rows; r += kMeanLanes) acc = __fadd_rn(acc, p.row_loss[r]);
    part[v] = acc;
  }
  __syncthreads();
  for (int w = kMeanLanes / 2; w > 0; w >>= 1) {
    for (int v = threadIdx.x; v < w; v += blockDim.x) part[v] = __fadd_rn(part[v], part[v + w]);
    __syncthreads();
  }
  if (threadIdx.x == 0) *p.loss = __fdiv_rn(part[0], static_cast<float>(p.rows));
}

}  // namespace maxsim
