// The transposed wgmma main loop of the tensor-core forward (sm_90a): S^T = D_tile * Q^T, each
// warpgroup on the 64 document tokens of a stage x its kWgCols query rows (m64n32 for 16-bit
// documents, both tiles read from swizzled shared memory; documents converted into the register
// operand: m64n128 for 8-bit codes, two warpgroups of m64n64 for fp32 rows).
// Thread (warp, lane) holds document rows my_row and my_row + 8 of the tile against query rows
// 8j + 2 (lane % 4) + h of its warpgroup's (d[4j + h], d[4j + 2 + h]).
#pragma once
#include "fwd_loop_wgmma.cuh"

namespace maxsim {

template <typename B>
struct WgmmaTransposedLoop {
  static constexpr int BM = B::BM, BN = B::BN, STAGES = B::STAGES;
  static constexpr int kAcc = B::kWgCols / 2;  // accumulators per thread: its warpgroup's columns
  using T = typename B::T;
  using DT = typename B::DT;

  // 8-bit codes: the warp's 16 document rows of the current stage (G 64-dim groups) as the
  // register operand, converted right before the product: per group each lane loads 16 codes of
  // rows my_row and my_row + 8 and turns them into four k steps' fragments.
  template <int G, typename Shadow>
  __device__ __forceinline__ static void codes_product(const B& b, float (&d)[kAcc], int my_row,
                                                       uint64_t q_desc, Shadow&& in_shadow) {
    // One group's operand registers, reused: group g + 1 is converted once group g's products
    // are done (the other resident blocks keep the tensor cores busy meanwhile). Holding every
    // group's operand spilled registers at three blocks per SM.
    const int ldd = b.ldd(), lane = b.lane;
    const uint8_t* row = reinterpret_cast<const uint8_t*>(b.d_s) + b.stage * BN * ldd + my_row * ldd;
    uint32_t a[4][4];
    auto keep_operand = [&]() {  // the registers stay put until the products that read them end
#pragma unroll
      for (int k = 0; k < 4; ++k)
#pragma unroll
        for (int i = 0; i < 4; ++i) wgmma_keep(a[k][i]);
    };
#pragma unroll
    for (int g = 0; g < G; ++g) {
      const int off = b.code_chunk(my_row, 4 * g + lane % 4) * 16;  // rows my_row, my_row + 8 alike
      const uint4 r0 = *reinterpret_cast<const uint4*>(row + off);
      const uint4 r1 = *reinterpret_cast<const uint4*>(row + 8 * ldd + off);
      const uint32_t w0[4] = {r0.x, r0.y, r0.z, r0.w}, w1[4] = {r1.x, r1.y, r1.z, r1.w};
      if (g > 0) {
        wgmma_wait<0>();
        keep_operand();
      }
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        codes_to_pairs<DT, T>(w0[j], a[j][0], a[j][2]);
        codes_to_pairs<DT, T>(w1[j], a[j][1], a[j][3]);
      }
      wgmma_fence();
#pragma unroll
      for (int k = 0; k < 4; ++k)
        wgmma_m64n128k16_rs<B::kBf16>(d, a[k], q_desc + k_off(4 * g + k, BM), g > 0 || k > 0);
      wgmma_commit();
    }
    in_shadow();  // work that does not touch the operands, while the products run
    wgmma_wait<0>();
    keep_operand();
#pragma unroll
    for (int i = 0; i < kAcc; ++i) wgmma_keep(d[i]);
  }

  // fp32 rows on TF32: the warp's 16 document rows of the current stage (G 32-dim groups of four
  // k8 steps) as the register operand, one step's fragment per ldmatrix, split into the three
  // products' operands (remainders' terms first, then hi * hi; the query tile holds the TF32
  // parts, q_lo_desc the remainders) or rounded (one product). Each group's operands take one of
  // two register sets, so that a group converts while the one before multiplies.
  // kSigned: the query tile holds +-Inf (TileBlock::q_inf), so the rows take split_tf32_signed.
  template <int G, bool kSigned, typename Shadow>
  __device__ __forceinline__ static void tf32_product(const B& b, float (&d)[kAcc], uint64_t q_desc,
                                                      uint64_t q_lo_desc, Shadow&& in_shadow) {
    static_assert(kAcc == 32, "fp32 rows: two warpgroups of m64n64");
    constexpr int P = B::kTf32Products;  // operands per value: lo, cross, hi (3) or rounded (1)
    const int ldd = b.ldd(), lane = b.lane;
    const float* row = reinterpret_cast<const float*>(b.d_s) + b.stage * BN * ldd +
                       ((b.warp % 4) * 16 + lane % 16) * ldd + (lane / 16) * 4;
    uint32_t op[2][4][P][4];  // [set][k step][operand][fragment register]
    auto keep_set = [&](int set) {  // registers stay put until the products that read them end
#pragma unroll
      for (int k = 0; k < 4; ++k)
#pragma unroll
        for (int o = 0; o < P; ++o)
#pragma unroll
          for (int i = 0; i < 4; ++i) wgmma_keep(op[set][k][o][i]);
    };
#pragma unroll
    for (int g = 0; g < G; ++g) {
      const int set = g % 2;
      uint32_t raw[4][4];
#pragma unroll
      for (int k = 0; k < 4; ++k) ldmatrix_x4(raw[k], row + (4 * g + k) * 8);
      if (g >= 2) {
        wgmma_wait<1>();  // group g - 2, the last reader of this set, is done
        keep_set(set);
      }
#pragma unroll
      for (int k = 0; k < 4; ++k)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          if constexpr (P == 3) {
            const SplitTf32x x = kSigned ? split_tf32_signed(raw[k][i]) : split_tf32(raw[k][i]);
            op[set][k][0][i] = x.lo;
            op[set][k][1][i] = x.cross;
            op[set][k][2][i] = x.hi;
          } else {
            op[set][k][0][i] = tf32_of(raw[k][i]);
          }
        }
      wgmma_fence();
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const uint64_t off = k_off(4 * g + k, BM);
        if constexpr (P == 3) {
          wgmma_m64n64k8_tf32_rs(d, op[set][k][0], q_desc + off, g > 0 || k > 0);
          wgmma_m64n64k8_tf32_rs(d, op[set][k][1], q_lo_desc + off, true);
          wgmma_m64n64k8_tf32_rs(d, op[set][k][2], q_desc + off, true);
        } else {
          wgmma_m64n64k8_tf32_rs(d, op[set][k][0], q_desc + off, g > 0 || k > 0);
        }
      }
      wgmma_commit();
    }
    in_shadow();  // work that does not touch the operands, while the products run
    wgmma_wait<0>();
    keep_set(0);
    if constexpr (G > 1) keep_set(1);
