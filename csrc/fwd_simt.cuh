// Exact forward on the CUDA cores: fp32 inputs (exact fp32 arithmetic), dims that are not a
// multiple of 8, misaligned rows, and GPUs without the sm_80 tensor-core instructions.
//
// One block per score at a time. The block takes the query 32 rows at a time and the document
// 32 tokens at a time; both are staged in shared memory in 128-dim slices, transposed, so that each
// thread's 2 x 4 dot products (fp32 FMAs in dim order) read one float2 and one float4 per dim.
// The 8 threads sharing rows merge their running maxima by shuffles at the end of the document.
// All pairs of padded fp32 inputs take fwd_simt_tile_kernel (below) where it fits: the same
// arithmetic on register tiles, several times faster.
#pragma once
#include "layout.cuh"
#include "mma.cuh"

namespace maxsim {

template <typename T> __device__ __forceinline__ float to_f32(T x) { return static_cast<float>(x); }
template <> __device__ __forceinline__ float to_f32(__half x) { return __half2float(x); }
template <> __device__ __forceinline__ float to_f32(__nv_bfloat16 x) { return __bfloat162float(x); }

constexpr int kSimtThreads = 128;

// Folds a thread's dot products of tokens s..s+3 (acc[row][token]) into its rows' running best,
// valid tokens only, in token order.
template <int kRows>
__device__ __forceinline__ void fold_tokens(const float (&acc)[kRows][4], int s, const TokenSet& d,
                                            const Segment& gd, Best (&best)[kRows]) {
#pragma unroll
  for (int c = 0; c < 4; ++c) {
    if (s + c >= gd.len || (d.mask != nullptr && !d.mask[gd.first_row + s + c])) continue;
#pragma unroll
    for (int i = 0; i < kRows; ++i)
      if (beats(acc[i][c], s + c, best[i])) best[i] = Best{acc[i][c], s + c};
  }
}

// A row's running best merged over the kLanes consecutive lanes that share the row (any order
// gives the same result: `beats` is a total order).
template <int kLanes>
__device__ __forceinline__ Best merge_lanes(Best b) {
#pragma unroll
  for (int off = 1; off < kLanes; off <<= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, b.v, off);
    const int oi = __shfl_xor_sync(0xffffffffu, b.idx, off);
    if (beats(ov, oi, b)) b = Best{ov, oi};
  }
  return b;
}

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
    const Segment gq = segment_of(p.q, qi);
    Segment gd = segment_of(p.d, dj);
    // Out of range (ids, lengths, offsets, a query past max_lq): NaN, argmax -1, nothing read.
    const bool pair_ok = query_ok(p.q, gq, p.max_lq) && gd.ok;
    if (!pair_ok) gd.len = 0;
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
        fold_tokens(acc, s0 + tx * 4, p.d, gd, best);
      }
      // The 8 lanes of a row group merge their maxima; thread 0 sums the rows in order.
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const Best b = merge_lanes<8>(best[i]);
        if (tx == 0) { row_v[ty * 2 + i] = b.v; row_i[ty * 2 + i] = b.idx; }
      }
      __syncthreads();
      if (tid == 0) {
        for (int r = 0; r < BM && t0 + r < rows; ++r) {
          const int t = t0 + r;
          const bool valid = pair_ok && t < gq.rows && row_valid(p.q, gq, t);
          if (kArgmax && t < p.max_lq) p.argmax[int64_t(pair) * p.max_lq + t] = valid ? row_i[r] : -1;
          if (valid && row_i[r] >= 0) score += row_v[r];
        }
      }
      __syncthreads();  // row_v and q_t are rewritten by the next row tile
    }
    if (tid == 0) p.scores[pair] = pair_ok ? score : NAN;
  }
}

// All pairs of padded fp32 queries (Lq <= 128) and documents (D a multiple of 4, at most 128).
// A block keeps 128 query rows (128 / Lq whole queries) in shared memory, transposed, and streams
// 64-token document tiles through one shared buffer while the next tile waits in registers. Each
// thread owns 8 rows x 4 tokens and adds the same fp32 FMAs in dim order as fwd_simt_kernel (so
// the same bits): 3 float4 shared-memory reads per 32 FMAs instead of 2 reads per 8.
constexpr int kTileThreads = 256;
constexpr int kTileRows = 128, kTileCols = 64, kTileMaxDim = 128;
constexpr int kTileLdq = kTileRows + 4, kTileLdd = kTileCols + 4;  // 16-byte aligned, padded rows

inline size_t simt_tile_smem(int dim) { return size_t(dim) * (kTileLdq + kTileLdd) * sizeof(float); }

