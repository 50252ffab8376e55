"""Documents that are segments of one token tensor (a model's output with sequences packed or
padded in any order), scored where they lie: nothing is gathered or copied."""

import torch

from . import validation as check
from .dispatch import forward
from .layouts import ALLPAIRS
from .settings import debug_enabled


def _packed_view(starts, lengths, total):
    """The segments as a packed token set over all ``total`` tokens: CSR offsets of the segments
    sorted by start (each runs to the next one's start) and a token mask that keeps each one's
    own ``length`` tokens. Returns (offsets int32 [N+1], mask [total], order, invalid): ``order``
    sorts the segments, ``invalid`` (in that order) marks segments that leave the tensor or
    overlap the next one, whose tails the view would cut off."""
    s = starts.long()
    order = torch.argsort(s, stable=True)
    s, length = s[order], lengths.long()[order]
    end = s + length
    invalid = (s < 0) | (length < 0) | (end > total)
    invalid[:-1] |= end[:-1] > s[1:]
    s, end = s.clamp(0, total), end.clamp(0, total)
    edges = torch.zeros(total + 1, dtype=torch.int32, device=s.device)
    edges.index_add_(0, s, torch.ones_like(s, dtype=torch.int32))
    edges.index_add_(0, end, torch.full_like(s, -1, dtype=torch.int32))
    mask = edges[:total].cumsum(0) > 0
    first = torch.zeros(1, dtype=s.dtype, device=s.device)
    last = torch.full((1,), total, dtype=s.dtype, device=s.device)
    offsets = torch.cat([first, s[1:], last]).to(torch.int32)
    return offsets, mask, order, invalid


def maxsim_segments(Q, tokens, starts, lengths, q_mask=None, *, backend="auto"):
    """MaxSim of every query with every document, the documents being segments of ``tokens``.

    Shapes: Q ``[Nq, Lq, H]`` (or ``[Lq, H]`` -> ``[N]``), q_mask ``[Nq, Lq]``; tokens ``[T, H]``;
    starts, lengths ``[N]`` (document i is ``tokens[starts[i] : starts[i] + lengths[i]]``)
    -> ``[Nq, N]`` fp32. Segments may come in any order and leave gaps between them; the kernels
    stream the gaps too (masked), so for right-padded batches ``maxsim(Q, D, d_lengths=)`` reads
    less. A segment that leaves ``tokens`` or overlaps another scores NaN (``MAXSIM_DEBUG=1``
    raises instead). Differentiable in Q and tokens.
    """
    single = isinstance(Q, torch.Tensor) and Q.dim() == 2
    if single:
        Q = Q[None]
        q_mask = None if q_mask is None else q_mask[None]
    Q = check.embeddings("Q", Q, ("Nq", "Lq", "H"))
    tokens = check.embeddings("tokens", tokens, ("T", "H"))
    check.same_space("Q", Q, "tokens", tokens)
    check.require_tensor("starts", starts, "of shape [N]")
    if starts.dim() != 1:
        raise ValueError(f"starts: expected 1-D [N], got shape {tuple(starts.shape)}")
    starts = check.index("starts", starts, tuple(starts.shape), tokens.device)
    lengths = check.index("lengths", lengths, tuple(starts.shape), tokens.device)
    if starts.numel() == 0:
        empty = torch.zeros(Q.size(0), 0, dtype=torch.float32, device=tokens.device)
        return empty[0] if single else empty
    offsets, mask, order, invalid = _packed_view(starts, lengths, tokens.size(0))
    if debug_enabled() and bool(invalid.any()):
        i = int(order[invalid.nonzero()[0, 0]])
        raise ValueError(
            f"starts, lengths: segment {i} (start {int(starts[i])}, length {int(lengths[i])}) "
            f"leaves tokens [0, {tokens.size(0)}) or overlaps another segment"
        )
    q = check.padded(Q, m=q_mask, mask_name="q_mask")
    d = check.packed(tokens, offsets, offsets_name="starts", m=mask)
    scores, _ = forward(q, d, ALLPAIRS, max_lq=Q.size(1), want_argmax=False, backend=backend)
    rank = torch.empty_like(order)
    rank[order] = torch.arange(order.numel(), device=order.device)
    scores = torch.where(invalid[rank], torch.nan, scores[:, rank])
    return scores[0] if single else scores
