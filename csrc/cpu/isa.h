// Which vector instruction set the CPU kernels run on: the best one this CPU has, or the one that
// MAXSIM_CPU_ISA names (read once; tests and benchmarks force each path with it). Torch-free, so
// that the standalone tile test builds it too.
#pragma once
#include <cstdlib>
#include <stdexcept>
#include <string>

namespace maxsim::cpu {

// Ordered from the most portable to the fastest of each architecture.
enum class Isa { kScalar, kAvx2, kAvx512, kAvx512Bf16, kNeon };

inline const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::kAvx2: return "avx2";
    case Isa::kAvx512: return "avx512";
    case Isa::kAvx512Bf16: return "avx512bf16";
    case Isa::kNeon: return "neon";
    default: return "scalar";
  }
}

// Whether this CPU (and this build) can run `isa`.
inline bool cpu_has(Isa isa) {
  switch (isa) {
    case Isa::kScalar: return true;
#if defined(__x86_64__) || defined(_M_X64)
    case Isa::kAvx2:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    case Isa::kAvx512:  // BW for the 16-bit conversions, VL for the 256-bit forms they use
      return cpu_has(Isa::kAvx2) && __builtin_cpu_supports("avx512f") &&
             __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl");
    case Isa::kAvx512Bf16:
      return cpu_has(Isa::kAvx512) && __builtin_cpu_supports("avx512bf16");
#endif
#if defined(__aarch64__)
    case Isa::kNeon: return true;  // Advanced SIMD is part of every AArch64 CPU
#endif
    default: return false;
  }
}

inline Isa best_isa() {
  for (Isa isa : {Isa::kAvx512Bf16, Isa::kAvx512, Isa::kAvx2, Isa::kNeon})
    if (cpu_has(isa)) return isa;
  return Isa::kScalar;
}

// The ISA named by `forced` (MAXSIM_CPU_ISA's value), or the best one when empty; throws
// std::invalid_argument for an unknown name or one this CPU lacks.
inline Isa choose_isa(const char* forced) {
  if (forced == nullptr || *forced == '\0') return best_isa();
  std::string have;
  for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512, Isa::kAvx512Bf16, Isa::kNeon}) {
    if (std::string(forced) == isa_name(isa)) {
      if (cpu_has(isa)) return isa;
      break;
    }
  }
  for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512, Isa::kAvx512Bf16, Isa::kNeon})
    if (cpu_has(isa)) have += std::string(have.empty() ? "" : ", ") + isa_name(isa);
  throw std::invalid_argument(std::string("maxsim: MAXSIM_CPU_ISA=") + forced +
                              ": expected one this CPU runs (" + have + ")");
}

// The process's ISA, chosen at the first call (a bad MAXSIM_CPU_ISA throws at every call).
inline Isa active_isa() {
  static const Isa isa = choose_isa(std::getenv("MAXSIM_CPU_ISA"));
  return isa;
}

}  // namespace maxsim::cpu
