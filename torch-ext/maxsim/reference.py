"""Plain float64 PyTorch MaxSim: the obviously-correct baseline of the tests and the
``*_reference`` twins.

It builds the whole ``[.., Lq, Ld]`` similarity tensor in float64 and reads offsets on the host:
slow and memory-hungry on purpose. It is differentiable, so its float64 autograd is the
gradient reference too.
"""

import torch

from .layouts import ALLPAIRS, GROUPED, PAIRS


def maxsim_reference_padded(Q, q_valid, D, d_valid):
    """MaxSim of padded blocks whose leading dims broadcast.

    Shapes: ``Q [..., Lq, H]``, ``q_valid [..., Lq]``, ``D [..., Ld, H]``, ``d_valid [..., Ld]``
    -> scores float64 ``[...]``, argmax int64 ``[..., Lq]`` (-1: invalid query token, or no valid
    document token).
    """
    Q = torch.where(q_valid[..., None], Q.double(), 0.0)  # padding never reaches the arithmetic
    D = torch.where(d_valid[..., None], D.double(), 0.0)
    sim = torch.einsum("...th,...sh->...ts", Q, D)
    d_valid = d_valid[..., None, :].expand(sim.shape)
    counts = q_valid.expand(sim.shape[:-1]) & d_valid.any(-1)
    if sim.size(-1) == 0:
        values = sim.new_zeros(sim.shape[:-1])
        index = torch.full(sim.shape[:-1], -1, dtype=torch.long, device=sim.device)
    else:
        sim = sim.masked_fill(~d_valid, float("-inf"))
        values, index = sim.max(dim=-1)  # ties: the lowest index
        first_valid = d_valid.long().argmax(-1)
        index = torch.where(values == float("-inf"), first_valid, index)
        is_nan = sim.isnan()
        index = torch.where(is_nan.any(-1), is_nan.long().argmax(-1), index)  # the first NaN wins
    values = torch.where(counts, values, 0.0)
    index = torch.where(counts, index, -1)
    return values.sum(-1), index


def _as_padded(x, offsets, lengths, mask):
    """A token set as padded float64 ``[N, L, H]`` plus validity ``[N, L]`` (loops on the host)."""
    if x.dim() == 3:
        valid = torch.ones(x.shape[:2], dtype=torch.bool, device=x.device)
        if lengths is not None:
            valid &= torch.arange(x.size(1), device=x.device) < lengths[:, None].long()
        if mask is not None:
            valid &= mask.bool()
        return x.double(), valid
    bounds = offsets.tolist()
    spans = list(zip(bounds[:-1], bounds[1:], strict=True))
    width = max((end - start for start, end in spans), default=0)
    out = x.new_zeros((len(spans), width, x.size(-1)), dtype=torch.float64)
    valid = torch.zeros((len(spans), width), dtype=torch.bool, device=x.device)
    for n, (start, end) in enumerate(spans):
        out[n, : end - start] = x[start:end].double()
        valid[n, : end - start] = True if mask is None else mask[start:end].bool()
    return out, valid


def reference_fwd(
    q,
    d,
    q_offsets=None,
    q_lengths=None,
    q_mask=None,
    d_offsets=None,
    d_lengths=None,
    d_mask=None,
    pair_q=None,
    pair_d=None,
    layout=ALLPAIRS,
    group=0,
    max_lq=None,
):
    """The ``fwd`` op in float64: same arguments; scores float64, argmax int32 ``[..., max_lq]``."""
    Q, q_valid = _as_padded(q, q_offsets, q_lengths, q_mask)
    D, d_valid = _as_padded(d, d_offsets, d_lengths, d_mask)
    if layout == ALLPAIRS:
        Q, q_valid, D, d_valid = Q[:, None], q_valid[:, None], D[None], d_valid[None]
    elif layout == GROUPED:
        Q, q_valid = Q[:, None], q_valid[:, None]
        D, d_valid = D.view(Q.size(0), group, *D.shape[1:]), d_valid.view(Q.size(0), group, -1)
    elif layout == PAIRS:
        Q, q_valid = Q[pair_q.long()], q_valid[pair_q.long()]
        D, d_valid = D[pair_d.long()], d_valid[pair_d.long()]
    scores, argmax = maxsim_reference_padded(Q, q_valid, D, d_valid)
    width = argmax.size(-1) if max_lq is None else max_lq
    out = torch.full((*argmax.shape[:-1], width), -1, dtype=torch.int32, device=argmax.device)
    keep = min(width, argmax.size(-1))
    out[..., :keep] = argmax[..., :keep].to(torch.int32)
    return scores, out


