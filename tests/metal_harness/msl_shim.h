// The subset of the Metal Shading Language that metal/*.metal uses, as C++20, for the CPU harness.
//
// Every GPU thread of a threadgroup is a fiber; one scheduler (runner.cpp) runs them one at a time
// and switches only at barriers and SIMD collectives, in an order that changes every phase. A
// barrier completes when every thread of its scope reached the same barrier; anything else
// (divergent barriers, a collective with fewer than 32 lanes) aborts. simdgroup_matrix elements
// live in the lanes that the selected lane layout assigns them, so a kernel that reads them any
// other way than through simdgroup_store gives wrong results under one of the layouts.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <tuple>
#include <type_traits>
#include <utility>

namespace msl_shim {

enum Scope { kSimdgroup = 1, kThreadgroup = 2 };

// Implemented by runner.cpp.
[[noreturn]] void fail(const char* what);
void block(Scope scope, int site);          // yield until every thread of the scope arrives
unsigned current_thread();                  // thread_index_in_threadgroup of the running fiber
float* simd_slots();                        // 32 x 8 floats shared by the running simdgroup
void* tg_alloc(std::size_t bytes);          // the next threadgroup array of the running thread
int lane_layout();                          // 0: the layout of MLX's GEMM, 1: a permutation
int planted();                              // MS_PLANT in the environment (tests plant bugs), or 0

inline unsigned lane() { return current_thread() % 32; }

// Row and column of element i (0 or 1) of a lane's 8x8 fragment.
inline void element_at(unsigned lane, int i, int& row, int& col) {
  if (lane_layout() == 0) {
    unsigned q = lane / 4;
    row = int((q & 4) + (lane / 2) % 4);
    col = int((q & 2) * 2 + (lane % 2) * 2 + i);
    return;
  }
  static const unsigned char kPerm[64] = {
      37, 4,  58, 21, 13, 50, 0,  43, 26, 61, 9,  34, 55, 18, 47, 2,  30, 63, 11, 40, 24, 6,
      53, 16, 45, 32, 59, 1,  20, 38, 8,  51, 28, 14, 62, 35, 5,  42, 23, 57, 10, 48, 31, 3,
      60, 17, 39, 25, 52, 7,  44, 15, 29, 56, 36, 12, 49, 22, 33, 41, 19, 54, 27, 46};
  unsigned e = kPerm[lane * 2 + i];
  row = int(e / 8);
  col = int(e % 8);
}

}  // namespace msl_shim

// ---- Types, conversions, math -------------------------------------------------------------------
typedef unsigned int uint;
typedef unsigned short ushort;
typedef unsigned char uchar;
typedef unsigned long ulong;
typedef _Float16 half;

struct uint3 {
  uint x = 0, y = 0, z = 0;
};
struct ulong2 {
  ulong x = 0, y = 0;
  ulong2() = default;
  ulong2(ulong v) : x(v), y(v) {}
  ulong2(ulong a, ulong b) : x(a), y(b) {}
};

template <class To, class From>
inline To as_type(From v) {
  static_assert(sizeof(To) == sizeof(From), "as_type: sizes differ");
  return std::bit_cast<To>(v);
}
using std::isinf;
using std::isnan;
template <class T>
inline T max(T a, T b) { return a > b ? a : b; }
template <class T>
inline T min(T a, T b) { return a < b ? a : b; }

// ---- Address spaces and attributes --------------------------------------------------------------
#define device
#define constant
#define thread
#define threadgroup
#define kernel

// ---- Barriers and SIMD collectives --------------------------------------------------------------
enum class mem_flags { mem_none = 0, mem_device = 1, mem_threadgroup = 2 };

// A barrier orders only the memory its flags name. Threads meet only where it orders memory the
// harness has (threadgroup arrays; device buffers, conservatively: ordering them orders every
// write here); mem_none orders nothing, so the threads run on as if it were absent, and a read it
// was meant to order sees whatever the schedule leaves there.
inline bool orders_memory(mem_flags flags) {
  return (int(flags) & (int(mem_flags::mem_threadgroup) | int(mem_flags::mem_device))) != 0;
}
inline void threadgroup_barrier(mem_flags flags, int site = __builtin_LINE()) {
  if (orders_memory(flags)) msl_shim::block(msl_shim::kThreadgroup, site);
}
inline void simdgroup_barrier(mem_flags flags, int site = __builtin_LINE()) {
  if (orders_memory(flags)) msl_shim::block(msl_shim::kSimdgroup, site);
}

