// Runs one kernel of metal/*.metal (compiled as C++ with msl_shim.h) over a grid, the way
// Metal's dispatchThreads would, and reports every buffer back.
//
// stdin:  u32 name length, name, u32 threads[3], u32 group[3], u32 lane layout, u32 schedule,
//         u32 argument count, then per argument u64 byte count and bytes (buffer(i) = argument i).
// stdout: the bytes of every argument after the run, in order.
// Each argument is its own exact-size heap allocation (AddressSanitizer sees any overflow). The
// threads of a threadgroup are fibers that switch only at barriers and collectives; between two
// barriers they run one after another, in ascending, descending or shuffled order (schedule 0, 1,
// 2; 2 reshuffles every phase), so a read that a missing barrier leaves unordered sees garbage.
#include <ucontext.h>

#include <algorithm>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "msl_shim.h"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/common_interface_defs.h>
#define MS_ASAN 1
#else
#define MS_ASAN 0
#endif

namespace msl_shim {
namespace {

constexpr std::size_t kStackBytes = 256 * 1024;
constexpr std::size_t kThreadgroupBytes = 32 * 1024;  // Apple GPUs' threadgroup memory
constexpr unsigned kMaxThreads = 1024;                // Apple GPUs' threads per threadgroup

enum State { kRunnable, kBlocked, kDone };

struct Fiber {
  ucontext_t context;
  std::unique_ptr<char[]> stack;
  State state = kRunnable;
  Scope scope = kThreadgroup;
  int site = 0;
  std::size_t next_array = 0;  // index of its next threadgroup array
  void* fake_stack = nullptr;
};

struct Kernel {
  void* fn;
  Invoker invoke;
  int nargs;
};

struct Launch {
  Kernel entry;
  void** args;
  uint3 group;
  int layout;
  int schedule;
  unsigned size;
  std::vector<Fiber> fibers;
  std::vector<float> slots;                 // 32 x 8 floats per simdgroup
  std::vector<std::unique_ptr<unsigned char[]>> arrays;
  std::vector<std::size_t> array_bytes;
  std::size_t threadgroup_bytes = 0;
  unsigned current = 0;
  ucontext_t main_context;
  const void* main_stack = nullptr;
  std::size_t main_stack_size = 0;
  std::uint64_t rng = 0x9e3779b97f4a7c15ull;
};

Launch* g_launch = nullptr;

std::map<std::string, Kernel>& registry() {
  static std::map<std::string, Kernel> kernels;
  return kernels;
}

std::uint64_t next_random(Launch& l) {
  l.rng ^= l.rng << 13;
  l.rng ^= l.rng >> 7;
  l.rng ^= l.rng << 17;
  return l.rng;
}

void switch_to_main(Fiber& f, bool finished) {
  Launch& l = *g_launch;
#if MS_ASAN
  __sanitizer_start_switch_fiber(finished ? nullptr : &f.fake_stack, l.main_stack,
                                 l.main_stack_size);
#endif
  swapcontext(&f.context, &l.main_context);
#if MS_ASAN
  __sanitizer_finish_switch_fiber(f.fake_stack, &l.main_stack, &l.main_stack_size);
#endif
  (void)finished;
}

void fiber_entry() {
  Launch& l = *g_launch;
#if MS_ASAN
  __sanitizer_finish_switch_fiber(nullptr, &l.main_stack, &l.main_stack_size);
#endif
  Fiber& f = l.fibers[l.current];
  l.entry.invoke(l.entry.fn, l.args, l.group, l.current);
  f.state = kDone;
  switch_to_main(f, true);
}

void run_fiber(Launch& l, unsigned t) {
  l.current = t;
  Fiber& f = l.fibers[t];
  void* fake = nullptr;
#if MS_ASAN
  __sanitizer_start_switch_fiber(&fake, f.stack.get(), kStackBytes);
#endif
  swapcontext(&l.main_context, &f.context);
#if MS_ASAN
  __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#endif
}

std::vector<unsigned> phase_order(Launch& l) {
  std::vector<unsigned> order(l.size);
  for (unsigned i = 0; i < l.size; ++i) order[i] = l.schedule == 1 ? l.size - 1 - i : i;
  if (l.schedule == 2)
    for (unsigned i = l.size; i > 1; --i) std::swap(order[i - 1], order[next_random(l) % i]);
  return order;
}

// Releases the simdgroups whose 32 lanes all wait at one collective; true if any was released.
bool release_simdgroups(Launch& l) {
  bool released = false;
  for (unsigned s = 0; s < l.size / 32; ++s) {
    Fiber* lanes = &l.fibers[s * 32];
    int waiting = 0;
    for (int i = 0; i < 32; ++i)
      waiting += lanes[i].state == kBlocked && lanes[i].scope == kSimdgroup;
    if (waiting == 0) continue;
    if (waiting != 32) fail("a SIMD collective or simdgroup barrier ran with fewer than 32 lanes");
    for (int i = 1; i < 32; ++i)
      if (lanes[i].site != lanes[0].site)
        fail("lanes of a simdgroup reached different collectives");
    for (int i = 0; i < 32; ++i) lanes[i].state = kRunnable;
    released = true;
  }
  return released;
}

void release_threadgroup(Launch& l) {
  unsigned done = 0;
  for (auto& f : l.fibers) done += f.state == kDone;
  if (done) fail("some threads of a threadgroup exited while others wait at a barrier");
  for (auto& f : l.fibers)
    if (f.site != l.fibers[0].site) fail("threads of a threadgroup reached different barriers");
  for (auto& f : l.fibers) f.state = kRunnable;
}

void fill_garbage(Launch& l, unsigned char* p, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) p[i] = static_cast<unsigned char>(next_random(l) >> 24);
}

void run_group(Launch& l) {
  for (auto& f : l.fibers) {
    f.state = kRunnable;
    f.next_array = 0;
    getcontext(&f.context);
    f.context.uc_stack.ss_sp = f.stack.get();
    f.context.uc_stack.ss_size = kStackBytes;
    f.context.uc_link = nullptr;
    makecontext(&f.context, fiber_entry, 0);
  }
  fill_garbage(l, reinterpret_cast<unsigned char*>(l.slots.data()), l.slots.size() * sizeof(float));
  l.arrays.clear();
  l.array_bytes.clear();
  l.threadgroup_bytes = 0;
  for (;;) {
    for (unsigned t : phase_order(l))
      if (l.fibers[t].state == kRunnable) run_fiber(l, t);
    bool all_done = std::all_of(l.fibers.begin(), l.fibers.end(),
                                [](const Fiber& f) { return f.state == kDone; });
    if (all_done) return;
    if (!release_simdgroups(l)) release_threadgroup(l);
  }
}

}  // namespace

