"""Corpus top-k without the ``[Nq, Nd]`` score matrix: stream the corpus, keep a running top-k."""

import torch

from . import validation as check
from .dispatch import forward
from .layouts import ALLPAIRS
from .quantize import QuantizedTokens
from .settings import memory_budget_bytes

# Bytes per (query, candidate document) while merging: score, key, and their concatenated copies.
_CANDIDATE_BYTES = 48


def _rank_keys(scores: torch.Tensor, first_doc: int) -> torch.Tensor:
    """int64 keys ordered like (score descending, document index ascending), so top-k has no ties.

    The fp32 bits become an order-preserving int32 (NaN above +inf, as torch.topk ranks it) in
    the high half; the complement of the document index fills the low half.
    """
    canonical = torch.where(scores.isnan(), float("nan"), scores + 0.0)  # one NaN, and -0.0 -> +0.0
    bits = canonical.view(torch.int32)
    ordered = torch.where(bits < 0, bits ^ 0x7FFFFFFF, bits).long()
    docs = torch.arange(first_doc, first_doc + scores.size(1), device=scores.device)
    return (ordered << 32) | (0xFFFFFFFF - docs)


def retrieve(Q, corpus, top_k, q_mask=None, d_mask=None, *, chunk_size=None, backend="auto"):
    """The ``top_k`` best documents of ``corpus`` for every query, ties to the lower document index.

    Shapes: Q ``[Nq, Lq, H]``, corpus ``[Nd, Ld, H]``, q_mask ``[Nq, Lq]``, d_mask ``[Nd, Ld]``
    -> scores ``[Nq, top_k]`` fp32 descending, indices ``[Nq, top_k]`` int64.
    The corpus is scored ``chunk_size`` documents at a time (default: as many as the
    ``MAXSIM_TORCH_MEMORY_MB`` budget holds), merging each chunk into the running top-k.
    A quantized corpus (:func:`maxsim.quantize`) is dequantized one chunk at a time.
    """
    if isinstance(Q, QuantizedTokens):
        Q = Q.dequantize()
    quantized = isinstance(corpus, QuantizedTokens)
    if quantized:  # checked through an empty fp32 stand-in: nothing is dequantized up front
        check.embeddings("corpus", corpus.codes[:0].float(), ("Nd", "Ld", "H"))
        Q = Q.float() if isinstance(Q, torch.Tensor) and Q.is_floating_point() else Q
    else:
        corpus = check.embeddings("corpus", corpus, ("Nd", "Ld", "H"))
    Q = check.embeddings("Q", Q, ("Nq", "Lq", "H"))
    check.same_space("Q", Q, "corpus", corpus.codes[:0].float() if quantized else corpus)
    nq, lq = Q.shape[:2]
    nd = corpus.size(0)
    top_k = check.integer("top_k", top_k, 0, nd)
    if chunk_size is None:
        chunk_size = max(1, memory_budget_bytes() // (max(nq, 1) * _CANDIDATE_BYTES))
    chunk_size = check.integer("chunk_size", chunk_size, 1)
    q = check.padded(Q, m=q_mask, mask_name="q_mask")
    d_mask = check.mask("d_mask", d_mask, corpus.shape[:2], corpus.device)

    best_scores = torch.empty((nq, 0), dtype=torch.float32, device=Q.device)
    best_keys = torch.empty((nq, 0), dtype=torch.int64, device=Q.device)
    for start in range(0, nd, chunk_size):
        stop = min(start + chunk_size, nd)
        chunk = corpus[start:stop].dequantize() if quantized else corpus[start:stop]
        d = check.TokenSet(chunk, mask=None if d_mask is None else d_mask[start:stop])
        scores, _ = forward(q, d, ALLPAIRS, max_lq=lq, want_argmax=False, backend=backend)
        candidates = torch.cat([best_scores, scores], dim=1)
        keys = torch.cat([best_keys, _rank_keys(scores, start)], dim=1)
        best_keys, position = torch.topk(keys, min(top_k, keys.size(1)), dim=1)
        best_scores = candidates.gather(1, position)
    return best_scores, 0xFFFFFFFF - (best_keys & 0xFFFFFFFF)
