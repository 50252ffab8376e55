// The AArch64 vector policy of the CPU tile (tile_body.h): Advanced SIMD, which every AArch64 CPU
// has, so no target region is needed. 4 query tokens per 128-bit vector; a 4-token x 16-query
// block (16 accumulators) leaves room for the operands in the 32 registers. Included by tile.h.
#pragma once
#include <arm_neon.h>

namespace maxsim::cpu::neon {
struct V {
  static constexpr int kLanes = 4, kPair = 1, kMaxVectors = 4, kTokenBlock = 4;
  using QElem = float;
  using DElem = float;
  using F = float32x4_t;
  using B = float32x4_t;
  using X = float32x4_t;
  using I = uint32x4_t;  // argmax indices and NaN flags, as stored in int arrays
  static F zero() { return vdupq_n_f32(0.f); }
  static F load(const float* p) { return vld1q_f32(p); }
  static void store(float* p, F x) { vst1q_f32(p, x); }
  static I load_int(const int* p) { return vld1q_u32(reinterpret_cast<const uint32_t*>(p)); }
  static void store_int(int* p, I x) { vst1q_u32(reinterpret_cast<uint32_t*>(p), x); }
  static I splat_int(int t) { return vdupq_n_u32(static_cast<uint32_t>(t)); }
  static B load_query(const float* p) { return vld1q_f32(p); }
  static X broadcast(const float* p) { return vld1q_dup_f32(p); }
  static X broadcast_last(const float* p) { return vld1q_dup_f32(p); }
  static F madd(F acc, X x, B b) { return vfmaq_f32(acc, x, b); }
  template <bool kArg>
  static void fold(F s, I t, F& m, I& a, I& f) {
    f = vorrq_u32(f, vmvnq_u32(vceqq_f32(s, s)));  // all ones where s is NaN
    const I gt = vcgtq_f32(s, m);                   // false for NaN
    m = vbslq_f32(gt, s, m);
    if (kArg) a = vbslq_u32(gt, t, a);
  }
};
#include "cpu/tile_body.h"
}  // namespace maxsim::cpu::neon
