// The tensor-core forward for documents stored as e4m3 codes (see codes.cuh), compiled apart.
#include "fwd_launch.cuh"

namespace maxsim {
namespace fwd_detail {
MAXSIM_CODE_STORAGE(, E4m3Codes)
}  // namespace fwd_detail
}  // namespace maxsim
