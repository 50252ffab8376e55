// Host views of the ops' token sets (padded [N, L, H] or packed [T, H] with offsets), with every
// index clamped into its tensor, and the argument checks the CPU ops share.
#pragma once
#include <ATen/ATen.h>

#include <algorithm>
#include <cstring>
#include <optional>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "params.h"

namespace maxsim::cpu {

using OptTensor = std::optional<at::Tensor>;

inline const int* cpu_ints(const OptTensor& t, const char* name) {
  if (!t.has_value()) return nullptr;
  TORCH_CHECK(t->scalar_type() == at::kInt, "maxsim: ", name, " must be int32, got ", t->scalar_type());
  TORCH_CHECK(t->device().is_cpu() && t->is_contiguous(), "maxsim: ", name, " must be a contiguous CPU tensor");
  return t->data_ptr<int>();
}

inline void check_pair(const at::Tensor& q, const at::Tensor& d) {
  TORCH_CHECK(q.scalar_type() == d.scalar_type(), "maxsim: queries and documents differ in dtype");
  TORCH_CHECK(q.device().is_cpu() && d.device().is_cpu(), "maxsim: expected CPU tensors");
  TORCH_CHECK(q.size(-1) == d.size(-1), "maxsim: queries and documents differ in embedding dim");
  const auto t = q.scalar_type();
  TORCH_CHECK(t == at::kFloat || t == at::kHalf || t == at::kBFloat16,
              "maxsim: expected float32, float16 or bfloat16, got ", t);
}

#if defined(__x86_64__)
// fp16 -> fp32 with the F16C instruction, 8 values at a time.
__attribute__((target("avx,f16c"))) inline void half_to_fp32_f16c(const uint16_t* s, int64_t n,
                                                                 float* out) {
  int64_t k = 0;
  for (; k + 8 <= n; k += 8)
    _mm256_storeu_ps(out + k, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s + k))));
  for (; k < n; ++k) out[k] = _cvtsh_ss(s[k]);
}

inline bool has_f16c() {
  static const bool ok = __builtin_cpu_supports("f16c") && __builtin_cpu_supports("avx");
  return ok;
}

// bf16 -> fp32, 8 values at a time: widen each 16-bit value to 32 bits and shift it to the top.
__attribute__((target("avx2"))) inline void bf16_to_fp32_avx2(const uint16_t* s, int64_t n,
                                                             float* out) {
  int64_t k = 0;
  for (; k + 8 <= n; k += 8) {
    const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s + k)));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + k), _mm256_slli_epi32(wide, 16));
  }
  for (; k < n; ++k) {
    const uint32_t bits = uint32_t(s[k]) << 16;
    std::memcpy(out + k, &bits, 4);
  }
}

inline bool has_avx2_integer() {
  static const bool ok = __builtin_cpu_supports("avx2");
  return ok;
}

