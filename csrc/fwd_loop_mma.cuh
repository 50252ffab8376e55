// The mma.sync main loop of the tensor-core forward (sm_80+): per document tile, each warp
// multiplies its query rows by its slice of the tile's columns (ldmatrix, m16n8k16; 8-bit codes
// turned into 16-bit operands in registers; int8 pairs on m16n8k32; fp32 rows on m16n8k8 TF32)
// and feeds the row max.
#pragma once
#include "fwd_epilogue.cuh"
#include "fwd_loader.cuh"

namespace maxsim {

template <typename B>
struct MmaSyncLoop {
  static constexpr int MT = B::MT, NT = B::NT, BN = B::BN, STAGES = B::STAGES;
  using T = typename B::T;
  using DT = typename B::DT;

  // fp32 rows on the TF32 tensor cores (m16n8k8): ldmatrix reads 16 bytes per row, four fp32
  // values, at the addresses of the 16-bit loop's k16 step; each k8 step's fragments are split
  // (three products: the remainders' cross terms first, then hi * hi) or the document's rounded
  // (one product).
  __device__ __forceinline__ static void product_tf32(const B& b, float (&acc)[MT][NT][4]) {
    const int lane = b.lane, lds = b.lds(), ldd = b.ldd(), kdim = b.kdim();
    const float* a_row = b.q_s + (b.warp_m * B::kWarpRows + (lane % 16)) * lds + (lane / 16) * 4;
    const float* b_row = b.d_s + b.stage * BN * ldd + (b.warp_n * B::kWarpCols + (lane / 16) * 8 + (lane % 8)) * ldd + ((lane / 8) % 2) * 4;
#pragma unroll
    for (int k0 = 0; k0 < kdim; k0 += 8) {
      uint32_t a[MT][4], bf[NT / 2][4];
#pragma unroll
      for (int mi = 0; mi < MT; ++mi) ldmatrix_x4(a[mi], a_row + mi * 16 * lds + k0);
#pragma unroll
      for (int nj = 0; nj < NT / 2; ++nj) ldmatrix_x4(bf[nj], b_row + nj * 16 * ldd + k0);
      if constexpr (B::kTf32Products == 3) {
        SplitTf32x as[MT][4];
#pragma unroll
        for (int mi = 0; mi < MT; ++mi)
#pragma unroll
          for (int j = 0; j < 4; ++j) as[mi][j] = split_tf32(a[mi][j]);
#pragma unroll
        for (int ni = 0; ni < NT; ++ni) {
          const SplitTf32x b0 = split_tf32(bf[ni / 2][(ni % 2) * 2]), b1 = split_tf32(bf[ni / 2][(ni % 2) * 2 + 1]);
#pragma unroll
          for (int mi = 0; mi < MT; ++mi) {
            const uint32_t a_hi[4] = {as[mi][0].hi, as[mi][1].hi, as[mi][2].hi, as[mi][3].hi};
            const uint32_t a_cross[4] = {as[mi][0].cross, as[mi][1].cross, as[mi][2].cross, as[mi][3].cross};
            const uint32_t a_lo[4] = {as[mi][0].lo, as[mi][1].lo, as[mi][2].lo, as[mi][3].lo};
            mma_1688_tf32(acc[mi][ni], a_lo, b0.cross, b1.cross);
            mma_1688_tf32(acc[mi][ni], a_cross, b0.lo, b1.lo);
            mma_1688_tf32(acc[mi][ni], a_hi, b0.hi, b1.hi);
          }
        }
      } else {  // the query tile was rounded as it was stored (StageLoader::load_queries)
#pragma unroll
        for (int ni = 0; ni < NT; ++ni) {
          const uint32_t b0 = tf32_of(bf[ni / 2][(ni % 2) * 2]), b1 = tf32_of(bf[ni / 2][(ni % 2) * 2 + 1]);
#pragma unroll
          for (int mi = 0; mi < MT; ++mi) mma_1688_tf32(acc[mi][ni], a[mi], b0, b1);
        }
      }
    }
  }

