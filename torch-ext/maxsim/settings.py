"""Environment switches, read at call time so a test or a session can flip them."""

import os

import torch

DEFAULT_MEMORY_MB = 128


def debug_enabled() -> bool:
    """``MAXSIM_DEBUG=1`` turns on the checks that read device values (a device->host sync).

    Never while ``torch.compile`` traces: those checks would break the graph.
    """
    if os.environ.get("MAXSIM_DEBUG", "0") in ("", "0"):
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
