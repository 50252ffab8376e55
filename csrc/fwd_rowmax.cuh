// The row-max (and argmax) accumulator of the tensor-core forward: each thread's running best
// per query row over the document tiles of one document, and the tile-level steps that feed it
// (valid columns, token scales, the max over a tile, the merge across lanes).
#pragma once
#include "fwd_block.cuh"

namespace maxsim {

template <typename B>
struct RowMax {
  static constexpr int MT = B::MT, NT = B::NT, BM = B::BM, BN = B::BN;
  static constexpr bool kArgmax = B::kArgmax;
  // Per row tile and column parity (transposed tile: per query column block j of the product and
  // parity h, over this thread's document rows).
  static constexpr int kBestRows = B::kWgT ? B::kWgCols / 8 : MT;
  // Which of this thread's columns of a tile are valid: bit 2 * ni + e for column col0 + ni * 8 + e.
  static constexpr uint32_t kAllCols = NT * 2 == 32 ? ~0u : (1u << (NT * 2)) - 1;

  B& b;
  float best_v[kBestRows][2];
  int best_i[kBestRows][2];

  __device__ __forceinline__ explicit RowMax(B& blk) : b(blk) {}

  __device__ __forceinline__ void reset() {
#pragma unroll
    for (int mi = 0; mi < kBestRows; ++mi)
#pragma unroll
      for (int h = 0; h < 2; ++h) { best_v[mi][h] = -INFINITY; best_i[mi][h] = -1; }
  }

  // The valid columns of the consumer's tile. Full tiles without a mask skip the per-column tests.
  __device__ __forceinline__ uint32_t valid_cols(int col0) const {
    const bool* mask = b.p.d.mask;
    if ((b.c_tile + 1) * BN <= b.c_span.cols && mask == nullptr) return kAllCols;
    uint32_t ok = 0;
#pragma unroll
    for (int ni = 0; ni < NT; ++ni)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int col = col0 + ni * 8 + e;
        if (col < b.c_span.cols && (mask == nullptr || b.mask_s[b.stage * BN + col - b.c_tile * BN]))
          ok |= 1u << (ni * 2 + e);
      }
    return ok;
  }

  // Scaled documents: each dot product times its token's scale (fp32), before the max. Int8x8's
  // int32 sums (held in acc's registers) become floats first, exactly: |sum| <= 127^2 * 256 < 2^24.
  __device__ __forceinline__ void scale_cols(float (&acc)[MT][NT][4], int col0) const {
#pragma unroll
    for (int ni = 0; ni < NT; ++ni) {
      const float2 sc = *reinterpret_cast<const float2*>(b.scale_s + b.stage * BN + col0 - b.c_tile * BN + ni * 8);
#pragma unroll
      for (int mi = 0; mi < MT; ++mi)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          float v = acc[mi][ni][e];
          if constexpr (B::kIntDot) v = __int2float_rn(__float_as_int(v));
          acc[mi][ni][e] = v * (e % 2 ? sc.y : sc.x);
        }
    }
  }

  // Running max over a tile's valid columns (`ok`, from valid_cols). With argmax, the tile's max
  // is found first (one max per element); only when it beats the running best is the row
  // rescanned for the lowest column holding it, so the common path costs the same as without.
  __device__ __forceinline__ void tile_max(const float (&acc)[MT][NT][4], uint32_t ok, int col0) {
    const bool all = ok == kAllCols;  // full tiles without a mask: no per-column selects
    // Every row's tile max first, with the test of `all` outside the loops: the rows' max trees
    // then interleave (one basic block), which hides the max latency. Full tiles keep the max of
    // each column pair (columns ni * 8 + 0 / 1) for the argmax rescan.
    float tmax[MT][2], pair_max[MT][2][NT];
    if (all) {
#pragma unroll
      for (int mi = 0; mi < MT; ++mi)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          float r[NT];
#pragma unroll
          for (int ni = 0; ni < NT; ++ni)
            r[ni] = pair_max[mi][h][ni] = max_nan(acc[mi][ni][h * 2], acc[mi][ni][h * 2 + 1]);
#pragma unroll
          for (int w = 1; w < NT; w *= 2)
#pragma unroll
            for (int ni = 0; ni + w < NT; ni += 2 * w) r[ni] = max_nan(r[ni], r[ni + w]);
          tmax[mi][h] = r[0];
        }
    } else {
#pragma unroll
      for (int mi = 0; mi < MT; ++mi)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          float m2[2] = {-INFINITY, -INFINITY};
#pragma unroll
          for (int ni = 0; ni < NT; ++ni)
#pragma unroll
            for (int e = 0; e < 2; ++e)
              m2[e] = max_nan(m2[e], ((ok >> (ni * 2 + e)) & 1u) ? acc[mi][ni][h * 2 + e] : -INFINITY);
          tmax[mi][h] = max_nan(m2[0], m2[1]);
        }
    }
