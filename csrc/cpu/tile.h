// The CPU forward's inner loop, torch-free: similarities of up to 16 query tokens with a run of
// document tokens, each folded into a running per-query-token max (and argmax) as it is made, so
// no similarity leaves the registers.
//
// Queries are packed transposed, 8 query tokens per vector: qt[v][k][lane] = q[8 v + lane][k].
// Document tokens are read in place through a row-pointer table (fp32 rows), so prefix lengths,
// masks and packed segments cost nothing here. A 6-token x 16-query register block (12
// accumulators) keeps both FMA pipes busy; the max, the argmax (strictly greater: the lowest index
// wins ties) and a NaN flag are per lane, so no horizontal reduction runs in the loop.
#pragma once
#include <cmath>
#include <cstdint>
#include <limits>

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#define MAXSIM_CPU_X86 1
#endif

namespace maxsim::cpu {

constexpr int kLanes = 8;        // query tokens per vector
constexpr int kTokenBlock = 6;   // document tokens per register block

// A query token's running reduction over the document tokens seen so far.
struct RowState {
  float* max;   // [8 v] running max per query token
  int* arg;     // [8 v] token index of the max (-1: none yet), null without argmax
  int* nan;     // [8 v] nonzero once a NaN similarity was seen
};

// Portable reference of the same contract (any CPU): query vectors [v0, v0 + nv) against the
// tokens rows[0 .. n), whose indices are tok[0 .. n).
inline void fold_tokens_scalar(const float* qt, int64_t h, int v0, int nv, const float* const* rows,
                               const int* tok, int n, RowState s) {
  for (int v = v0; v < v0 + nv; ++v) {
    const float* qv = qt + v * h * kLanes;
    for (int j = 0; j < n; ++j) {
      float acc[kLanes] = {};
      for (int64_t k = 0; k < h; ++k)
        for (int l = 0; l < kLanes; ++l) acc[l] = std::fma(qv[k * kLanes + l], rows[j][k], acc[l]);
      for (int l = 0; l < kLanes; ++l) {
        const int i = v * kLanes + l;
        if (std::isnan(acc[l])) s.nan[i] = 1;
        if (acc[l] > s.max[i]) {
          s.max[i] = acc[l];
          if (s.arg) s.arg[i] = tok[j];
        }
      }
    }
  }
}

#ifdef MAXSIM_CPU_X86

// kV query vectors (8 tokens each) x kJ document tokens, folded into the running state (m, a, f).
template <int kV, int kJ, bool kArg>
__attribute__((target("avx2,fma"), always_inline)) inline void fold_block_avx2(
    const float* const* qv, int64_t h, const float* const* rows, const int* tok, __m256* m,
    __m256i* a, __m256* f) {
  __m256 acc[kJ][kV];
  for (int j = 0; j < kJ; ++j)
    for (int v = 0; v < kV; ++v) acc[j][v] = _mm256_setzero_ps();
  for (int64_t k = 0; k < h; ++k) {
    __m256 b[kV];
    for (int v = 0; v < kV; ++v) b[v] = _mm256_loadu_ps(qv[v] + k * kLanes);
    for (int j = 0; j < kJ; ++j) {
      const __m256 x = _mm256_broadcast_ss(rows[j] + k);
      for (int v = 0; v < kV; ++v) acc[j][v] = _mm256_fmadd_ps(x, b[v], acc[j][v]);
    }
  }
  for (int j = 0; j < kJ; ++j) {
    for (int v = 0; v < kV; ++v) {
      f[v] = _mm256_or_ps(f[v], _mm256_cmp_ps(acc[j][v], acc[j][v], _CMP_UNORD_Q));
      const __m256 gt = _mm256_cmp_ps(acc[j][v], m[v], _CMP_GT_OQ);  // false for NaN
      m[v] = _mm256_blendv_ps(m[v], acc[j][v], gt);
      if (kArg)
        a[v] = _mm256_castps_si256(_mm256_blendv_ps(
            _mm256_castsi256_ps(a[v]), _mm256_castsi256_ps(_mm256_set1_epi32(tok[j])), gt));
    }
  }
}

template <int kV, bool kArg>
__attribute__((target("avx2,fma"))) void fold_tokens_avx2(const float* qt, int64_t h, int v0,
                                                          const float* const* rows, const int* tok,
                                                          int n, RowState s) {
  const float* qv[kV];
  __m256 m[kV], f[kV];
  __m256i a[kV];
  for (int v = 0; v < kV; ++v) {
    const int i = (v0 + v) * kLanes;
    qv[v] = qt + (v0 + v) * h * kLanes;
    m[v] = _mm256_loadu_ps(s.max + i);
    f[v] = _mm256_castsi256_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(s.nan + i)));
    a[v] = kArg ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s.arg + i))
                : _mm256_setzero_si256();
  }
  int j = 0;
  for (; j + kTokenBlock <= n; j += kTokenBlock)
    fold_block_avx2<kV, kTokenBlock, kArg>(qv, h, rows + j, tok + j, m, a, f);
  switch (n - j) {  // the run's last tokens
    case 5: fold_block_avx2<kV, 5, kArg>(qv, h, rows + j, tok + j, m, a, f); break;
    case 4: fold_block_avx2<kV, 4, kArg>(qv, h, rows + j, tok + j, m, a, f); break;
    case 3: fold_block_avx2<kV, 3, kArg>(qv, h, rows + j, tok + j, m, a, f); break;
    case 2: fold_block_avx2<kV, 2, kArg>(qv, h, rows + j, tok + j, m, a, f); break;
    case 1: fold_block_avx2<kV, 1, kArg>(qv, h, rows + j, tok + j, m, a, f); break;
    default: break;
  }
  for (int v = 0; v < kV; ++v) {
    const int i = (v0 + v) * kLanes;
    _mm256_storeu_ps(s.max + i, m[v]);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(s.nan + i), _mm256_castps_si256(f[v]));
    if (kArg) _mm256_storeu_si256(reinterpret_cast<__m256i*>(s.arg + i), a[v]);
  }
}

inline bool has_avx2() {
  static const bool ok = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return ok;
}

#endif  // MAXSIM_CPU_X86

// Folds the tokens rows[0 .. n) into the state of query vectors [0, nv): two vectors at a time
// on AVX2 (16 query tokens share each broadcast of a document value), the scalar loop elsewhere.
inline void fold_tokens(const float* qt, int64_t h, int nv, const float* const* rows,
                        const int* tok, int n, RowState s) {
#ifdef MAXSIM_CPU_X86
  if (has_avx2()) {
    int v = 0;
    for (; v + 2 <= nv; v += 2) {
      if (s.arg) fold_tokens_avx2<2, true>(qt, h, v, rows, tok, n, s);
      else fold_tokens_avx2<2, false>(qt, h, v, rows, tok, n, s);
    }
    if (v < nv) {
      if (s.arg) fold_tokens_avx2<1, true>(qt, h, v, rows, tok, n, s);
      else fold_tokens_avx2<1, false>(qt, h, v, rows, tok, n, s);
    }
    return;
  }
#endif
  fold_tokens_scalar(qt, h, 0, nv, rows, tok, n, s);
}

}  // namespace maxsim::cpu
