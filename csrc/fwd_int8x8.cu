// The tensor-core forward for int8 queries against int8 documents (integer mma), compiled apart.
#include "fwd_launch.cuh"

namespace maxsim {
namespace fwd_detail {
MAXSIM_CODE_STORAGE(, Int8x8)
}  // namespace fwd_detail
}  // namespace maxsim
