"""The native surface: what PyLate / colpali-engine users call (docs/API.md).

Every function validates, reshapes (views), optionally L2-normalises, and runs the one ``fwd`` op.
All are autograd-aware: when an input requires grad the op also returns the int32 argmax, which
is all that backward keeps besides the inputs themselves.
"""

import torch
import torch.nn.functional as F

from . import validation as check
from .dispatch import forward, fwd, select_ops
from .layouts import ALLPAIRS, GROUPED, PAIRS
from .quantize import QuantizedTokens, resolve, scaled_operands
from .validation import TokenSet


def _normalized(x: torch.Tensor, normalize: bool) -> torch.Tensor:
    return F.normalize(x, dim=-1) if normalize else x


def operands(Q, D, normalize, backend):
    """``(Q, D, q_scale, d_scale)``: quantized inputs as the CUDA kernels' scaled operands where
    they apply (8-bit codes stay 8-bit), else dequantized to fp32 (scales None); float inputs cast
    under autocast."""
    quantized = type(Q) is QuantizedTokens or type(D) is QuantizedTokens
    if quantized and isinstance(Q, (torch.Tensor, QuantizedTokens)):
        scaled = scaled_operands(Q, D, normalize=normalize, ops=select_ops(Q.device, backend))
        if scaled is not None:
            return scaled[0], scaled[2], scaled[1], scaled[3]
    Q, D = check.autocast_pair(*resolve(Q, D))
    return Q, D, None, None


_LENGTH_NAMES = ("q_lengths", "d_lengths")


def _op_tensor(t, dtype, shape, device) -> bool:
    """Whether ``t`` is already what the op takes as it is: a contiguous ``dtype`` tensor of
    ``shape`` on ``device``."""
    return (
        type(t) is torch.Tensor and t.dtype == dtype and t.device == device and t.shape == shape
        and t.is_contiguous()
    )


def _index_tensor(t, shape, device) -> bool:
    """Whether ``t`` is contiguous int32 / int64 of ``shape`` on ``device``."""
    return (
        type(t) is torch.Tensor and t.dtype in check.INDEX_DTYPES and t.device == device
        and t.shape == shape and t.is_contiguous()
    )


def _plain_parts(
    Q, D, q_mask, d_mask, q_lengths, d_lengths, codes=False, d_rank=None, names=_LENGTH_NAMES
):
    """What the op takes for the most common calls (plain tensors of one float dtype, no
    normalisation, no autocast, contiguous int32 / int64 prefix lengths and bool masks of the
    right shapes, or none): ``(d_x, q_lengths, q_mask, d_lengths, d_mask, layout, group)``;
    None when the call is anything else (the checked path then converts it or raises what it
    must). Shapes and dtypes only: the host work of a small call is its whole time. ``codes``: Q and D are already
    the kernels' scaled operands (:func:`quantize.scaled_operands` checked their dtypes);
    ``d_rank``: the only rank of ``D`` taken (None: 3 or 4); ``names``: the lengths' argument
    names in errors."""
    if type(Q) is not torch.Tensor or type(D) is not torch.Tensor:
        return None
    q_shape, d_shape = Q.shape, D.shape
    rank = len(d_shape)
    if len(q_shape) != 3 or not (rank == d_rank if d_rank else 3 <= rank <= 4):
        return None
    nq, lq, h = q_shape
    dtype = Q.dtype
    if (
        (not codes and (D.dtype != dtype or dtype not in check.FLOAT_DTYPES)) or h == 0
        or d_shape[-1] != h or (rank == 4 and d_shape[0] != nq)
        or Q.stride()[-1] != 1 or D.stride()[-1] != 1
    ):
        return None
    device = Q.device
    if D.device != device or (
        not codes and torch._C._is_any_autocast_enabled() and check.autocast_enabled(device.type)
    ):
        return None
    if q_lengths is not None or d_lengths is not None:
        if (
            (q_lengths is not None and not _index_tensor(q_lengths, q_shape[:1], device))
            or (d_lengths is not None  # [Nd] or [Nq, K]
                and not _index_tensor(d_lengths, d_shape[: rank - 2], device))
        ):
            return None
        if Q.is_cpu:  # values are checked where reading them is free
            if q_lengths is not None:
                check.check_lengths(names[0], q_lengths, lq)
            if d_lengths is not None:
                check.check_lengths(names[1], d_lengths, d_shape[-2])
        elif check.debug_enabled():
            return None  # the checked path reads their values
        if not Q.is_cuda:  # the CUDA ops take int64 values as they are (one launch, no host op)
            if q_lengths is not None and q_lengths.dtype != torch.int32:
                q_lengths = check.int32(q_lengths)
            if d_lengths is not None and d_lengths.dtype != torch.int32:
                d_lengths = check.int32(d_lengths)
        if rank == 4 and d_lengths is not None:
            d_lengths = d_lengths.view(-1)
    if q_mask is not None and not _op_tensor(q_mask, torch.bool, q_shape[:2], device):
        return None
    if d_mask is not None:
        if not _op_tensor(d_mask, torch.bool, d_shape[:-1], device):
            return None
        if rank == 4:
            d_mask = d_mask.view(-1, d_shape[2])
    if rank == 3:
        return D, q_lengths, q_mask, d_lengths, d_mask, ALLPAIRS, 0
    return D.flatten(0, 1), q_lengths, q_mask, d_lengths, d_mask, GROUPED, d_shape[1]