template <bool kArgmax>
__global__ void __launch_bounds__(kTileThreads, 2)
fwd_simt_tile_kernel(const FwdParams p, int chunks, int docs_per_block) {
  extern __shared__ __align__(16) float tile_smem[];
  float* q_s = tile_smem;                 // [dim][kTileLdq]: query rows
  float* d_s = q_s + p.dim * kTileLdq;    // [dim][kTileLdd]: the current document tile
  __shared__ float row_v[kTileRows];
  __shared__ int row_i[kTileRows];
  const int tid = threadIdx.x, tx = tid % 16, ty = tid / 16;  // rows 8ty.., tokens 4tx.. of a tile
  const int dim = p.dim, lq = p.q.pad_len, qpb = kTileRows / lq;
  const int q0 = (blockIdx.x / chunks) * qpb;
  const int j0 = (blockIdx.x % chunks) * docs_per_block;
  const int j1 = min(p.d.count, j0 + docs_per_block);
  const float* qg = static_cast<const float*>(p.q.data);
  const float* dg = static_cast<const float*>(p.d.data);

  // Row r: token r % lq of query q0 + r / lq; zeros past the last query.
  for (int e = tid; e < kTileRows * dim; e += kTileThreads) {
    const int r = e / dim, k = e % dim, qi = q0 + r / lq;
    const bool in = r < qpb * lq && qi < p.q.count;
    q_s[k * kTileLdq + r] = in ? qg[row_elem(p.q, qi, 0, r % lq) + k] : 0.f;
  }

  // Thread x fetches token x % 64 of a tile, its float4s x / 64, x / 64 + 4, ...
  const int f_tok = tid % kTileCols, f_first = tid / kTileCols, nf = dim / 4;
  float4 pre[kTileMaxDim / 16];
  int fj = j0, fs = 0;  // the next tile to fetch: document fj, tokens fs..
  auto skip_empty = [&]() {
    while (fj < j1 && segment_of(p.d, fj).len == 0) ++fj;
  };
  auto fetch = [&]() {
    if (fj >= j1) return;
    const Segment g = segment_of(p.d, fj);
    const int s = fs + f_tok;
    const float* src = dg + row_elem(p.d, fj, g.first_row, min(s, g.len - 1));
#pragma unroll
    for (int u = 0; u < kTileMaxDim / 16; ++u) {
      const int f = f_first + 4 * u;
      pre[u] = s < g.len && f < nf ? __ldg(reinterpret_cast<const float4*>(src) + f)
                                   : make_float4(0.f, 0.f, 0.f, 0.f);
    }
    if ((fs += kTileCols) >= g.len) {
      ++fj;
      fs = 0;
      skip_empty();
    }
  };
  skip_empty();
  fetch();

  for (int j = j0; j < j1; ++j) {
    const Segment gd = segment_of(p.d, j);
    Best best[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) best[i] = Best{-INFINITY, -1};
    for (int s0 = 0; s0 < gd.len; s0 += kTileCols) {
      __syncthreads();  // the previous tile's readers are done (and the query rows are stored)
#pragma unroll
      for (int u = 0; u < kTileMaxDim / 16; ++u) {
        const int f = f_first + 4 * u;
        if (f < nf) {
          float* dst = d_s + 4 * f * kTileLdd + f_tok;
          dst[0] = pre[u].x;
          dst[kTileLdd] = pre[u].y;
          dst[2 * kTileLdd] = pre[u].z;
          dst[3 * kTileLdd] = pre[u].w;
        }
      }
      __syncthreads();
      fetch();  // the next tile's loads fly during this tile's FMAs
      float acc[8][4] = {};
#pragma unroll 4
      for (int k = 0; k < dim; ++k) {
        const float4 a0 = *reinterpret_cast<const float4*>(q_s + k * kTileLdq + 8 * ty);
        const float4 a1 = *reinterpret_cast<const float4*>(q_s + k * kTileLdq + 8 * ty + 4);
        const float4 b = *reinterpret_cast<const float4*>(d_s + k * kTileLdd + 4 * tx);
        const float av[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
        const float bv[4] = {b.x, b.y, b.z, b.w};
#pragma unroll
        for (int i = 0; i < 8; ++i)
#pragma unroll
          for (int c = 0; c < 4; ++c) acc[i][c] = fmaf(av[i], bv[c], acc[i][c]);
      }
      fold_tokens(acc, s0 + 4 * tx, p.d, gd, best);
    }
    // The 16 lanes of a row group merge their maxima; thread x < qpb sums query x's rows in order.
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const Best b = merge_lanes<16>(best[i]);
      if (tx == 0) {
        row_v[8 * ty + i] = b.v;
        row_i[8 * ty + i] = b.idx;
      }
    }
    __syncthreads();
    const int qi = q0 + tid;
    if (tid < qpb && qi < p.q.count) {
      const Segment gq = segment_of(p.q, qi);
      const int64_t pair = int64_t(qi) * p.d.count + j;
      float score = 0.f;
      for (int t = 0; t < lq; ++t) {
        const int r = tid * lq + t;
        const bool valid = row_valid(p.q, gq, t);
        if (kArgmax) p.argmax[pair * p.max_lq + t] = valid ? row_i[r] : -1;
        if (valid && row_i[r] >= 0) score += row_v[r];
      }
      p.scores[pair] = gq.ok && gd.ok ? score : NAN;  // a length out of range: NaN
    }
    __syncthreads();  // row_v is rewritten by the next document
  }
}

}  // namespace maxsim
