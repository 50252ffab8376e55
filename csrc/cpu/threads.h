// The CPU kernels' threads: torch's own intra-op pool (at::parallel_for; the extension is built
// with OpenMP on Linux, as torch's CPU build is, so it joins torch's OpenMP runtime instead of
// starting threads that would compete with torch's spinning workers), else plain std::threads.
// Either way torch.set_num_threads is obeyed.
#pragma once
#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <thread>
#include <vector>

namespace maxsim::cpu {

// Runs `work(first, last, scratch)` over [0, n) in grabs of a few items, on up to
// at::get_num_threads() threads; `make_scratch()` gives each thread its own scratch. Items differ
// in cost, so they are handed out dynamically; each item's result depends on the item only, so
// results do not depend on the thread count or on which thread ran an item.
template <typename MakeScratch, typename Work>
void for_each_grab(int64_t n, const MakeScratch& make_scratch, const Work& work) {
  if (n <= 0) return;
  const int64_t threads = std::clamp<int64_t>(at::get_num_threads(), 1, n);
  const int64_t grab = std::max<int64_t>(1, n / (16 * threads));
  std::atomic<int64_t> next{0};
  auto body = [&] {
    auto scratch = make_scratch();
    for (int64_t i0; (i0 = next.fetch_add(grab)) < n;) work(i0, std::min(n, i0 + grab), scratch);
  };
#if defined(_OPENMP)
  // One task per thread (grain 1); inside a parallel region this runs inline on the caller.
  at::parallel_for(0, threads, 1, [&](int64_t, int64_t) { body(); });
#else
  // A build without OpenMP (Apple's clang has no -fopenmp): at::parallel_for would run inline.
  std::vector<std::thread> pool;
  for (int64_t t = 1; t < threads; ++t) pool.emplace_back(body);
  body();
  for (auto& t : pool) t.join();
#endif
}

}  // namespace maxsim::cpu