def plain_call(
    Q, D, q_mask, d_mask, q_lengths, d_lengths, want_argmax, backend, d_rank=None,
    names=_LENGTH_NAMES,
):
    """``fwd``'s outputs for a call :func:`_plain_parts` takes, from one op call and nothing
    else; None for any other call."""
    parts = _plain_parts(Q, D, q_mask, d_mask, q_lengths, d_lengths, False, d_rank, names)
    if parts is None:
        return None
    d_x, q_lengths, q_mask, d_lengths, d_mask, layout, group = parts
    return fwd(
        backend, want_argmax, Q, d_x, None, q_lengths, q_mask, None, d_lengths, d_mask, None,
        None, layout, group, Q.shape[1],
    )


def _plain_sets(Q, D, q_mask, d_mask, normalize, q_lengths, d_lengths, codes=False):
    """:func:`padded_sets` of a call :func:`_plain_parts` takes, without the layers of checks;
    None for any other call."""
    if normalize:
        return None
    parts = _plain_parts(Q, D, q_mask, d_mask, q_lengths, d_lengths, codes)
    if parts is None:
        return None
    d_x, q_lengths, q_mask, d_lengths, d_mask, layout, group = parts
    q = TokenSet(Q, None, q_lengths, q_mask)
    return q, TokenSet(d_x, None, d_lengths, d_mask), layout, group


def padded_sets(Q, D, q_mask, d_mask, normalize, q_lengths=None, d_lengths=None, backend="auto"):
    """Validated token sets of a padded call: ``(q, d, layout, group)``; 3-D ``D`` is all pairs,
    4-D ``D`` each query's own candidates. Quantized inputs: see :func:`operands`."""
    if type(Q) is not QuantizedTokens and type(D) is not QuantizedTokens:
        plain = _plain_sets(Q, D, q_mask, d_mask, normalize, q_lengths, d_lengths)
        if plain is not None:
            return plain
    Q, D, q_scale, d_scale = operands(Q, D, normalize, backend)
    codes = d_scale is not None
    if codes or q_scale is not None:  # codes the kernels take as they are: the same plain path
        plain = _plain_sets(Q, D, q_mask, d_mask, normalize, q_lengths, d_lengths, codes=True)
        if plain is not None:
            q, d, layout, group = plain
            return q._replace(scale=q_scale), d._replace(scale=d_scale), layout, group
    Q = check.embeddings("Q", Q, ("Nq", "Lq", "H"), codes=q_scale is not None)
    check.require_tensor("D", D, "[Nd, Ld, H] or [Nq, K, Ld, H]")
    if D.dim() not in (3, 4):
        raise ValueError(
            f"D: expected 3-D [Nd, Ld, H] or 4-D [Nq, K, Ld, H], got shape {tuple(D.shape)}"
        )
    dims = ("Nd", "Ld", "H") if D.dim() == 3 else ("Nq", "K", "Ld", "H")
    D = check.embeddings("D", D, dims, codes=codes)
    check.same_space("Q", Q, "D", D, same_dtype=not codes)
    nq = Q.size(0)
    q = check.padded(
        _normalized(Q, normalize), lengths=q_lengths, lengths_name="q_lengths", m=q_mask,
        mask_name="q_mask",
    )
    if D.dim() == 3:
        d = check.padded(
            _normalized(D, normalize), lengths=d_lengths, lengths_name="d_lengths", m=d_mask,
            mask_name="d_mask",
        )
        layout, group = ALLPAIRS, 0
    else:
        if D.size(0) != nq:
            raise ValueError(
                f"D: expected {nq} rows of candidates [Nq, K, Ld, H] like Q, "
                f"got shape {tuple(D.shape)}"
            )
        d_mask = check.mask("d_mask", d_mask, D.shape[:3], D.device)
        d = check.padded(
            _normalized(D, normalize).flatten(0, 1),
            lengths=d_lengths,
            lengths_name="d_lengths",
            lengths_shape=tuple(D.shape[:2]),
            m=None if d_mask is None else d_mask.flatten(0, 1),
            mask_name="d_mask",
        )
        layout, group = GROUPED, D.size(1)
    if q_scale is not None or d_scale is not None:
        q, d = q._replace(scale=q_scale), d._replace(scale=d_scale)
    return q, d, layout, group


