"""Picks the namespace that runs a call (the CUDA extension's, the CPU extension's or
``maxsim_torch``) and calls ``fwd``.

The CUDA extension is looked up once, at import, and only where CUDA is available; the CPU
kernels on the first call with CPU tensors (the CUDA extension carries them too; else a CPU-only
build, compiled once). Their ops then get the same fake kernels as the pure-PyTorch ones. Their
autograd formula is registered in C++ by the extension itself (a call that needs no gradient then
never enters Python below this module).
The Metal kernels serve MPS tensors only once metal.GATE let them through (first use: kernels
resolved, known-answer self-test on the device; any failure warns once and keeps the PyTorch path).
"""

import os
import warnings

import torch

from . import metal
from ._ops import load_cpu_ops, load_cuda_ops
from .registry import register_fakes, torch_ops
from .settings import _assume_constant_result, fp32_on_tf32
from .validation import TokenSet

BACKENDS = ("auto", "cuda", "cpu", "metal", "torch")


def _load_cuda():
    if not torch.cuda.is_available():
        return None, "torch.cuda.is_available() is False"
    ops, reason = load_cuda_ops()
    if ops is not None:
        _with_fakes(ops)
    elif os.environ.get("MAXSIM_NO_JIT") != "1":  # said once: CUDA calls will run the fallback
        warnings.warn(f"maxsim: CUDA tensors will take the PyTorch fallback, not the fused "
                      f"kernels: {reason}", RuntimeWarning, stacklevel=2)
    return ops, reason


def _with_fakes(ops):
    namespace = ops.fwd.default.namespace
    # A second copy of this package in the process finds the fake kernels already there.
    if not torch._C._dispatch_has_kernel_for_dispatch_key(f"{namespace}::fwd", "Meta"):
        register_fakes(namespace)
    return ops


_CUDA_OPS, _CUDA_REASON = _load_cuda()


def cuda_ops():
    """``(ops, reason)``: the extension's namespace, or None and why it is unavailable."""
    return _CUDA_OPS, _CUDA_REASON


def metal_ops():
    """``(ops, reason)``: the ``maxsim_metal`` namespace (MPS tensors), or None and why. The first
    call decides, once per process (metal.MetalGate: kernels resolved, self-test on the device)."""
    return metal.GATE.verdict()


def _metal_ready() -> bool:
    """Whether the Metal kernels serve their device (deciding now if not yet decided)."""
    return metal.GATE.verdict()[0] is not None


# Under torch.compile the decision is taken eagerly at trace time, never traced.
_metal_ready = _assume_constant_result(_metal_ready)


_CPU = []  # [(ops, reason)] once looked up


def cpu_ops():
    """``(ops, reason)``: the namespace whose CPU kernels serve CPU tensors, or None and why none
    is available. The first call may compile the CPU extension (once per machine)."""
    if not _CPU:
        cuda = _CUDA_OPS
        if cuda is not None and torch._C._dispatch_has_kernel_for_dispatch_key(
            f"{cuda.fwd.default.namespace}::fwd", "CPU"
        ):
            _CPU.append((cuda, "the CUDA extension's CPU kernels"))
        else:
            ops, reason = load_cpu_ops()
            _CPU.append((ops if ops is None else _with_fakes(ops), reason))
    return _CPU[0]


def select_ops(device: torch.device, backend: str = "auto"):
    """The op namespace for tensors on ``device``: the CUDA extension for CUDA tensors, the
    compiled CPU kernels for CPU tensors, the Metal kernels for MPS tensors, when they load; else
    ``maxsim_torch``.

    ``backend`` forces one: "torch" always works; "cuda", "cpu" and "metal" raise if their
    kernels are unavailable or the tensors are elsewhere.
    """
    if backend == "torch":
        return torch_ops
    if backend == "cpu":
        ops, reason = cpu_ops()
        if ops is None:
            raise RuntimeError(f"backend='cpu': the CPU kernels are unavailable: {reason}")
        if device.type != "cpu":
            raise ValueError(f"backend='cpu': expected CPU tensors, got {device}")
        return ops
    if backend == "cuda":
        if _CUDA_OPS is None:
            raise RuntimeError(f"backend='cuda': the CUDA extension is unavailable: {_CUDA_REASON}")
        if device.type != "cuda":
            raise ValueError(f"backend='cuda': expected tensors on a CUDA device, got {device}")
        return _CUDA_OPS
    if backend == "metal":
        ops, reason = metal_ops()
        if ops is None:
            raise RuntimeError(f"backend='metal': the Metal kernels are unavailable: {reason}")
        if device.type != metal.GATE.device:
            raise ValueError(f"backend='metal': expected tensors on an MPS device, got {device}")
        return ops
    if backend == "auto":
        if device.type == "cuda" and _CUDA_OPS is not None:
            return _CUDA_OPS
        if device.type == metal.GATE.device:  # mps: the Metal kernels once they pass the gate
            return metal.GATE.verdict()[0] if _metal_ready() else torch_ops
        if device.type == "cpu":
            return cpu_ops()[0] or torch_ops
        return torch_ops
    raise ValueError(f"backend: expected one of {BACKENDS}, got {backend!r}")


def ops_for(x: torch.Tensor, backend: str = "auto"):
    """:func:`select_ops` for tensors like ``x``, without building its device for a CUDA tensor
    with the extension loaded (the common call)."""
    if backend == "auto" and x.is_cuda and _CUDA_OPS is not None:
        return _CUDA_OPS
    return select_ops(x.device, backend)


def needs_grad(*tensors: torch.Tensor) -> bool:
    """Whether autograd will need a backward through these inputs (so ``fwd`` keeps its argmax)."""
    if not torch.is_grad_enabled():
        return False
    for t in tensors:
        if t.requires_grad:
            return True
    return False


def forward(
    q: TokenSet,
    d: TokenSet,
    layout: int,
    *,
    group: int = 0,
    pair_q=None,
    pair_d=None,
    max_lq: int,
    want_argmax: bool,
    backend: str = "auto",
):
    """Run ``fwd`` on validated token sets; the argmax is computed only when wanted or when an
    input requires grad.

    Shapes: scores fp32 by layout (``[Nq, Nd]``, ``[Nq, group]``, ``[P]``); argmax int32
    ``scores.shape + [max_lq]`` when computed, else ``[0]``.
    """
    sets = (q.offsets, q.lengths, q.mask, d.offsets, d.lengths, d.mask, pair_q, pair_d)
    if q.scale is not None or d.scale is not None:  # quantized tokens (quantize.scaled_operands)
        return ops_for(q.x, backend).fwd_scaled(
            q.x, q.scale, d.x, d.scale, *sets, layout, group, max_lq, want_argmax
        )
    return fwd(backend, want_argmax, q.x, d.x, *sets, layout, group, max_lq)


def fwd(backend: str, want_argmax: bool, q: torch.Tensor, d: torch.Tensor, *args):
    """The ``fwd`` op on checked arguments (``args``: its arguments from ``q_offsets`` through
    ``max_lq``), with the argmax where wanted or where an input requires grad: one op call."""
    tf32 = q.dtype == torch.float32 and q.is_cuda and fp32_on_tf32()
    return ops_for(q, backend).fwd(q, d, *args, want_argmax or needs_grad(q, d), tf32)
