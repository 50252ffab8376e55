"""Route sentence-transformers' multi-vector MaxSim similarity through maxsim.

    import maxsim.integrations.sentence_transformers
    maxsim.integrations.sentence_transformers.patch()   # unpatch() undoes it

sentence-transformers 6 scores multi-vector models with `util.similarity.maxsim` and
`maxsim_pairwise` (and through them `mean_maxsim*`, the `multi_vector_encoder.scoring` functions and
its losses). Both are replaced wherever they were imported. Their rules, all kept:

* a document mask excludes tokens from the max (maxsim's validity mask), and a document with no
  valid token scores -1e9 rather than 0;
* a query mask multiplies each token's max, so float masks act as non-negative weights;
* a 3-D tensor given without a mask is masked by its all-zero rows, a list by its item lengths;
* `length_normalize` divides by the number of real query tokens (at least 1);
* scores are fp32 on the documents' device; `device=` picks where they are computed;
* `chunk_elements` only bounds their own einsum's memory: maxsim never builds that tensor, so it is
  accepted and ignored.

Their own input handling (padding, mask derivation, the empty-document fill) is called as is, so
only the score itself changes hands.
"""

from __future__ import annotations

import functools

import torch

from ._patching import (
    Patcher,
    disabled,
    import_optional,
    logger,
    require_version,
    supported_tensors,
)

# The multi-vector similarity functions arrived in 6.0; tested with 6.0.0, 6.1.0 and 6.2.0.
SUPPORTED = ("6.0.0", "7.0.0")

_patcher = Patcher()


def _prepare(st, a, b, a_mask, b_mask, device, length_normalize):
    """sentence-transformers' own input handling: padded embeddings and [batch, tokens] masks for
    both sides on the scoring device, the result device, and the query token counts that
    `length_normalize` divides by. `a`, `b` and their masks are already canonicalised."""
    counts = st._query_token_counts(a, a_mask) if length_normalize else None
    result_device = st._embeddings_device(b) or st._embeddings_device(a) or torch.device("cpu")
    scoring_device = torch.device(device) if device is not None else result_device
    a, a_mask = st._pad_multi_vector_inputs(a, a_mask)
    b, b_mask = st._pad_multi_vector_inputs(b, b_mask)
    if a_mask is not None:
        a_mask = st._fit_mask_width(a_mask, a.shape[1], "a_mask").expand(len(a), -1)
    if b_mask is not None:
        b_mask = st._fit_mask_width(b_mask, b.shape[1], "b_mask").expand(len(b), -1)
    a, a_mask = st._to_device(a, a_mask, scoring_device)
    b, b_mask = st._to_device(b, b_mask, scoring_device)
    return a, b, a_mask, b_mask, counts, result_device


def _score(st, pairwise, a, b, a_mask, b_mask, length_normalize, device):
    import maxsim

    a, b, a_mask, b_mask, counts, result_device = _prepare(
        st, a, b, a_mask, b_mask, device, length_normalize
    )
    q_mask = None
    if a_mask is not None:
        # Their query mask multiplies each token's max: zero drops the token, a weight scales it.
        q_mask = a_mask.bool()
        if a_mask.is_floating_point():
            a = a * a_mask.unsqueeze(-1).to(a.dtype)
    d_mask = b_mask.bool() if b_mask is not None else None
    score = maxsim.maxsim_pairs if pairwise else maxsim.maxsim
    scores = score(a, b, q_mask=q_mask, d_mask=d_mask).float()
    if d_mask is not None:
        empty = ~d_mask.any(dim=-1)
        scores = st._fill_empty_document_scores(scores, empty if pairwise else empty.unsqueeze(0))
    scores = scores.to(result_device)
    if length_normalize:
        counts = counts.to(device=scores.device, dtype=scores.dtype)
        scores = scores / (counts if pairwise else counts.unsqueeze(1))
    return scores


def _eligible(a, b) -> bool:
    """Inputs whose padded form the kernels take: 3-D tensors or lists of 2-D tensors of one kernel
    dtype on one device, and no empty batch (their code defines those results)."""
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return (
            a.dim() == 3
            and b.dim() == 3
            and a.shape[1] > 0
            and b.shape[1] > 0
            and supported_tensors(a, b)
        )
    if isinstance(a, list) and isinstance(b, list) and a and b:
        items = a + b
        return all(
            isinstance(x, torch.Tensor) and x.dim() == 2 for x in items
        ) and supported_tensors(*items)
    return False


def _maxsim(st, original, pairwise: bool):
    @functools.wraps(original)
    def patched(
        a, b, a_mask=None, b_mask=None, chunk_elements=None, length_normalize=False, device=None
    ):
        # Their canonicalisation first (list masks padded, a single 2-D item made a batch of one),
        # so that the eligibility check sees what their scoring code would.
        a, a_mask = st._canonicalize_side(a, a_mask, "a_mask")
        b, b_mask = st._canonicalize_side(b, b_mask, "b_mask")
        if not _eligible(a, b) or (pairwise and len(a) != len(b)):
            return original(a, b, a_mask, b_mask, chunk_elements, length_normalize, device)
        return _score(st, pairwise, a, b, a_mask, b_mask, length_normalize, device)

    return patched


def patch() -> bool:
    """Route sentence-transformers' `maxsim` / `maxsim_pairwise` through maxsim. Returns False when
    MAXSIM_DISABLE is set, True when the patch is in place. Raises UnsupportedVersionError for a
    version without these functions or outside the tested range."""
    if disabled("sentence-transformers"):
        return False
    require_version(
        "sentence-transformers",
        *SUPPORTED,
        hint="Multi-vector maxsim / maxsim_pairwise similarity functions exist from 6.0 on.",
    )
    if _patcher.active:
        return True
    import_optional(
        "sentence_transformers.util",
        "sentence_transformers.multi_vector_encoder",
        "sentence_transformers.multi_vector_encoder.losses",
        "sentence_transformers.multi_vector_encoder.evaluation",
    )
    import sentence_transformers.util.similarity as st

    replacements = {
        id(st.maxsim): _maxsim(st, st.maxsim, pairwise=False),
        id(st.maxsim_pairwise): _maxsim(st, st.maxsim_pairwise, pairwise=True),
    }
    _patcher.sweep("sentence_transformers", replacements)
    logger.info("sentence-transformers multi-vector similarity routed through maxsim")
    return True


def unpatch() -> bool:
    """Put sentence-transformers' own functions back. Returns True if a patch was removed."""
    return _patcher.restore()
