// The tensor-core forward for fp32 rows as split-TF32 products (fwd_tile.cuh),
// compiled apart.
#include "fwd_launch.cuh"

namespace maxsim {
namespace fwd_detail {
MAXSIM_CODE_STORAGE(, SplitTf32)
}  // namespace fwd_detail
}  // namespace maxsim
