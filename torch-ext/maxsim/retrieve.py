"""Corpus top-k without the ``[Nq, Nd]`` score matrix: stream the corpus, keep a running top-k."""

import torch

from . import validation as check
from .corpus import Corpus
from .dispatch import forward, select_ops
from .layouts import ALLPAIRS, PAIRS
from .quantize import QuantizedTokens, quantize, scaled_operands
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

    A packed :class:`maxsim.Corpus` (no padding, no ``d_mask`` / ``d_lengths``) is scanned
    ``chunk_size`` documents at a time on the all-pairs kernels: its float tokens, or its codes
    when it holds no tokens. With ``rescore=True`` a corpus holding both is searched in two
    stages: its int8 codes against int8 queries (quantized per call: integer tensor cores)
    keep ``candidates`` documents per query, which are rescored exactly against its tokens
    (a query holding NaN scores NaN for its candidates, which the scan chose).
    """
    if isinstance(corpus, Corpus):
        if d_mask is not None or d_lengths is not None:
            raise ValueError("d_mask / d_lengths: a Corpus holds only valid tokens; expected None")
        return _retrieve_packed(Q, corpus, top_k, (q_mask, q_lengths), rescore, candidates,
                                chunk_size, backend)
    if rescore is not None:
        return _two_stage(Q, corpus, top_k, (q_mask, d_mask, q_lengths, d_lengths), rescore,
                          candidates, chunk_size, backend)
    if candidates is not None:
        raise ValueError("candidates: only used with rescore= (the two-stage search)")
    quantized = isinstance(corpus, QuantizedTokens)
    Q, q_scale, scaled = _scan_queries(Q, corpus[:0], backend)
    codes = quantized and scaled
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

    best = _no_candidates(nq, Q.device)
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
        best = _merge(best, scores, start, top_k)
    best_scores, best_keys = best
    return best_scores, _doc_of(best_keys)


def _scan_queries(Q, empty_corpus, backend):
    """``(Q, q_scale, scaled)``: the queries as the kernels take them against ``empty_corpus``
    (an empty slice of the corpus's tokens or codes); ``scaled`` says whether the call runs on
    the scaled kernels (8-bit operands kept), else quantized queries come back dequantized."""
    scaled = None
    quantized = isinstance(empty_corpus, QuantizedTokens) or isinstance(Q, QuantizedTokens)
    if quantized and isinstance(Q, (torch.Tensor, QuantizedTokens)):
        ops = select_ops(Q.device, backend)
        scaled = scaled_operands(Q, empty_corpus, normalize=False, ops=ops)
    if scaled is not None:
        return scaled[0], scaled[1], True
    if isinstance(Q, QuantizedTokens):
        Q = Q.dequantize()
    return Q, None, False


def _no_candidates(nq, device):
    return (torch.empty((nq, 0), dtype=torch.float32, device=device),
            torch.empty((nq, 0), dtype=torch.int64, device=device))


def _merge(best, scores, start, top_k):
    """The running ``(scores, keys)`` top-k merged with a chunk's ``scores [Nq, n]`` of
    documents ``start .. start + n - 1``: the chunk's own top-k first, so that only ``2 * top_k``
    candidates per query are concatenated."""
    docs = torch.arange(start, start + scores.size(1), device=scores.device)
    chunk_keys, position = torch.topk(_rank_keys(scores, docs), min(top_k, scores.size(1)), dim=1)
    chunk_scores = scores.gather(1, position)
    best_scores, best_keys = best
    if best_keys.size(1) == 0:
        return chunk_scores, chunk_keys
    keys = torch.cat([best_keys, chunk_keys], dim=1)
    best_keys, position = torch.topk(keys, min(top_k, keys.size(1)), dim=1)
    return torch.cat([best_scores, chunk_scores], dim=1).gather(1, position), best_keys


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
    q = _padded_side(queries, q_mask, q_lengths, "q")
    d = _padded_side(rescore, d_mask, d_lengths, "d")
    return _exact_top_k(q, d, docs, top_k, lq, backend)


def _exact_top_k(q, d, docs, top_k, max_lq, backend, pair_docs=None):
    """The exact scores of each query's candidates ``docs [Nq, C]`` (pairs of ids, scored in
    place) and the ``top_k`` of them, ties to the lower document index. ``pair_docs``: the
    candidates' rows in ``d`` where they differ from ``docs``."""
    nq, count = docs.shape
    # int32 ids, as the op takes them (queries in order: each query's tile loads once)
    pair_q = torch.arange(nq, dtype=torch.int32, device=docs.device).repeat_interleave(count)
    pair_d = (docs if pair_docs is None else pair_docs).reshape(-1).to(torch.int32)
    scores, _ = forward(q, d, PAIRS, pair_q=pair_q, pair_d=pair_d, max_lq=max_lq,
                        want_argmax=False, backend=backend)
    scores = scores.view(nq, count)
    best_keys, position = torch.topk(_rank_keys(scores, docs), top_k, dim=1)
    return scores.gather(1, position), _doc_of(best_keys)


