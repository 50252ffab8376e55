// fp32 rows as fp16 parts for Hopper's 16-bit wgmma tile (SplitFp16, codes.cuh), and the
// tile's instances, compiled apart.
//
// Each row is scaled by a power of two that brings its largest finite magnitude into
// [2^14, 2^15), then every value y = x * scale is stored as hi = fp16(y) and lo = fp16(y - hi):
// 22 bits of each value, as split TF32 keeps. The tile takes hi * hi + hi * lo + lo * hi (each
// product exact in the fp32 accumulator) at the fp16 rate, twice TF32's, and multiplies each dot
// product by the document token's 1 / scale before the max and each row's max by the query
// row's. Values more than about 2^17 below their row's largest count with an absolute error of
// up to about 2^-39 of it (their lo an fp16 subnormal), where TF32 keeps each value's exponent.
// The opt-in TF32 mode (RoundFp16) takes hi * hi alone (11 bits per value, as TF32 keeps): its
// rows hold the hi halves only (half the scratch and the bytes), which leaves room for two
// blocks per SM.
//
// Inf: stored as +-Inf in both parts. Where the other side holds an Inf, a side takes the split
// whose parts both carry the value's sign and are nonzero for a nonzero value (hi cut toward
// zero, one step lower where the cut is exact; a part that would vanish becomes fp16's smallest
// subnormal), so that Inf times each part agrees with Inf times the value, as in fp32. Whether
// a side holds an Inf is found on the device (no host sync): queries scanned, documents split,
// then queries split.
#include <cuda_fp16.h>

#include "fwd_launch.cuh"

namespace maxsim {
namespace fwd_detail {
MAXSIM_CODE_STORAGE(, SplitFp16)
MAXSIM_CODE_STORAGE(, RoundFp16)

namespace {

constexpr int kSplitThreads = 256;  // eight rows per block, one warp each

// Row r of a token set's storage (padded: segment r / pad_len, row r % pad_len of it).
__device__ __forceinline__ const float* stored_row(const TokenSet& s, int64_t r) {
  const float* base = static_cast<const float*>(s.data);
  if (s.offsets != nullptr) return base + r * s.row_stride;
  return base + (r / s.pad_len) * s.seg_stride + (r % s.pad_len) * s.row_stride;
}

struct Fp16Parts {
  __half hi, lo;
};

// y = x * scale as hi + lo (|y| < 2^15). kept_sign: the parts of a nonzero y both carry its sign
// and neither is zero (products with an Inf on the other side), within about 2^-21 |y| plus
// 2^-23 instead of 2^-22 |y| plus 2^-25.
__device__ __forceinline__ Fp16Parts split_fp16(float x, float scale, bool kept_sign) {
  if (!isfinite(x)) return {__float2half(x), __float2half(x)};  // NaN in both, +-Inf in both
  const float y = x * scale;
  if (!kept_sign || y == 0.f) {
    const __half hi = __float2half_rn(y);
    return {hi, __float2half_rn(y - __half2float(hi))};
  }
  __half hi = __float2half_rz(y);
  if (__half2float(hi) == y) hi = __ushort_as_half(__half_as_ushort(hi) - 1);  // one step toward 0
  const __half tiny = __float2half_rn(copysignf(0x1p-24f, y));
  __half lo = __float2half_rn(y - __half2float(hi));
  if (__half2float(lo) == 0.f) lo = tiny;
  if (__half2float(hi) == 0.f) hi = tiny;
  return {hi, lo};
}

// One warp per stored row, kPer = dim / 32 values per lane. flags[self] is set where the row holds
// an Inf; kWrite: the row's parts go to out (row r at r * parts * dim: dim hi halves, then with
// two parts dim lo halves) and its 1 / scale to unscale[r], with the kept-sign split where
// flags[other] is set.
template <int kPer, bool kWrite>
__global__ void __launch_bounds__(kSplitThreads)
split_fp16_kernel(const TokenSet s, int64_t rows, int parts, __half* out, float* unscale, int* flags, int other,
                  int self) {
  const int64_t r = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (r >= rows) return;  // whole warps: rows are per warp
  const float* src = stored_row(s, r) + lane * kPer;
  float x[kPer];
  if constexpr (kPer == 4) {
    const float4 v = *reinterpret_cast<const float4*>(src);
    x[0] = v.x; x[1] = v.y; x[2] = v.z; x[3] = v.w;
  } else {
    const float2 v = *reinterpret_cast<const float2*>(src);
    x[0] = v.x; x[1] = v.y;
  }
  bool inf = false;
  float top = 0.f;  // largest finite magnitude
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    inf |= isinf(x[i]);
    top = isfinite(x[i]) ? fmaxf(top, fabsf(x[i])) : top;
  }
  if (__any_sync(0xffffffffu, inf) && lane == 0) atomicOr(flags + self, 1);
  if constexpr (kWrite) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) top = fmaxf(top, __shfl_xor_sync(0xffffffffu, top, off));
    // 2^k with top * 2^k in [2^14, 2^15); both 2^k and 2^-k normal floats.
    const int k = top > 0.f ? min(max(14 - ilogbf(top), -126), 126) : 0;
    const float scale = __int_as_float((127 + k) << 23);
    const bool kept_sign = flags[other] != 0;
    __half hi[kPer], lo[kPer];
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      const Fp16Parts split = split_fp16(x[i], scale, kept_sign);
      hi[i] = split.hi;
      lo[i] = split.lo;
    }
    const int dim = 32 * kPer;
    __half* row = out + r * parts * dim + lane * kPer;
    if constexpr (kPer == 4) {
      *reinterpret_cast<uint2*>(row) = *reinterpret_cast<const uint2*>(hi);
      if (parts == 2) *reinterpret_cast<uint2*>(row + dim) = *reinterpret_cast<const uint2*>(lo);
    } else {
      *reinterpret_cast<uint32_t*>(row) = *reinterpret_cast<const uint32_t*>(hi);
      if (parts == 2) *reinterpret_cast<uint32_t*>(row + dim) = *reinterpret_cast<const uint32_t*>(lo);
    }
    if (lane == 0) unscale[r] = __int_as_float((127 - k) << 23);
  }
}

