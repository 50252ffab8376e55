// int64 index tensors (lengths, offsets, pair ids) as the int32 the kernels read: one launch in
// the op itself, instead of two PyTorch ops (a clamp, a conversion) on the host before it. Values
// past the int32 range saturate, so they stay out of range (NaN scores) rather than wrap into it.
#include <algorithm>
#include <climits>
#include <cstdint>
#include "launch.h"

namespace maxsim {
namespace {

constexpr int kIndexThreads = 256;

__global__ void saturate_int32_kernel(const int64_t* in, int* out, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(kIndexThreads) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * kIndexThreads) {
    const int64_t v = in[i];
    out[i] = static_cast<int>(v < INT_MIN ? INT_MIN : v > INT_MAX ? INT_MAX : v);
  }
}

}  // namespace

void launch_saturate_int32(const int64_t* in, int* out, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  const int64_t blocks = std::min<int64_t>((n + kIndexThreads - 1) / kIndexThreads, 1024);
  saturate_int32_kernel<<<static_cast<unsigned>(blocks), kIndexThreads, 0, stream>>>(in, out, n);
}

}  // namespace maxsim
