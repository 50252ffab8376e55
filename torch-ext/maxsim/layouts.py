"""Which (query, document) pairs an op call scores, and the shape of its scores.

Shared by the fallback implementation and the fake (meta) kernels so both agree on shapes.
"""

import torch

ALLPAIRS = 0  # every query with every document -> [Nq, Nd]
GROUPED = 1  # query i with documents i*G .. i*G+G-1 -> [Nq, G]
PAIRS = 2  # pair p: query pair_q[p] with document pair_d[p] -> [P]


def segment_count(x: torch.Tensor, offsets) -> int:
    """Segments ``N`` of a token set: padded ``x [N, L, H]``, or packed ``offsets [N+1]``."""
    return x.size(0) if x.dim() == 3 else offsets.size(0) - 1


def scores_shape(q, d, q_offsets, d_offsets, pair_q, layout: int, group: int) -> tuple:
    """Shape of the fp32 scores of ``fwd`` for this layout."""
    if layout == ALLPAIRS:
        return (segment_count(q, q_offsets), segment_count(d, d_offsets))
    if layout == GROUPED:
        return (segment_count(q, q_offsets), group)
    if layout == PAIRS:
        return (pair_q.size(0),)
    raise ValueError(f"layout: expected {ALLPAIRS}, {GROUPED} or {PAIRS}, got {layout}")
