"""Pure-PyTorch implementation of the ``fwd`` and ``bwd`` ops: CPU, MPS, CUDA without the extension.

Same semantics as the CUDA kernels (docs/ARCHITECTURE.md). Pairs are scored in chunks sized from
``MAXSIM_TORCH_MEMORY_MB``, so the ``[.., Lq, Ld]`` similarities of a whole batch never exist at
once. fp16 / bf16 tokens are upcast to fp32 a chunk at a time; fp32 is exact (``tf32`` is ignored).

Padded token sets are read without any device->host sync. A packed token set is gathered into
padded blocks: packed queries as wide as ``max_lq`` (the bound the kernels size their work by;
a longer query scores NaN), packed documents as wide as their longest segment, which is read
on the host once per call (free on CPU, one sync on other devices). Bad index values are clamped
for the gathers and their scores marked NaN, as the kernels do (bounds.py).

``bwd`` never reads device values and never lets floating-point atomics decide an order, so its
gradients are bit-identical run after run.
"""

import contextlib

import torch

from . import bounds, fallback_scores
from .layouts import ALLPAIRS, GROUPED, scores_shape, segment_count
from .schemas import FwdArgs
from .settings import memory_budget_bytes

# Bytes per element of a similarity block: the fp32 block, plus a NaN map on the argmax path.
_SIM_BYTES = 5
# Bytes per query token of a pair: per-token maxima, indices and validity on the way to the score.
_TOKEN_BYTES = 32
# Bytes per (pair, query token) in backward, per embedding dim: gathered rows, fp32 copy, product.
_GRAD_BYTES = 16
# Largest similarity block: few enough ops per call that their fixed cost (and a thread pool's
# wake-up) stays small, small enough that a block and its reduction share the last-level cache.
_SIM_BLOCK_BYTES = 64 * 2**20


class _Segments:
    """A token set as segments of at most ``width`` tokens, gathered a chunk of segments at a time.

    Shapes: ``x`` padded ``[N, L, H]`` (``lengths [N]``, ``mask [N, L]``) or packed ``[T, H]``
    (``offsets [N+1]``, ``mask [T]``).
    """

    def __init__(self, x, offsets, lengths, mask, width=None):
        self.x, self.mask = x, mask
        self.packed = x.dim() == 2
        if self.packed:  # offsets clamped into [0, T]: bad ones are marked NaN (bounds.py)
            bounded = offsets.long().clamp(0, x.size(0))
            self.starts = bounded[:-1]
            self.lengths = (bounded[1:] - bounded[:-1]).clamp_(min=0)
            if width is None:  # the longest segment: the one host read
                width = int(self.lengths.max()) if self.lengths.numel() else 0
            self.width = width
        else:
            self.lengths = None if lengths is None else lengths.long()
            self.width = x.size(1)
        # Bytes a gathered token costs beyond its input: none for a view of padded fp32 tokens
        # that are all valid; an fp32 copy and its zeroed twin otherwise.
        views = not self.packed and x.dtype == torch.float32 and lengths is None and mask is None
        self.copy_bytes = 0 if views else 8 * x.size(-1)

    def gather(self, ids, width=None):
        """fp32 tokens ``[n, width, H]`` and validity ``[n, width]`` of segments ``ids``.

        ``ids`` is a slice (padded: a view, no copy) or an int64 index tensor; ``width``: a
        narrower width for packed segments known to be no longer.
        """
        cols = torch.arange(self.width if width is None else width, device=self.x.device)
        if self.packed:
            rows = (self.starts[ids, None] + cols).clamp_(max=max(self.x.size(0) - 1, 0))
            empty = self.x.size(0) == 0  # no row to clamp to
            tokens = self.x.new_zeros(*rows.shape, self.x.size(1)) if empty else self.x[rows]
            valid = cols < self.lengths[ids, None]
            if self.mask is not None and not empty:
                valid &= self.mask[rows]
        else:
            tokens = self.x[ids]
            if self.lengths is None:
                valid = torch.ones(tokens.shape[:2], dtype=torch.bool, device=self.x.device)
            else:
                valid = cols < self.lengths[ids, None]
            if self.mask is not None:
                valid = valid & self.mask[ids]
        return tokens.float(), valid

    def blocks(self, size):
        """``(ids, width)`` of consecutive blocks of ``size`` segments. Packed CPU segments go
        shortest first, each block only as wide as its longest (the lengths are on the host), so
        little of a block is padding; elsewhere in order, as slices, at the full width."""
        n = self.lengths.numel() if self.packed else self.x.size(0)
        if not (self.packed and self.x.device.type == "cpu"):
            return [(slice(j, j + size), self.width) for j in range(0, n, size)]
        order = torch.argsort(self.lengths, stable=True)
        ends = self.lengths[order].tolist()
        return [(order[j : j + size], ends[min(j + size, n) - 1]) for j in range(0, n, size)]

    def gather_zeroed(self, ids, width=None):
        """``gather`` with invalid tokens zeroed (padding may hold anything, NaN included), and
        the additive fp32 bias ``[n, width]`` that keeps them from ever winning a max (0 / -inf);
        None when every token is valid."""
        tokens, valid = self.gather(ids, width)
        if not (self.packed or self.lengths is not None or self.mask is not None):
            return tokens, valid, None
        tokens = torch.where(valid[..., None], tokens, 0.0)
        bias = torch.zeros(valid.shape, dtype=torch.float32, device=valid.device)
        return tokens, valid, bias.masked_fill_(~valid, float("-inf"))