namespace msl_shim {
// Every lane writes its value, all 32 meet, each reads what it needs, all 32 meet again (so no
// lane overwrites its slot before the others read it).
template <class Read>
inline float collective(float v, int site, Read read) {
  float* slots = simd_slots();
  slots[lane() * 8] = v;
  block(kSimdgroup, site);
  float r = read(slots);
  block(kSimdgroup, site);
  return r;
}
}  // namespace msl_shim

inline float simd_sum(float v, int site = __builtin_LINE()) {
  return msl_shim::collective(v, site, [](const float* s) {
    float acc = 0.0f;
    for (int l = 0; l < 32; ++l) acc += s[l * 8];
    return acc;
  });
}
inline float simd_max(float v, int site = __builtin_LINE()) {
  return msl_shim::collective(v, site, [](const float* s) {
    float acc = s[0];
    for (int l = 1; l < 32; ++l) acc = s[l * 8] > acc ? s[l * 8] : acc;
    return acc;
  });
}
inline float simd_shuffle(float v, ushort from, int site = __builtin_LINE()) {
  if (from >= 32) msl_shim::fail("simd_shuffle: lane out of range");
  return msl_shim::collective(v, site, [from](const float* s) { return s[from * 8]; });
}
inline float simd_broadcast(float v, ushort from, int site = __builtin_LINE()) {
  return simd_shuffle(v, from, site);
}

// ---- simdgroup_matrix ---------------------------------------------------------------------------
template <class T, int Cols, int Rows>
struct simdgroup_matrix {
  static_assert(Cols == 8 && Rows == 8, "simdgroup_matrix: only 8x8 exists");
  T v[2];                                       // this lane's two elements, by the lane layout
  simdgroup_matrix() { v[0] = v[1] = T(std::nanf("")); }  // unset elements read as NaN
  explicit simdgroup_matrix(T diagonal) {       // MSL: a diagonal matrix, not a filled one
    for (int i = 0; i < 2; ++i) {
      int r, c;
      msl_shim::element_at(msl_shim::lane(), i, r, c);
      v[i] = r == c ? diagonal : T(0);
    }
  }
};
typedef simdgroup_matrix<float, 8, 8> simdgroup_float8x8;
typedef simdgroup_matrix<half, 8, 8> simdgroup_half8x8;

template <class T, int C, int R>
inline simdgroup_matrix<T, C, R> make_filled_simdgroup_matrix(T value) {
  simdgroup_matrix<T, C, R> m;
  m.v[0] = m.v[1] = value;
  return m;
}

template <class T>
inline void simdgroup_load(simdgroup_matrix<T, 8, 8>& m, const T* src, ulong elements_per_row = 8,
                           ulong2 origin = ulong2(0), bool transpose = false,
                           int site = __builtin_LINE()) {
  if (origin.x || origin.y) msl_shim::fail("simdgroup_load: offset the pointer, not the origin");
  for (int i = 0; i < 2; ++i) {
    int r, c;
    msl_shim::element_at(msl_shim::lane(), i, r, c);
    m.v[i] = transpose ? src[c * elements_per_row + r] : src[r * elements_per_row + c];
  }
  // Each lane reads before the lanes meet: a load orders nothing, only barriers do.
  msl_shim::block(msl_shim::kSimdgroup, site);  // simdgroup-uniform: every lane must be here
}

