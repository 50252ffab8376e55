"""Hub kernel layers: sentence-transformers' multi-vector scorer runs them in place of its own.

sentence-transformers (6.3) decorates its scoring modules with
``use_kernel_forward_from_hub("STMaxSim")`` / ``("STMaxSimPairwise")``; a transformers
``KernelConfig({"STMaxSim": "<repo>:MaxSim", "STMaxSimPairwise": "<repo>:MaxSimPairwise"})``
swaps in the ``forward`` of the classes below. Their contract, kept point for point:

* a ``[Na, Lq, H]`` with b ``[Nb, Ld, H]`` -> ``[Na, Nb]`` float32 (pairwise: b ``[Na, Ld, H]``
  -> ``[Na]``), accumulated in float32 whatever the input dtype;
* a ``b_mask``'ed token never wins a max, even over negative similarities;
* ``a_mask`` multiplies each query token's maximum, so a float or integer mask weights it;
* a document with no valid token, and every document of a zero-width ``b``, scores -1e9.

The kernels keep each similarity in float32 up to the max, where sentence-transformers' einsum
rounds it to the input dtype first: for float16 / bfloat16 inputs our scores are the closer to
the exact ones and differ from theirs by at most that rounding. Inputs the kernels do not take
(other ranks, mixed dtypes or devices, empty query widths) go to :func:`exact_score`, the same
formula in plain PyTorch, never to an error.
"""

import torch

from .native import maxsim, maxsim_pairs
from .validation import FLOAT_DTYPES

EMPTY_DOCUMENT_SCORE = -1e9  # sentence-transformers' score for a document with no valid token
KERNEL_DEVICES = ("cuda", "cpu", "mps")


def _mask_fits(mask, rows, width, device) -> bool:
    return mask is None or (
        isinstance(mask, torch.Tensor) and mask.shape == (rows, width) and mask.device == device
        and not mask.is_complex()
    )


def kernels_take(a, b, a_mask, b_mask, pairwise: bool) -> bool:
    """Whether the kernels score this call: 3-D tensors of one float dtype on one CUDA, CPU or MPS
    device, non-empty token widths and H, masks of the padded shapes on that device."""
    if type(a) is not torch.Tensor or type(b) is not torch.Tensor or a.dim() != 3 or b.dim() != 3:
        return False
    (na, lq, h), (nb, ld, hb) = a.shape, b.shape
    return (
        a.dtype == b.dtype and a.dtype in FLOAT_DTYPES and a.device == b.device
        and a.device.type in KERNEL_DEVICES and h == hb and h > 0 and lq > 0 and ld > 0
        and (na == nb or not pairwise)
        and _mask_fits(a_mask, na, lq, a.device) and _mask_fits(b_mask, nb, ld, a.device)
    )


def exact_score(a, b, a_mask, b_mask, pairwise: bool) -> torch.Tensor:
    """sentence-transformers' formula in plain PyTorch: the path for what the kernels do not take.
    Mixed dtypes or devices, which their einsum rejects, meet in b's device and the wider dtype."""
    dtype = torch.promote_types(a.dtype, b.dtype)
    a, b = a.to(b.device, dtype), b.to(dtype)
    a_mask = None if a_mask is None else a_mask.to(b.device)
    b_mask = None if b_mask is None else b_mask.to(b.device)
    if b.shape[1] == 0:  # zero-width documents: nothing to take the max over
        shape = (b.shape[0],) if pairwise else (a.shape[0], b.shape[0])
        return torch.full(shape, EMPTY_DOCUMENT_SCORE, dtype=torch.float32, device=b.device)
    scores = torch.einsum("bsh,bth->bst" if pairwise else "ash,bth->abst", a, b)
    if b_mask is not None:
        invalid = ~b_mask.bool()
        invalid = invalid.unsqueeze(1) if pairwise else invalid.unsqueeze(0).unsqueeze(2)
        scores = scores.masked_fill(invalid, torch.finfo(scores.dtype).min)
    maxima = scores.max(dim=-1).values.float()
    if a_mask is not None:
        maxima = maxima * (a_mask if pairwise else a_mask.unsqueeze(1))
    return _fill_empty(maxima.sum(dim=-1), b_mask, pairwise)


def _fill_empty(scores, b_mask, pairwise: bool) -> torch.Tensor:
    if b_mask is None:
        return scores
    empty = ~b_mask.bool().any(dim=-1)
    return scores.masked_fill(empty if pairwise else empty.unsqueeze(0), EMPTY_DOCUMENT_SCORE)


def _weighted(a, weights):
    """``a`` with each token scaled by a non-negative weight, computed in float32 and stored in
    a's dtype (exact for 0 / 1 masks; otherwise rounded as the input already is)."""
    return (a.float() * weights.unsqueeze(-1)).to(a.dtype)


def kernel_score(a, b, a_mask, b_mask, pairwise: bool) -> torch.Tensor:
    """The kernels' scores under sentence-transformers' rules (see the module docstring)."""
    score = maxsim_pairs if pairwise else maxsim
    d_mask = None if b_mask is None else b_mask.bool().contiguous()
    if a_mask is None or a_mask.dtype == torch.bool:
        scores = score(a, b, None if a_mask is None else a_mask.contiguous(), d_mask)
    else:
        # w * max_t <a, b_t> = max_t <w a, b_t> for w >= 0, so a weight scales its query token;
        # negative weights flip the max into a min, hence their own call on -w (no host sync).
        weights = a_mask.float()
        positive, negative = weights.clamp(min=0), (-weights).clamp(min=0)
        scores = score(_weighted(a, positive), b, positive > 0, d_mask) - score(
            _weighted(a, negative), b, negative > 0, d_mask
        )
    return _fill_empty(scores, b_mask, pairwise)


def score_documents(a, b, a_mask, b_mask) -> torch.Tensor:
    """``[Na, Nb]`` float32: every query of ``a`` against every document of ``b``."""
    if kernels_take(a, b, a_mask, b_mask, pairwise=False):
        return kernel_score(a, b, a_mask, b_mask, pairwise=False)
    return exact_score(a, b, a_mask, b_mask, pairwise=False)


def score_pairs(a, b, a_mask, b_mask) -> torch.Tensor:
    """``[B]`` float32: query ``i`` of ``a`` against document ``i`` of ``b``."""
    if kernels_take(a, b, a_mask, b_mask, pairwise=True):
        return kernel_score(a, b, a_mask, b_mask, pairwise=True)
    return exact_score(a, b, a_mask, b_mask, pairwise=True)


class MaxSim(torch.nn.Module):
    """sentence-transformers' ``STMaxSim``: ``[Na, Lq, H]`` x ``[Nb, Ld, H]`` -> ``[Na, Nb]``."""

    has_backward = True
    can_torch_compile = True

    def forward(self, a, b, a_mask, b_mask):
        return score_documents(a, b, a_mask, b_mask)


class MaxSimPairwise(torch.nn.Module):
    """sentence-transformers' ``STMaxSimPairwise``: ``[B, Lq, H]`` x ``[B, Ld, H]`` -> ``[B]``."""

    has_backward = True
    can_torch_compile = True

    def forward(self, a, b, a_mask, b_mask):
        return score_pairs(a, b, a_mask, b_mask)


__all__ = ["MaxSim", "MaxSimPairwise"]
