"""Route PyLate's ColBERT scoring through maxsim.

    import maxsim.integrations.pylate
    maxsim.integrations.pylate.patch()   # before building losses; unpatch() undoes it

Replaced: `colbert_scores`, `colbert_scores_pairwise`, `colbert_kd_scores` (in `pylate.scores`,
their defining module, every `from ..scores import ...` copy and every default argument that holds
them, e.g. `Distillation(score_metric=colbert_kd_scores)`) and `ColBERTScores.__call__` (the
contrastive and cached contrastive losses), which becomes one all-pairs call instead of one call
per document group.

PyLate masks by multiplying similarities by the mask, so a masked document token scores exactly 0:
it still takes part in the max (and wins it when every real similarity is negative), a fully masked
document gives 0 per query token, and a masked query token contributes 0. Since
`<q, d> * m == <q, d * m>`, multiplying the embeddings by their masks before scoring reproduces
that result exactly, holes included, and float masks act as the same weights. The masks are
therefore applied to the embeddings, not passed to maxsim as validity masks (which would drop
the 0).
Scores come back in PyLate's dtype: the embeddings' dtype promoted with any floating mask's.
The patch wins over PyLate's own `backend=` argument and PYLATE_SCORES_BACKEND.

`Contrastive(gather_across_devices=True)` under torch.distributed runs
`maxsim.distributed.contrastive_loss` instead of gathering the documents itself: the same loss
and gradients, from one all-gather, one fused step and one reduce-scatter back.
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

# Tested with 1.5.0, 1.5.1 and 1.6.0, whose `pylate.scores` exports the three functions and
# `ColBERTScores`.
SUPPORTED = ("1.5.0", "1.7.0")

_patcher = Patcher()


def _convert(x):
    from pylate.utils.tensor import convert_to_tensor

    return convert_to_tensor(x)


def _result_dtype(dtype: torch.dtype, *masks) -> torch.dtype:
    """The dtype PyLate's `scores * mask` produces: bool/int masks keep the scores' dtype, floating
    masks promote it."""
    for mask in masks:
        if mask is not None and mask.is_floating_point():
            dtype = torch.promote_types(dtype, mask.dtype)
    return dtype


def _apply_mask(embeddings: torch.Tensor, mask) -> torch.Tensor:
    """Zero (or weight) masked tokens: the numbers PyLate gets by multiplying the similarities."""
    if mask is None:
        return embeddings
    return embeddings * mask.unsqueeze(-1).to(embeddings.dtype)


def _masks_fit(embeddings: torch.Tensor, mask) -> bool:
    return mask is None or (
        isinstance(mask, torch.Tensor) and tuple(mask.shape) == tuple(embeddings.shape[:-1])
    )


def _score(queries, documents, queries_mask, documents_mask) -> torch.Tensor:
    import maxsim

    dtype = _result_dtype(queries.dtype, queries_mask, documents_mask)
    scores = maxsim.maxsim(
        _apply_mask(queries, queries_mask), _apply_mask(documents, documents_mask)
    )
    return scores.to(dtype)


def _masked_scores(original, document_dims: int):
    """`colbert_scores` (3-D documents, all pairs) or `colbert_kd_scores` (4-D documents, each
    query with its own candidates): the same arguments, masks and result."""

    @functools.wraps(original)
    def scores(
        queries_embeddings,
        documents_embeddings,
        queries_mask=None,
        documents_mask=None,
        backend=None,
    ):
        q = _convert(queries_embeddings)
        d = _convert(documents_embeddings)
        q_mask = _convert(queries_mask) if queries_mask is not None else None
        d_mask = _convert(documents_mask) if documents_mask is not None else None
        if not (
            supported_tensors(q, d)
            and q.dim() == 3
            and d.dim() == document_dims
            and (document_dims == 3 or d.size(0) == q.size(0))
            and _masks_fit(q, q_mask)
            and _masks_fit(d, d_mask)
        ):
            return original(q, d, q_mask, d_mask, **_backend(backend))
        return _score(q, d, q_mask, d_mask)

    return scores


def _colbert_scores_pairwise(original):
    @functools.wraps(original)
    def colbert_scores_pairwise(queries_embeddings, documents_embeddings, backend=None):
        import maxsim

        if isinstance(queries_embeddings, torch.Tensor) and isinstance(
            documents_embeddings, torch.Tensor
        ):
            q, d = queries_embeddings, documents_embeddings
            if supported_tensors(q, d) and q.dim() == 3 and d.dim() == 3 and len(q) == len(d):
                return maxsim.maxsim_pairs(q, d).to(q.dtype)
            return original(q, d, **_backend(backend))
        # Lists of per-item embeddings of different lengths: PyLate scores each pair on its own, so
        # the padding added here must never take part, hence validity masks (not zeros).
        qs = [_convert(x) for x in queries_embeddings]
        ds = [_convert(x) for x in documents_embeddings]
        if not (
            qs
            and len(qs) == len(ds)
            and supported_tensors(*qs, *ds)
            and all(x.dim() == 2 for x in qs + ds)
        ):
            return original(queries_embeddings, documents_embeddings, **_backend(backend))
        q, q_mask = _pad(qs)
        d, d_mask = _pad(ds)
        return maxsim.maxsim_pairs(q, d, q_mask=q_mask, d_mask=d_mask).to(q.dtype)

    return colbert_scores_pairwise


def _backend(backend) -> dict:
    """PyLate's `backend=` argument for a fallback call; versions before 1.5.1 do not take it."""
    return {} if backend is None else {"backend": backend}


