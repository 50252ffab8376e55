// Exact forward on the CUDA cores: fp32 inputs (exact fp32 arithmetic), dims that are not a
// multiple of 8, misaligned rows, and GPUs without the sm_80 tensor-core instructions.
//
// One block per score at a time. The block takes the query 32 rows at a time and the document
// 32 tokens at a time; both are staged in shared memory in 128-dim slices, transposed, so that each
// thread's 2 x 4 dot products (fp32 FMAs in dim order) read one float2 and one float4 per dim.
// The 8 threads sharing rows merge their running maxima by shuffles at the end of the document.
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
  constexpr int BM = 32, BN = 32, KC = 128;
  constexpr int LDT = 36;  // padded row: 16-byte aligned float4 reads, 4-way store conflicts at most
  __shared__ __align__(16) float q_t[KC][LDT];  // [dim slice][query row]
  __shared__ __align__(16) float d_t[KC][LDT];  // [dim slice][document token]
  __shared__ float row_v[BM];
  __shared__ int row_i[BM];
  const int tid = threadIdx.x, tx = tid % 8, ty = tid / 8;  // thread: rows 2ty, 2ty+1; cols 4tx..4tx+3
  const T* qg = static_cast<const T*>(p.q.data);
  const T* dg = static_cast<const T*>(p.d.data);
  const int slices = (p.dim + KC - 1) / KC;

  for (int pair = blockIdx.x; pair < p.pairs.num_pairs; pair += gridDim.x) {
    const int qi = pair_query(p.pairs, p.d.count, pair), dj = pair_doc(p.pairs, p.d.count, pair);
    const Segment gq = segment_of(p.q, qi), gd = segment_of(p.d, dj);
    const int rows = kArgmax ? max(gq.rows, p.max_lq) : gq.rows;
    float score = 0.f;  // thread 0's
    for (int t0 = 0; t0 < rows; t0 += BM) {
      auto load_q = [&](int slice) {
        for (int e = tid; e < BM * KC; e += kSimtThreads) {
          const int r = e / KC, k = e % KC, t = t0 + r, kk = slice * KC + k;
          q_t[k][r] = t < gq.rows && kk < p.dim ? to_f32(qg[row_elem(p.q, qi, gq.first_row, t) + kk]) : 0.f;
        }
      };
      if (slices == 1) load_q(0);  // stays for every document tile (the first barrier below orders it)
      Best best[2] = {{-INFINITY, -1}, {-INFINITY, -1}};
      for (int s0 = 0; s0 < gd.len; s0 += BN) {
        float acc[2][4] = {};
        for (int slice = 0; slice < slices; ++slice) {
          __syncthreads();  // the previous slice's readers are done
          if (slices > 1) load_q(slice);
          for (int e = tid; e < BN * KC; e += kSimtThreads) {
            const int c = e / KC, k = e % KC, s = s0 + c, kk = slice * KC + k;
            d_t[k][c] = s < gd.len && kk < p.dim ? to_f32(dg[row_elem(p.d, dj, gd.first_row, s) + kk]) : 0.f;
          }
          __syncthreads();
          const int kmax = min(KC, p.dim - slice * KC);
          for (int k = 0; k < kmax; ++k) {
            const float2 qv = *reinterpret_cast<const float2*>(&q_t[k][ty * 2]);
            const float4 dv = *reinterpret_cast<const float4*>(&d_t[k][tx * 4]);
            const float dvs[4] = {dv.x, dv.y, dv.z, dv.w};
#pragma unroll
            for (int c = 0; c < 4; ++c) {
              acc[0][c] = fmaf(qv.x, dvs[c], acc[0][c]);
              acc[1][c] = fmaf(qv.y, dvs[c], acc[1][c]);
            }
          }
        }
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          const int s = s0 + tx * 4 + c;
          if (s >= gd.len || (p.d.mask != nullptr && !p.d.mask[gd.first_row + s])) continue;
#pragma unroll
          for (int i = 0; i < 2; ++i)
            if (beats(acc[i][c], s, best[i])) best[i] = Best{acc[i][c], s};
        }
      }
      // The 8 lanes of a row group merge their maxima; thread 0 sums the rows in order.
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        Best b = best[i];
#pragma unroll
        for (int off = 1; off < 8; off <<= 1) {
          const float ov = __shfl_xor_sync(0xffffffffu, b.v, off);
          const int oi = __shfl_xor_sync(0xffffffffu, b.idx, off);
          if (beats(ov, oi, b)) b = Best{ov, oi};
        }
        if (tx == 0) { row_v[ty * 2 + i] = b.v; row_i[ty * 2 + i] = b.idx; }
      }
      __syncthreads();
      if (tid == 0) {
        for (int r = 0; r < BM && t0 + r < rows; ++r) {
          const int t = t0 + r;
          const bool valid = t < gq.rows && row_valid(p.q, gq, t);
          if (kArgmax && t < p.max_lq) p.argmax[int64_t(pair) * p.max_lq + t] = valid ? row_i[r] : -1;
          if (valid && row_i[r] >= 0) score += row_v[r];
        }
      }
      __syncthreads();  // row_v and q_t are rewritten by the next row tile
    }
    if (tid == 0) p.scores[pair] = score;
  }
}

}  // namespace maxsim