#pragma unroll
    for (int mi = 0; mi < MT; ++mi)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        if constexpr (kArgmax) {
          const float bv = best_v[mi][h], t = tmax[mi][h];
          if (t > bv || (t != t && bv == bv)) {
            int idx = -1;
            if (all && t == t && MT == 1) {
              // Every column valid and no NaN: the lowest column pair holding the max, then which
              // of its two columns; one compare and two selects per pair (the rescan runs in
              // nearly every tile, since some lane of the warp nearly always improves). Only
              // where the pair maxima fit in registers (one row tile per warp: the wgmma tile).
              int off = 0;
              float first = 0.f;  // the lower column of that pair
#pragma unroll
              for (int ni = NT - 1; ni >= 0; --ni) {
                const bool hit = pair_max[mi][h][ni] == t;
                off = hit ? ni * 8 : off;
                first = hit ? acc[mi][ni][h * 2] : first;
              }
              idx = col0 + off + (first == t ? 0 : 1);
            } else if (all && t == t) {  // one compare and one select per value
              int off = 0;
#pragma unroll
              for (int ni = NT - 1; ni >= 0; --ni)
#pragma unroll
                for (int e = 1; e >= 0; --e) off = acc[mi][ni][h * 2 + e] == t ? ni * 8 + e : off;
              idx = col0 + off;
            } else {
#pragma unroll
              for (int ni = NT - 1; ni >= 0; --ni)
#pragma unroll
                for (int e = 1; e >= 0; --e) {
                  const float v = acc[mi][ni][h * 2 + e];
                  if (((ok >> (ni * 2 + e)) & 1u) && (v == t || (v != v && t != t)))
                    idx = col0 + ni * 8 + e;
                }
            }
            best_v[mi][h] = t;
            best_i[mi][h] = idx;
          }
        } else {
          best_v[mi][h] = max_nan(best_v[mi][h], tmax[mi][h]);
        }
      }
  }

  // The transposed tile's step: d[4j + h] and d[4j + 2 + h] are document rows col and col + 8
  // (valid: ok0, ok1) against query row 8j + 2 (lane % 4) + h.
  __device__ __forceinline__ void transposed_max(const float (&d)[B::kWgCols / 2], bool ok0, bool ok1, int col) {
    if (B::kDocOperand && !kArgmax && ok0 && ok1) {  // both rows valid: no selects (compute-bound)
#pragma unroll
      for (int j = 0; j < B::kWgCols / 8; ++j)
#pragma unroll
        for (int h = 0; h < 2; ++h) best_v[j][h] = max_nan(best_v[j][h], max_nan(d[4 * j + h], d[4 * j + 2 + h]));
      return;
    }
#pragma unroll
    for (int j = 0; j < B::kWgCols / 8; ++j)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float v0 = ok0 ? d[4 * j + h] : -INFINITY, v1 = ok1 ? d[4 * j + 2 + h] : -INFINITY;
        if constexpr (kArgmax) {
          // The lower row wins ties; the first NaN wins (as tile_max).
          const bool second = v1 > v0 || (v1 != v1 && v0 == v0);
          const float t = second ? v1 : v0, bv = best_v[j][h];
          if (t > bv || (t != t && bv == bv)) {
            best_v[j][h] = t;
            best_i[j][h] = second ? col + 8 : col;
          }
        } else {
          best_v[j][h] = max_nan(best_v[j][h], max_nan(v0, v1));
        }
      }
  }

  // (v, i) merged with the lanes whose index differs from this one's in the bits [first, last):
  // a butterfly, so that every one of them ends with the best.
  __device__ __forceinline__ static void merge_lanes(float& v, int& i, int first, int last) {
#pragma unroll
    for (int off = first; off < last; off <<= 1) {
      const float ov = __shfl_xor_sync(0xffffffffu, v, off);
      if constexpr (kArgmax) {
        const int oi = __shfl_xor_sync(0xffffffffu, i, off);
        if (beats(ov, oi, Best{v, i})) { v = ov; i = oi; }
      } else {
        v = max_nan(v, ov);
      }
    }
  }
};

}  // namespace maxsim
