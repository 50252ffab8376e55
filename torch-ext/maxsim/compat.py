"""The compatibility surface: the entry points of ``erikkaum/maxsim`` with the same names, argument
order, shapes and dtypes, so code written against it runs unchanged (docs/API.md).

Unlike there, lengths may be 0, any Lq / D is accepted, and no call syncs with the host except
``score_pairs_packed*`` without ``max_q_len`` (it reads the longest query once). Every function
is autograd-aware; the ``_train`` names are the same functions. Argmax holds -1 where a query token
is padding or meets no valid document token.
"""

from . import validation as check
from .dispatch import forward, fwd
from .layouts import ALLPAIRS, GROUPED, PAIRS
from .native import plain_call


def _candidates(queries, documents, query_lengths, doc_lengths, want_argmax, backend):
    out = plain_call(
        queries, documents, None, None, query_lengths, doc_lengths, want_argmax, backend, 4,
        ("query_lengths", "doc_lengths"),
    )
    if out is not None:  # the native surface's call, as is
        return out
    queries = check.embeddings("queries", queries, ("B", "Lq", "D"))
    documents = check.embeddings("documents", documents, ("B", "K", "Ld", "D"))
    check.same_space("queries", queries, "documents", documents)
    b, lq = queries.shape[:2]
    if documents.size(0) != b:
        raise ValueError(
            f"documents: expected batch {b} like queries [B, K, Ld, D], "
            f"got shape {tuple(documents.shape)}"
        )
    k = documents.size(1)
    q = check.padded(queries, lengths=query_lengths, lengths_name="query_lengths")
    d = check.padded(
        documents.flatten(0, 1), lengths=doc_lengths, lengths_name="doc_lengths",
        lengths_shape=(b, k),
    )
    return forward(q, d, GROUPED, group=k, max_lq=lq, want_argmax=want_argmax, backend=backend)


def score_candidates_padded(queries, documents, query_lengths, doc_lengths, *, backend="auto"):
    """Query ``b`` with its ``K`` candidates.

    Shapes: queries ``[B, Lq, D]``, documents ``[B, K, Ld, D]``, query_lengths ``[B]``,
    doc_lengths ``[B, K]`` (prefix lengths, int32/int64) -> ``[B, K]`` fp32.
    """
    return _candidates(queries, documents, query_lengths, doc_lengths, False, backend)[0]


def score_candidates_padded_with_argmax(
    queries, documents, query_lengths, doc_lengths, *, backend="auto"
):
    """Shapes: as :func:`score_candidates_padded`, plus argmax int32 ``[B, K, Lq]``."""
    return _candidates(queries, documents, query_lengths, doc_lengths, True, backend)


def _contrastive(queries, documents, document_offsets, want_argmax, backend):
    queries = check.embeddings("queries", queries, ("Nq", "Lq", "D"))
    documents = check.embeddings("documents", documents, ("total_d_tokens", "D"))
    check.same_space("queries", queries, "documents", documents)
    offsets = check.segment_offsets("document_offsets", document_offsets, documents)
    return fwd(
        backend, want_argmax, queries, documents, None, None, None, offsets, None, None, None,
        None, ALLPAIRS, 0, queries.shape[1],
    )


def score_contrastive(queries, documents, document_offsets, *, backend="auto"):
    """Every query with every packed document (in-batch contrastive training).

    Shapes: queries ``[Nq, Lq, D]``, documents ``[total_d_tokens, D]``, document_offsets ``[Nb+1]``
    -> ``[Nq, Nb]`` fp32.
    """
    return _contrastive(queries, documents, document_offsets, False, backend)[0]


def score_contrastive_with_argmax(queries, documents, document_offsets, *, backend="auto"):
    """Shapes: as :func:`score_contrastive`, plus argmax int32 ``[Nq, Nb, Lq]``."""
    return _contrastive(queries, documents, document_offsets, True, backend)


def _pairs(
    queries,
    query_offsets,
    documents,
    document_offsets,
    pair_query_ids,
    pair_document_ids,
    max_q_len,
    want_argmax,
    backend,
):
    queries = check.embeddings("queries", queries, ("total_q_tokens", "D"))
    documents = check.embeddings("documents", documents, ("total_d_tokens", "D"))
    check.same_space("queries", queries, "documents", documents)
    q = check.packed(queries, query_offsets, offsets_name="query_offsets")
    d_offsets = check.segment_offsets("document_offsets", document_offsets, documents)
    pair_q, pair_d = check.pair_ids(
        "pair_query_ids",
        pair_query_ids,
        "pair_document_ids",
        pair_document_ids,
        q.count,
        d_offsets.shape[0] - 1,
        queries.device,
    )
    max_lq = check.query_width("max_q_len", max_q_len, q)
    return fwd(
        backend, want_argmax, queries, documents, q.offsets, None, None, d_offsets, None, None,
        pair_q, pair_d, PAIRS, 0, max_lq,
    )


def score_pairs_packed(
    queries,
    query_offsets,
    documents,
    document_offsets,
    pair_query_ids,
    pair_document_ids,
    *,
    max_q_len=None,
    backend="auto",
):
    """Arbitrary (query, document) pairs of packed token sets.

    Shapes: queries ``[total_q_tokens, D]``, query_offsets ``[Nq+1]``, documents
    ``[total_d_tokens, D]``, document_offsets ``[Nd+1]``, pair ids ``[P]`` -> ``[P]`` fp32.
    Without ``max_q_len`` (>= the longest query) the longest query is read from
    ``query_offsets``: one device->host sync; pass it to keep the call sync-free.
    """
    return _pairs(
        queries,
        query_offsets,
        documents,
        document_offsets,
        pair_query_ids,
        pair_document_ids,
        max_q_len,
        False,
        backend,
    )[0]


def score_pairs_packed_with_argmax(
    queries,
    query_offsets,
    documents,
    document_offsets,
    pair_query_ids,
    pair_document_ids,
    *,
    max_q_len=None,
    backend="auto",
):
    """Shapes: as :func:`score_pairs_packed`, plus argmax int32 ``[P, max_q_len]``.

    Without ``max_q_len`` the argmax is as wide as the longest query, read from ``query_offsets``
    (one device->host sync); pass ``max_q_len`` (>= the longest query) to avoid it.
    """
    return _pairs(
        queries,
        query_offsets,
        documents,
        document_offsets,
        pair_query_ids,
        pair_document_ids,
        max_q_len,
        True,
        backend,
    )


# The plain functions are autograd-aware; these names keep code written for the peer running.
score_candidates_padded_train = score_candidates_padded
score_contrastive_train = score_contrastive
score_pairs_packed_train = score_pairs_packed
