"""A test device, not a feature: run another GPU's code paths on the GPU at hand.

`MAXSIM_EMULATE_GPU=t4|a100|a10g|l4|b200|rtx5090` (read once per process) makes

* the extension build its device code only from that GPU's PTX (`compute_80` for an A100, ...),
  so every `__CUDA_ARCH__` guard is what that GPU compiles and the driver JIT-compiles it for the
  card present (a Hopper: every such PTX runs there);
* the planner (torch_binding.cpp, `device_info`) see that GPU's compute capability, SM count,
  opt-in shared memory per block and DRAM bandwidth;
* every Python-side arch decision (`device_capability`) see its compute capability.

Blackwell (sm_100, sm_120) is emulated from the plain `compute_90` PTX: its machine code is built
from the same sources without the Hopper-only (`sm_90a`) features, so the guards match. A build
that holds code for any other arch is refused: the card would run that code, not the emulated
one. The card's timings are not the emulated GPU's; only the paths are.

This module imports nothing from the package, so build scripts can load it by path.
"""

import functools
import os
from typing import NamedTuple

ENV = "MAXSIM_EMULATE_GPU"


class EmulatedGpu(NamedTuple):
    name: str
    capability: tuple  # (major, minor) that the planner and Python see
    ptx: str  # the compute capability whose PTX the build holds, e.g. "8.0"
    sms: int
    smem_per_block: int  # opt-in shared memory per block, bytes
    dram_gbps: int


# Keep in step with kEmulatedGpus in torch-ext/torch_binding.cpp (tests/test_emulation.py checks).
GPUS = {
    g.name: g
    for g in (
        EmulatedGpu("t4", (7, 5), "7.5", 40, 64 * 1024, 320),
        EmulatedGpu("a100", (8, 0), "8.0", 108, 163 * 1024, 2039),
        EmulatedGpu("a10g", (8, 6), "8.6", 80, 99 * 1024, 600),
        EmulatedGpu("l4", (8, 9), "8.9", 58, 99 * 1024, 300),
        EmulatedGpu("b200", (10, 0), "9.0", 148, 227 * 1024, 8000),
        EmulatedGpu("rtx5090", (12, 0), "9.0", 170, 99 * 1024, 1792),
    )
}


class EmulationRefused(RuntimeError):
    """The loaded build cannot stand in for the emulated GPU (raised, never degraded)."""


class UnknownGpu(EmulationRefused, ValueError):
    """MAXSIM_EMULATE_GPU names no GPU of the table."""


@functools.cache
def emulated_gpu():
    """The GPU named by MAXSIM_EMULATE_GPU, or None when it is unset or empty."""
    name = os.environ.get(ENV, "").strip().lower()
    if not name:
        return None
    if name not in GPUS:
        raise UnknownGpu(f"{ENV}: expected one of {', '.join(GPUS)}, got {name!r}")
    return GPUS[name]


def build_archs(gpu):
    """The arch list of the build that emulates `gpu`: its PTX only, no machine code."""
    return [f"{gpu.ptx}+PTX-only"]


def check_build(archs, what):
    """Refuses a build whose device code is not exactly the emulated GPU's PTX (no-op when not
    emulating). `archs`: the build's arch list as the recipe writes it ("8.0+PTX-only")."""
    gpu = emulated_gpu()
    if gpu is None or list(archs) == build_archs(gpu):
        return
    raise EmulationRefused(
        f"{ENV}={gpu.name}: {what} holds code for {' '.join(archs)}, expected only "
        f"{build_archs(gpu)[0]} (compute_{gpu.ptx.replace('.', '')} PTX): the card would run "
        "that code instead of the emulated GPU's"
    )


def device_capability(device=None):
    """torch.cuda.get_device_capability, or the emulated GPU's capability."""
    gpu = emulated_gpu()
    if gpu is not None:
        return gpu.capability
    import torch

    return torch.cuda.get_device_capability(device)
