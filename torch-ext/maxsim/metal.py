"""The MPS kernels of the ops (Apple Silicon): metal/*.metal, launched from here.

Two loaders, one shader source, one launch plan:

- a Hub build for Metal ships a compiled extension (``_maxsim*``) whose single op
  ``launch(kernel, args, threads, group_size)`` dispatches a kernel of its embedded metallib;
- a pip or editable install compiles the shader text at first use with
  ``torch.mps.compile_shader`` (torch >= 2.7, no Xcode).

Both are objects with ``compile_shader``'s call convention (``lib.<kernel>(*args, threads=...,
group_size=...)``), and every decision (which kernel, its arguments, its grid) is made by the
functions below, which the CPU harness of tests/ also drives. The ops are registered on the
``maxsim_metal`` namespace for the MPS dispatch key, with the same fake kernels and autograd
formulas as every other namespace, by :class:`MetalGate` at first use, and only once the kernels
resolved and passed the known-answer self-test on the device (maxsim/metal_selftest.py).
"""

import contextlib
import math
import os
import threading
import warnings
from pathlib import Path

import torch

from . import bounds, fallback, metal_selftest
from .layouts import scores_shape, segment_count
from .registry import _exact, register_autograd, register_fakes
from .schemas import BWD_SCHEMA, CE_SCHEMA, FWD_SCHEMA, STEP_SCHEMA

NAMESPACE = "maxsim_metal"
SIMD_WIDTH = 32  # threads of a simdgroup; every threadgroup is whole simdgroups
SHADER_FILES = ("maxsim_fwd.metal", "maxsim_bwd.metal")
COMMON_HEADER = "maxsim_common.h"
_DTYPE_SUFFIX = {torch.float32: "float", torch.float16: "half", torch.bfloat16: "bfloat"}
KERNEL_STEMS = ("maxsim_fwd", "maxsim_gather_rows")
# Every kernel a launch can name: the host names of the shaders' instances (metal/*.metal).
KERNELS = tuple(f"{stem}_{suffix}" for stem in KERNEL_STEMS for suffix in _DTYPE_SUFFIX.values())


# ---------------------------------------------------------------------------------------------
# Shader text
# ---------------------------------------------------------------------------------------------


def shader_dir() -> Path:
    """``metal/`` shipped inside the package (pip), else the repository's (editable install)."""
    here = Path(__file__).resolve().parent
    for folder in (here / "metal", here.parent.parent / "metal"):
        if (folder / COMMON_HEADER).is_file():
            return folder
    raise FileNotFoundError(f"maxsim: no metal/{COMMON_HEADER} beside {here}")


def shader_source(folder: Path = None) -> str:
    """One translation unit for ``compile_shader``: the common header inlined once, then every
    shader (their ``#include`` of it removed: compile_shader has no include path)."""
    folder = shader_dir() if folder is None else folder
    header = (folder / COMMON_HEADER).read_text().replace("#pragma once\n", "")
    parts = [header]
    for name in SHADER_FILES:
        text = (folder / name).read_text()
        parts.append(text.replace(f'#include "{COMMON_HEADER}"\n', ""))
    return "\n".join(parts)


# ---------------------------------------------------------------------------------------------
# Launch plan: what every kernel gets (shared by both loaders and the CPU harness)
# ---------------------------------------------------------------------------------------------


def kernel_name(stem: str, dtype: torch.dtype) -> str:
    if dtype not in _DTYPE_SUFFIX:
        raise TypeError(f"maxsim metal: expected float32, float16 or bfloat16, got {dtype}")
    return f"{stem}_{_DTYPE_SUFFIX[dtype]}"


def _bindable(t: torch.Tensor) -> torch.Tensor:
    """Contiguous and non-empty: Metal binds raw storage, and an empty buffer cannot be bound
    (the kernels never read past the sizes they are given)."""
    t = t.contiguous()
    return t if t.numel() else t.new_zeros(1)


