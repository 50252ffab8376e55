// Registers the CPU implementations of the ops (their schemas and autograd: torch_binding.cpp).
#include <torch/library.h>

#include "cpu/ops.h"
#include "registration.h"

TORCH_LIBRARY_IMPL_EXPAND(TORCH_EXTENSION_NAME, CPU, m) {
  m.impl("fwd", &maxsim::cpu::fwd);
  m.impl("bwd", &maxsim::cpu::bwd);
  m.impl("ce", &maxsim::cpu::ce);
  m.impl("contrastive_step", &maxsim::cpu::contrastive_step);
}
