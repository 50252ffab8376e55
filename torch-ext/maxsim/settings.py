"""Environment switches, read at call time so a test or a session can flip them."""

import os

import torch

DEFAULT_MEMORY_MB = 128


# os.environ's own mapping where it has one (CPython): a lookup there skips re-encoding the name,
# which costs more than the rest of a small call's checks.
_ENVIRON = getattr(os.environ, "_data", None)
_DEBUG_KEY = os.environ.encodekey("MAXSIM_DEBUG") if _ENVIRON is not None else None
_OFF = (None, "", "0", b"", b"0")


def _assume_constant_result(fn):
    """``torch.compiler.assume_constant_result`` without its import of torch._dynamo (over a second
    at ``import maxsim``): it only sets this attribute, which torch.compile reads when it traces."""
    fn._dynamo_marked_constant = True
    return fn


def debug_enabled() -> bool:
    """``MAXSIM_DEBUG=1`` turns on the checks that read device values (a device->host sync).

    Never while ``torch.compile`` traces: those checks would break the graph.
    """
    if _ENVIRON is not None:
        raw = _ENVIRON.get(_DEBUG_KEY)
    else:
        raw = os.environ.get("MAXSIM_DEBUG")
    if raw in _OFF:
        return False
    return not torch.compiler.is_compiling()


def memory_budget_bytes() -> int:
    """Extra memory the PyTorch fallback and ``retrieve`` may use per call, in bytes
    (``MAXSIM_TORCH_MEMORY_MB``)."""
    raw = os.environ.get("MAXSIM_TORCH_MEMORY_MB", "")
    try:
        megabytes = float(raw) if raw else DEFAULT_MEMORY_MB
    except ValueError:
        raise ValueError(
            f"MAXSIM_TORCH_MEMORY_MB: expected a number of megabytes, got {raw!r}"
        ) from None
    if megabytes <= 0:
        raise ValueError(f"MAXSIM_TORCH_MEMORY_MB: expected a positive number, got {raw!r}")
    return int(megabytes * 2**20)


@_assume_constant_result  # read once when torch.compile traces a call
def fp32_on_tf32() -> bool:
    """Whether fp32 inputs on CUDA take single-TF32 products (opt-in, about 1e-3 relative) instead
    of the default split-TF32 ones (fp32 accuracy).

    ``MAXSIM_FP32=tf32`` or ``exact`` decides; unset, PyTorch's own switch does:
    ``torch.backends.cuda.matmul.allow_tf32 = True`` (or ``fp32_precision = "tf32"``).
    """
    mode = os.environ.get("MAXSIM_FP32", "")
    if mode:
        if mode not in ("tf32", "exact"):
            raise ValueError(f"MAXSIM_FP32: expected 'tf32' or 'exact', got {mode!r}")
        return mode == "tf32"
    try:
        return torch._C._get_cublas_allow_tf32()
    except RuntimeError:  # set through the newer fp32_precision switches, which then decide
        precision = torch._C._get_fp32_precision_getter("cuda", "matmul")
        if precision == "none":  # inherited from the global switch
            precision = torch._C._get_fp32_precision_getter("generic", "all")
        return precision == "tf32"
