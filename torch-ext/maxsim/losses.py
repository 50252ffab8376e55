"""Training losses over MaxSim scores, fused: the loss and its gradient with respect to the
scores come from one op, so a training step is the forward kernel, one small loss kernel and the
two backward kernels, with a single autograd node per op.
"""

import math

import torch

from . import validation as check
from .dispatch import select_ops
from .native import maxsim
from .settings import debug_enabled


def contrastive_loss(
    Q, D, q_mask=None, d_mask=None, *, q_lengths=None, d_lengths=None, targets=None,
    temperature=1.0, normalize=False, backend="auto",
):
    """Mean softmax cross-entropy of MaxSim scores: query ``i`` against every document, its
    positive being document ``targets[i]`` (in-batch negatives; ``F.cross_entropy(maxsim(Q, D) /
    temperature, targets)`` computed in fp32).

    Shapes:
        Q ``[Nq, Lq, H]``; D ``[Nd, Ld, H]`` (all pairs) or ``[Nq, K, Ld, H]`` (each query against
        its own K candidates); masks and lengths as :func:`maxsim`.
        targets int ``[Nq]`` with values in ``[0, Nd)`` (or ``[0, K)``); None means ``arange(Nq)``
        (the diagonal: document ``i`` is query ``i``'s positive, so ``Nd >= Nq``), which 4-D ``D``
        does not allow.
    Returns a 0-d fp32 tensor, differentiable with respect to ``Q`` and ``D``.
    """
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not (
        math.isfinite(temperature) and temperature > 0
    ):
        raise ValueError(f"temperature: expected a positive finite number, got {temperature!r}")
    scores = maxsim(
        Q, D, q_mask, d_mask, q_lengths=q_lengths, d_lengths=d_lengths, normalize=normalize,
        backend=backend,
    )
    nq, cols = scores.shape
    if targets is None:
        if D.dim() == 4:
            raise ValueError(
                "targets: expected a tensor [Nq] of candidate indices for 4-D D "
                "(the diagonal default needs all-pairs scores)"
            )
        if cols < nq:
            raise ValueError(
                f"targets: the diagonal default needs at least as many documents as queries, "
                f"got {nq} queries and {cols} documents; pass targets"
            )
    else:
        check.index("targets", targets, (nq,), scores.device)  # the op takes int64 as is
        if debug_enabled() and nq:
            check.check_range("targets", targets, 0, cols - 1, f"a document index in [0, {cols})")
    if cols == 0 and nq:
        raise ValueError("D: expected at least one document (or candidate) per query, got none")
    return select_ops(scores.device, backend).ce(scores, targets, 1.0 / temperature)[0]
