"""Environment switches, read at call time so a test or a session can flip them."""

import os

import torch

DEFAULT_MEMORY_MB = 128


# os.environ's own mapping where it has one (CPython): a lookup there skips re-encoding the name,
# which costs more than the rest of a small call's checks.
_ENVIRON = getattr(os.environ, "_data", None)
_DEBUG_KEY = os.environ.encodekey("MAXSIM_DEBUG") if _ENVIRON is not None else None
_OFF = (None, "", "0", b"", b"0")


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
