// Exact forward on the CUDA cores: fp32 inputs (exact fp32 arithmetic), dims that are not a
// multiple of 8, misaligned rows, and GPUs without the sm_80 tensor-core instructions.
// One block per score; one warp per document token at a time, lanes split the embedding dim.
#pragma once
#include "layout.cuh"
#include "mma.cuh"

namespace maxsim {

template <typename T> __device__ __forceinline__ float to_f32(T x) { return static_cast<float>(x); }
template <> __device__ __forceinline__ float to_f32(__half x) { return __half2float(x); }
template <> __device__ __forceinline__ float to_f32(__nv_bfloat16 x) { return __bfloat162float(x); }

constexpr int kSimtThreads = 128;

template <typename T, bool kArgmax>
__global__ void __launch_bounds__(kSimtThreads) fwd_simt_kernel(const FwdParams p) {
  extern __shared__ float q_row[];  // [dim]
  __shared__ float warp_v[kSimtThreads / 32];
  __shared__ int warp_i[kSimtThreads / 32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const T* qg = static_cast<const T*>(p.q.data);
  const T* dg = static_cast<const T*>(p.d.data);

  for (int pair = blockIdx.x; pair < p.pairs.num_pairs; pair += gridDim.x) {
    const int qi = pair_query(p.pairs, p.d.count, pair), dj = pair_doc(p.pairs, p.d.count, pair);
    const Segment gq = segment_of(p.q, qi), gd = segment_of(p.d, dj);
    float score = 0.f;
    const int rows = kArgmax ? max(gq.rows, p.max_lq) : gq.rows;
    for (int t = 0; t < rows; ++t) {
      const bool valid = t < gq.rows && row_valid(p.q, gq, t);
      if (!valid) {
        if (kArgmax && threadIdx.x == 0 && t < p.max_lq) p.argmax[int64_t(pair) * p.max_lq + t] = -1;
        continue;
      }
      const T* qr = qg + row_elem(p.q, qi, gq.first_row, t);
      for (int k = threadIdx.x; k < p.dim; k += kSimtThreads) q_row[k] = to_f32(qr[k]);
      __syncthreads();
      Best best{-INFINITY, -1};
      for (int s = warp; s < gd.len; s += kSimtThreads / 32) {
        if (p.d.mask != nullptr && !p.d.mask[gd.first_row + s]) continue;
        const T* dr = dg + row_elem(p.d, dj, gd.first_row, s);
        float dot = 0.f;
        for (int k = lane; k < p.dim; k += 32) dot = fmaf(q_row[k], to_f32(dr[k]), dot);
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, off);
        if (beats(dot, s, best)) best = Best{dot, s};
      }
      if (lane == 0) { warp_v[warp] = best.v; warp_i[warp] = best.idx; }
      __syncthreads();
      if (threadIdx.x == 0) {
        Best b{warp_v[0], warp_i[0]};
        for (int w = 1; w < kSimtThreads / 32; ++w)
          if (beats(warp_v[w], warp_i[w], b)) b = Best{warp_v[w], warp_i[w]};
        if (b.idx >= 0) score += b.v;
        if (kArgmax && t < p.max_lq) p.argmax[int64_t(pair) * p.max_lq + t] = b.idx;
      }
      __syncthreads();
    }
    if (threadIdx.x == 0) p.scores[pair] = score;
  }
}

}  // namespace maxsim
