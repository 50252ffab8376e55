// Thin wrappers over the sm_80 warp-level tensor-core path: cp.async, ldmatrix, mma.sync m16n8k16.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cstdint>

namespace maxsim {

template <typename T> struct MmaType;
template <> struct MmaType<__half> { static constexpr bool kBf16 = false; };
template <> struct MmaType<__nv_bfloat16> { static constexpr bool kBf16 = true; };
template <> struct MmaType<float> { static constexpr bool kBf16 = false; };  // TF32 products

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16-byte async copy; `bytes` = 0 fills the destination with zeros without reading `src`.
__device__ __forceinline__ void cp_async16(void* dst, const void* src, int bytes) {
#if __CUDA_ARCH__ >= 800
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src),
               "r"(bytes));
#endif
}
__device__ __forceinline__ void cp_async_commit() {
#if __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\n" ::);
#endif
}
template <int N>
__device__ __forceinline__ void cp_async_wait() {
#if __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
#endif
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* p) {
#if __CUDA_ARCH__ >= 800
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
#endif
}

// D += A(16x16, row) * B(16x8, col), fp32 accumulators.
template <bool kBf16>
__device__ __forceinline__ void mma_16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                          uint32_t b1) {
#if __CUDA_ARCH__ >= 800
  if constexpr (kBf16) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
#endif
}

// D += A(16x32, row) * B(32x8, col) on int8 codes, int32 accumulators (exact). Fragments hold
// four codes per register where mma_16816 holds two 16-bit values, in the same places: the
// ldmatrix addresses of a 32-byte k step serve both.
__device__ __forceinline__ void mma_s8_16832(int (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                             uint32_t b1) {
#if __CUDA_ARCH__ >= 800
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}

// D += A(16x8, row) * B(8x8, col) on TF32 operands (fp32 registers whose low 13 mantissa bits
// the tensor core ignores), fp32 accumulators. Fragments hold one value per register in the
// places of mma_16816's 16-bit pairs, so the same ldmatrix addresses (16 bytes per row) serve.
__device__ __forceinline__ void mma_1688_tf32(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                              uint32_t b1) {
#if __CUDA_ARCH__ >= 800
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}

// fp32 bits rounded to TF32 (nearest, ties away from zero, as cvt.rna.tf32 does, in two integer
// ops instead of its four): Inf stays Inf, the few finite values within 2^-12 of the largest
// round to Inf, and a NaN whose payload fills the top mantissa bits (0x7fffffff, what CUDA's own
// arithmetic makes) wraps to a zero, so callers keep NaN themselves.
__device__ __forceinline__ uint32_t round_tf32(uint32_t x) { return (x + 0x1000u) & 0xffffe000u; }

// x rounded to TF32, NaN kept: the operand of the single-TF32 products.
__device__ __forceinline__ uint32_t tf32_of(uint32_t x) {
  const float f = __uint_as_float(x);
  return f == f ? round_tf32(x) : x;
}

// An fp32 value as the operands of split-TF32 products, x = hi + lo: a * b ~ a.hi * b.hi +
// a.cross * b.lo + a.lo * b.cross, within about 2^-21 |a| |b| per product. `hi` is x rounded to
// TF32, `lo` the exact remainder (its low 13 bits ignored by the mma), `cross` stands for hi in
// the cross terms. For Inf (or a value rounding to it) cross and lo are 0, so that only hi * hi
// carries it: an Inf times a zero remainder must not give NaN. For NaN, lo is NaN and carries it
// through a.lo * b.cross whatever the rounding made of hi.
struct SplitTf32x {
  uint32_t hi, cross, lo;
};
__device__ __forceinline__ SplitTf32x split_tf32(uint32_t x) {
  const float f = __uint_as_float(x);
  const uint32_t r = round_tf32(x);
  const float lo = f - __uint_as_float(r);
  const bool inf = fabsf(f) >= __uint_as_float(0x7f7ff000u);  // false for NaN
  return {r, inf ? 0u : r, inf ? 0u : __float_as_uint(lo)};
}
// split_tf32 for products whose other operand may be +-Inf in the remainder's term (lo * q.hi):
// lo has x's sign and is nonzero unless x is 0, so that Inf * lo agrees with Inf * hi. hi is x
// cut toward zero (one TF32 step lower where the cut is exact), lo the rest rounded to TF32; an
// Inf's lo is +-1 (its hi carries the Inf) and its cross 0. Within about 2^-20 |x| |y| per
// product, against split_tf32's 2^-21.
__device__ __forceinline__ SplitTf32x split_tf32_signed(uint32_t x) {
  const float f = __uint_as_float(x);
  uint32_t hi = x & 0xffffe000u;
  if (hi == x && f != 0.f && !isinf(f)) hi -= 0x2000u;
  if (isinf(f)) return {x, 0u, __float_as_uint(copysignf(1.f, f))};
  return {hi, hi, tf32_of(__float_as_uint(f - __uint_as_float(hi)))};
}

// ---- Hopper warpgroup MMA (sm_90a): operands read from shared memory through descriptors.
// Tiles are stored K-major with the 128-byte swizzle: rows of 64 16-bit values (128 bytes), their
// 16-byte chunks XOR-ed by row % 8, in atoms of 8 rows (1024 bytes, 1024-byte aligned) stacked
// along M / N. A k16 step inside an atom advances the start address by 32 bytes.
__device__ __forceinline__ uint64_t smem_desc_sw128(const void* p) {
  const uint32_t addr = smem_addr(p);
  return uint64_t((addr & 0x3FFFF) >> 4) | (uint64_t(1) << 16) | (uint64_t(1024 >> 4) << 32) |
         (uint64_t(1) << 62);
}

__device__ __forceinline__ void wgmma_fence() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void wgmma_commit() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}
// Waits until at most N committed wgmma groups are still in flight.
template <int N>
__device__ __forceinline__ void wgmma_wait() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
#endif
}
// Shared-memory writes of this thread (plain stores, cp.async) become visible to the async proxy
// that wgmma reads through.
__device__ __forceinline__ void fence_proxy_async() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}