  // S = Q_tile * D_tile^T for this warp's rows and columns of stage `stage`.
  __device__ __forceinline__ static void product(const B& b, float (&acc)[MT][NT][4]) {
    const int lane = b.lane, lds = b.lds(), ldd = b.ldd(), kdim = b.kdim();
#pragma unroll
    for (int mi = 0; mi < MT; ++mi)
#pragma unroll
      for (int ni = 0; ni < NT; ++ni)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[mi][ni][e] = 0.f;
    if constexpr (B::kTf32) {
      product_tf32(b, acc);
    } else if constexpr (B::kCodes) {
      const T* a_base = b.q_s + (b.warp_m * B::kWarpRows + (lane % 16)) * lds + (lane / 16) * 8;
      // Lane (g = lane / 4, c = lane % 4) loads 8 codes of its column g: dims 8c .. 8c+7 of each
      // 32-dim step. An mma reads B elements (k = 2c, 2c+1, 2c+8, 2c+9): codes 0,1,2,3 feed the
      // first k16 step and 4,5,6,7 the second; q_s holds the query dims in the matching order.
      const uint8_t* b_base = b.d_s + b.stage * BN * ldd + (b.warp_n * B::kWarpCols + lane / 4) * ldd + (lane % 4) * 8;
      // The 8-warp tile's registers have no room for a second step in flight: not unrolled.
      constexpr int kUnroll = B::WM * B::WN == 8 ? 1 : 8;
#pragma unroll kUnroll
      for (int k0 = 0; k0 < kdim; k0 += 32) {
#pragma unroll
        for (int s = 0; s < 2; ++s) {
          uint32_t a[MT][4], w[NT];
#pragma unroll
          for (int ni = 0; ni < NT; ++ni) w[ni] = *reinterpret_cast<const uint32_t*>(b_base + ni * 8 * ldd + k0 + s * 4);
#pragma unroll
          for (int mi = 0; mi < MT; ++mi) ldmatrix_x4(a[mi], a_base + mi * 16 * lds + k0 + s * 16);
#pragma unroll
          for (int ni = 0; ni < NT; ++ni) {
            uint32_t b0, b1;
            codes_to_pairs<DT, T>(w[ni], b0, b1);
#pragma unroll
            for (int mi = 0; mi < MT; ++mi) mma_16816<B::kBf16>(acc[mi][ni], a[mi], b0, b1);
          }
        }
      }
    } else {
      const T* a_row = b.q_s + (b.warp_m * B::kWarpRows + (lane % 16)) * lds;
      const T* b_row = b.d_s + b.stage * BN * ldd + (b.warp_n * B::kWarpCols + (lane / 16) * 8 + (lane % 8)) * ldd;
#pragma unroll
      for (int k0 = 0; k0 < kdim; k0 += 16) {
        uint32_t a[MT][4], bf[NT / 2][4];
        const int a_col = k0 + (lane / 16) * 8, b_col = k0 + ((lane / 8) % 2) * 8;
#pragma unroll
        for (int mi = 0; mi < MT; ++mi) ldmatrix_x4(a[mi], a_row + mi * 16 * lds + a_col);
#pragma unroll
        for (int nj = 0; nj < NT / 2; ++nj) ldmatrix_x4(bf[nj], b_row + nj * 16 * ldd + b_col);
#pragma unroll
        for (int mi = 0; mi < MT; ++mi)
#pragma unroll
          for (int ni = 0; ni < NT; ++ni) {
            if constexpr (B::kIntDot)
              mma_s8_16832(reinterpret_cast<int(&)[4]>(acc[mi][ni]), a[mi], bf[ni / 2][(ni % 2) * 2], bf[ni / 2][(ni % 2) * 2 + 1]);
            else
              mma_16816<B::kBf16>(acc[mi][ni], a[mi], bf[ni / 2][(ni % 2) * 2], bf[ni / 2][(ni % 2) * 2 + 1]);
          }
      }
    }
  }

  __device__ __forceinline__ static void run(B& b, StageLoader<B>& ld, RowMax<B>& rm, Epilogue<B>& epi) {
    const PairMap& pm = b.p.pairs;
    while (b.more()) {
      ld.stage_mask();
      cp_async_wait<STAGES - 2>();
      __syncthreads();
      ld.issue((b.stage + STAGES - 1) % STAGES, false);

      if (pm.layout == kPairs && b.c_tile == 0) {
        const int qi = pm.pair_q[b.c_item];
        if (qi != b.loaded_q) {  // pairs sorted by query reload rarely
          __syncthreads();
          ld.load_queries(qi, false);
          ld.load_row_flags(qi);
          b.loaded_q = qi;
          __syncthreads();
        }
      }

      // Column validity first: its mask loads are then in flight during the MMAs.
      const int col0 = b.c_tile * BN + b.warp_n * B::kWarpCols + (b.lane % 4) * 2;
      const uint32_t ok = rm.valid_cols(col0);
      float acc[MT][NT][4];
      product(b, acc);
      if constexpr (B::kScaled) rm.scale_cols(acc, col0);
      rm.tile_max(acc, ok, col0);
      b.next_tile(epi);
    }
  }
};

}  // namespace maxsim