def _padded_call(
    Q, D, q_mask, d_mask, normalize, backend, want_argmax, q_lengths=None, d_lengths=None
):
    if not normalize:
        out = plain_call(Q, D, q_mask, d_mask, q_lengths, d_lengths, want_argmax, backend)
        if out is not None:
            return out
    q, d, layout, group = padded_sets(
        Q, D, q_mask, d_mask, normalize, q_lengths, d_lengths, backend
    )
    return forward(
        q, d, layout, group=group, max_lq=q.x.size(1), want_argmax=want_argmax, backend=backend
    )


def maxsim(
    Q, D, q_mask=None, d_mask=None, *, q_lengths=None, d_lengths=None, normalize=False,
    backend="auto",
):
    """MaxSim of every query with every document (3-D ``D``) or with its own candidates (4-D ``D``).

    Shapes:
        Q ``[Nq, Lq, H]``; D ``[Nd, Ld, H]`` -> ``[Nq, Nd]``; D ``[Nq, K, Ld, H]`` -> ``[Nq, K]``;
        scores are fp32.
        q_mask ``[Nq, Lq]``; d_mask ``[Nd, Ld]`` or ``[Nq, K, Ld]`` (True / nonzero = valid token).
        q_lengths ``[Nq]``; d_lengths ``[Nd]`` or ``[Nq, K]``: prefix lengths, combinable with
        masks. Prefer them for right-padded batches: the kernels then never read the padding.
    ``normalize=True`` L2-normalises every token first (differentiably).
    """
    return _padded_call(Q, D, q_mask, d_mask, normalize, backend, False, q_lengths, d_lengths)[0]


def maxsim_with_argmax(
    Q, D, q_mask=None, d_mask=None, *, q_lengths=None, d_lengths=None, normalize=False,
    backend="auto",
):
    """Like :func:`maxsim`, plus the winning document token of every query token.

    Shapes: scores as :func:`maxsim`; argmax int32 ``scores.shape + [Lq]``, index within the
    document, -1 for a masked query token or a document without valid tokens.
    """
    return _padded_call(Q, D, q_mask, d_mask, normalize, backend, True, q_lengths, d_lengths)


def maxsim_pairs(Q, D, q_mask=None, d_mask=None, *, normalize=False, backend="auto"):
    """MaxSim of query ``b`` with document ``b`` only (the diagonal of :func:`maxsim`).

    Shapes: Q ``[B, Lq, H]``, D ``[B, Ld, H]``, q_mask ``[B, Lq]``, d_mask ``[B, Ld]``
    -> ``[B]`` fp32.
    """
    Q, D, q_scale, d_scale = operands(Q, D, normalize, backend)
    codes = d_scale is not None
    Q = check.embeddings("Q", Q, ("B", "Lq", "H"), codes=q_scale is not None)
    D = check.embeddings("D", D, ("B", "Ld", "H"), codes=codes)
    check.same_space("Q", Q, "D", D, same_dtype=not codes)
    if D.size(0) != Q.size(0):
        raise ValueError(
            f"D: expected {Q.size(0)} documents, one per query in Q, got shape {tuple(D.shape)}"
        )
    q = check.padded(_normalized(Q, normalize), m=q_mask, mask_name="q_mask")
    d = check.padded(_normalized(D, normalize), m=d_mask, mask_name="d_mask")
    if q_scale is not None or d_scale is not None:
        q, d = q._replace(scale=q_scale), d._replace(scale=d_scale)
    scores, _ = forward(
        q, d, GROUPED, group=1, max_lq=Q.size(1), want_argmax=False, backend=backend
    )
    return scores.view(Q.size(0))


