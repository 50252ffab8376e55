// Backward launcher: one launch for dQ, one or two for dD (the sort runs beside dQ).
#include <algorithm>
#include <type_traits>
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

// Whether every kSlice-value slice of a token set's rows is one aligned 16-byte load.
bool vec_rows(const TokenSet& s, int dim, int slice) {
  return reinterpret_cast<uintptr_t>(s.data) % 16 == 0 && dim % slice == 0 &&
         s.row_stride % slice == 0 && (s.offsets != nullptr || s.seg_stride % slice == 0);
}

// The largest sort (its counters' shared memory) launched beside dQ.
constexpr size_t kSortBesideSmem = 32 * 1024;

// Per-(range, row) counters of the dD sort, within a 64 KB budget. Padded documents take one
// range per warp, as many as fit whole. Packed ones (their lengths known only on the device) take
// one range per warp of twice the average document and split them themselves: a longer document
// takes fewer ranges, or several passes (bwd_dd_sort_kernel). So small batches' sorts stay small
// enough to run beside dQ.
int sort_counters(const TokenSet& d, const DeviceInfo& dev) {
  const int budget = std::min(64 * 1024, dev.max_smem - 1024) / int(sizeof(int));  // + static smem
  if (d.offsets == nullptr) return std::max(1, std::min(kSortWarps, budget / d.pad_len)) * d.pad_len;
  const int64_t average = (d.rows + std::max(d.count, 1) - 1) / std::max(d.count, 1);
  const int64_t chunk = std::max<int64_t>(32, (2 * average + 31) / 32 * 32);
  return static_cast<int>(std::min<int64_t>(budget, kSortWarps * chunk));
}

}  // namespace

bool bwd_sorts_rows(const BwdParams& p) {
  return p.d.offsets != nullptr || (p.d.pad_len > 0 && p.d.pad_len <= kSortMaxRows);
}

// Query rows the dQ kernel covers per query (packed queries: up to max_lq).
static int dq_rows(const BwdParams& p) { return p.q.offsets ? p.max_lq : p.q.pad_len; }

bool bwd_fuses_ce(const BwdParams& p, int cols) {
  return p.pairs.layout != kPairs && p.q.count > 0 && dq_rows(p) > 0 && p.d.rows > 0 &&
         bwd_sorts_rows(p) && cols <= kCeFusedCols;
}

void launch_bwd(const BwdParams& p, DType dtype, const DeviceInfo& dev, cudaStream_t stream) {
  auto go = [&](auto tag) {
    using T = decltype(tag);
    const int warps = kBwdThreads / 32;
    const int q_rows = dq_rows(p);
    const int row_blocks = (std::max(q_rows, 1) + warps - 1) / warps;
    const bool dq_queued = p.q.count > 0 && q_rows > 0;
    if (dq_queued) {
      const bool vec = vec_rows(p.d, p.dim, kSlice<T>);
      auto dq = p.ce.rows > 0 ? (vec ? bwd_dq_kernel<T, true, true> : bwd_dq_kernel<T, false, true>)
                              : (vec ? bwd_dq_kernel<T, true, false> : bwd_dq_kernel<T, false, false>);
      dq<<<p.q.count * row_blocks, kBwdThreads, 0, stream>>>(p, row_blocks);
    }
    if (p.d.rows > 0 && p.dd_sorted != nullptr) {
      const int counters = sort_counters(p.d, dev);
      const size_t smem = size_t(counters) * sizeof(int);
      // Beside dQ where the counters fit next to dQ's blocks in the shared memory an SM set aside
      // for them; larger ones wait for whole SMs to drain and lost time on the H100.
      const bool beside = dq_queued && smem <= kSortBesideSmem;
      auto sort = [&](auto packed) {
        constexpr auto kernel = bwd_dd_sort_kernel<decltype(packed)::value>;
        allow_smem<kernel>(smem);
        if (beside) launch_beside(dev, kernel, p.d.count, kSortThreads, smem, stream, p, counters);
        else kernel<<<p.d.count, kSortThreads, smem, stream>>>(p, counters);
      };
      if (p.d.count > 0) {  // packed rows and no documents: every row's dD is zero
        if (p.d.offsets != nullptr) sort(std::true_type{});
        else sort(std::false_type{});
      }
      const int64_t rows_per_block = 2 * kBwdWarps;
      const int64_t blocks = (p.d.rows + rows_per_block - 1) / rows_per_block;
      auto rows = vec_rows(p.q, p.dim, kSlice<T>) ? bwd_dd_rows_kernel<T, true>
                                                 : bwd_dd_rows_kernel<T, false>;
      rows<<<static_cast<unsigned>(blocks), kBwdThreads, 0, stream>>>(p);
    } else if (p.d.rows > 0 && p.d.offsets == nullptr) {  // padded documents past kSortMaxRows
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