def _retrieve_packed(Q, corpus, top_k, q_validity, rescore, candidates, chunk_size, backend):
    """retrieve over a packed :class:`Corpus`; ``q_validity`` is ``(q_mask, q_lengths)``."""
    if rescore not in (None, False, True):
        raise TypeError(f"rescore: with a Corpus, expected True or False (its own tokens rescore"
                        f"), got {type(rescore).__name__}")
    nd = len(corpus)
    top_k = check.integer("top_k", top_k, 0, nd)
    if not rescore:
        if candidates is not None:
            raise ValueError("candidates: only used with rescore=True (the two-stage search)")
        return _scan_packed(Q, corpus, top_k, q_validity, chunk_size, backend)
    if corpus.codes is None or corpus.tokens is None:
        raise ValueError(f"corpus: rescore=True needs codes and tokens (Corpus.with_codes), got "
                         f"{corpus!r}")
    if isinstance(Q, QuantizedTokens):
        raise TypeError("Q: rescore=True takes float queries (they are quantized for the scan)")
    candidates = min(4 * top_k, nd) if candidates is None else candidates
    candidates = check.integer("candidates", candidates, top_k, nd)
    scan_q = Q
    if corpus.codes.format == "int8" and isinstance(Q, torch.Tensor) and Q.is_cuda:
        scan_q = quantize(Q, "int8", check_finite=False)  # int8 x int8 on the integer cores
    _, docs = _scan_packed(scan_q, corpus.codes_only(), candidates, q_validity, chunk_size,
                           backend)
    return _rescore_packed(Q, corpus, docs, top_k, q_validity, backend)


def _scan_packed(Q, corpus, top_k, q_validity, chunk_size, backend):
    """The exact top-k of ``Q`` over the corpus's tokens, or over its codes when it has none."""
    use_codes = corpus.tokens is None
    whole = corpus.codes if use_codes else corpus.tokens
    Q, q_scale, scaled = _scan_queries(Q, whole[:0], backend)
    kept_codes = use_codes and scaled
    if use_codes and not scaled:
        check.embeddings("corpus", whole.codes[:0].float(), ("T", "H"), codes=True)
        stand_in = whole.codes[:0].float()
        if isinstance(Q, torch.Tensor) and Q.is_floating_point():
            Q = Q.float()
    else:
        stand_in = whole.codes[:0] if use_codes else whole
        check.embeddings("corpus", stand_in, ("T", "H"), codes=use_codes)
    Q = check.embeddings("Q", Q, ("Nq", "Lq", "H"), codes=q_scale is not None)
    check.same_space("Q", Q, "corpus", stand_in, same_dtype=not kept_codes)
    nq, lq = Q.shape[:2]
    if chunk_size is None:
        chunk_size = max(1, memory_budget_bytes() // (max(nq, 1) * _CANDIDATE_BYTES))
    chunk_size = check.integer("chunk_size", chunk_size, 1)
    q_mask, q_lengths = q_validity
    q = _padded_side(Q, q_mask, q_lengths, "q")._replace(scale=q_scale)
    best = _no_candidates(nq, Q.device)
    for start in range(0, len(corpus), chunk_size):
        stop = min(start + chunk_size, len(corpus))
        x, offsets, scale = corpus.chunk(start, stop, use_codes)
        if use_codes and not scaled:
            x, scale = (x.float() * scale[:, None]), None
        d = check.TokenSet(x, offsets=check.op_index(offsets),
                           scale=None if scale is None else scale.float())
        scores, _ = forward(q, d, ALLPAIRS, max_lq=lq, want_argmax=False, backend=backend)
        best = _merge(best, scores, start, top_k)
    best_scores, best_keys = best
    return best_scores, _doc_of(best_keys)


def _rescore_packed(Q, corpus, docs, top_k, q_validity, backend):
    """The exact top-k among candidates ``docs [Nq, C]`` by the corpus's float tokens; tokens
    held on another device (host memory) are copied over for the candidates only."""
    Q = check.embeddings("Q", Q, ("Nq", "Lq", "H"))
    tokens, offsets, pair_docs = corpus.tokens, corpus.offsets, None
    if tokens.device != Q.device:
        unique, local = torch.unique(docs, return_inverse=True)
        tokens, offsets = corpus.gather(unique, Q.device)
        pair_docs = local.view_as(docs)
    check.same_space("Q", Q, "corpus", tokens[:0])
    q = _padded_side(Q, *q_validity, "q")
    d = check.TokenSet(tokens, offsets=check.op_index(offsets))
    return _exact_top_k(q, d, docs, top_k, Q.size(1), backend, pair_docs)
