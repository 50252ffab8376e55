"""Corpus top-k without the ``[Nq, Nd]`` score matrix: stream the corpus, keep a running top-k."""

import torch

from . import validation as check
from .dispatch import forward, select_ops
from .layouts import ALLPAIRS, PAIRS
from .quantize import QuantizedTokens, scaled_operands
from .settings import memory_budget_bytes

# Bytes per (query, candidate document) while merging: score, key, and their concatenated copies.
_CANDIDATE_BYTES = 48


def _rank_keys(scores: torch.Tensor, docs: torch.Tensor) -> torch.Tensor:
    """int64 keys ordered like (score descending, document index ascending), so top-k has no ties.

    The fp32 bits become an order-preserving int32 (NaN above +inf, as torch.topk ranks it) in
    the high half; the complement of the document index (``docs``, broadcast against
    ``scores``) fills the low half.
    """
    canonical = torch.where(scores.isnan(), float("nan"), scores + 0.0)  # one NaN, and -0.0 -> +0.0
    bits = canonical.view(torch.int32)
    ordered = torch.where(bits < 0, bits ^ 0x7FFFFFFF, bits).long()
    return (ordered << 32) | (0xFFFFFFFF - docs)


def _doc_of(keys: torch.Tensor) -> torch.Tensor:
    return 0xFFFFFFFF - (keys & 0xFFFFFFFF)