void fail(const char* what) {
  std::fprintf(stderr, "metal harness: %s\n", what);
  std::fflush(stderr);
  std::_Exit(3);
}

void block(Scope scope, int site) {
  Launch& l = *g_launch;
  Fiber& f = l.fibers[l.current];
  if (scope == kSimdgroup && l.size % 32) fail("a simdgroup operation in a partial simdgroup");
  f.state = kBlocked;
  f.scope = scope;
  f.site = site;
  switch_to_main(f, false);
}

unsigned current_thread() { return g_launch->current; }

float* simd_slots() { return &g_launch->slots[(g_launch->current / 32) * 32 * 8]; }

int lane_layout() { return g_launch->layout; }

int planted() {
  static const int plant = std::getenv("MS_PLANT") ? std::atoi(std::getenv("MS_PLANT")) : 0;
  return plant;
}

void* tg_alloc(std::size_t bytes) {
  Launch& l = *g_launch;
  Fiber& f = l.fibers[l.current];
  std::size_t k = f.next_array++;
  if (k == l.arrays.size()) {
    l.threadgroup_bytes += bytes;
    if (l.threadgroup_bytes > kThreadgroupBytes) fail("more than 32 KB of threadgroup memory");
    l.arrays.emplace_back(new unsigned char[bytes ? bytes : 1]);
    l.array_bytes.push_back(bytes);
    fill_garbage(l, l.arrays.back().get(), bytes);  // unwritten memory reads as garbage
  } else if (k > l.arrays.size() || l.array_bytes[k] != bytes) {
    fail("threads of a threadgroup declared different threadgroup arrays");
  }
  return l.arrays[k].get();
}

void register_kernel(const char* name, void* fn, Invoker invoke, int nargs) {
  registry()[name] = Kernel{fn, invoke, nargs};
}

}  // namespace msl_shim

namespace {

template <class T>
T read_value() {
  T v;
  if (std::fread(&v, sizeof v, 1, stdin) != 1) msl_shim::fail("truncated input");
  return v;
}

}  // namespace

int main() {
  using namespace msl_shim;
  std::string name(read_value<std::uint32_t>(), '\0');
  if (!name.empty() && std::fread(name.data(), 1, name.size(), stdin) != name.size())
    fail("truncated input");
  unsigned threads[3], group[3];
  for (auto& t : threads) t = read_value<std::uint32_t>();
  for (auto& g : group) g = read_value<std::uint32_t>();
  Launch l;
  l.layout = int(read_value<std::uint32_t>());
  l.schedule = int(read_value<std::uint32_t>());
  unsigned nargs = read_value<std::uint32_t>();
  auto found = registry().find(name);
  if (found == registry().end()) fail(("no kernel named " + name).c_str());
  l.entry = found->second;
  if (int(nargs) != l.entry.nargs) fail("wrong number of arguments for the kernel");
  std::vector<std::unique_ptr<unsigned char[]>> buffers;
  std::vector<std::uint64_t> sizes;
  std::vector<void*> args;
  for (unsigned i = 0; i < nargs; ++i) {
    std::uint64_t n = read_value<std::uint64_t>();
    buffers.emplace_back(new unsigned char[n ? n : 1]);  // exact size: ASan bounds it
    if (n && std::fread(buffers.back().get(), 1, n, stdin) != n) fail("truncated input");
    sizes.push_back(n);
    args.push_back(buffers.back().get());
  }
  if (group[1] != 1 || group[2] != 1) fail("threadgroups are one-dimensional in metal/");
  l.size = group[0];
  if (l.size == 0 || l.size > kMaxThreads) fail("threads per threadgroup must be 1 .. 1024");
  for (int a = 0; a < 3; ++a)
    if (group[a] == 0 || threads[a] % group[a]) fail("threads must be a multiple of group_size");
  l.args = args.data();
  l.fibers.resize(l.size);
  for (auto& f : l.fibers) f.stack.reset(new char[kStackBytes]);
  l.slots.resize(((l.size + 31) / 32) * 32 * 8);
  g_launch = &l;
  for (unsigned z = 0; z < threads[2] / group[2]; ++z)
    for (unsigned y = 0; y < threads[1] / group[1]; ++y)
      for (unsigned x = 0; x < threads[0] / group[0]; ++x) {
        l.group = uint3{x, y, z};
        run_group(l);
      }
  for (unsigned i = 0; i < nargs; ++i) std::fwrite(buffers[i].get(), 1, sizes[i], stdout);
  std::fflush(stdout);
  return 0;
}
