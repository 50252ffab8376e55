"""What unchecked index values do (docs/API.md, "Bad index values"): the segments and pairs they
make invalid, whose scores are NaN, so the pure-PyTorch path answers as the CUDA kernels do.
Vectorised, without a device->host sync."""

import torch

from .layouts import ALLPAIRS, PAIRS, segment_count


def invalid_segments(x, offsets, lengths, width=None):
    """Segments of a token set that no kernel may read: bool ``[N]``, or None when all are fine.

    Packed ``x [T, H]``: offsets outside ``[0, T]`` or decreasing, or (``width``, the ``max_lq``
    hint of packed queries) longer than ``width``. Padded ``x [N, L, H]``: ``lengths`` outside
    ``[0, L]``.
    """
    if x.dim() == 2:
        start, end = offsets[:-1], offsets[1:]
        bad = (start < 0) | (end > x.size(0)) | (end < start)
        return bad if width is None else bad | (end - start > width)
    if lengths is None:
        return None
    return (lengths < 0) | (lengths > x.size(1))


def clamped_ids(ids, count):
    """Pair ids clamped into ``[0, count)`` (``count`` > 0), so gathers stay in bounds."""
    return None if ids is None else ids.clamp(0, max(count - 1, 0))


def invalid_pairs(scores, layout, pair_q, pair_d, q_bad, d_bad, nq, nd):
    """Which ``scores`` are NaN: pairs with an invalid segment or an id out of range (bool like
    ``scores``), or None when nothing can be."""
    if layout != PAIRS:
        if q_bad is None and d_bad is None:
            return None
        bad = torch.zeros(scores.shape, dtype=torch.bool, device=scores.device)
        if q_bad is not None:
            bad |= q_bad[:, None]
        if d_bad is not None:
            bad |= d_bad[None, :] if layout == ALLPAIRS else d_bad.view(scores.shape)
        return bad
    bad = (pair_q < 0) | (pair_q >= nq) | (pair_d < 0) | (pair_d >= nd)
    if q_bad is not None and nq:
        bad |= q_bad[clamped_ids(pair_q, nq).long()]
    if d_bad is not None and nd:
        bad |= d_bad[clamped_ids(pair_d, nd).long()]
    return bad


def bad_scores(scores, layout, q, d, q_offsets, q_lengths, d_offsets, d_lengths, pair_q, pair_d,
               max_lq):
    """``invalid_pairs`` of a ``fwd`` call's arguments: packed queries longer than ``max_lq``,
    bad lengths, offsets and ids (bool like ``scores``), or None when nothing can be bad."""
    return invalid_pairs(
        scores, layout, pair_q, pair_d, invalid_segments(q, q_offsets, q_lengths, max_lq),
        invalid_segments(d, d_offsets, d_lengths), segment_count(q, q_offsets),
        segment_count(d, d_offsets),
    )