def segments(x, offsets, lengths, mask, width=None):
    """A token set as flat segments: start row and row count per segment (int32 ``[N]``) and a
    validity byte per row (uint8 ``[rows]``), all computed on the device (no host sync).

    Shapes: ``x`` padded ``[N, L, H]`` (``lengths [N]``, ``mask [N, L]``) or packed ``[T, H]``
    (``offsets [N+1]``, ``mask [T]``); ``width`` bounds the count (queries: ``max_lq``).
    """
    dev = x.device
    if x.dim() == 2:
        start = offsets[:-1].long()
        count = offsets[1:].long() - start
        valid = torch.ones(x.size(0), dtype=torch.bool, device=dev) if mask is None else mask
    else:
        n, length = x.size(0), x.size(1)
        start = torch.arange(n, device=dev) * length
        count = torch.full((n,), length, dtype=torch.long, device=dev)
        valid = torch.ones(n, length, dtype=torch.bool, device=dev)
        if lengths is not None:
            valid = valid & (torch.arange(length, device=dev) < lengths.long()[:, None])
        if mask is not None:
            valid = valid & mask
    if width is not None:
        count = count.clamp(max=width)
    return start.int(), count.clamp(min=0).int(), valid.reshape(-1).to(torch.uint8)


def launch_fwd(lib, q, d, q_offsets, q_lengths, q_mask, d_offsets, d_lengths, d_mask, pair_q,
               pair_d, layout, group, max_lq, with_argmax):
    """The ``fwd`` op on ``lib``: one threadgroup of one simdgroup per scored pair."""
    shape = scores_shape(q, d, q_offsets, d_offsets, pair_q, layout, group)
    pairs = math.prod(shape)
    scores = torch.zeros(shape, dtype=torch.float32, device=q.device)
    argmax = torch.full((*shape, max_lq) if with_argmax else (0,), -1, dtype=torch.int32,
                        device=q.device)
    if pairs == 0:
        return scores, argmax
    h = q.size(-1)
    nq, nd = segment_count(q, q_offsets), segment_count(d, d_offsets)
    qi, dj = fallback._pair_ids(layout, group, pair_q, pair_d, nd, 0, pairs, q.device)
    q_start, q_count, q_valid = segments(q, q_offsets, q_lengths, q_mask, width=max_lq)
    d_start, d_count, d_valid = segments(d, d_offsets, d_lengths, d_mask)
    out_scores = scores.view(-1)
    out_argmax = argmax if with_argmax else argmax.new_zeros(1)
    getattr(lib, kernel_name("maxsim_fwd", q.dtype))(
        _bindable(q), _bindable(d.to(q.dtype)), _bindable(q_start), _bindable(q_count),
        _bindable(q_valid), _bindable(d_start), _bindable(d_count), _bindable(d_valid),
        qi.int().contiguous(), dj.int().contiguous(), out_scores, out_argmax,
        h, q.shape[:-1].numel(), d.shape[:-1].numel(), nq, nd, max_lq, int(with_argmax),
        threads=pairs * SIMD_WIDTH, group_size=SIMD_WIDTH,
    )
    # Unchecked lengths / offsets, and packed queries longer than max_lq: NaN, argmax -1.
    bad = bounds.bad_scores(scores, layout, q, d, q_offsets, q_lengths, d_offsets, d_lengths,
                            pair_q, pair_d, max_lq)
    if bad is not None:
        scores.masked_fill_(bad, float("nan"))
        if with_argmax:
            argmax.masked_fill_(bad[..., None], -1)
    return scores, argmax