def _pad(items: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    lengths = torch.tensor([len(x) for x in items], device=items[0].device)
    padded = torch.nn.utils.rnn.pad_sequence(items, batch_first=True)
    mask = torch.arange(padded.size(1), device=padded.device) < lengths.unsqueeze(1)
    return padded, mask


def _colbert_scores_call(original_call):
    @functools.wraps(original_call)
    def __call__(
        self,
        queries_embeddings,
        documents_embeddings,
        queries_mask=None,
        documents_mask=None,
        backend=None,
    ):
        q = _convert(queries_embeddings)
        d = _convert(documents_embeddings)
        if not (
            supported_tensors(q, d)
            and q.dim() == 3
            and d.dim() == 4
            and _masks_fit(q, queries_mask)
            and _masks_fit(d, documents_mask)
        ):
            return original_call(self, q, d, queries_mask, documents_mask, **_backend(backend))
        groups, per_group, length, dim = d.shape
        # Column j*N + k is document k of group j: the row-major flattening of [Qd, N].
        flat_mask = (
            documents_mask.reshape(groups * per_group, length)
            if documents_mask is not None
            else None
        )
        return _score(q, d.reshape(groups * per_group, length, dim), queries_mask, flat_mask)

    return __call__


def _gathered_contrastive(original_forward):
    """`Contrastive.forward` that, when it gathers across devices under torch.distributed, runs
    maxsim.distributed.contrastive_loss on the rank's queries and documents (PyLate's own forward
    otherwise)."""

    @functools.wraps(original_forward)
    def forward(self, sentence_features, labels=None):
        import torch.distributed as dist

        if not (
            getattr(self, "gather_across_devices", False)
            and dist.is_available()
            and dist.is_initialized()
        ):
            return original_forward(self, sentence_features, labels)
        return _gathered_loss(self, list(sentence_features), dist.get_world_size())

    return forward


def _gathered_loss(loss, sentence_features, world_size):
    """PyLate's gathered contrastive loss, from maxsim.distributed: each rank's documents are all
    its groups, positives (group 0) first, so query `i`'s positive is the rank's document `i`."""
    from pylate.losses.contrastive import extract_skiplist_mask

    from .. import distributed

    model = getattr(loss.model, "module", loss.model)  # under (D)DP
    embeddings = [
        torch.nn.functional.normalize(loss.model(f)["token_embeddings"], p=2, dim=-1)
        for f in sentence_features
    ]
    masks = extract_skiplist_mask(sentence_features=sentence_features, skiplist=model.skiplist)
    queries = embeddings[0]
    if not model.do_query_expansion:
        queries = _apply_mask(queries, masks[0])
    documents = torch.cat([_apply_mask(e, m) for e, m in zip(embeddings[1:], masks[1:])])
    value = distributed.contrastive_loss(
        queries, documents, temperature=getattr(loss, "temperature", 1.0)
    )
    if not loss.size_average:
        value = value * queries.size(0)
    return (value * world_size).to(queries.dtype)  # PyLate scales its gathered loss so


def patch() -> bool:
    """Route PyLate's scoring through maxsim. Returns False when MAXSIM_DISABLE is set, True when
    the patch is in place. Raises UnsupportedVersionError for an untested PyLate version."""
    if disabled("pylate"):
        return False
    require_version("pylate", *SUPPORTED)
    if _patcher.active:
        return True
    import_optional(
        "pylate.scores",
        "pylate.losses",
        "pylate.rank",
        "pylate.evaluation",
        "pylate.models",
        "pylate.retrieve",
    )
    import pylate.scores as scores

    replacements = {
        id(scores.colbert_scores): _masked_scores(scores.colbert_scores, 3),
        id(scores.colbert_kd_scores): _masked_scores(scores.colbert_kd_scores, 4),
        id(scores.colbert_scores_pairwise): _colbert_scores_pairwise(
            scores.colbert_scores_pairwise
        ),
    }
    _patcher.sweep("pylate", replacements)
    cls = scores.ColBERTScores
    _patcher.swap(cls, "__call__", _colbert_scores_call(cls.__dict__["__call__"]))
    import pylate.losses.contrastive as contrastive

    loss = contrastive.Contrastive
    _patcher.swap(loss, "forward", _gathered_contrastive(loss.__dict__["forward"]))
    logger.info("pylate scoring routed through maxsim")
    return True


def unpatch() -> bool:
    """Put PyLate's own functions back. Returns True if a patch was removed."""
    return _patcher.restore()
