"""``erikkaum/maxsim``'s raw backward ops (``maxsim._ops.ops.maxsim_*_backward``), for code that
calls them directly: each gives the gradients of its forward from the forward's argmax, through
the same deterministic backward op the autograd entry points use.

Lengths and the width arguments are accepted for their signature's sake: the argmax (-1 where a
query token is padding or meets no valid document token) already says which tokens take part.
"""

from . import validation as check
from .dispatch import ops_for
from .layouts import ALLPAIRS, GROUPED, PAIRS


def _argmax(argmax, shape):
    """The forward's argmax as the backward op reads it: int32 ``shape``."""
    check.require_tensor("argmax", argmax, f"of shape {list(shape)}")
    if argmax.numel() != _count(shape):
        raise ValueError(f"argmax: expected {list(shape)} ({_count(shape)} values), got shape "
                         f"{list(argmax.shape)}")
    return argmax.reshape(shape).int().contiguous()


def _count(shape):
    n = 1
    for s in shape:
        n *= s
    return n


def _fp32(grads):
    """(dq, dd) in float32, as that project's raw ops return them."""
    return tuple(g.float() for g in grads)


class RawOps:
    """The raw backward ops of that project, by name; each returns float32 ``(dq, dd)`` shaped
    like its ``queries`` and ``documents`` arguments."""

    @staticmethod
    def maxsim_padded_backward(dscore, queries, documents, query_lengths, doc_lengths, argmax,
                               Lq_max, Ld_max, num_candidates):  # noqa: N803 (their names)
        """dscore ``[B*K]``, queries ``[B*Lq, D]``, documents ``[B*K*Ld, D]``, argmax
        ``[B*K, Lq]`` -> dq ``[B*Lq, D]``, dd ``[B*K*Ld, D]``."""
        k, lq, ld = int(num_candidates), int(Lq_max), int(Ld_max)
        b = dscore.numel() // max(k, 1)
        q = queries.reshape(b, lq, -1).contiguous()
        d = documents.reshape(b * k, ld, -1).contiguous()
        grad = dscore.reshape(b, k).float().contiguous()
        dq, dd = ops_for(q).bwd(grad, q, d, _argmax(argmax, (b, k, lq)), None, None, None, None,
                                GROUPED, k)
        return _fp32((dq.reshape(queries.shape), dd.reshape(documents.shape)))

    @staticmethod
    def maxsim_contrastive_backward(dscore, queries, documents, document_offsets, argmax):
        """dscore ``[Nq, Nb]``, queries ``[Nq, Lq, D]``, documents ``[T, D]`` split by
        document_offsets ``[Nb+1]``, argmax ``[Nq, Nb, Lq]``."""
        offsets = check.segment_offsets("document_offsets", document_offsets, documents)
        shape = (*dscore.shape, queries.shape[1])
        return _fp32(ops_for(queries).bwd(dscore.float().contiguous(), queries.contiguous(),
                                          documents.contiguous(), _argmax(argmax, shape), None,
                                          offsets, None, None, ALLPAIRS, 0))

    @staticmethod
    def maxsim_packed_backward(dscore, queries, query_offsets, documents, document_offsets,
                               pair_query_ids, pair_document_ids, argmax, max_q_len):
        """dscore ``[P]``, queries ``[Tq, D]`` and documents ``[Td, D]`` split by their offsets,
        pair ids ``[P]``, argmax ``[P, max_q_len]``."""
        q = check.packed(queries, query_offsets, offsets_name="query_offsets")
        d_offsets = check.segment_offsets("document_offsets", document_offsets, documents)
        pair_q, pair_d = check.pair_ids(
            "pair_query_ids", pair_query_ids, "pair_document_ids", pair_document_ids, q.count,
            d_offsets.shape[0] - 1, queries.device,
        )
        shape = (dscore.numel(), int(max_q_len))
        return _fp32(ops_for(queries).bwd(dscore.float().contiguous(), queries.contiguous(),
                                          documents.contiguous(), _argmax(argmax, shape),
                                          q.offsets, d_offsets, pair_q, pair_d, PAIRS, 0))


RAW_OPS = RawOps()