def _gather_rows(lib, src, key, src_row, weight, out_rows):
    """``out[r] = sum of weight[e] * src[src_row[e]]`` over the entries ``e`` with ``key[e] == r``
    in entry order (fp32 ``[out_rows, H]``); a key outside ``[0, out_rows)`` drops its entry."""
    h = src.size(-1)
    out = torch.zeros(out_rows, h, dtype=torch.float32, device=src.device)
    if out_rows == 0 or h == 0:
        return out
    key = torch.where((key >= 0) & (key < out_rows), key, out_rows)
    key, order = torch.sort(key, stable=True)  # stable: each row's list keeps entry order
    row_entries = torch.searchsorted(key, torch.arange(out_rows + 1, device=src.device))
    getattr(lib, kernel_name("maxsim_gather_rows", src.dtype))(
        _bindable(src), row_entries.int(), _bindable(src_row[order].int()),
        _bindable(weight[order].float()), out, h, src.numel() // h, out_rows, key.numel(),
        threads=(-(-h // SIMD_WIDTH) * SIMD_WIDTH, out_rows), group_size=(SIMD_WIDTH, 1),
    )
    return out


def launch_bwd(lib, grad, q, d, argmax, q_offsets, d_offsets, pair_q, pair_d, layout, group):
    """The ``bwd`` op on ``lib``: the winning (pair, query token) entries gathered per row of dQ
    and per row of dD, without atomics."""
    h = q.size(-1)
    q_rows, d_rows = q.shape[:-1].numel(), d.shape[:-1].numel()
    pairs, width = grad.numel(), argmax.size(-1)
    dq = torch.zeros(q_rows, h, dtype=torch.float32, device=q.device)
    dd = torch.zeros(d_rows, h, dtype=torch.float32, device=q.device)
    if pairs and width and q_rows and d_rows and h:
        nd = segment_count(d, d_offsets)
        qi, dj = fallback._pair_ids(layout, group, pair_q, pair_d, nd, 0, pairs, q.device)
        winner = argmax.reshape(pairs, width).long()
        cols = torch.arange(width, device=q.device)
        won = winner >= 0
        q_row = torch.where(won, fallback._starts(q, q_offsets)[qi, None] + cols, -1).view(-1)
        d_row = torch.where(won, fallback._starts(d, d_offsets)[dj, None] + winner, -1).view(-1)
        d_row = torch.where(q_row < q_rows, d_row, -1)  # an entry is whole or dropped
        q_row = torch.where(d_row < d_rows, q_row, -1)
        weight = grad.reshape(pairs, 1).float().expand(pairs, width).reshape(-1)
        dq = _gather_rows(lib, d.reshape(d_rows, h).to(q.dtype), q_row, d_row, weight, q_rows)
        dd = _gather_rows(lib, q.reshape(q_rows, h).to(d.dtype), d_row, q_row, weight, d_rows)
    return dq.view(q.shape).to(q.dtype), dd.view(d.shape).to(d.dtype)


def launch_contrastive_step(lib, q, d, q_offsets, q_lengths, q_mask, d_offsets, d_lengths,
                            d_mask, layout, group, max_lq, targets, scale):
    """``fwd`` with argmax, ``ce``, then ``bwd``: (loss, dq, dd)."""
    scores, argmax = launch_fwd(lib, q, d, q_offsets, q_lengths, q_mask, d_offsets, d_lengths,
                                d_mask, None, None, layout, group, max_lq, True)
    loss, grad = fallback.ce(scores, targets, scale)
    dq, dd = launch_bwd(lib, grad, q, d, argmax, q_offsets, d_offsets, None, None, layout, group)
    return loss, dq, dd


# ---------------------------------------------------------------------------------------------
# Registration and loaders
# ---------------------------------------------------------------------------------------------


def define_ops(namespace: str, get_lib, dispatch_key: str):
    """Define the op set on ``namespace`` with kernels for ``dispatch_key`` that launch on
    ``get_lib()`` (called at first use); returns the Library (keep it alive)."""
    library = torch.library.Library(namespace, "DEF")
    for schema in (FWD_SCHEMA, BWD_SCHEMA, CE_SCHEMA, STEP_SCHEMA):
        library.define(schema)

    def fwd(*args):
        return launch_fwd(get_lib(), *args[:-1])  # tf32: fp32 products are exact here

    library.impl("fwd", fwd, dispatch_key)
    library.impl("bwd", lambda *args: launch_bwd(get_lib(), *args), dispatch_key)
    library.impl("ce", _exact(fallback.ce), dispatch_key)
    library.impl(
        "contrastive_step", lambda *args: launch_contrastive_step(get_lib(), *args), dispatch_key
    )
    register_fakes(namespace)
    register_autograd(namespace)
    return library


class _ExtensionLibrary:
    """The Hub build's ``launch`` op with ``compile_shader``'s call convention: Python ints and
    floats travel as CPU scalar tensors, which the binding passes by value."""

    def __init__(self, launch_op):
        self._launch = launch_op

    def __getattr__(self, kernel):
        if kernel.startswith("_"):
            raise AttributeError(kernel)

        def launch(*args, threads, group_size):
            tensors = [_scalar_tensor(a) for a in args]
            dims = [threads] if isinstance(threads, int) else list(threads)
            group = [group_size] if isinstance(group_size, int) else list(group_size)
            self._launch(kernel, tensors, dims, group)

        return launch


def _scalar_tensor(arg):
    if isinstance(arg, torch.Tensor):
        return arg
    if isinstance(arg, int):
        return torch.tensor([arg], dtype=torch.int64)
    return torch.tensor([arg], dtype=torch.float32)


def _extension_library():
    """The compiled Hub extension beside this file (its namespace has ``launch``), or None: pip
    installs have none."""
    for path in sorted(Path(__file__).resolve().parent.glob("_maxsim*.so")):
        torch.ops.load_library(str(path))  # registers the module's ops on its namespace
        namespace = getattr(torch.ops, path.name.split(".")[0])
        if hasattr(namespace, "launch"):
            return _ExtensionLibrary(namespace.launch)
    return None


def mps_library():
    """The kernels for MPS tensors: the Hub extension's, else the shader text compiled now
    (raises where this torch has no ``torch.mps.compile_shader``, or the compiler refuses)."""
    lib = _extension_library()
    if lib is not None:
        return lib
    if not hasattr(torch.mps, "compile_shader"):
        raise RuntimeError(f"torch.mps.compile_shader is missing (torch {torch.__version__}; "
                           "it needs torch >= 2.7)")
    return torch.mps.compile_shader(shader_source())


def _mps_missing():
    """Why this process has no MPS device, or None."""
    if not (hasattr(torch.backends, "mps") and torch.backends.mps.is_available()):
        return "torch.backends.mps.is_available() is False"
    return None


def resolve_kernels(lib):
    """Look up every kernel of :data:`KERNELS` on ``lib``; raise naming the first one missing."""
    for name in KERNELS:
        try:
            kernel = getattr(lib, name)
        except Exception as err:  # compile_shader raises its own error type for a missing name
            raise LookupError(f"kernel {name} not found: {err}") from err
        if not callable(kernel):
            raise LookupError(f"kernel {name} is not callable")


@contextlib.contextmanager
def _plain_tensors(device):
    """Real tensors, no autograd, no autocast, whatever the first caller runs under (a fake
    tensor mode while torch.compile traces, autocast in a training step)."""
    with contextlib.ExitStack() as stack:
        unset_fake = getattr(torch._subclasses.fake_tensor, "unset_fake_temporarily", None)
        if unset_fake is not None:
            stack.enter_context(unset_fake())
        stack.enter_context(torch.no_grad())
        try:
            stack.enter_context(torch.autocast(device_type=device, enabled=False))
        except RuntimeError:  # a torch without autocast for this device: nothing to turn off
            pass
        yield


class MetalGate:
    """Whether tensors on ``device`` run the Metal kernels, decided once per process at first
    use: the library loads, every kernel resolves, and the known-answer self-test
    (maxsim/metal_selftest.py) matches the PyTorch path on the device. Any failure warns once and
    leaves the PyTorch path for the rest of the process; ``MAXSIM_NO_METAL=1`` skips all of it.

    The defaults are the real ones (MPS, compile_shader or the Hub extension); tests build a gate
    for CPU tensors over a fake library.
    """

    def __init__(self, device="mps", dispatch_key="MPS", namespace=NAMESPACE,
                 missing=_mps_missing, load_library=mps_library):
        self.device, self.dispatch_key, self.namespace = device, dispatch_key, namespace
        self._missing, self._load_library = missing, load_library
        self._verdict = None  # (ops or None, reason)
        self._lock = threading.Lock()

    @property
    def decided(self) -> bool:
        return self._verdict is not None

    def verdict(self):
        """``(ops, reason)``: the Metal op namespace and why it runs, or None and why not."""
        if self._verdict is None:
            with self._lock:  # two threads' first calls: one decision, one warning
                if self._verdict is None:
                    self._verdict = self._decide()
        return self._verdict

    def _decide(self):
        if os.environ.get("MAXSIM_NO_METAL", "").strip() not in ("", "0"):
            return None, "MAXSIM_NO_METAL is set"
        missing = self._missing()
        if missing is not None:
            return None, missing
        try:
            lib = self._load_library()
            resolve_kernels(lib)
            with _plain_tensors(self.device):
                metal_selftest.check(lib, self.device, launch_fwd, launch_bwd)
        except Exception as err:  # any failure: the PyTorch path, said once
            reason = f"{type(err).__name__}: {' '.join(str(err).split())[:400]}"
            warnings.warn(
                f"maxsim: the Metal kernels are off for this process ({reason}); "
                f"{self.device} tensors take the PyTorch path. `python -m maxsim.info` says more.",
                RuntimeWarning, stacklevel=4,
            )
            return None, f"self-test at first use failed: {reason}"
        if not hasattr(getattr(torch.ops, self.namespace), "fwd"):
            _LIBRARIES.append(define_ops(self.namespace, lambda: lib, self.dispatch_key))
        return getattr(torch.ops, self.namespace), "passed the known-answer self-test at first use"


_LIBRARIES = []  # the registered op Libraries, kept alive for the process
GATE = MetalGate()