template <class T>
inline void simdgroup_store(const simdgroup_matrix<T, 8, 8>& m, T* dst, ulong elements_per_row = 8,
                            ulong2 origin = ulong2(0), bool transpose = false,
                            int site = __builtin_LINE()) {
  if (origin.x || origin.y) msl_shim::fail("simdgroup_store: offset the pointer, not the origin");
  // The lanes meet first, then each writes: a store orders nothing after it, only barriers do.
  msl_shim::block(msl_shim::kSimdgroup, site);
  for (int i = 0; i < 2; ++i) {
    int r, c;
    msl_shim::element_at(msl_shim::lane(), i, r, c);
    (transpose ? dst[c * elements_per_row + r] : dst[r * elements_per_row + c]) = m.v[i];
  }
}

// d = a * b + c: the 32 lanes publish their elements, each lane computes its own elements of d
// in float, k ascending, from the gathered matrices.
template <class TD, class TA, class TB, class TC>
inline void simdgroup_multiply_accumulate(simdgroup_matrix<TD, 8, 8>& d,
                                          const simdgroup_matrix<TA, 8, 8>& a,
                                          const simdgroup_matrix<TB, 8, 8>& b,
                                          const simdgroup_matrix<TC, 8, 8>& c,
                                          int site = __builtin_LINE()) {
  float* slots = msl_shim::simd_slots();
  unsigned me = msl_shim::lane();
  for (int i = 0; i < 2; ++i) {
    slots[me * 8 + i] = float(a.v[i]);
    slots[me * 8 + 2 + i] = float(b.v[i]);
    slots[me * 8 + 4 + i] = float(c.v[i]);
  }
  msl_shim::block(msl_shim::kSimdgroup, site);
  float A[8][8], B[8][8], C[8][8];
  for (unsigned l = 0; l < 32; ++l)
    for (int i = 0; i < 2; ++i) {
      int r, col;
      msl_shim::element_at(l, i, r, col);
      A[r][col] = slots[l * 8 + i];
      B[r][col] = slots[l * 8 + 2 + i];
      C[r][col] = slots[l * 8 + 4 + i];
    }
  msl_shim::block(msl_shim::kSimdgroup, site);
  for (int i = 0; i < 2; ++i) {
    int r, col;
    msl_shim::element_at(me, i, r, col);
    float acc = C[r][col];
    for (int k = 0; k < 8; ++k) acc += A[r][k] * B[k][col];
    d.v[i] = TD(acc);
  }
}

// ---- Kernel registration ------------------------------------------------------------------------
namespace msl_shim {

using Invoker = void (*)(void* fn, void** args, uint3 group, uint thread_in_group);
void register_kernel(const char* name, void* fn, Invoker invoke, int nargs);

template <class T>
inline T bind_arg(void* p) {
  if constexpr (std::is_pointer_v<T>) {
    return static_cast<T>(p);
  } else {
    return *static_cast<std::remove_reference_t<T>*>(p);
  }
}

// Convention of metal/*.metal: buffers first, then the two builtins (group, thread in group).
template <class... A>
struct Binder {
  template <std::size_t... I>
  static void call(void (*f)(A...), void** args, uint3 g, uint t, std::index_sequence<I...>) {
    using Tuple = std::tuple<A...>;
    f(bind_arg<std::tuple_element_t<I, Tuple>>(args[I])..., g, t);
  }
  static void invoke(void* fn, void** args, uint3 g, uint t) {
    call(reinterpret_cast<void (*)(A...)>(fn), args, g, t,
         std::make_index_sequence<sizeof...(A) - 2>{});
  }
};

template <class... A>
struct Registrar {
  Registrar(const char* name, void (*f)(A...)) {
    register_kernel(name, reinterpret_cast<void*>(f), &Binder<A...>::invoke, int(sizeof...(A)) - 2);
  }
};

}  // namespace msl_shim

// Threadgroup arrays are allocated per threadgroup (every thread of the group gets the same one).
#define MS_THREADGROUP_ARRAY(T, name, n) \
  T* name = static_cast<T*>(msl_shim::tg_alloc(sizeof(T) * (n)))
// Which planted bug an edited copy of a shader turns on (tests/test_metal_tiles.py); 0: none.
#define MS_PLANT(k) (msl_shim::planted() == (k))
#define MS_KERNEL_INSTANCE(host_name, fn, ...) \
  static msl_shim::Registrar ms_registrar_##host_name(#host_name, &fn<__VA_ARGS__>);