def retrieve(
    Q, corpus, top_k, q_mask=None, d_mask=None, *, q_lengths=None, d_lengths=None, rescore=None,
    candidates=None, chunk_size=None, backend="auto",
):
    """The ``top_k`` best documents of ``corpus`` for every query, ties to the lower document index.

    Shapes: Q ``[Nq, Lq, H]``, corpus ``[Nd, Ld, H]``, q_mask ``[Nq, Lq]``, d_mask ``[Nd, Ld]``,
    q_lengths ``[Nq]``, d_lengths ``[Nd]`` (prefix lengths, combinable with masks, as in
    :func:`maxsim.maxsim`) -> scores ``[Nq, top_k]`` fp32 descending, indices ``[Nq, top_k]``
    int64.
    The corpus is scored ``chunk_size`` documents at a time (default: as many as the
    ``MAXSIM_TORCH_MEMORY_MB`` budget holds), merging each chunk into the running top-k.
    A quantized corpus (:func:`maxsim.quantize`) streams its 8-bit codes through the CUDA kernels
    where they apply (see :mod:`maxsim.quantize`), else it is dequantized one chunk at a time.

    Two stages: with ``rescore`` (the same documents in the queries' dtype, ``[Nd, Ld, H]``, e.g.
    the embeddings a quantized ``corpus`` was made from), the scan keeps ``candidates`` documents
    per query (default ``min(4 * top_k, Nd)``) and their exact scores against ``rescore`` pick
    the ``top_k``, which are the scores returned (quantized queries are dequantized for it). The
    candidates are scored in place (pairs of query and document ids): nothing is gathered.
    """
    if rescore is not None:
        return _two_stage(Q, corpus, top_k, (q_mask, d_mask, q_lengths, d_lengths), rescore,
                          candidates, chunk_size, backend)
    if candidates is not None:
        raise ValueError("candidates: only used with rescore= (the two-stage search)")
    quantized = isinstance(corpus, QuantizedTokens)
    scaled = None  # the kernels' scaled operands, worked out on an empty slice of the corpus
    if (quantized or isinstance(Q, QuantizedTokens)) and isinstance(
        Q, (torch.Tensor, QuantizedTokens)
    ):
        ops = select_ops(Q.device, backend)
        scaled = scaled_operands(Q, corpus[:0], normalize=False, ops=ops)
    q_scale = None
    if scaled is not None:
        Q, q_scale = scaled[0], scaled[1]
    elif isinstance(Q, QuantizedTokens):
        Q = Q.dequantize()
    codes = quantized and scaled is not None
    if quantized:  # checked through an empty stand-in: nothing is converted up front
        stand_in = corpus.codes[:0] if codes else corpus.codes[:0].float()
        check.embeddings("corpus", stand_in, ("Nd", "Ld", "H"), codes=True)
        if not codes and isinstance(Q, torch.Tensor) and Q.is_floating_point():
            Q = Q.float()
    else:
        corpus = stand_in = check.embeddings("corpus", corpus, ("Nd", "Ld", "H"))
    Q = check.embeddings("Q", Q, ("Nq", "Lq", "H"), codes=q_scale is not None)
    check.same_space("Q", Q, "corpus", stand_in, same_dtype=not codes)
    nq, lq = Q.shape[:2]
    nd = corpus.size(0)
    top_k = check.integer("top_k", top_k, 0, nd)
    if chunk_size is None:
        chunk_size = max(1, memory_budget_bytes() // (max(nq, 1) * _CANDIDATE_BYTES))
    chunk_size = check.integer("chunk_size", chunk_size, 1)
    q = _padded_side(Q, q_mask, q_lengths, "q")._replace(scale=q_scale)
    whole = _padded_side(corpus.codes if quantized else corpus, d_mask, d_lengths, "d")

    best_scores = torch.empty((nq, 0), dtype=torch.float32, device=Q.device)
    best_keys = torch.empty((nq, 0), dtype=torch.int64, device=Q.device)
    for start in range(0, nd, chunk_size):
        stop = min(start + chunk_size, nd)
        chunk, chunk_scale = corpus[start:stop], None
        if codes:
            chunk, chunk_scale = chunk.codes, chunk.scale.float()
        elif quantized:
            chunk = chunk.dequantize()
        d = check.TokenSet(chunk, lengths=_rows(whole.lengths, start, stop),
                           mask=_rows(whole.mask, start, stop), scale=chunk_scale)
        scores, _ = forward(q, d, ALLPAIRS, max_lq=lq, want_argmax=False, backend=backend)
        candidates = torch.cat([best_scores, scores], dim=1)
        docs = torch.arange(start, stop, device=scores.device)
        keys = torch.cat([best_keys, _rank_keys(scores, docs)], dim=1)
        best_keys, position = torch.topk(keys, min(top_k, keys.size(1)), dim=1)
        best_scores = candidates.gather(1, position)
    return best_scores, _doc_of(best_keys)


def _padded_side(x, m, lengths, side):
    """The validated mask and prefix lengths of ``x`` (``side`` "q" or "d" names them)."""
    return check.padded(x, lengths=lengths, lengths_name=f"{side}_lengths", m=m,
                        mask_name=f"{side}_mask")


def _rows(t, start, stop):
    return None if t is None else t[start:stop]


def _two_stage(Q, corpus, top_k, validity, rescore, candidates, chunk_size, backend):
    """retrieve's scan for ``candidates`` documents per query, then their exact scores.
    ``validity`` is ``(q_mask, d_mask, q_lengths, d_lengths)``."""
    q_mask, d_mask, q_lengths, d_lengths = validity
    codes = corpus.codes if isinstance(corpus, QuantizedTokens) else corpus
    check.embeddings("corpus", codes, ("Nd", "Ld", "H"), codes=True)
    rescore = check.embeddings("rescore", rescore, ("Nd", "Ld", "H"))
    queries = Q.dequantize(rescore.dtype) if isinstance(Q, QuantizedTokens) else Q
    queries = check.embeddings("Q", queries, ("Nq", "Lq", "H"))
    check.same_space("Q", queries, "rescore", rescore)
    if tuple(rescore.shape[:2]) != tuple(corpus.shape[:2]):
        raise ValueError(
            f"rescore: expected the corpus's [Nd, Ld] = {list(corpus.shape[:2])} in its first "
            f"two dims, got {list(rescore.shape)}"
        )
    nq, lq = queries.shape[:2]
    nd = rescore.size(0)
    top_k = check.integer("top_k", top_k, 0, nd)
    if candidates is None:
        candidates = min(4 * top_k, nd)
    candidates = check.integer("candidates", candidates, top_k, nd)
    _, docs = retrieve(Q, corpus, candidates, q_mask, d_mask, q_lengths=q_lengths,
                       d_lengths=d_lengths, chunk_size=chunk_size, backend=backend)
    # int32 ids, as the op takes them (queries in order: each query's tile loads once)
    pair_q = torch.arange(nq, dtype=torch.int32, device=docs.device).repeat_interleave(candidates)
    q = _padded_side(queries, q_mask, q_lengths, "q")
    d = _padded_side(rescore, d_mask, d_lengths, "d")
    pair_d = docs.reshape(-1).to(torch.int32)
    scores, _ = forward(q, d, PAIRS, pair_q=pair_q, pair_d=pair_d, max_lq=lq,
                        want_argmax=False, backend=backend)
    scores = scores.view(nq, candidates)
    best_keys, position = torch.topk(_rank_keys(scores, docs), top_k, dim=1)
    return scores.gather(1, position), _doc_of(best_keys)
