// The tensor-core forward for fp32 rows as single TF32 products (the opt-in TF32
// mode, fwd_tile.cuh), compiled apart.
#include "fwd_launch.cuh"

namespace maxsim {
namespace fwd_detail {
MAXSIM_CODE_STORAGE(, RoundTf32)
}  // namespace fwd_detail
}  // namespace maxsim
