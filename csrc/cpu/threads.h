// The CPU kernels' threads: plain std::threads, as many as torch's intra-op setting allows. The
// extension is compiled without OpenMP (at::parallel_for's inline OpenMP loop would run
// serially, and a second OpenMP runtime beside torch's would compete with it).
#pragma once
#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <thread>
#include <vector>

namespace maxsim::cpu {

// Runs `work(first, last)` over [0, n) in grabs of a few items, on up to at::get_num_threads()
// threads (the caller's included); `make_scratch()` gives each thread its own scratch, passed
// as work's third argument. Items differ in cost, so they are handed out dynamically.
template <typename MakeScratch, typename Work>
void for_each_grab(int64_t n, const MakeScratch& make_scratch, const Work& work) {
  const int64_t threads = std::clamp<int64_t>(at::get_num_threads(), 1, std::max<int64_t>(n, 1));
  const int64_t grab = std::max<int64_t>(1, n / (16 * threads));
  std::atomic<int64_t> next{0};
  auto body = [&] {
    auto scratch = make_scratch();
    for (int64_t i0; (i0 = next.fetch_add(grab)) < n;) work(i0, std::min(n, i0 + grab), scratch);
  };
  std::vector<std::thread> pool;
  for (int64_t t = 1; t < threads; ++t) pool.emplace_back(body);
  body();
  for (auto& t : pool) t.join();
}

}  // namespace maxsim::cpu
