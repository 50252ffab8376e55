// The CPU forward's inner loop, torch-free: similarities of a few query tokens with a run of
// document tokens, each folded into a running per-query-token max (and argmax) as it is made, so
// no similarity leaves the registers. One tile (tile_body.h) over a vector policy per ISA
// (simd_x86.h, simd_neon.h, the scalar one here), chosen at run time (isa.h).
//
// Queries are packed transposed, kLanes query tokens per vector and kPair dimensions per step:
// element (token c, dimension k) of a query sits at
//   (c / kLanes) * query_vector_elems(h) + (k / kPair) * kLanes * kPair + (c % kLanes) * kPair + k % kPair,
// zero-padded. Document tokens are read through a row-pointer table (fp32 rows, or bf16 rows as
// stored for the bf16 tile), so prefix lengths, masks and packed segments cost nothing here.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "cpu/isa.h"

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#define MAXSIM_CPU_X86 1
#endif

#define MAXSIM_ALWAYS_INLINE __attribute__((always_inline))
#define MAXSIM_PRAGMA(x) _Pragma(#x)
#if defined(__clang__)
#define MAXSIM_TARGET_BEGIN(T) \
  MAXSIM_PRAGMA(clang attribute push(__attribute__((target(T))), apply_to = function))
#define MAXSIM_TARGET_END MAXSIM_PRAGMA(clang attribute pop)
#else
#define MAXSIM_TARGET_BEGIN(T) MAXSIM_PRAGMA(GCC push_options) MAXSIM_PRAGMA(GCC target(T))
#define MAXSIM_TARGET_END MAXSIM_PRAGMA(GCC pop_options)
#endif

namespace maxsim::cpu {

// A query token's running reduction over the document tokens seen so far.
struct RowState {
  float* max;   // [lanes per query vector x vectors] running max per query token
  int* arg;     // the same: token index of the max (-1: none yet), null without argmax
  int* nan;     // the same: nonzero once a NaN similarity was seen
};

// Elements of one packed query vector of dimension h.
inline int64_t query_vector_elems(int64_t h, int lanes, int pair) {
  return (h + pair - 1) / pair * pair * lanes;
}

// The portable policy: 8 lanes of plain arrays, one fused multiply-add per lane and dimension
// (the same roundings as the vector paths), a one-vector x 4-token block.
namespace scalar {
struct V {
  static constexpr int kLanes = 8, kPair = 1, kMaxVectors = 1, kTokenBlock = 4;
  using QElem = float;
  using DElem = float;
  struct F { float x[kLanes]; };
  struct I { int x[kLanes]; };
  using B = F;
  using X = float;
  static F zero() { return F{}; }
  static F load(const float* p) { F r; std::memcpy(r.x, p, sizeof r.x); return r; }
  static void store(float* p, const F& v) { std::memcpy(p, v.x, sizeof v.x); }
  static I load_int(const int* p) { I r; std::memcpy(r.x, p, sizeof r.x); return r; }
  static void store_int(int* p, const I& v) { std::memcpy(p, v.x, sizeof v.x); }
  static I splat_int(int t) { I r; for (int& x : r.x) x = t; return r; }
  static B load_query(const float* p) { return load(p); }
  static X broadcast(const float* p) { return *p; }
  static X broadcast_last(const float* p) { return *p; }
  static F madd(F acc, X x, const B& b) {
    for (int l = 0; l < kLanes; ++l) acc.x[l] = std::fma(x, b.x[l], acc.x[l]);
    return acc;
  }
  template <bool kArg>
  static void fold(const F& s, const I& t, F& m, I& a, I& f) {
    for (int l = 0; l < kLanes; ++l) {
      if (s.x[l] != s.x[l]) f.x[l] = -1;
      if (s.x[l] > m.x[l]) {  // strictly greater: the lowest index wins ties; false for NaN
        m.x[l] = s.x[l];
        if (kArg) a.x[l] = t.x[l];
      }
    }
  }
};
#include "cpu/tile_body.h"
}  // namespace scalar

}  // namespace maxsim::cpu

#ifdef MAXSIM_CPU_X86
#include "cpu/simd_x86.h"
#endif
#if defined(__aarch64__)
#include "cpu/simd_neon.h"
#endif

namespace maxsim::cpu {

// The packed query layout and inner loop of one (ISA, input dtype): the bf16 tile takes bf16
// inputs as stored; fp32 and fp16 inputs (and bf16 on other ISAs) are converted to fp32 rows.
struct Tile {
  Isa isa;
  int lanes;  // query tokens per vector
  int pair;   // dimensions per step: 2 for bf16 pairs, 1 for fp32
  bool bf16_rows() const { return pair == 2; }
};

inline Tile tile_for(Isa isa, bool bf16_inputs) {
  switch (isa) {
#ifdef MAXSIM_CPU_X86
    case Isa::kAvx512Bf16:
      if (bf16_inputs) return {isa, avx512bf16::V::kLanes, avx512bf16::V::kPair};
      return {Isa::kAvx512, avx512::V::kLanes, 1};
    case Isa::kAvx512: return {isa, avx512::V::kLanes, 1};
    case Isa::kAvx2: return {isa, avx2::V::kLanes, 1};
#endif
#if defined(__aarch64__)
    case Isa::kNeon: return {isa, neon::V::kLanes, 1};
#endif
    default: return {Isa::kScalar, scalar::V::kLanes, 1};
  }
}

// Stores query token c (its fp32 values `row`; bf16-exact for the bf16 tile, which keeps their
// top 16 bits) into the packed vectors `qt`, zero-filled beforehand, in the tile's layout.
inline void store_query_token(const Tile& tile, int64_t h, int c, const float* row, void* qt) {
  const int64_t base = c / tile.lanes * query_vector_elems(h, tile.lanes, tile.pair);
  for (int64_t k = 0; k < h; ++k) {
    const int64_t e = base + k / tile.pair * tile.lanes * tile.pair + c % tile.lanes * tile.pair +
                      k % tile.pair;
    if (tile.bf16_rows()) {
      uint32_t bits;
      std::memcpy(&bits, row + k, 4);
      static_cast<uint16_t*>(qt)[e] = static_cast<uint16_t>(bits >> 16);
    } else {
      static_cast<float*>(qt)[e] = row[k];
    }
  }
}

// Folds the tokens rows[0 .. n) (indices tok[0 .. n)) into the state of the packed query
// vectors [0, nv) of `qt` (both in the tile's layout).
inline void fold_tokens(const Tile& tile, const void* qt, int64_t h, int nv,
                        const void* const* rows, const int* tok, int n, RowState s) {
  switch (tile.isa) {
#ifdef MAXSIM_CPU_X86
    case Isa::kAvx512Bf16: return avx512bf16::fold_tokens(qt, h, nv, rows, tok, n, s);
    case Isa::kAvx512: return avx512::fold_tokens(qt, h, nv, rows, tok, n, s);
    case Isa::kAvx2: return avx2::fold_tokens(qt, h, nv, rows, tok, n, s);
#endif
#if defined(__aarch64__)
    case Isa::kNeon: return neon::fold_tokens(qt, h, nv, rows, tok, n, s);
#endif
    default: return scalar::fold_tokens(qt, h, nv, rows, tok, n, s);
  }
}

}  // namespace maxsim::cpu
