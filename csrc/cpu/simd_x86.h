// The x86 vector policies of the CPU tile (tile_body.h), each with the tile instantiated inside
// its own target region, so that only the functions of that region use its instructions and the
// rest of the extension runs on any x86-64. Included by tile.h.
#pragma once

// AVX2 + FMA: 8 query tokens per 256-bit vector; a 6-token x 16-query block (12 accumulators)
// keeps both FMA pipes busy within the 16 registers.
MAXSIM_TARGET_BEGIN("avx2,fma")
namespace maxsim::cpu::avx2 {
struct V {
  static constexpr int kLanes = 8, kPair = 1, kMaxVectors = 2, kTokenBlock = 6;
  using QElem = float;
  using DElem = float;
  using F = __m256;
  using B = __m256;
  using X = __m256;
  using I = __m256i;
  static F zero() { return _mm256_setzero_ps(); }
  static F load(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, F x) { _mm256_storeu_ps(p, x); }
  static I load_int(const int* p) { return _mm256_loadu_si256(reinterpret_cast<const I*>(p)); }
  static void store_int(int* p, I x) { _mm256_storeu_si256(reinterpret_cast<I*>(p), x); }
  static I splat_int(int t) { return _mm256_set1_epi32(t); }
  static B load_query(const float* p) { return _mm256_loadu_ps(p); }
  static X broadcast(const float* p) { return _mm256_broadcast_ss(p); }
  static X broadcast_last(const float* p) { return _mm256_broadcast_ss(p); }
  static F madd(F acc, X x, B b) { return _mm256_fmadd_ps(x, b, acc); }
  template <bool kArg>
  static void fold(F s, I t, F& m, I& a, I& f) {
    f = _mm256_or_si256(f, _mm256_castps_si256(_mm256_cmp_ps(s, s, _CMP_UNORD_Q)));
    const F gt = _mm256_cmp_ps(s, m, _CMP_GT_OQ);  // false for NaN
    m = _mm256_blendv_ps(m, s, gt);
    if (kArg)
      a = _mm256_castps_si256(
          _mm256_blendv_ps(_mm256_castsi256_ps(a), _mm256_castsi256_ps(t), gt));
  }
};
#include "cpu/tile_body.h"
}  // namespace maxsim::cpu::avx2
MAXSIM_TARGET_END

// AVX-512F: 16 query tokens per 512-bit vector; an 8-token x 32-query block (16 accumulators)
// leaves room for the operands and the running state in the 32 registers. Compares write mask
// registers, so the fold is a masked move.
MAXSIM_TARGET_BEGIN("avx2,fma,avx512f,avx512bw,avx512vl")
namespace maxsim::cpu::avx512 {
struct V {
  static constexpr int kLanes = 16, kPair = 1, kMaxVectors = 2, kTokenBlock = 8;
  using QElem = float;
  using DElem = float;
  using F = __m512;
  using B = __m512;
  using X = __m512;
  using I = __m512i;
  static F zero() { return _mm512_setzero_ps(); }
  static F load(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, F x) { _mm512_storeu_ps(p, x); }
  static I load_int(const int* p) { return _mm512_loadu_si512(p); }
  static void store_int(int* p, I x) { _mm512_storeu_si512(p, x); }
  static I splat_int(int t) { return _mm512_set1_epi32(t); }
  static B load_query(const float* p) { return _mm512_loadu_ps(p); }
  static X broadcast(const float* p) { return _mm512_set1_ps(*p); }
  static X broadcast_last(const float* p) { return _mm512_set1_ps(*p); }
  static F madd(F acc, X x, B b) { return _mm512_fmadd_ps(x, b, acc); }
  template <bool kArg>
  static void fold(F s, I t, F& m, I& a, I& f) {
    f = _mm512_mask_set1_epi32(f, _mm512_cmp_ps_mask(s, s, _CMP_UNORD_Q), -1);
    const __mmask16 gt = _mm512_cmp_ps_mask(s, m, _CMP_GT_OQ);  // false for NaN
    m = _mm512_mask_mov_ps(m, gt, s);
    if (kArg) a = _mm512_mask_mov_epi32(a, gt, t);
  }
};
#include "cpu/tile_body.h"
}  // namespace maxsim::cpu::avx512
MAXSIM_TARGET_END

// AVX512-BF16: bf16 queries and documents multiplied as they are stored, two dimensions per
// vdpbf16ps. Each of its two products is exact in fp32 and added with one rounding, in fp32, so
// a score is an fp32 sum of exact products like the FMA paths' (within a pair the order differs).
// The instruction treats bf16 subnormal inputs as zero and flushes subnormal sums to zero.
MAXSIM_TARGET_BEGIN("avx2,fma,avx512f,avx512bw,avx512vl,avx512bf16")
namespace maxsim::cpu::avx512bf16 {
struct V : avx512::V {
  static constexpr int kPair = 2;
  using QElem = uint16_t;  // bf16 bits
  using DElem = uint16_t;
  using B = __m512bh;
  using X = __m512bh;
  static B load_query(const uint16_t* p) { return (__m512bh)_mm512_loadu_si512(p); }
  static X broadcast(const uint16_t* p) {  // dimensions k, k + 1 of a document token
    uint32_t pair;
    std::memcpy(&pair, p, sizeof pair);
    return (__m512bh)_mm512_set1_epi32(static_cast<int>(pair));
  }
  static X broadcast_last(const uint16_t* p) { return (__m512bh)_mm512_set1_epi32(*p); }
  static F madd(F acc, X x, B b) { return _mm512_dpbf16_ps(acc, x, b); }
};
#include "cpu/tile_body.h"
}  // namespace maxsim::cpu::avx512bf16
MAXSIM_TARGET_END