// fp32 -> fp16 with the F16C instruction (to nearest even), 8 values at a time.
__attribute__((target("avx,f16c"))) inline void fp32_to_half_f16c(const float* s, int64_t n, uint16_t* out) {
  int64_t k = 0;
  for (; k + 8 <= n; k += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + k),
                     _mm256_cvtps_ph(_mm256_loadu_ps(s + k), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  for (; k < n; ++k) out[k] = _cvtss_sh(s[k], _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}
#endif

// fp32 copies of `n` values of a row in any of the ops' dtypes.
inline void to_fp32(const void* src, at::ScalarType t, int64_t n, float* out) {
  if (t == at::kFloat) {
    std::memcpy(out, src, n * sizeof(float));
  } else if (t == at::kBFloat16) {
#if defined(__x86_64__)
    if (has_avx2_integer()) return bf16_to_fp32_avx2(static_cast<const uint16_t*>(src), n, out);
#endif
    const uint16_t* s = static_cast<const uint16_t*>(src);
    for (int64_t k = 0; k < n; ++k) {  // bf16 is the top half of an fp32
      const uint32_t bits = uint32_t(s[k]) << 16;
      std::memcpy(out + k, &bits, 4);
    }
  } else {
#if defined(__x86_64__)
    if (has_f16c()) return half_to_fp32_f16c(static_cast<const uint16_t*>(src), n, out);
#endif
    const at::Half* s = static_cast<const at::Half*>(src);
    for (int64_t k = 0; k < n; ++k) out[k] = static_cast<float>(s[k]);
  }
}

// `n` fp32 values stored in one of the ops' dtypes, rounded to nearest even as ATen rounds.
inline void from_fp32(const float* src, at::ScalarType t, int64_t n, void* out) {
  if (t == at::kFloat) {
    std::memcpy(out, src, n * sizeof(float));
  } else if (t == at::kBFloat16) {
    uint16_t* o = static_cast<uint16_t*>(out);
    for (int64_t k = 0; k < n; ++k) {  // branch-free, so that the compiler vectorizes it
      uint32_t bits;
      std::memcpy(&bits, src + k, 4);
      const uint16_t rounded = uint16_t((bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16);
      o[k] = src[k] != src[k] ? uint16_t(0x7FC0) : rounded;  // NaN: c10's quiet NaN
    }
  } else {
#if defined(__x86_64__)
    if (has_f16c()) return fp32_to_half_f16c(src, n, static_cast<uint16_t*>(out));
#endif
    at::Half* o = static_cast<at::Half*>(out);
    for (int64_t k = 0; k < n; ++k) o[k] = at::Half(src[k]);
  }
}

struct Segments {
  const char* data = nullptr;
  at::ScalarType dtype = at::kFloat;
  int64_t elem = 4, h = 0, count = 0, pad_len = 0, rows = 0;
  bool packed = false;
  const int* offsets = nullptr;
  const int* lengths = nullptr;
  const bool* mask = nullptr;

  Segments(const at::Tensor& x, const OptTensor& offs, const OptTensor& lens,
           const OptTensor& m, const char* name)
      : data(static_cast<const char*>(x.data_ptr())), dtype(x.scalar_type()),
        elem(x.element_size()), h(x.size(-1)), packed(x.dim() == 2) {
    if (m.has_value()) {
      TORCH_CHECK(m->scalar_type() == at::kBool && m->is_contiguous() && m->device().is_cpu(),
                  "maxsim: ", name, " mask must be a contiguous CPU bool tensor");
      mask = m->data_ptr<bool>();
    }
    if (packed) {
      TORCH_CHECK(offs.has_value(), "maxsim: ", name, " is packed (2-D) and needs offsets");
      TORCH_CHECK(!lens.has_value(), "maxsim: ", name, " is packed; lengths must be None");
      offsets = cpu_ints(offs, "offsets");
      count = offs->numel() - 1;
      rows = x.size(0);
    } else {
      TORCH_CHECK(x.dim() == 3, "maxsim: ", name, " must be 2-D (packed) or 3-D (padded), got ", x.dim(), "-D");
      TORCH_CHECK(!offs.has_value(), "maxsim: ", name, " is padded (3-D) but offsets were given");
      lengths = cpu_ints(lens, "lengths");
      count = x.size(0);
      pad_len = x.size(1);
      rows = count * pad_len;
      if (lengths) TORCH_CHECK(lens->numel() == count, "maxsim: ", name, " lengths must have N entries");
    }
    if (mask) TORCH_CHECK(m->numel() == rows, "maxsim: ", name, " mask must have one entry per row");
  }

  bool is_fp32() const { return dtype == at::kFloat; }
  // First row of segment n, and its token count (offsets and lengths clamped into the tensor).
  int64_t begin(int64_t n) const {
    return packed ? std::clamp<int64_t>(offsets[n], 0, rows) : n * pad_len;
  }
  int64_t length(int64_t n) const {
    if (packed) return std::clamp<int64_t>(offsets[n + 1], begin(n), rows) - begin(n);
    return lengths ? std::clamp<int64_t>(lengths[n], 0, pad_len) : pad_len;
  }
  // Whether segment n's index values are out of range (docs/ARCHITECTURE.md, "Index values the
  // kernels check themselves"): a padded length outside [0, pad_len], packed offsets outside
  // [0, rows] or decreasing, or (width >= 0, packed queries) more tokens than `width`.
  bool out_of_range(int64_t n, int64_t width = -1) const {
    if (!packed) return lengths && (lengths[n] < 0 || lengths[n] > pad_len);
    const int64_t b = offsets[n], e = offsets[n + 1];
    return b < 0 || e > rows || e < b || (width >= 0 && e - b > width);
  }
  // Whether packed offsets decrease somewhere (only then can two segments share rows).
  bool offsets_decrease() const {
    for (int64_t n = 0; packed && n < count; ++n)
      if (offsets[n + 1] < offsets[n]) return true;
    return false;
  }
  bool valid(int64_t n, int64_t t) const { return mask == nullptr || mask[begin(n) + t]; }
  const char* row(int64_t r) const { return data + r * h * elem; }
  void row_fp32(int64_t n, int64_t t, float* out) const { to_fp32(row(begin(n) + t), dtype, h, out); }

  // The valid tokens of segment n in [t0, t1): their rows, copied into `buf` (one sequential
  // stream from memory, then read from cache by every query vector), as stored (`as_stored`: the
  // bf16 tile) or in fp32, and their indices; returns how many.
  int gather_rows(int64_t n, int64_t t0, int64_t t1, const void** out, int* tok, float* buf,
                  bool as_stored = false) const {
    const int64_t b = begin(n);
    char* dst = reinterpret_cast<char*>(buf);
    const int64_t row_bytes = h * (as_stored ? elem : 4);
    int c = 0;
    for (int64_t t = t0; t < t1; ++t) {
      if (mask && !mask[b + t]) continue;
      char* r = dst + c * row_bytes;
      if (as_stored) std::memcpy(r, row(b + t), row_bytes);
      else to_fp32(row(b + t), dtype, h, reinterpret_cast<float*>(r));
      out[c] = r;
      tok[c++] = static_cast<int>(t);
    }
    return c;
  }
};

inline std::vector<int64_t> scores_shape(const Segments& q, const Segments& d, const OptTensor& pair_q,
                                         const OptTensor& pair_d, int64_t layout, int64_t group) {
  switch (layout) {
    case kAllPairs: return {q.count, d.count};
    case kGrouped:
      TORCH_CHECK(group >= 0 && q.count * group == d.count,
                  "maxsim: grouped layout needs documents == queries * group");
      return {q.count, group};
    case kPairs:
      TORCH_CHECK(pair_q.has_value() && pair_d.has_value(), "maxsim: pairs layout needs pair_q and pair_d");
      TORCH_CHECK(pair_q->numel() == pair_d->numel(), "maxsim: pair_q and pair_d differ in length");
      cpu_ints(pair_q, "pair_q");
      cpu_ints(pair_d, "pair_d");
      return {pair_q->numel()};
    default: TORCH_CHECK(false, "maxsim: unknown layout ", layout);
  }
}

}  // namespace maxsim::cpu