def _plus_bias(bias, product, *factors):
    """``bias + a @ b`` in one call (the GEMM starts from the bias), or just ``a @ b``."""
    if bias is None:
        return torch.matmul(*factors)
    return product(bias, *factors)


def _fit(budget: int, per_item: int, total: int) -> int:
    """How many items of ``per_item`` bytes fit in ``budget`` (at least 1, at most ``total``)."""
    return max(1, min(total, budget // max(per_item, 1)))


def _sim_budget() -> int:
    """Bytes a call's similarity blocks may take at once: the memory budget, at most a block that
    stays cache-friendly."""
    return min(memory_budget_bytes(), _SIM_BLOCK_BYTES)


@contextlib.contextmanager
def _exact_fp32_matmul(device: torch.device):
    """cuBLAS uses TF32 for fp32 matmuls when the global flag allows; the fallback stays exact."""
    if device.type != "cuda" or not torch.backends.cuda.matmul.allow_tf32:
        yield
        return
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = True


def _reduce(sim, q_valid, d_valid, with_argmax=True, masked=False):
    """Scores and argmax of a block of similarities whose invalid document tokens hold -inf.

    Scores alone take one pass over the block (``amax``); the argmax adds a first-NaN search
    (checking first whether any NaN won would need a device->host read). The other fix-ups touch
    only ``[a, Lq, b]`` tensors.

    Shapes: ``sim [a, Lq, b, Ld]`` fp32, ``q_valid [a, Lq]``, ``d_valid [a or 1, b, Ld]`` ->
    scores ``[a, b]`` fp32, argmax ``[a, b, Lq]`` int32 (None without ``with_argmax``).
    """
    a, lq, b, ld = sim.shape
    if masked:  # an inf query value times a zeroed invalid token is NaN, not -inf: reset it
        sim.masked_fill_(~d_valid[:, None], float("-inf"))
    d_any = d_valid.any(-1)[:, None]  # [a or 1, 1, b]
    counts = q_valid[:, :, None] & d_any  # a token with no valid doc token adds 0
    if ld == 0:
        argmax = torch.full((a, b, lq), -1, dtype=torch.int32, device=sim.device)
        return sim.new_zeros(a, b), argmax if with_argmax else None
    if not with_argmax:
        return torch.where(counts, sim.amax(dim=-1), 0.0).sum(dim=1), None
    values, index = sim.max(dim=-1)  # NaN wins; ties: the lowest index
    # All valid similarities are -inf: the first valid token is the argmax.
    first_valid = d_valid.view(torch.uint8).argmax(-1)[:, None]
    index = torch.where(values == float("-inf"), first_valid, index)
    # The first valid NaN is the argmax (not left to max's unspecified NaN index).
    is_nan = sim.isnan() & d_valid[:, None]
    index = torch.where(values.isnan(), is_nan.view(torch.uint8).argmax(-1), index)
    values = torch.where(counts, values, 0.0)
    index = torch.where(counts, index, -1)
    return values.sum(dim=1), index.transpose(1, 2).to(torch.int32)


def _pair_ids(layout, group, pair_q, pair_d, nd, p0, p1, device):
    """Query and document segment of the flat pairs ``p0 .. p1-1`` (int64 ``[p1-p0]`` each)."""
    p = torch.arange(p0, p1, device=device)
    if layout == ALLPAIRS:
        return p // nd, p % nd
    if layout == GROUPED:
        return p // group, p
    return pair_q[p0:p1].long(), pair_d[p0:p1].long()


def fwd(*args):
    """The ``fwd`` op, its arguments as in ``FwdArgs`` (schema: docs/ARCHITECTURE.md).

    Shapes: scores fp32 by layout (``[Nq, Nd]``, ``[Nq, group]``, ``[P]``); argmax int32
    ``scores.shape + [max_lq]`` when ``with_argmax``, else ``[0]``.
    """
    a = FwdArgs(*args)
    q, d, layout, max_lq, with_argmax = a.q, a.d, a.layout, a.max_lq, a.with_argmax
    shape = scores_shape(q, d, a.q_offsets, a.d_offsets, a.pair_q, layout, a.group)
    scores = torch.zeros(shape, dtype=torch.float32, device=q.device)
    if with_argmax:
        argmax = torch.full((*shape, max_lq), -1, dtype=torch.int32, device=q.device)
    else:
        argmax = torch.empty(0, dtype=torch.int32, device=q.device)
    queries = _Segments(q, a.q_offsets, a.q_lengths, a.q_mask, width=max_lq)
    documents = _Segments(d, a.d_offsets, a.d_lengths, a.d_mask)
    nq, nd = segment_count(q, a.q_offsets), segment_count(d, a.d_offsets)
    bad = bounds.bad_scores(scores, layout, q, d, a.q_offsets, a.q_lengths, a.d_offsets,
                            a.d_lengths, a.pair_q, a.pair_d, max_lq)
    if scores.numel() == 0 or queries.width == 0 or min(nq, nd) == 0:
        return scores.masked_fill_(bad, float("nan")) if bad is not None else scores, argmax
    pair_q, pair_d = bounds.clamped_ids(a.pair_q, nq), bounds.clamped_ids(a.pair_d, nd)
    with _exact_fp32_matmul(q.device):
        if not with_argmax and fallback_scores.supported(queries, documents, layout):
            fallback_scores.score(queries, documents, layout, a.group, scores)
        elif layout == ALLPAIRS:
            _fwd_allpairs(queries, documents, scores, argmax if with_argmax else None)
        elif layout == GROUPED and not documents.packed:
            _fwd_grouped(queries, documents, a.group, scores, argmax if with_argmax else None)
        else:
            flat_argmax = argmax.view(scores.numel(), max_lq) if with_argmax else None
            _fwd_paired(
                queries,
                documents,
                layout,
                a.group,
                pair_q,
                pair_d,
                scores.view(-1),
                flat_argmax,
                nd,
            )
    if bad is not None:
        scores.masked_fill_(bad, float("nan"))
        if with_argmax:
            argmax.masked_fill_(bad[..., None], -1)
    return scores, argmax


def _fwd_allpairs(queries, documents, scores, argmax):
    """Every query with every document: one GEMM per (query chunk, document chunk), the -inf of
    invalid document tokens added by the GEMM itself."""
    nq, nd = scores.shape
    lw, dw, h = queries.width, documents.width, queries.x.size(-1)
    per_pair = lw * dw * _SIM_BYTES + lw * _TOKEN_BYTES
    budget = _sim_budget()
    q_copy, d_copy = lw * queries.copy_bytes, dw * documents.copy_bytes
    bq = _fit(budget - d_copy, per_pair + q_copy, nq)  # queries next to one document
    bd = _fit(budget - bq * q_copy, bq * per_pair + d_copy, nd)
    keep = lw if argmax is None else min(lw, argmax.size(-1))
    for ids, dw in documents.blocks(bd):
        d_tokens, d_valid, d_bias = documents.gather_zeroed(ids, dw)
        b = d_tokens.size(0)
        d_flat = d_tokens.reshape(b * dw, h)
        d_bias = None if d_bias is None else d_bias.view(1, b * dw)
        for i0 in range(0, nq, bq):
            q_tokens, q_valid = queries.gather(slice(i0, i0 + bq))
            a = q_tokens.size(0)
            # One expression, so no similarity block outlives its reduction.
            block_scores, block_argmax = _reduce(
                _plus_bias(d_bias, torch.addmm, q_tokens.reshape(a * lw, h), d_flat.T).view(
                    a, lw, b, dw
                ),
                q_valid,
                d_valid[None],
                argmax is not None,
                d_bias is not None,
            )
            scores[i0 : i0 + a, ids] = block_scores
            if argmax is not None:
                argmax[i0 : i0 + a, ids, :keep] = block_argmax[..., :keep]


def _fwd_grouped(queries, documents, group, scores, argmax):
    """GROUPED: each query with its own ``group`` documents, one batched GEMM per query chunk."""
    nq = scores.size(0)
    lw, dw, h = queries.width, documents.width, queries.x.size(-1)
    per_doc = lw * dw * _SIM_BYTES + lw * _TOKEN_BYTES + dw * documents.copy_bytes
    per_query = group * per_doc + lw * queries.copy_bytes
    bq = _fit(_sim_budget(), per_query, nq)
    keep = lw if argmax is None else min(lw, argmax.size(-1))
    for i0 in range(0, nq, bq):
        q_tokens, q_valid = queries.gather(slice(i0, i0 + bq))
        a = q_tokens.size(0)
        d_tokens, d_valid, d_bias = documents.gather_zeroed(slice(i0 * group, (i0 + a) * group))
        block_scores, block_argmax = _reduce(
            _plus_bias(
                None if d_bias is None else d_bias.view(a, 1, group * dw),
                torch.baddbmm,
                q_tokens,
                d_tokens.view(a, group * dw, h).transpose(1, 2),
            ).view(a, lw, group, dw),
            q_valid,
            d_valid.view(a, group, dw),
            argmax is not None,
            d_bias is not None,
        )
        scores[i0 : i0 + a] = block_scores
        if argmax is not None:
            argmax[i0 : i0 + a, :, :keep] = block_argmax[..., :keep]


def _fwd_paired(queries, documents, layout, group, pair_q, pair_d, scores, argmax, nd):
    """PAIRS: gather each pair's query and document, one batched matmul per chunk."""
    lw, dw, h = queries.width, documents.width, queries.x.size(-1)
    per_pair = lw * dw * _SIM_BYTES + lw * _TOKEN_BYTES + (lw + dw) * h * 8
    bp = _fit(_sim_budget(), per_pair, scores.numel())
    keep = lw if argmax is None else min(lw, argmax.size(-1))
    for p0 in range(0, scores.numel(), bp):
        p1 = min(p0 + bp, scores.numel())
        qi, dj = _pair_ids(layout, group, pair_q, pair_d, nd, p0, p1, queries.x.device)
        q_tokens, q_valid = queries.gather(qi)
        d_tokens, d_valid, d_bias = documents.gather_zeroed(dj)
        block_scores, block_argmax = _reduce(
            _plus_bias(
                None if d_bias is None else d_bias[:, None],
                torch.baddbmm,
                q_tokens,
                d_tokens.transpose(1, 2),
            ).view(p1 - p0, lw, 1, dw),
            q_valid,
            d_valid[:, None],
            argmax is not None,
            d_bias is not None,
        )
        scores[p0:p1] = block_scores[:, 0]
        if argmax is not None:
            argmax[p0:p1, :keep] = block_argmax[:, 0, :keep]


def _starts(x, offsets):
    """First row of every segment in ``x.reshape(-1, H)`` (int64 ``[N]``)."""
    if x.dim() == 2:
        return offsets[:-1].long()
    return torch.arange(x.size(0), device=x.device) * x.size(1)


def _add_rows_sorted(acc, target, values):
    """Device-agnostic ``_add_rows``: stable sort by target, then a segmented suffix scan.

    After ``log2(M)`` passes every run's first row holds the run's sum. Only those rows reach
    their target, once each; every other row goes to the scratch row.
    """
    target, order = torch.sort(target, stable=True)
    values = values[order]
    shift = 1
    while shift < target.numel():
        same = (target[:-shift] == target[shift:])[:, None]
        values = torch.cat(
            [values[:-shift] + torch.where(same, values[shift:], 0.0), values[-shift:]]
        )
        shift *= 2
    starts = torch.ones_like(target, dtype=torch.bool)
    starts[1:] = target[1:] != target[:-1]
    acc.index_put_((torch.where(starts, target, acc.size(0) - 1),), values, accumulate=True)


def _add_rows(acc, target, values):
    """``acc[target[m]] += values[m]`` in an order fixed by the inputs, so results are bit-stable.

    Shapes: ``acc [R+1, H]`` fp32, ``target [M]`` int64 in ``[0, R]``, ``values [M, H]`` fp32;
    row ``R`` is scratch (the caller discards it).
    """
    if acc.device.type == "cpu":
        acc.index_add_(0, target, values)  # on CPU a serial loop over the rows of values
    elif acc.device.type == "cuda":
        # CUDA accumulate=True sorts the targets and one warp sums each run in order: no atomics
        # (unlike index_add_).
        acc.index_put_((target,), values, accumulate=True)
    else:
        _add_rows_sorted(acc, target, values)


def _weighted_rows(rows, index, weight):
    """``weight * rows[index]`` in fp32; scratch-row entries gather a clamped, arbitrary row."""
    return rows[index.clamp(max=rows.size(0) - 1)].float() * weight


def bwd(grad, q, d, argmax, q_offsets, d_offsets, pair_q, pair_d, layout, group):
    """The ``bwd`` op: ``dq`` like ``q``, ``dd`` like ``d``; only argmax tokens receive gradient.

    Every (pair, query token) that won a max adds ``grad * d[winner]`` to its query token and
    ``grad * q[token]`` to the winning document token, accumulated in fp32 and rounded once.
    """
    h = q.size(-1)
    q_rows, d_rows = q.reshape(-1, h), d.reshape(-1, h)
    dq = torch.zeros(q_rows.size(0) + 1, h, dtype=torch.float32, device=q.device)
    dd = torch.zeros(d_rows.size(0) + 1, h, dtype=torch.float32, device=q.device)
    pairs, width = grad.numel(), argmax.size(-1)
    if pairs and width and q_rows.size(0) and d_rows.size(0):
        q_starts, d_starts = _starts(q, q_offsets), _starts(d, d_offsets)
        nd = segment_count(d, d_offsets)
        # ids out of range come with argmax -1 from fwd: clamped only to keep the gathers in bounds
        pair_q = bounds.clamped_ids(pair_q, segment_count(q, q_offsets))
        pair_d = bounds.clamped_ids(pair_d, nd)
        g = grad.reshape(pairs).float()
        won_by = argmax.reshape(pairs, width)
        cols = torch.arange(width, device=q.device)
        bp = _fit(memory_budget_bytes(), width * (h * _GRAD_BYTES + 64), pairs)
        for p0 in range(0, pairs, bp):
            p1 = min(p0 + bp, pairs)
            qi, dj = _pair_ids(layout, group, pair_q, pair_d, nd, p0, p1, q.device)
            winner = won_by[p0:p1].long()
            won = winner >= 0
            q_row = torch.where(won, q_starts[qi, None] + cols, q_rows.size(0)).view(-1)
            d_row = torch.where(won, d_starts[dj, None] + winner, d_rows.size(0)).view(-1)
            weight = g[p0:p1, None].expand(-1, width).reshape(-1, 1)
            _add_rows(dq, q_row, _weighted_rows(d_rows, d_row, weight))
            _add_rows(dd, d_row, _weighted_rows(q_rows, q_row, weight))
    return dq[:-1].view(q.shape).to(q.dtype), dd[:-1].view(d.shape).to(d.dtype)


def ce(scores, targets, scale):
    """The ``ce`` op: mean softmax cross-entropy of the rows of ``scores * scale`` against
    ``targets`` (the diagonal when None), and its gradient with respect to ``scores``."""
    logits = scores.float() * scale
    rows = logits.size(0)
    if rows == 0:
        return logits.new_full((), float("nan")), torch.empty_like(logits)
    t = torch.arange(rows, device=logits.device) if targets is None else targets.long()
    outside = (t < 0) | (t >= logits.size(1))  # unchecked targets: a NaN loss, row gradient 0
    t = t.clamp(0, max(logits.size(1) - 1, 0))
    logp = torch.log_softmax(logits, dim=1)
    loss = -logp.gather(1, t[:, None]).mean()
    grad = logp.exp()
    grad[torch.arange(rows, device=logits.device), t] -= 1.0
    loss = torch.where(outside.any(), float("nan"), loss)
    return loss, grad.masked_fill_(outside[:, None], 0.0) * (scale / rows)


def contrastive_step(q, d, q_offsets, q_lengths, q_mask, d_offsets, d_lengths, d_mask, layout,
                     group, max_lq, targets, scale):
    """The ``contrastive_step`` op: ``fwd`` with argmax, ``ce``, then ``bwd``, without autograd;
    returns (loss, dq, dd)."""
    with torch.no_grad():
        scores, argmax = fwd(q, d, q_offsets, q_lengths, q_mask, d_offsets, d_lengths, d_mask,
                             None, None, layout, group, max_lq, True, False)
        loss, grad = ce(scores, targets, scale)
        dq, dd = bwd(grad, q, d, argmax, q_offsets, d_offsets, None, None, layout, group)
    return loss, dq, dd
