// The wgmma main loop of the tensor-core forward (sm_90a): two warpgroups of 64 query rows x 128
// document tokens (96 for fp32 rows' fp16 parts) read both tiles through shared-memory
// descriptors (128-byte swizzle); document tiles arrive by TMA where the host built a tensor map,
// else by cp.async.
#pragma once
#include "fwd_epilogue.cuh"
#include "fwd_loader.cuh"

namespace maxsim {

// Descriptor offset (16-byte units) of k step k in a swizzled wgmma tile of `rows` rows, a step
// being 32 bytes of a row (k16 of 16-bit values, k8 of fp32, k32 of int8): a k step or a stage
// moves the start address only (its field holds address / 16, no carry out).
__device__ __forceinline__ uint64_t k_off(int k, int rows) {
  return uint64_t((k / 4) * rows * 128 + (k % 4) * 32) / 16;
}

template <typename B>
struct WgmmaLoop {
  static constexpr int MT = B::MT, NT = B::NT, BM = B::BM, BN = B::BN, STAGES = B::STAGES;
  using T = typename B::T;

  // One accumulator set per thread (64 values), so that two blocks share an SM and one's max
  // runs while the other's wgmma does (all-pairs and grouped layouts: the query tile never
  // changes).
  __device__ __forceinline__ static void run(B& b, StageLoader<B>& ld, RowMax<B>& rm, Epilogue<B>& epi) {
    float acc[MT][NT][4];
    // Descriptors of this warpgroup's 64 query rows and of stage 0, first k step (k_off).
    const uint64_t a_desc = smem_desc_sw128(b.q_s + (b.warp / 4) * 64 * 64);
    const uint64_t b_desc = smem_desc_sw128(reinterpret_cast<const T*>(b.d_s));
    int steps = 0;  // tiles consumed: stage `stage` holds its (steps / STAGES)-th load
    while (b.more()) {
      ld.stage_mask();
      if (b.d_tma) {
        mbar_wait(b.full + b.stage, (steps / STAGES) & 1);
      } else {
        cp_async_wait<STAGES - 2>();
        fence_proxy_async();  // this thread's copies, then wgmma's reads
        __syncthreads();
        ld.issue((b.stage + STAGES - 1) % STAGES, false);
      }
      ++steps;
      const uint64_t b_stage = b_desc + uint64_t(b.stage) * (BN * b.ldd() * sizeof(T) / 16);
      float(&d)[MT * NT * 4] = reinterpret_cast<float(&)[MT * NT * 4]>(acc);
      wgmma_fence();
      if constexpr (B::kFp16Parts) {
        // Rows [hi | lo] of kdim / 2 dims each: hi * lo and lo * hi first, then hi * hi; one
        // product: rows of the hi parts alone.
        static_assert(BN == 96, "fp16 parts: m64n96 tiles");
        constexpr bool kCross = B::kFp16Products == 3;
        const int parts = b.kdim() / (kCross ? 32 : 16);  // k steps per part
        if constexpr (kCross) {
#pragma unroll
          for (int k = 0; k < parts; ++k) {
            wgmma_m64n96k16_f16(d, a_desc + k_off(k, BM), b_stage + k_off(k + parts, BN), k > 0);
            wgmma_m64n96k16_f16(d, a_desc + k_off(k + parts, BM), b_stage + k_off(k, BN), true);
          }
        }
#pragma unroll
        for (int k = 0; k < parts; ++k)
          wgmma_m64n96k16_f16(d, a_desc + k_off(k, BM), b_stage + k_off(k, BN), kCross || k > 0);
      } else {
#pragma unroll
        for (int k = 0; k < b.kdim() / 16; ++k) {
          if constexpr (B::kIntDot)
            wgmma_m64n128k32_s8(reinterpret_cast<int(&)[MT * NT * 4]>(d), a_desc + k_off(k, BM), b_stage + k_off(k, BN), k > 0);
          else
            wgmma_m64n128k16<B::kBf16>(d, a_desc + k_off(k, BM), b_stage + k_off(k, BN), k > 0);
        }
      }
      wgmma_commit();
      if (b.d_tma) {
        // The previous tile's stage is free once every warp has waited for its wgmma: with TMA
        // the barrier and the refill run while this tile's wgmma does.
        __syncthreads();
        ld.issue((b.stage + STAGES - 1) % STAGES, false);
      }
      // After the step's barrier: this tile's mask bytes were stored at the start of the step
      // (two stages leave no earlier barrier between that store and these reads).
      const int col0 = b.c_tile * BN + (b.lane % 4) * 2;
      const uint32_t ok = rm.valid_cols(col0);
      wgmma_wait<0>();
      if constexpr (B::kScaled) rm.scale_cols(acc, col0);
      rm.tile_max(acc, ok, col0);
      b.next_tile(epi);
    }
  }
};

}  // namespace maxsim
