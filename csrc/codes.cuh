// 8-bit document codes (INT8, FP8 e4m3) turned into fp16 / bf16 tensor-core operands.
//
// Every int8 and every e4m3 value is exactly representable in fp16 and in bf16, and the products
// of two fp16 (or bf16) values are exact in the fp32 accumulator, so the 8-bit codes can run the
// 16-bit mma unchanged: memory traffic is halved, no precision is lost, and the per-token scale
// is applied to each fp32 dot product before the max. The conversions are a few integer ops per
// pair (no cvt through fp32 for fp16), cheap next to the bytes they save.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cstdint>
#include <type_traits>

namespace maxsim {

// Document storage tags: Plain means documents in the queries' dtype. Int8x8: queries and
// documents both int8 codes, multiplied on the integer tensor cores (s8 x s8 -> s32, exact). The
// kernels see such rows as fp16 pairs of codes (two codes per 16-bit element, dims halved), so
// they copy, stage and address them exactly as 16-bit rows; only the mma differs.
// SplitFp16: fp32 rows passed as fp16 parts [hi | lo] of each value times a power-of-two scale
// per token (fwd_split_fp16.cu), the kernels seeing 16-bit rows of twice the dim; three products per
// pair of parts keep fp32 accuracy, and the token's scale undoes its own. RoundFp16: the same rows,
// one product of the hi parts (opt-in TF32 mode: 11 bits per value, as TF32 keeps).
struct Plain {};
struct Int8Codes {};
struct E4m3Codes {};
struct Int8x8 {};
struct SplitFp16 {};
struct RoundFp16 {};

// 8-bit documents turned into 16-bit operands in registers (codes_to_pairs).
template <typename DT>
constexpr bool kIsCodes = std::is_same_v<DT, Int8Codes> || std::is_same_v<DT, E4m3Codes>;
// fp32 rows as fp16 parts, three products or one.
template <typename DT>
constexpr bool kIsFp16Parts = std::is_same_v<DT, SplitFp16> || std::is_same_v<DT, RoundFp16>;
// Documents with one scale per token, applied to each dot product before the max.
template <typename DT>
constexpr bool kIsScaled = kIsCodes<DT> || std::is_same_v<DT, Int8x8> || kIsFp16Parts<DT>;

// sm_89+ converts e4m3 pairs to fp16 pairs in hardware (cvt.rn.f16x2.e4m3x2, exact).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
#define MAXSIM_CVT_E4M3 1
#else
#define MAXSIM_CVT_E4M3 0
#endif

// Factor the pairs below leave out of each value, folded into the token's scale instead: e4m3
// bits placed into an fp16 by hand land exactly 2^-8 below their value (a power of two: exact).
// Device code only: it depends on the architecture being compiled.
template <typename DT, typename T>
constexpr float kCodeFold =
    std::is_same_v<DT, E4m3Codes> && std::is_same_v<T, __half> && !MAXSIM_CVT_E4M3 ? 256.f : 1.f;

// Four codes (bytes 0..3 of w) -> two operand registers: lo = (c0, c1), hi = (c2, c3), as T pairs
// (times 1 / kCodeFold).
template <typename DT, typename T>
__device__ __forceinline__ void codes_to_pairs(uint32_t w, uint32_t& lo, uint32_t& hi) {
  if constexpr (std::is_same_v<DT, Int8Codes> && std::is_same_v<T, __half>) {
    // x + 128 as the low mantissa byte of 1024 (0x64xx): exact, then subtract 1152.
    const uint32_t u = w ^ 0x80808080u;
    uint32_t a = __byte_perm(u, 0x64646464u, 0x4140), b = __byte_perm(u, 0x64646464u, 0x4342);
    const __half2 bias = __halves2half2(__ushort_as_half(0x6480), __ushort_as_half(0x6480));
    __half2 ha = __hsub2(*reinterpret_cast<__half2*>(&a), bias);
    __half2 hb = __hsub2(*reinterpret_cast<__half2*>(&b), bias);
    lo = *reinterpret_cast<uint32_t*>(&ha);
    hi = *reinterpret_cast<uint32_t*>(&hb);
  } else if constexpr (std::is_same_v<DT, Int8Codes>) {
    // bf16 has too few mantissa bits for the byte trick: x + 128 as the low byte of 2^23 in fp32.
    const uint32_t u = w ^ 0x80808080u;
    float f[4];
#pragma unroll
    for (int i = 0; i < 4; ++i)
      f[i] = __uint_as_float(__byte_perm(u, 0x4B00u, 0x5440 + i)) - 8388736.f;
    __nv_bfloat162 ba = __floats2bfloat162_rn(f[0], f[1]), bb = __floats2bfloat162_rn(f[2], f[3]);
    lo = *reinterpret_cast<uint32_t*>(&ba);
    hi = *reinterpret_cast<uint32_t*>(&bb);
  } else if constexpr (std::is_same_v<T, __half> && MAXSIM_CVT_E4M3) {
    static_assert(std::is_same_v<DT, E4m3Codes>, "unknown code type");
    asm("{\n .reg .b16 l, h;\n mov.b32 {l, h}, %2;\n cvt.rn.f16x2.e4m3x2 %0, l;\n cvt.rn.f16x2.e4m3x2 %1, h;\n}"
        : "=r"(lo), "=r"(hi) : "r"(w));
  } else {
    static_assert(std::is_same_v<DT, E4m3Codes>, "unknown code type");
    // Each byte moved to the top of its 16-bit half: sign | eeee mmm.
    const uint32_t ta = __byte_perm(w, 0u, 0x1404), tb = __byte_perm(w, 0u, 0x3424);
    if constexpr (std::is_same_v<T, __half>) {
      // fp16 s eeeee mmmmmmmmmm: the code's 7 bits one place down give value * 2^-8, subnormal
      // codes included (they land on fp16 subnormals).
      lo = (ta & 0x80008000u) | ((ta >> 1) & 0x3F803F80u);
      hi = (tb & 0x80008000u) | ((tb >> 1) & 0x3F803F80u);
    } else {
      // bf16 s eeeeeeee mmmmmmm: four places down gives value * 2^-120; scale back by 2^120
      // here (2^-120 times a query value would leave the fp32 normal range).
      uint32_t a = (ta & 0x80008000u) | ((ta >> 4) & 0x07F007F0u);
      uint32_t b = (tb & 0x80008000u) | ((tb >> 4) & 0x07F007F0u);
      const __nv_bfloat162 up = __halves2bfloat162(__ushort_as_bfloat16(0x7B80), __ushort_as_bfloat16(0x7B80));
      __nv_bfloat162 ba = __hmul2(*reinterpret_cast<__nv_bfloat162*>(&a), up);
      __nv_bfloat162 bb = __hmul2(*reinterpret_cast<__nv_bfloat162*>(&b), up);
      lo = *reinterpret_cast<uint32_t*>(&ba);
      hi = *reinterpret_cast<uint32_t*>(&bb);
    }
  }
}

// The mma.sync tiles of codes feed a lane's 8 codes of a 32-dim step as dims 0..3 of its 8-dim
// group in one k16 step and 4..7 in the next; the query's rows are stored in that order, so that
// ldmatrix pairs each query dim with its code. Stores chunk k (dims 8k .. 8k+7) of a row.
template <typename T>
__device__ __forceinline__ void store_query_chunk_for_codes(T* row, int k, const uint4& v) {
  const int base = (k / 4) * 32 + (k % 4) * 2;
  const uint32_t* w = reinterpret_cast<const uint32_t*>(&v);
#pragma unroll
  for (int j = 0; j < 4; ++j) *reinterpret_cast<uint32_t*>(row + base + (j / 2) * 16 + (j % 2) * 8) = w[j];
}

}  // namespace maxsim