#define MAXSIM_WG_D8(C, i) C(d[i]), C(d[i + 1]), C(d[i + 2]), C(d[i + 3]), \
                           C(d[i + 4]), C(d[i + 5]), C(d[i + 6]), C(d[i + 7])
#define MAXSIM_WG_REGS                                                                         \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "                    \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "           \
  "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "           \
  "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
#define MAXSIM_WG_OUT(C)                                                                       \
  MAXSIM_WG_D8(C, 0), MAXSIM_WG_D8(C, 8), MAXSIM_WG_D8(C, 16), MAXSIM_WG_D8(C, 24),            \
  MAXSIM_WG_D8(C, 32), MAXSIM_WG_D8(C, 40), MAXSIM_WG_D8(C, 48), MAXSIM_WG_D8(C, 56)
// One m64n128k16 wgmma of element type TYPE into d: OPERANDS names A (a descriptor or four
// registers), B and the immediates after the accumulators, PRED the operand of `accumulate`.
#define MAXSIM_F(x) "+f"(x)
#define MAXSIM_WG128(TYPE, OPERANDS, PRED, ...)                                                   \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " PRED ", 0;\n"                                \
               "wgmma.mma_async.sync.aligned.m64n128k16.f32." TYPE "." TYPE " " MAXSIM_WG_REGS    \
               OPERANDS ";\n}\n"                                                                  \
               : MAXSIM_WG_OUT(MAXSIM_F)                                                           \
               : __VA_ARGS__)
