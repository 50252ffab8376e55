// Registers the CPU implementations of the ops (their schemas and autograd: torch_binding.cpp),
// and cpu_isa(), which names the vector instruction set the CPU kernels run on (maxsim.info).
#include <torch/library.h>

#include <string>

#include "cpu/isa.h"
#include "cpu/ops.h"
#include "registration.h"

#define TORCH_LIBRARY_FRAGMENT_EXPAND(NAME, MODULE) TORCH_LIBRARY_FRAGMENT(NAME, MODULE)

namespace {
std::string cpu_isa() { return maxsim::cpu::isa_name(maxsim::cpu::active_isa()); }
}  // namespace

TORCH_LIBRARY_FRAGMENT_EXPAND(TORCH_EXTENSION_NAME, m) { m.def("cpu_isa() -> str", &cpu_isa); }

TORCH_LIBRARY_IMPL_EXPAND(TORCH_EXTENSION_NAME, CPU, m) {
  m.impl("fwd", &maxsim::cpu::fwd);
  m.impl("bwd", &maxsim::cpu::bwd);
  m.impl("ce", &maxsim::cpu::ce);
  m.impl("contrastive_step", &maxsim::cpu::contrastive_step);
}
