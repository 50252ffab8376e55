"""Route colpali-engine's late-interaction scoring through maxsim.

    import maxsim.integrations.colpali
    maxsim.integrations.colpali.patch()   # unpatch() undoes it

colpali-engine scores through two functions of `colpali_engine.utils.maxsim`:
`maxsim_inbatch` (`BaseVisualRetrieverProcessor.score_multi_vector` and the in-batch part of every
`Colbert*Loss`) and `maxsim_kd` (the explicit negatives of `ColbertNegativeCELoss` and
`ColbertPairwiseNegativeCELoss`). Both are replaced wherever they were imported, so the losses keep
all of their own logic: temperature, `normalize_scores` (query length counted as rows whose first
value is non-zero), `pos_aware_negative_filtering`, `in_batch_term_weight` and the multi-GPU
`offset`.

colpali-engine has no masks: padding is zero rows, possibly on the left after the trainer gathers
documents across ranks. Its einsum gives a zero row the similarity 0, which takes part in the max
(and wins it when every real similarity is negative); a zero query row contributes 0. maxsim
computes the same numbers when it is given the zero rows as ordinary tokens, so no mask is derived.
Scores come back in the embeddings' dtype, as the einsum's do (accumulated in fp32 before that
rounding).

`use_smooth_max=True` has no kernel: those losses keep their own logsumexp path and warn once.
The patch wins over COLPALI_SCORES_BACKEND.
"""

from __future__ import annotations

import functools

from ._patching import (
    Patcher,
    WarnOnce,
    disabled,
    import_optional,
    logger,
    require_version,
    supported_tensors,
)

# `colpali_engine.utils.maxsim` (both scoring entry points) exists from 0.3.17.
# Tested with 0.3.17 and 0.3.18.
SUPPORTED = ("0.3.17", "0.4.0")

LOSSES = (
    "ColbertLoss",
    "ColbertPairwiseCELoss",
    "ColbertSigmoidLoss",
    "ColbertNegativeCELoss",
    "ColbertPairwiseNegativeCELoss",
)

_patcher = Patcher()
_warn_once = WarnOnce()


def _maxsim_inbatch(original):
    @functools.wraps(original)
    def maxsim_inbatch(query, doc):
        if not (supported_tensors(query, doc) and query.dim() == 3 and doc.dim() == 3):
            return original(query, doc)
        import maxsim

        return maxsim.maxsim(query, doc).to(query.dtype)

    return maxsim_inbatch


def _maxsim_kd(original):
    @functools.wraps(original)
    def maxsim_kd(query, doc):
        if not (
            supported_tensors(query, doc)
            and query.dim() == 3
            and doc.dim() == 4
            and doc.size(0) == query.size(0)
        ):
            return original(query, doc)
        import maxsim

        return maxsim.maxsim(query, doc).to(query.dtype)

    return maxsim_kd


def _warn_on_smooth_max(name: str, forward):
    @functools.wraps(forward)
    def wrapped(self, *args, **kwargs):
        if getattr(self, "use_smooth_max", False):
            _warn_once(
                name,
                f"{name}(use_smooth_max=True) has no maxsim kernel; it keeps colpali-engine's "
                "logsumexp path",
            )
        return forward(self, *args, **kwargs)

    return wrapped


def patch() -> bool:
    """Route colpali-engine's scoring through maxsim. Returns False when MAXSIM_DISABLE is set, True
    when the patch is in place. Raises UnsupportedVersionError for an untested version."""
    if disabled("colpali-engine"):
        return False
    require_version(
        "colpali-engine",
        *SUPPORTED,
        hint="Older versions score inside each loss; upgrade colpali-engine.",
    )
    if _patcher.active:
        return True
    import_optional("colpali_engine.loss", "colpali_engine.utils.processing_utils")
    import colpali_engine.loss.late_interaction_losses as losses
    import colpali_engine.utils.maxsim as scoring

    replacements = {
        id(scoring.maxsim_inbatch): _maxsim_inbatch(scoring.maxsim_inbatch),
        id(scoring.maxsim_kd): _maxsim_kd(scoring.maxsim_kd),
    }
    _patcher.sweep("colpali_engine", replacements)
    for name in LOSSES:
        cls = getattr(losses, name)
        _patcher.swap(cls, "forward", _warn_on_smooth_max(name, cls.__dict__["forward"]))
    logger.info("colpali-engine scoring routed through maxsim")
    return True


def unpatch() -> bool:
    """Put colpali-engine's own functions back. Returns True if a patch was removed."""
    return _patcher.restore()
