// Backward launcher: one launch for dQ, one for dD.
#include <algorithm>
#include "bwd.cuh"
#include "bwd_sorted.cuh"
#include "launch.h"

namespace maxsim {
namespace {

// Document rows per dD block: at most what fits a 64 KB fp32 accumulator, and few enough that
// small batches still spread over every SM (each block's adds are a latency-bound chain).
int dd_rows(int dim, int64_t total_rows, int num_sms) {
  const int cap = std::max(8, std::min(128, (64 * 1024) / (dim * 4)));
  const int64_t spread = total_rows / (2 * std::max(num_sms, 1));
  return static_cast<int>(std::max<int64_t>(8, std::min<int64_t>(cap, spread)));
}

}  // namespace

bool bwd_sorts_rows(const BwdParams& p) {
  return p.d.offsets == nullptr && p.d.pad_len > 0 && p.d.pad_len <= kSortMaxRows;
}

void launch_bwd(const BwdParams& p, DType dtype, const DeviceInfo& dev, cudaStream_t stream) {
  auto go = [&](auto tag) {
    using T = decltype(tag);
    const int warps = kBwdThreads / 32;
    const int q_rows = p.q.offsets ? p.max_lq : p.q.pad_len;
    const int row_blocks = (std::max(q_rows, 1) + warps - 1) / warps;
    if (p.q.count > 0 && q_rows > 0)
      bwd_dq_kernel<T><<<p.q.count * row_blocks, kBwdThreads, 0, stream>>>(p, row_blocks);
    if (p.d.rows > 0 && p.dd_sorted != nullptr) {
      const size_t smem = size_t(p.d.pad_len) * sizeof(int);
      allow_smem<bwd_dd_sort_kernel>(smem);
      bwd_dd_sort_kernel<<<p.d.count, kSortThreads, smem, stream>>>(p);
      const int64_t blocks = (p.d.rows + kBwdWarps - 1) / kBwdWarps;
      bwd_dd_rows_kernel<T><<<static_cast<unsigned>(blocks), kBwdThreads, 0, stream>>>(p);
    } else if (p.d.rows > 0) {
      const int rows = dd_rows(p.dim, p.d.rows, dev.num_sms);
      const size_t smem = size_t(rows) * p.dim * sizeof(float);
      allow_smem<bwd_dd_kernel<T>>(smem);
      const int64_t blocks = (p.d.rows + rows - 1) / rows;
      bwd_dd_kernel<T><<<static_cast<unsigned>(blocks), kBwdThreads, smem, stream>>>(
          p, p.d.rows, rows);
    }
  };
  switch (dtype) {
    case DType::kF16: go(__half{}); break;
    case DType::kBF16: go(__nv_bfloat16{}); break;
    default: go(float{}); break;
  }
}

}  // namespace maxsim
