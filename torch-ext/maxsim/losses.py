"""Training losses over MaxSim scores, fused: the loss and its gradient with respect to the
scores come from one op, so a training step is the forward kernel, one small loss kernel and the
two backward kernels, with a single autograd node per op.
"""

import math

from . import validation as check
from .dispatch import select_ops
from .layouts import ALLPAIRS
from .native import _plain_sets, maxsim, padded_sets
from .quantize import resolve


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
    _check_temperature(temperature)
    scores = maxsim(
        Q, D, q_mask, d_mask, q_lengths=q_lengths, d_lengths=d_lengths, normalize=normalize,
        backend=backend,
    )
    targets = _check_targets(targets, D, scores.shape, scores.device)
    return select_ops(scores.device, backend).ce(scores, targets, 1.0 / temperature)[0]


def contrastive_step(
    Q, D, q_mask=None, d_mask=None, *, q_lengths=None, d_lengths=None, targets=None,
    temperature=1.0, backend="auto",
):
    """One contrastive training step without autograd: the loss of :func:`contrastive_loss` and
    its gradients with respect to ``Q`` and ``D``, from one op (on CUDA: four kernels, no host
    sync, capturable in a CUDA graph).

    Shapes: as :func:`contrastive_loss`. Returns ``(loss, dQ, dD)``: 0-d fp32, ``dQ`` like ``Q``,
    ``dD`` like ``D`` (contiguous, in their dtype). Apply them with ``Q.backward(dQ)`` or an
    optimizer directly.
    """
    _check_temperature(temperature)
    plain = _plain_sets(Q, D, q_mask, d_mask, False, q_lengths, d_lengths)
    if plain is None:
        Q, D = resolve(Q, D)  # gradients are of the dequantized tokens
        plain = padded_sets(Q, D, q_mask, d_mask, False, q_lengths, d_lengths)
    q, d, layout, group = plain
    qx = q.x
    nq = qx.size(0)
    cols = d.x.size(0) if layout == ALLPAIRS else group
    targets = _check_targets(targets, D, (nq, cols), qx.device)
    loss, dq, dd = select_ops(qx.device, backend).contrastive_step(
        qx, d.x, q.offsets, q.lengths, q.mask, d.offsets, d.lengths, d.mask, layout, group,
        qx.size(1), targets, 1.0 / temperature,
    )
    return loss, dq, (dd if layout == ALLPAIRS else dd.view(D.shape))


def _check_temperature(temperature):
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not (
        math.isfinite(temperature) and temperature > 0
    ):
        raise ValueError(f"temperature: expected a positive finite number, got {temperature!r}")


def _check_targets(targets, D, shape, device):
    """``targets`` checked against scores of ``shape`` (their values where they are checked; an
    unchecked one out of range makes the loss NaN); returned as given (int64 passes as is)."""
    nq, cols = shape
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
        check.require_index("targets", targets, (nq,), device)  # the op takes either as is
        if check.values_checked(targets):
            check.check_range("targets", targets, 0, cols - 1, f"a document index in [0, {cols})")
    if cols == 0 and nq:
        raise ValueError("D: expected at least one document (or candidate) per query, got none")
    return targets
