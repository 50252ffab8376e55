// Two independent kernels of one stream run side by side (programmatic dependent launch, sm_90+):
// the first lets the second's blocks start once each of its own blocks has started, and the
// second waits for the first as its last step, so that its completion still implies the first's
// for whatever the stream runs next. Elsewhere both calls are no-ops and the launch is plain.
#pragma once
#include <cuda_runtime.h>
#include "params.h"

namespace maxsim {

// Called by every block of the first kernel, early: the second may now be scheduled.
__device__ __forceinline__ void let_dependents_start() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Called by the second kernel before it exits (and before it reads anything the first writes):
// returns once the kernel queued before it has completed and its writes are visible.
__device__ __forceinline__ void wait_for_prerequisite() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// Launches `kernel` beside the kernel queued just before it on `stream` (see above); a plain
// launch before sm_90. The kernel must end with wait_for_prerequisite().
template <typename... Params, typename... Args>
void launch_beside(const DeviceInfo& dev, void (*kernel)(Params...), dim3 grid, dim3 block,
                   size_t smem, cudaStream_t stream, const Args&... args) {
  cudaLaunchAttribute overlap[1];
  overlap[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  overlap[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  config.attrs = overlap;
  config.numAttrs = dev.sm >= 90 ? 1 : 0;
  if (cudaLaunchKernelEx(&config, kernel, args...) == cudaSuccess || config.numAttrs == 0) return;
  (void)cudaGetLastError();  // a driver without programmatic launches: a plain one
  config.numAttrs = 0;
  cudaLaunchKernelEx(&config, kernel, args...);  // a real error stays for cudaGetLastError
}

}  // namespace maxsim
