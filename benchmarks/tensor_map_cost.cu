// Host cost of one cuTensorMapEncodeTiled call with the forward's arguments (a query or document
// map: fp16 rows of 128 dims, boxes of 64 dims x 32-128 rows, 128-byte swizzle), the encoder looked
// up through the runtime as csrc/fwd.cu does. The forward encodes its maps on every call instead
// of caching them; this measures what that costs. Needs a GPU machine's driver:
//   nvcc -O2 benchmarks/tensor_map_cost.cu -o /tmp/tensor_map_cost && /tmp/tensor_map_cost
#include <cuda.h>
#include <cuda_runtime.h>
#include <chrono>
#include <cstdio>
using EncodeTiled = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                 const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                                 CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
int main() {
  void* f = nullptr;
  cudaDriverEntryPointQueryResult found;
  cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &found);
  auto encode = reinterpret_cast<EncodeTiled>(f);
  void* data = nullptr;
  cudaMalloc(&data, 1 << 24);
  for (int rows : {1024, 288000}) {
    for (int box : {32, 64, 128}) {
      const cuuint64_t dims[2] = {128, cuuint64_t(rows)}, strides[1] = {256};
      const cuuint32_t boxd[2] = {64, cuuint32_t(box)}, es[2] = {1, 1};
      CUtensorMap map;
      int bad = 0;
      for (int round = 0; round < 3; ++round) {
        const int n = 200000;
        auto t0 = std::chrono::steady_clock::now();
        for (int i = 0; i < n; ++i)
          bad += encode(&map, CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 2, data, dims, strides, boxd, es,
                        CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                        CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) != CUDA_SUCCESS;
        const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / n;
        std::printf("rows %d box %d round %d: %.4f us per encode (%d failed)\n", rows, box, round, us, bad);
      }
    }
  }
  return 0;
}
