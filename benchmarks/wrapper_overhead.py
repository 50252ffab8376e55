"""Host time of the Python layer alone: the public calls with the op replaced by a stub that
returns preallocated outputs, so that what is left is validation, reshaping and dispatch. Runs on
any machine (CPU tensors); the GPU's own host adds the op's dispatch, allocation and launch.

    python benchmarks/wrapper_overhead.py
"""
from __future__ import annotations

import sys
import time
import types
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "torch-ext"))
import maxsim  # noqa: E402
import maxsim.dispatch as dispatch  # noqa: E402
import maxsim.native as native  # noqa: E402


def per_call_us(fn, n=20000, rounds=5) -> float:
    """Best of ``rounds`` averages over ``n`` calls, in microseconds."""
    for _ in range(200):
        fn()
    best = float("inf")
    for _ in range(rounds):
        t = time.perf_counter()
        for _ in range(n):
            fn()
        best = min(best, (time.perf_counter() - t) / n * 1e6)
    return best


def main() -> int:
    out = (torch.zeros(32, 100), torch.empty(0, dtype=torch.int32))
    stub = types.SimpleNamespace(fwd=lambda *a: out, fwd_scaled=lambda *a: out)
    dispatch.select_ops = native.select_ops = lambda device, backend="auto": stub
    Q = torch.randn(32, 32, 128).half()
    D4 = torch.randn(32, 100, 256, 128).half()
    D3 = D4[0]
    lengths = torch.randint(128, 257, (32, 100), dtype=torch.int32)
    mask = torch.ones(32, 100, 256, dtype=torch.bool)
    calls = {
        "maxsim(Q, D[B,K,Ld,H], d_lengths=)": lambda: maxsim.maxsim(Q, D4, d_lengths=lengths),
        "maxsim(Q, D[Nd,Ld,H])": lambda: maxsim.maxsim(Q, D3),
        "maxsim(Q, D[B,K,Ld,H], d_mask=)": lambda: maxsim.maxsim(Q, D4, d_mask=mask),
    }
    for name, fn in calls.items():
        print(f"{name:40s} {per_call_us(fn):6.2f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