def maxsim_varlen(
    q,
    cu_seqlens_q,
    d,
    cu_seqlens_d,
    *,
    max_seqlen_q=None,
    num_candidates=None,
    pair_q=None,
    pair_d=None,
    q_mask=None,
    d_mask=None,
    normalize=False,
    backend="auto",
):
    """MaxSim of packed (variable-length) queries and documents.

    Shapes:
        q ``[Tq, H]`` split by ``cu_seqlens_q [Nq+1]``; d ``[Td, H]`` split by
        ``cu_seqlens_d [Nd+1]``; q_mask ``[Tq]``, d_mask ``[Td]``.
        default -> ``[Nq, Nd]`` (all pairs); ``num_candidates=K`` (Nd == Nq*K) -> ``[Nq, K]``;
        ``pair_q``, ``pair_d`` ``[P]`` -> ``[P]``.
    Without ``max_seqlen_q`` (>= the longest query) the longest query is read from
    ``cu_seqlens_q``: one device->host sync; pass it to keep the call sync-free.
    """
    q, d, q_scale, d_scale = operands(q, d, normalize, backend)
    codes = d_scale is not None
    q = check.embeddings("q", q, ("Tq", "H"), codes=q_scale is not None)
    d = check.embeddings("d", d, ("Td", "H"), codes=codes)
    check.same_space("q", q, "d", d, same_dtype=not codes)
    queries = check.packed(
        _normalized(q, normalize),
        cu_seqlens_q,
        offsets_name="cu_seqlens_q",
        m=q_mask,
        mask_name="q_mask",
    )
    docs = check.packed(
        _normalized(d, normalize),
        cu_seqlens_d,
        offsets_name="cu_seqlens_d",
        m=d_mask,
        mask_name="d_mask",
    )
    if q_scale is not None or d_scale is not None:
        queries, docs = queries._replace(scale=q_scale), docs._replace(scale=d_scale)
    layout, group, pair_ids = ALLPAIRS, 0, (None, None)
    if (pair_q is None) != (pair_d is None):
        given, missing = ("pair_q", "pair_d") if pair_d is None else ("pair_d", "pair_q")
        raise ValueError(f"{missing}: expected a tensor [P] since {given} is given, got None")
    if pair_q is not None:
        if num_candidates is not None:
            raise ValueError("num_candidates: expected None when pair_q / pair_d are given")
        layout = PAIRS
        pair_ids = check.pair_ids(
            "pair_q", pair_q, "pair_d", pair_d, queries.count, docs.count, q.device
        )
    elif num_candidates is not None:
        check.integer("num_candidates", num_candidates)
        if docs.count != queries.count * num_candidates:
            raise ValueError(
                f"cu_seqlens_d: expected {queries.count} * {num_candidates} documents "
                f"(num_candidates per query), got {docs.count}"
            )
        layout, group = GROUPED, num_candidates
    max_lq = check.query_width("max_seqlen_q", max_seqlen_q, queries)
    scores, _ = forward(
        queries,
        docs,
        layout,
        group=group,
        pair_q=pair_ids[0],
        pair_d=pair_ids[1],
        max_lq=max_lq,
        want_argmax=False,
        backend=backend,
    )
    return scores


class MaxSimScorer(torch.nn.Module):
    """Stateless module around :func:`maxsim`, for models that compose scorers as layers.

    Shapes: as :func:`maxsim`.
    """

    def __init__(self, normalize: bool = False, backend: str = "auto"):
        super().__init__()
        self.normalize, self.backend = normalize, backend

    def forward(self, Q, D, q_mask=None, d_mask=None):
        return maxsim(Q, D, q_mask, d_mask, normalize=self.normalize, backend=self.backend)

    def extra_repr(self) -> str:
        return f"normalize={self.normalize}, backend={self.backend!r}"