#pragma unroll
    for (int i = 0; i < kAcc; ++i) wgmma_keep(d[i]);
  }

  __device__ __forceinline__ static void run(B& b, StageLoader<B>& ld, RowMax<B>& rm, Epilogue<B>& epi) {
    const FwdParams& p = b.p;
    const PairMap& pm = p.pairs;
    // This warpgroup's query rows: kWgCols rows of 128 bytes into each swizzled atom column.
    const int q_row0 = (b.warp / 4) * B::kWgCols * (128 / int(sizeof(T)));
    const uint64_t q_desc = smem_desc_sw128(b.q_s + q_row0);
    const uint64_t q_lo_desc = B::kQueryParts == 2 ? smem_desc_sw128(b.q_lo_s + q_row0) : q_desc;
    const uint64_t d_desc = smem_desc_sw128(reinterpret_cast<const T*>(b.d_s));
    const int my_row = (b.warp % 4) * 16 + b.lane / 4;
    while (b.more()) {
      ld.stage_mask();
      cp_async_wait<STAGES - 2>();
      // This thread's copies, then wgmma's reads (converted rows are read by the threads).
      if constexpr (!B::kDocOperand) fence_proxy_async();
      if (ld.first_tma) {
        mbar_wait(b.full, 0);
        ld.first_tma = false;
      }
      __syncthreads();
      // The next stage's copies: converted rows issue them while this tile's products run.
      auto refill = [&]() { ld.issue((b.stage + STAGES - 1) % STAGES, false); };
      if constexpr (!B::kDocOperand) refill();
      if (pm.layout == kPairs && b.c_tile == 0) {
        const int qi = pm.pair_q[b.c_item];
        if (qi != b.loaded_q) {  // every warp passed its last wgmma's wait before the barrier above
          ld.load_queries(qi, false);
          ld.load_row_flags(qi);
          b.loaded_q = qi;
          fence_proxy_async();
          __syncthreads();
        }
      }
      float d[kAcc];
      const int col = b.c_tile * BN + my_row;  // document token of d[4j + h]; d[4j + 2 + h]: col + 8
      bool ok0, ok1;
      auto rows_ok = [&]() {
        ok0 = col < b.c_span.cols && (p.d.mask == nullptr || b.mask_s[b.stage * BN + my_row]);
        ok1 = col + 8 < b.c_span.cols && (p.d.mask == nullptr || b.mask_s[b.stage * BN + my_row + 8]);
      };
      if constexpr (B::kCodes) {
        rows_ok();
        const float s0 = b.scale_s[b.stage * BN + my_row], s1 = b.scale_s[b.stage * BN + my_row + 8];
        if constexpr (B::kDim > 0) codes_product<B::kDim / 64>(b, d, my_row, q_desc, refill);
        else if (b.kdim() == 128) codes_product<2>(b, d, my_row, q_desc, refill);
        else codes_product<1>(b, d, my_row, q_desc, refill);
#pragma unroll
        for (int j = 0; j < kAcc / 4; ++j)
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            d[4 * j + h] *= s0;
            d[4 * j + 2 + h] *= s1;
          }
      } else if constexpr (B::kTf32) {
        rows_ok();
        auto product = [&](auto groups) {
          constexpr int G = decltype(groups)::value;
          if (b.q_inf) tf32_product<G, B::kTf32Products == 3>(b, d, q_desc, q_lo_desc, refill);
          else tf32_product<G, false>(b, d, q_desc, q_lo_desc, refill);
        };
        if constexpr (B::kDim > 0) product(std::integral_constant<int, B::kDim / 32>{});
        else if (b.kdim() == 128) product(std::integral_constant<int, 4>{});
        else product(std::integral_constant<int, 2>{});
      } else {
        const uint64_t d_stage = d_desc + uint64_t(b.stage) * (BN * b.ldd() * sizeof(T) / 16);
        wgmma_fence();
#pragma unroll
        for (int k = 0; k < b.kdim() / 16; ++k)
          wgmma_m64n32k16<B::kBf16>(d, d_stage + k_off(k, BN), q_desc + k_off(k, BM), k > 0);
        wgmma_commit();
        rows_ok();
        wgmma_wait<0>();
      }
      rm.transposed_max(d, ok0, ok1, col);
      b.next_tile(epi);
    }
  }
};

}  // namespace maxsim