// D[64 x 128] (+)= A[64 x 16] * B[128 x 16]^T, fp32 accumulators: thread's d[4j + e] holds
// row (warp % 4) * 16 + lane / 4 + 8 * (e / 2), column 8j + (lane % 4) * 2 + e % 2 of the
// warpgroup's tile, the m16n8 layout repeated over 16 column blocks. A and B are read from shared
// memory through their descriptors.
template <bool kBf16>
__device__ __forceinline__ void wgmma_m64n128k16(float (&d)[64], uint64_t a, uint64_t b, bool accumulate) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  if constexpr (kBf16) MAXSIM_WG128("bf16", "%64, %65, p, 1, 1, 0, 0", "%66", "l"(a), "l"(b), "r"(int(accumulate)));
  else MAXSIM_WG128("f16", "%64, %65, p, 1, 1, 0, 0", "%66", "l"(a), "l"(b), "r"(int(accumulate)));
#endif
}
// D[64 x 96] (+)= A[64 x 16] * B[96 x 16]^T, fp16: the same layout over 12 column blocks.
__device__ __forceinline__ void wgmma_m64n96k16_f16(float (&d)[48], uint64_t a, uint64_t b, bool accumulate) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %50, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n96k16.f32.f16.f16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47}, "
      "%48, %49, p, 1, 1, 0, 0;\n}\n"
      : MAXSIM_WG_D8(MAXSIM_F, 0), MAXSIM_WG_D8(MAXSIM_F, 8), MAXSIM_WG_D8(MAXSIM_F, 16),
        MAXSIM_WG_D8(MAXSIM_F, 24), MAXSIM_WG_D8(MAXSIM_F, 32), MAXSIM_WG_D8(MAXSIM_F, 40)
      : "l"(a), "l"(b), "r"(int(accumulate)));
#endif
}
// D[64 x 32] (+)= A[64 x 16] * B[32 x 16]^T: the same layout over 4 column blocks (d[4j + e]).
template <bool kBf16>
__device__ __forceinline__ void wgmma_m64n32k16(float (&d)[16], uint64_t a, uint64_t b, bool accumulate) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define MAXSIM_WG_ASM(TYPE)                                                                        \
  asm volatile(                                                                                    \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"                                                \
      "wgmma.mma_async.sync.aligned.m64n32k16.f32." TYPE "." TYPE " "                              \
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, "                 \
      "%16, %17, p, 1, 1, 0, 0;\n}\n"                                                              \
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),      \
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),  \
        "+f"(d[14]), "+f"(d[15])                                                                   \
      : "l"(a), "l"(b), "r"(int(accumulate)))
  if constexpr (kBf16) MAXSIM_WG_ASM("bf16");
  else MAXSIM_WG_ASM("f16");
#undef MAXSIM_WG_ASM
#endif
}
// D[64 x 128] (+)= A[64 x 16] * B[128 x 16]^T with A from registers: a[4] is each warp's
// m16n8k16 A fragment of its 16 rows (rows lane / 4 and + 8; k pairs 2 (lane % 4) and + 8), B
// from shared memory. A's registers stay read until the wgmma's wait (wgmma_keep).
template <bool kBf16>
__device__ __forceinline__ void wgmma_m64n128k16_rs(float (&d)[64], const uint32_t (&a)[4], uint64_t b, bool accumulate) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define MAXSIM_A "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3])
  if constexpr (kBf16) MAXSIM_WG128("bf16", "{%64, %65, %66, %67}, %68, p, 1, 1, 0", "%69", MAXSIM_A, "l"(b), "r"(int(accumulate)));
  else MAXSIM_WG128("f16", "{%64, %65, %66, %67}, %68, p, 1, 1, 0", "%69", MAXSIM_A, "l"(b), "r"(int(accumulate)));
