// A test device, not a feature: MAXSIM_EMULATE_GPU=<name> plans as that GPU
// (docs/ARCHITECTURE.md). The Python loader gives such a process only a build of that GPU's PTX.
// Keep in step with maxsim/emulation.py (tests/test_emulation.py compares the two tables).
#pragma once

#include <c10/util/Exception.h>

#include <cctype>
#include <cstdlib>
#include <string>

#include "params.h"

namespace maxsim {

struct EmulatedGpu {
  const char* name;
  DeviceInfo limits;  // compute capability, SMs, opt-in smem per block, DRAM GB/s
};
constexpr EmulatedGpu kEmulatedGpus[] = {
    {"t4", {75, 40, 64 * 1024, 320}},      {"a100", {80, 108, 163 * 1024, 2039}},
    {"a10g", {86, 80, 99 * 1024, 600}},    {"l4", {89, 58, 99 * 1024, 300}},
    {"b200", {100, 148, 227 * 1024, 8000}}, {"rtx5090", {120, 170, 99 * 1024, 1792}},
};

// The emulated GPU's limits, or nullptr when MAXSIM_EMULATE_GPU is unset; read once per process.
inline const DeviceInfo* emulated_limits() {
  static const DeviceInfo* limits = [] () -> const DeviceInfo* {
    const char* env = std::getenv("MAXSIM_EMULATE_GPU");
    if (env == nullptr || *env == '\0') return nullptr;
    std::string name(env);
    for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    for (const EmulatedGpu& gpu : kEmulatedGpus)
      if (name == gpu.name) return &gpu.limits;
    TORCH_CHECK(false, "MAXSIM_EMULATE_GPU: expected t4, a100, a10g, l4, b200 or rtx5090, got ", env);
    return nullptr;
  }();
  return limits;
}

}  // namespace maxsim
