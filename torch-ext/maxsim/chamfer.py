"""Chamfer distance (squared L2) between point sets, as MaxSim over augmented points.

    min_j ||x - y_j||^2 = ||x||^2 - max_j (2 <x, y_j> - ||y_j||^2)
                        = ||x||^2 - max_j <[x, 1], [2 y_j, -||y_j||^2]>

so one direction's sum of nearest-point distances is the squared norms minus the MaxSim of the
augmented sets, and autograd through that (the argmax the op saves, and the augmentation) is the
exact gradient of the nearest-point distances. Everything runs in fp32 (the exact kernels): the
norms and their difference need its precision. The L1 distance is no dot product: it takes
PyTorch's ``cdist`` over blocks of points under the ``MAXSIM_TORCH_MEMORY_MB`` budget.
"""

import torch

from . import validation as check
from .native import maxsim_pairs
from .settings import memory_budget_bytes

METRICS = ("l2_sq", "l1")


def _augmented(x: torch.Tensor, side: str) -> torch.Tensor:
    """``[x, 1]`` for the points whose nearest neighbour is sought, ``[2 x, -||x||^2]`` for the
    points searched."""
    if side == "source":
        return torch.cat([x, x.new_ones(x.shape[:-1] + (1,))], dim=-1)
    return torch.cat([2 * x, -(x * x).sum(-1, keepdim=True)], dim=-1)


def _nearest_sums(x, y, x_mask, y_mask, backend):
    """Per set: the sum over the valid points of x of their squared distance to the nearest valid
    point of y."""
    norms = (x * x).sum(-1)
    if x_mask is not None:
        norms = norms.masked_fill(~x_mask, 0.0)
    best = maxsim_pairs(_augmented(x, "source"), _augmented(y, "target"), x_mask, y_mask,
                        backend=backend)
    return norms.sum(-1) - best


def _nearest_sums_l1(x, y, x_mask, y_mask):
    """As :func:`_nearest_sums` for the L1 distance: blocks of x against all of y (cdist)."""
    # a block of points against all of y: [rows, M, d] fp32 inside cdist at most
    rows = max(1, memory_budget_bytes() // max(1, 4 * y.size(1) * y.size(2)))
    sums = []
    for b in range(x.size(0)):
        parts = []
        for start in range(0, x.size(1), rows):
            dist = torch.cdist(x[b, start:start + rows], y[b], p=1)
            if y_mask is not None:
                dist = dist.masked_fill(~y_mask[b], torch.inf)
            near = dist.amin(1)
            if x_mask is not None:
                near = near.masked_fill(~x_mask[b, start:start + rows], 0.0)
            parts.append(near.sum())
        sums.append(torch.stack(parts).sum() if parts else x.new_zeros(()))
    return torch.stack(sums)


def _counts(points, mask):
    """Valid points per set, fp32."""
    if mask is None:
        return torch.full(points.shape[:1], points.size(1), dtype=torch.float32,
                          device=points.device)
    return mask.sum(-1).float()


def chamfer(X, Y, x_mask=None, y_mask=None, *, metric="l2_sq", backend="auto"):
    """Chamfer distance between point set ``X[b]`` and point set ``Y[b]``:
    mean over x of min_y d(x, y) plus mean over y of min_x d(y, x), with d the squared L2
    distance (``metric="l2_sq"``, on the MaxSim kernels) or the L1 distance (``"l1"``, PyTorch's
    cdist in blocks: not fused).

    Shapes: X ``[B, N, d]``, Y ``[B, M, d]``, x_mask ``[B, N]``, y_mask ``[B, M]`` (True = a point)
    -> ``[B]`` fp32; 2-D X ``[N, d]`` and Y ``[M, d]`` (masks ``[N]``, ``[M]``) -> a 0-d tensor.
    A set with no valid point gives NaN (the mean over, or the minimum over, nothing).
    Differentiable in X and Y; the gradient flows to each point's nearest neighbour (ties to the
    lower index), deterministically.
    """
    if metric not in METRICS:
        raise ValueError(f"metric: expected one of {METRICS}, got {metric!r}")
    single = isinstance(X, torch.Tensor) and X.dim() == 2
    dims_x, dims_y = (("N", "d"), ("M", "d")) if single else (("B", "N", "d"), ("B", "M", "d"))
    X = check.embeddings("X", X, dims_x)
    Y = check.embeddings("Y", Y, dims_y)
    check.same_space("X", X, "Y", Y)
    if single:
        X, Y = X[None], Y[None]
        x_mask = None if x_mask is None else x_mask[None]
        y_mask = None if y_mask is None else y_mask[None]
    if X.size(0) != Y.size(0):
        raise ValueError(f"Y: expected {X.size(0)} point sets like X, got shape {tuple(Y.shape)}")
    x_mask = check.mask("x_mask", x_mask, X.shape[:2], X.device)
    y_mask = check.mask("y_mask", y_mask, Y.shape[:2], Y.device)
    with torch.autocast(X.device.type, enabled=False):
        x, y = X.float(), Y.float()
        if metric == "l1":
            to_y = _nearest_sums_l1(x, y, x_mask, y_mask)
            to_x = _nearest_sums_l1(y, x, y_mask, x_mask)
        else:
            to_y = _nearest_sums(x, y, x_mask, y_mask, backend)
            to_x = _nearest_sums(y, x, y_mask, x_mask, backend)
    n_x = _counts(X, x_mask)
    n_y = _counts(Y, y_mask)
    distance = to_y / n_x + to_x / n_y
    distance = torch.where((n_x > 0) & (n_y > 0), distance, torch.nan)
    return distance[0] if single else distance