def _prefix_valid(lengths, width):
    return torch.arange(width, device=lengths.device) < lengths[..., None].long()


# Compatibility twins: same arguments as the functions in compat.py, float64 inside, fp32 out.


def maxsim_reference(q, d):
    """One pair: ``q [Lq, H]``, ``d [Ld, H]`` -> scalar fp32 score."""
    return maxsim_reference_with_argmax(q, d)[0]


def maxsim_reference_with_argmax(q, d):
    """One pair: ``q [Lq, H]``, ``d [Ld, H]`` -> (scalar fp32 score, int32 argmax ``[Lq]``)."""
    scores, argmax = maxsim_reference_padded(
        q,
        torch.ones(q.shape[:1], dtype=torch.bool, device=q.device),
        d,
        torch.ones(d.shape[:1], dtype=torch.bool, device=d.device),
    )
    return scores.float(), argmax.to(torch.int32)


def score_candidates_padded_with_argmax_reference(queries, documents, query_lengths, doc_lengths):
    """Shapes: ``queries [B, Lq, D]``, ``documents [B, K, Ld, D]``, lengths ``[B]`` and ``[B, K]``
    -> ``[B, K]``, ``[B, K, Lq]``."""
    q_valid = _prefix_valid(query_lengths, queries.size(1))
    d_valid = _prefix_valid(doc_lengths, documents.size(2))
    scores, argmax = maxsim_reference_padded(queries[:, None], q_valid[:, None], documents, d_valid)
    return scores.float(), argmax.to(torch.int32)


def score_candidates_padded_reference(queries, documents, query_lengths, doc_lengths):
    return score_candidates_padded_with_argmax_reference(
        queries, documents, query_lengths, doc_lengths
    )[0]


def score_contrastive_with_argmax_reference(queries, documents, document_offsets):
    """Shapes: ``queries [Nq, Lq, D]``, ``documents [Td, D]``, ``document_offsets [Nb+1]``
    -> ``[Nq, Nb]``, ``[Nq, Nb, Lq]``."""
    scores, argmax = reference_fwd(queries, documents, d_offsets=document_offsets, layout=ALLPAIRS)
    return scores.float(), argmax


def score_contrastive_reference(queries, documents, document_offsets):
    return score_contrastive_with_argmax_reference(queries, documents, document_offsets)[0]


def score_pairs_packed_with_argmax_reference(
    queries,
    query_offsets,
    documents,
    document_offsets,
    pair_query_ids,
    pair_document_ids,
    max_q_len=None,
):
    """Shapes: packed queries and documents, pair ids ``[P]`` -> ``[P]``, ``[P, max_q_len]``
    (default width: the longest query)."""
    scores, argmax = reference_fwd(
        queries,
        documents,
        q_offsets=query_offsets,
        d_offsets=document_offsets,
        pair_q=pair_query_ids,
        pair_d=pair_document_ids,
        layout=PAIRS,
        max_lq=max_q_len,
    )
    return scores.float(), argmax


def score_pairs_packed_reference(
    queries,
    query_offsets,
    documents,
    document_offsets,
    pair_query_ids,
    pair_document_ids,
    max_q_len=None,
):
    return score_pairs_packed_with_argmax_reference(
        queries,
        query_offsets,
        documents,
        document_offsets,
        pair_query_ids,
        pair_document_ids,
        max_q_len,
    )[0]
