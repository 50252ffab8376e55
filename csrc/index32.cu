// int64 index tensors (lengths, offsets, pair ids) as the int32 the kernels read: one launch in
// the op itself for all of a call's, instead of two PyTorch ops (a clamp, a conversion) per
// tensor on the host before it. Values past the int32 range saturate, so they stay out of range
// (NaN scores) rather than wrap into it.
#include <algorithm>
#include <climits>
#include <cstdint>
#include "launch.h"

namespace maxsim {
namespace {

constexpr int kIndexThreads = 256;

// blockIdx.y: which tensor of the batch.
__global__ void saturate_int32_kernel(const Int32Copies c) {
  const int t = blockIdx.y;
  const int64_t* in = c.in[t];
  int* out = c.out[t];
  for (int64_t i = blockIdx.x * int64_t(kIndexThreads) + threadIdx.x; i < c.n[t];
       i += int64_t(gridDim.x) * kIndexThreads) {
    const int64_t v = in[i];
    out[i] = static_cast<int>(v < INT_MIN ? INT_MIN : v > INT_MAX ? INT_MAX : v);
  }
}

}  // namespace

void launch_saturate_int32(const Int32Copies& copies, cudaStream_t stream) {
  if (copies.count <= 0) return;
  int64_t longest = 0;
  for (int t = 0; t < copies.count; ++t) longest = std::max(longest, copies.n[t]);
  const int64_t blocks = std::max<int64_t>(1, std::min<int64_t>((longest + kIndexThreads - 1) / kIndexThreads, 1024));
  saturate_int32_kernel<<<dim3(static_cast<unsigned>(blocks), copies.count), kIndexThreads, 0, stream>>>(copies);
}

}  // namespace maxsim
