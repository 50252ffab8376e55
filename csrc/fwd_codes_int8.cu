// The tensor-core forward for documents stored as int8 codes (see codes.cuh), compiled apart.
#include "fwd_launch.cuh"

namespace maxsim {
namespace fwd_detail {
MAXSIM_CODE_STORAGE(, Int8Codes)
}  // namespace fwd_detail
}  // namespace maxsim