template <bool kWrite>
void launch_split(const TokenSet& s, int dim, int parts, __half* out, float* unscale, int* flags, int other,
                  int self, cudaStream_t stream) {
  const int64_t rows = stored_rows(s);
  if (rows == 0) return;
  const unsigned blocks = static_cast<unsigned>((rows * 32 + kSplitThreads - 1) / kSplitThreads);
  if (dim == 128)
    split_fp16_kernel<4, kWrite><<<blocks, kSplitThreads, 0, stream>>>(s, rows, parts, out, unscale, flags, other, self);
  else
    split_fp16_kernel<2, kWrite><<<blocks, kSplitThreads, 0, stream>>>(s, rows, parts, out, unscale, flags, other, self);
}

// A token set's fp16 parts: the same segments, rows packed at parts * dim halves.
TokenSet as_parts(const TokenSet& s, const __half* data, int dim, int parts) {
  TokenSet h = s;
  h.data = data;
  h.row_stride = int64_t(parts) * dim;
  h.seg_stride = int64_t(s.pad_len) * h.row_stride;
  return h;
}

// Parts stored per value: hi and lo, or hi alone for the TF32 mode's one product.
int parts_per_value(const FwdParams& p) { return p.tf32 ? 1 : 2; }

size_t aligned_floats(int64_t n) { return size_t((n + 31) / 32 * 32); }  // 128-byte regions

}  // namespace

FwdParams as_fp16_parts(const FwdParams& p) {
  FwdParams h = p;
  h.dim = parts_per_value(p) * p.dim;  // the TF32 mode's rows: the hi halves alone
  return h;
}

size_t split_fp16_floats(const FwdParams& p) {
  const int64_t q_rows = stored_rows(p.q), d_rows = stored_rows(p.d);
  const int64_t halves = int64_t(parts_per_value(p)) * p.dim;  // per row
  // Parts (two halves per float), then scales, then the two Inf flags.
  return aligned_floats(q_rows * halves / 2) + aligned_floats(d_rows * halves / 2) + aligned_floats(q_rows) +
         aligned_floats(d_rows) + aligned_floats(2);
}

FwdParams split_fp16_inputs(const FwdParams& p, float* scratch, cudaStream_t stream) {
  const int64_t q_rows = stored_rows(p.q), d_rows = stored_rows(p.d);
  float* at = scratch;
  auto take = [&](int64_t n) {
    float* region = at;
    at += aligned_floats(n);
    return region;
  };
  const int parts = parts_per_value(p);
  const int64_t halves = int64_t(parts) * p.dim;  // per row
  __half* q_parts = reinterpret_cast<__half*>(take(q_rows * halves / 2));
  __half* d_parts = reinterpret_cast<__half*>(take(d_rows * halves / 2));
  float* q_unscale = take(q_rows);
  float* d_unscale = take(d_rows);
  int* flags = reinterpret_cast<int*>(take(2));  // [queries hold an Inf, documents do]
  cudaMemsetAsync(flags, 0, 2 * sizeof(int), stream);
  launch_split<false>(p.q, p.dim, parts, nullptr, nullptr, flags, 1, 0, stream);
  launch_split<true>(p.d, p.dim, parts, d_parts, d_unscale, flags, 0, 1, stream);
  launch_split<true>(p.q, p.dim, parts, q_parts, q_unscale, flags, 1, 0, stream);
  FwdParams h = as_fp16_parts(p);
  h.q = as_parts(p.q, q_parts, p.dim, parts);
  h.d = as_parts(p.d, d_parts, p.dim, parts);
  h.q_scale = q_unscale;
  h.d_scale = d_unscale;
  return h;
}

}  // namespace fwd_detail
}  // namespace maxsim
