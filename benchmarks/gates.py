"""The correctness gate of every benchmark row, written once: bench.py applies it to the rows it
measures and render.py to every row it reads (files written before the gate included), so a row
whose output is wrong is shown as ``wrong`` and never counts as a best peer. No torch import: the
renderer runs without it. The thresholds and their reasons: bench_results/README.md.
"""

from __future__ import annotations

# Largest relative error ||out - ref|| / ||ref|| of the scores against float64, by input dtype.
# fp32 admits TF32 products (10-bit mantissa: about 5e-4); fp16 / bf16 admit similarities rounded
# to the input dtype (the naive baseline's einsum: about 4e-5 and 4e-4).
SCORE_TOL = {"fp32": 2e-3, "fp16": 1e-3, "bf16": 4e-3}
# Largest relative error of a training step's gradients (each rounded once to the input dtype:
# about 2e-4 in fp16, 2e-3 in bf16).
GRAD_TOL = {"fp32": 1e-3, "fp16": 2e-3, "bf16": 1e-2}
# Smallest fraction of queries whose top-10 document set equals float64's.
TOP10_MIN = 0.8


def wrong_reason(dtype: str, rel_err, top10, *, gradients: bool) -> str | None:
    """Why a measured row's output is wrong, or None when it passes. ``rel_err`` None (no finite
    output) is not judged here: such a row is an ``error``."""
    if rel_err is None:
        return None
    tol = (GRAD_TOL if gradients else SCORE_TOL).get(dtype, min(SCORE_TOL.values()))
    what = "gradient" if gradients else "score"
    if rel_err > tol:
        return f"wrong: {what} rel err {rel_err:.1e} > {tol:.0e} ({dtype})"
    if not gradients and top10 is not None and top10 < TOP10_MIN:
        return f"wrong: top-10 agreement {top10:.3f} < {TOP10_MIN}"
    return None


def gate_row(row: dict, *, gradients: bool) -> dict:
    """``row`` with status ``wrong`` (and the reason first in its note) when an ``ok`` row fails
    the gate; unchanged otherwise. Rows of stand-ins (``stand_in``: not MaxSim) are not judged."""
    if row.get("status") != "ok" or row.get("stand_in"):
        return row
    why = wrong_reason(row["dtype"], row.get("rel_err"), row.get("top10_agree"),
                       gradients=gradients)
    if why is None:
        return row
    note = row.get("note") or ""
    return {**row, "status": "wrong", "note": why + ("; " + note if note else "")}
