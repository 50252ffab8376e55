// What metal/*.metal share: the Metal standard library on Apple's compiler, the CPU harness's shim
// (tests/metal_harness/msl_shim.h) everywhere else, and the dtype conversions of the kernels.
// torch.mps.compile_shader gets this text inlined in place of the #include (maxsim/metal.py).
#pragma once

#ifdef __METAL_VERSION__
#include <metal_stdlib>
using namespace metal;
#if __METAL_VERSION__ >= 320
// IEEE arithmetic whatever the loader's default (kernel-builder's metallib defaults to fast math):
// NaN in gives NaN out, inf stays inf. MSL 3.1 has no pragma; the first-use self-test covers it.
#pragma METAL fp math_mode(safe)
#endif
// Threadgroup arrays: static, declared in the kernel body.
#define MS_THREADGROUP_ARRAY(T, name, n) threadgroup T name[n]
// One named instance of a kernel template; the name is what torch and the binding look up.
// (The name parameter must not be spelled host_name: the attribute's own word would be replaced.)
#define MS_KERNEL_INSTANCE(name, fn, ...) \
  template [[host_name(#name)]] kernel decltype(fn<__VA_ARGS__>) fn<__VA_ARGS__>;
#else
#include "msl_shim.h"
#endif

// bfloat16 tokens are read as their 16 bits (any MSL version, no bfloat type needed).
struct bf16_bits {
  ushort bits;
};

inline float to_float(float x) { return x; }
inline float to_float(half x) { return float(x); }
inline float to_float(bf16_bits x) { return as_type<float>(uint(x.bits) << 16); }

// NaN by its bits: Apple's compiler defaults to fast math, under which isnan() may fold to false.
inline bool is_nan_bits(float x) { return (as_type<uint>(x) & 0x7fffffffu) > 0x7f800000u; }

// 64-bit min / max without relying on metal_stdlib's integer overloads for long.
inline long min_long(long a, long b) { return a < b ? a : b; }
inline long max_long(long a, long b) { return a > b ? a : b; }