#undef MAXSIM_A
#endif
}
#undef MAXSIM_WG128
// D[64 x 64] (+)= A[64 x 8] * B[64 x 8]^T on TF32 operands, the m64n128 layout over 8 column
// blocks (d[4j + e]): a[4] is each warp's m16n8k8 TF32 A fragment (rows lane / 4 and + 8; k =
// lane % 4 and + 4), B from shared memory, where a k8 step of fp32 spans the 32 bytes of a
// 16-bit k16 step (k_off). TF32 takes no transpose immediate.
__device__ __forceinline__ void wgmma_m64n64k8_tf32_rs(float (&d)[32], const uint32_t (&a)[4], uint64_t b, bool accumulate) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k8.f32.tf32.tf32 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
      "{%32, %33, %34, %35}, %36, p, 1, 1;\n}\n"
      : MAXSIM_WG_D8(MAXSIM_F, 0), MAXSIM_WG_D8(MAXSIM_F, 8), MAXSIM_WG_D8(MAXSIM_F, 16),
        MAXSIM_WG_D8(MAXSIM_F, 24)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(int(accumulate)));
#endif
}
#undef MAXSIM_F
// Keeps a register the compiler sees as free (a wgmma's A operand, its accumulators) untouched up
// to this point: placed after the wgmma's wait.
template <typename R>
__device__ __forceinline__ void wgmma_keep(R& r) {
  static_assert(sizeof(R) == 4, "32-bit registers");
  asm volatile("" : "+r"(*reinterpret_cast<uint32_t*>(&r))::"memory");
}
// The same tile on int8 codes: D[64 x 128] (+)= A[64 x 32] * B[128 x 32]^T, int32 accumulators in
// the same places. A k32 step of codes spans the 32 bytes of an fp16 k16 step, so the descriptors
// advance alike.
__device__ __forceinline__ void wgmma_m64n128k32_s8(int (&d)[64], uint64_t a, uint64_t b, bool accumulate) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define MAXSIM_R(x) "+r"(x)
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k32.s32.s8.s8 " MAXSIM_WG_REGS "%64, %65, p;\n}\n"
      : MAXSIM_WG_OUT(MAXSIM_R)
      : "l"(a), "l"(b), "r"(int(accumulate)));
#undef MAXSIM_R
#endif
}
#undef MAXSIM_WG_OUT
#undef MAXSIM_WG_REGS
#undef MAXSIM_WG_D8

// ---- Hopper TMA (sm_90): one thread loads a tile box into shared memory; an mbarrier counts the
// bytes that arrived (its phase completes when all announced bytes have).
__device__ __forceinline__ void mbar_init(uint64_t* bar, int count) {
#if __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(count) : "memory");
#endif
}
__device__ __forceinline__ void mbar_init_fence() {
#if __CUDA_ARCH__ >= 900
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
#endif
}
// Arrives once on `bar`, announcing `bytes` more to come from TMA loads.
__device__ __forceinline__ void mbar_expect_tx(uint64_t* bar, uint32_t bytes) {
#if __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_addr(bar)),
               "r"(bytes) : "memory");
#endif
}
__device__ __forceinline__ void mbar_wait(uint64_t* bar, int parity) {
#if __CUDA_ARCH__ >= 900
  asm volatile(
      "{\n.reg .pred done;\nWAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT;\n}\n" ::"r"(smem_addr(bar)), "r"(parity) : "memory");
#endif
}
// Box (x = inner element, y = row) of the 2-D tensor map `map` (a __grid_constant__ parameter).
__device__ __forceinline__ void tma_load_2d(void* dst, const void* map, int x, int y, uint64_t* bar) {
#if __CUDA_ARCH__ >= 900
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes "
      "[%0], [%1, {%2, %3}], [%4];\n" ::"r"(smem_addr(dst)), "l"(map), "r"(x), "r"(y),
      "r"(smem_addr(bar)) : "memory");
#endif
}

// max that propagates NaN (fmaxf drops it).
__device__ __forceinline__ float max_nan(float a, float b) {
  float r;
#if __CUDA_ARCH__ >= 800
  asm("max.NaN.f32 %0, %1, %2;\n" : "=f"(r) : "f"(a), "f"(b));
#else
  r = (a != a || b != b) ? __int_as_float(0x7fffffff) : fmaxf(a, b);
#endif
  return r;
}

}  // namespace maxsim
