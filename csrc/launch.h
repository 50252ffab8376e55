// Host entry points of the kernels; the torch binding fills the params and owns the memory.
#pragma once
#include <cuda_runtime.h>
#include <cstddef>
#include "params.h"

namespace maxsim {

// Floats of scratch the forward needs for `p` (partial scores of long queries); 0 when none.
size_t fwd_workspace_floats(const FwdParams& p, DType dtype, const DeviceInfo& dev);
// fp32 inputs always take the exact fp32 path.
void launch_fwd(const FwdParams& p, DType dtype, const DeviceInfo& dev, cudaStream_t stream);
void launch_bwd(const BwdParams& p, DType dtype, const DeviceInfo& dev, cudaStream_t stream);

}  // namespace maxsim
