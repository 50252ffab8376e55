"""MaxSim across ranks on ``torch.distributed`` (NCCL on GPUs, gloo on CPU): a contrastive loss
whose negatives are every rank's documents, and ``retrieve`` over a corpus sharded across ranks.

Every rank calls the same function with its own part; the process group's collectives move the
data (nothing else). Results equal those of one process holding the whole batch or corpus.
"""

from typing import NamedTuple, Optional

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.overrides import has_torch_function

from . import validation as check
from .dispatch import select_ops
from .layouts import ALLPAIRS
from .losses import _check_temperature
from .native import padded_sets
from .retrieve import _doc_of, _rank_keys
from .retrieve import retrieve as _retrieve_local

# torch renamed the tensor collectives; the old names stay for torch before the rename.
_gather_into = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor

try:  # the process group's own calls, under the public functions' per-call checks
    from torch._C._distributed_c10d import AllgatherOptions, ReduceScatterOptions
except ImportError:  # pragma: no cover - torch without them: the public functions
    AllgatherOptions = ReduceScatterOptions = None

_NO_DOC = torch.iinfo(torch.int64).min  # below every key of _rank_keys: a shard's empty slot
_FLOATS = (torch.float32, torch.float16, torch.bfloat16)  # their index travels in the exchange

# Called with a phase's name where the phase ends on the device's stream (None: off); the
# benchmark puts CUDA events there (benchmarks/dist_bench.py).
phase_marks = None


def _mark(name):
    if phase_marks is not None:
        phase_marks(name)


def _on_host(group):
    """Whether ``group`` takes CPU tensors (gloo, alone or beside NCCL as
    ``init_process_group()`` without a backend makes it): small exchanges then skip the device."""
    types = getattr(group or dist.group.WORLD, "_device_types", None)
    if types is None:  # torch without the attribute: read the configuration
        return "gloo" in str(dist.get_backend_config(group))
    return any(t.type == "cpu" for t in types)


def _all_ints(values, device, group):
    """Every rank's tuple of ints ``values``, from one all-gather: over the host where the group
    can (no wait for the device's queue), else on ``device`` (one host sync to read them)."""
    world = dist.get_world_size(group)
    mine = torch.tensor(values, dtype=torch.int64,
                        device="cpu" if _on_host(group) else device)
    out = mine.new_empty(world * len(values))
    _gather_into(out, mine, group=group)
    return [tuple(row) for row in out.view(world, len(values)).tolist()]


def _wait(works):
    for work in works:
        work.wait()
    works.clear()


def _process_group(group):
    return group if group is not None else dist.distributed_c10d._get_default_group()


def _direct(pg, x, name):
    """The process group's method ``name``, where calling it directly is equivalent to the public
    function (no torch function override or mode to honour); else None."""
    if AllgatherOptions is None or has_torch_function((x,)):
        return None
    return getattr(pg, name, None)


def _opts(kind, async_op):
    opts = kind()
    opts.asyncOp = async_op
    return opts


# One of each, reused: asyncOp False lets NCCL run on the caller's stream (no event pair, no
# stream bookkeeping) where nothing is to overlap with the transfer.
if AllgatherOptions is not None:
    _GATHER_OPTS = {a: _opts(AllgatherOptions, a) for a in (False, True)}
    _SUM_OPTS = {a: _opts(ReduceScatterOptions, a) for a in (False, True)}


def _gather(out, x, pg, works, async_op=True):
    """Starts the all-gather of flat ``x`` into flat ``out``; its handle goes to ``works``."""
    call = _direct(pg, x, "_allgather_base")
    if call is None:
        work = _gather_into(out, x, group=pg, async_op=async_op)
    else:
        work = call(out, x, _GATHER_OPTS[async_op])
    if work is not None:
        works.append(work)


def _sum_scatter(out, x, pg, works, async_op=True, factor=None):
    """Starts the reduce-scatter (sum) of flat ``x`` into flat ``out``; its handle goes to
    ``works``. ``factor`` (a one-element device tensor of ``x``'s dtype): every rank's ``x`` is
    multiplied by its own factor inside the collective (NCCL's pre-multiplied sum), with no pass
    of its own over ``x``."""
    op = dist.ReduceOp.SUM if factor is None else dist._make_nccl_premul_sum(factor)
    call = _direct(pg, x, "_reduce_scatter_base")
    if call is None:
        work = _reduce_scatter(out, x, op=op, group=pg, async_op=async_op)
    else:
        opts = _SUM_OPTS[async_op]
        if factor is not None:
            opts = _opts(ReduceScatterOptions, async_op)
            opts.reduceOp = op
        work = call(out, x, opts)
    if work is not None:
        works.append(work)


class _Layout(NamedTuple):
    """Every rank's part ``parts[s] = (queries, documents, document length)``, the block
    ``rows x cols`` each rank's documents are padded to for the transfer, and whether the
    documents travel with prefix lengths and masks (where any rank needs them, every rank sends
    them)."""

    parts: tuple
    rows: int
    cols: int
    lengths: bool
    mask: bool

    @property
    def uniform(self):
        return all(p[1:] == (self.rows, self.cols) for p in self.parts)


def _shapes(q, d, group, same_shapes):
    """Every rank's ``(B, N, Ld, H, dtype index, has lengths, has mask)``: from one small
    all-gather, or this rank's own where ``same_shapes`` promises they are the same everywhere."""
    mine = (q.x.size(0), *d.x.shape, _FLOATS.index(d.x.dtype), d.lengths is not None,
            d.mask is not None)
    if same_shapes:
        return (mine,) * dist.get_world_size(group)
    return tuple(_all_ints(mine, d.x.device, group))


def _layout(every):
    """The :class:`_Layout` of every rank's :func:`_shapes`."""
    if len({e[3:5] for e in every}) > 1:  # every rank sees the same list: all raise together
        raise ValueError(
            f"D: expected the same token dim and dtype on every rank, got (H, dtype) "
            f"{[(e[3], _FLOATS[e[4]]) for e in every]}"
        )
    rows, cols = max(e[1] for e in every), max(e[2] for e in every)
    lengths = any(e[5] for e in every) or any(e[2] != cols for e in every)
    return _Layout(tuple(e[:3] for e in every), rows, cols, lengths, any(e[6] for e in every))


class _Plan(NamedTuple):
    """What a call's shapes fix, made once per shapes and process group: the layout, this rank's
    first column, the loss's ``share`` factor, the diagonal targets, the process group, whether
    its reduce-scatter can pre-multiply (NCCL), and ``buffers`` (the gathered documents' buffer,
    reused by the calls that read it only in forward)."""

    layout: _Layout
    rank: int
    first: int
    share: float
    diagonal: Optional[torch.Tensor]
    pg: object
    premul: bool
    buffers: dict


_PLANS = {}
_PLANS_KEPT = 16  # distinct shapes kept (a training loop has one or a few)


def _plan(q, d, group, same_shapes):
    """The :class:`_Plan` of this call (cached per shapes, device and process group)."""
    pg = _process_group(group)
    every = _shapes(q, d, pg, same_shapes)
    key = (pg, q.x.device, every)
    plan = _PLANS.get(key)
    if plan is None:
        if len(_PLANS) >= _PLANS_KEPT:
            _PLANS.clear()
        plan = _PLANS[key] = _new_plan(every, q, d, pg)
    return plan


def _new_plan(every, q, d, pg):
    layout = _layout(every)
    rank = dist.get_rank(pg)
    first = sum(p[1] for p in layout.parts[:rank])
    nq, nd = q.x.size(0), d.x.size(0)
    diagonal = None
    if nd >= nq:  # the default targets: query i -> this rank's document i
        diagonal = torch.arange(first, first + nq, device=q.x.device)
    share = nq * len(every) / max(sum(p[0] for p in layout.parts), 1)
    premul = q.x.device.type == "cuda" and "nccl" in str(dist.get_backend(pg)).lower()
    return _Plan(layout, rank, first, share, diagonal, pg, premul, {})


def _padded_to(x, rows, cols, value=0):
    """``x [N, L, ...]`` padded at the end of its first two dims to ``[rows, cols, ...]``."""
    pad = [0, 0] * (x.dim() - 2) + [0, cols - x.size(1), 0, rows - x.size(0)]
    return F.pad(x, pad, value=value) if any(pad) else x


class _Gathered(NamedTuple):
    """Every rank's documents: ``x [world, rows, cols, H]``, int32 ``lengths [world, rows]`` and
    bool ``mask [world, rows, cols]`` (None where the layout has none)."""

    x: torch.Tensor
    lengths: Optional[torch.Tensor]
    mask: Optional[torch.Tensor]


def _start_gather(d, layout, pg, works, reuse=None, async_op=True):
    """Starts the all-gathers of this rank's documents (one flat buffer: ``reuse``'s where given,
    a dict it is kept in) and of their lengths and masks (one more, of bytes); their handles go
    to ``works``. Returns what :func:`_arrived` reads once they are waited for."""
    world, rows, cols = len(layout.parts), layout.rows, layout.cols
    x = _padded_to(d.x, rows, cols).contiguous()
    out = None if reuse is None else reuse.get("x")
    if out is None:
        out = x.new_empty((world, rows, cols, x.size(2)))
        if reuse is not None:
            reuse["x"] = out
    _gather(out.view(-1), x.view(-1), pg, works, async_op)
    if not (layout.lengths or layout.mask):
        return out, None
    n, ld = d.x.shape[:2]
    meta = []
    if layout.lengths:
        lengths = d.lengths if d.lengths is not None else torch.full(
            (n,), ld, dtype=torch.int32, device=x.device)
        meta.append(F.pad(lengths, (0, rows - n)).view(torch.uint8))
    if layout.mask:
        mask = d.mask if d.mask is not None else torch.ones(n, ld, dtype=torch.bool,
                                                            device=x.device)
        meta.append(_padded_to(mask.view(torch.uint8), rows, cols).reshape(-1))
    meta = torch.cat(meta)
    every = meta.new_empty((world, meta.numel()))
    _gather(every.view(-1), meta, pg, works, async_op)
    return out, every


def _arrived(pending, layout):
    """The :class:`_Gathered` of :func:`_start_gather`'s buffers (after the wait: it reads them)."""
    out, every = pending
    if every is None:
        return _Gathered(out, None, None)
    width = 4 * layout.rows if layout.lengths else 0
    lengths = every[:, :width].contiguous().view(torch.int32) if layout.lengths else None
    mask = None
    if layout.mask:
        mask = every[:, width:].view(torch.bool).view(out.size(0), layout.rows, layout.cols)
    return _Gathered(out, lengths, mask)


def _docs_of(gathered, layout, sources):
    """The documents of ranks ``sources`` (ascending) as one token set ``[sum N, cols, H]``, and
    their rows in the gathered buffer viewed ``[world * rows, ...]`` (a slice where they are
    one block of it: a view, no copy)."""
    rows = layout.rows
    if layout.uniform and sources == list(range(sources[0], sources[-1] + 1)):
        slot = slice(sources[0] * rows, (sources[-1] + 1) * rows)
    else:  # padding rows left out (one small index, built on the device)
        slot = torch.cat([torch.arange(s * rows, s * rows + layout.parts[s][1],
                                       device=gathered.x.device) for s in sources])
    pick = lambda t: None if t is None else t.flatten(0, 1)[slot]  # noqa: E731
    return check.TokenSet(pick(gathered.x), None, pick(gathered.lengths),
                          pick(gathered.mask)), slot


def _start_return(pieces, layout, like, pg, works, zero_block=None, factor=None,
                  async_op=True):
    """Starts the reduce-scatter that sums every rank's gradient of each rank's documents into
    its owner (each rank's multiplied by its ``factor`` where given: see
    :func:`_sum_scatter`). ``pieces``: ``(gradient, slot)`` of the gathered rows this rank
    has a gradient for (:func:`_docs_of`); block ``zero_block`` (a rank) is sent as zeros; the
    padding rows are left as they are (they only reach their owner's padding, which is cut off).
    Returns the owner's ``[rows, cols, H]``."""
    world, rows = len(layout.parts), layout.rows
    whole = slice(0, world * rows)
    if len(pieces) == 1 and isinstance(pieces[0][1], slice) and pieces[0][1] == whole:
        buffer = pieces[0][0].contiguous()
    else:
        buffer = like.new_empty((world * rows, layout.cols, like.size(-1)))
        if zero_block is not None:
            buffer[zero_block * rows:(zero_block + 1) * rows].zero_()
        for grad, slot in pieces:
            buffer[slot] = grad
    out = buffer.new_empty((rows, layout.cols, buffer.size(-1)))
    _sum_scatter(out.view(-1), buffer.view(-1), pg, works, async_op, factor)
    return out


class _Call(NamedTuple):
    """What the gathered loss works on: this rank's token sets ``q``, ``d`` (validated), the
    call's :class:`_Plan`, global ``targets``, the softmax ``scale`` (1 / temperature) and the op
    namespace."""

    q: check.TokenSet
    d: check.TokenSet
    plan: _Plan
    targets: torch.Tensor
    scale: float
    ops: object

    @property
    def layout(self):
        return self.plan.layout

    @property
    def share(self):
        return self.plan.share

    @property
    def group(self):
        return self.plan.pg


def _fwd(c, d, want_argmax):
    """This rank's queries against token set ``d``: fp32 scores and (wanted) int32 argmax."""
    q = c.q
    return c.ops.fwd(q.x, d.x, q.offsets, q.lengths, q.mask, None, d.lengths, d.mask, None, None,
                     ALLPAIRS, 0, q.x.size(1), want_argmax, False)


def _bwd(c, grad, d, argmax):
    return c.ops.bwd(grad, c.q.x, d.x, argmax, c.q.offsets, None, None, None, ALLPAIRS, 0)


def _gathered_docs(c):
    """Every rank's documents, once they have arrived (no overlap)."""
    works, kept = [], c.plan.buffers
    pending = _start_gather(c.d, c.layout, c.group, works, reuse=kept, async_op=False)
    _wait(works)
    _mark("gather")
    if "docs" in kept:  # a view of the same buffer: the same view
        return kept["docs"]
    docs = _docs_of(_arrived(pending, c.layout), c.layout, list(range(len(c.layout.parts))))
    if pending[1] is None and isinstance(docs[1], slice):  # not a copy, no per-call metadata
        kept["docs"] = docs
    return docs


def _loss_only(c):
    """The loss where no gradient is wanted: scores without argmax, cross-entropy."""
    docs, _ = _gathered_docs(c)
    scores, _ = _fwd(c, docs, False)
    return c.ops.ce(scores, c.targets, c.scale)[0]


class _FusedStep(torch.autograd.Function):
    """Gather, then the whole training step of this rank's rows in one op (scores, loss and both
    gradients: :func:`maxsim.contrastive_step`); backward scales the gradients by the incoming
    one and sends the documents' back to their owners with one reduce-scatter."""

    @staticmethod
    def forward(ctx, qx, dx, c):
        docs, slot = _gathered_docs(c)
        q = c.q
        loss, dq, dd = c.ops.contrastive_step(
            q.x, docs.x, q.offsets, q.lengths, q.mask, None, docs.lengths, docs.mask, ALLPAIRS,
            0, q.x.size(1), c.targets, c.scale)
        _mark("step")
        ctx.call, ctx.grads = c, (dq, dd, slot)
        return loss * c.share if c.share != 1.0 else loss

    @staticmethod
    def backward(ctx, grad):
        if ctx.grads is None:
            raise RuntimeError("maxsim.distributed.contrastive_loss: a second backward through the "
                               "same step is not supported (its gradients are scaled in place)")
        c, (dq, dd, slot) = ctx.call, ctx.grads
        ctx.grads = None
        factor = grad * c.share if c.share != 1.0 else grad
        works = []
        mine, held = _FusedStep.start_return(c, dd, slot, factor, works)
        _wait(works)
        del held  # the collective has read it
        _mark("reduce_scatter")
        dQ = dq.mul_(factor)  # in place: the step's own buffer, nothing new
        _mark("scale")
        n, ld = c.d.x.shape[:2]
        return dQ, mine[:n, :ld], None

    @staticmethod
    def start_return(c, dd, slot, factor, works):
        """Starts the documents' gradient back to their owners, each rank's scaled by its
        ``factor``: inside the reduce-scatter where it can pre-multiply (no pass over the 2x
        documents' gradient, no launch), else in place before it. Returns the owner's buffer
        and what must stay alive until the wait (the collective reads it)."""
        if c.plan.premul and _PREMUL[0]:
            send = factor.to(dd.dtype).reshape(1)
            try:
                return _start_return([(dd, slot)], c.layout, dd, c.group, works, factor=send,
                                     async_op=False), send
            except (RuntimeError, TypeError, ValueError, AttributeError):
                _PREMUL[0] = False  # this torch / NCCL cannot: scale first, from now on
        dd.mul_(factor)
        return _start_return([(dd, slot)], c.layout, dd, c.group, works, async_op=False), None


_PREMUL = [True]  # cleared once a pre-multiplied reduce-scatter is refused


class _OverlappedStep(torch.autograd.Function):
    """The local block scored while the other ranks' documents arrive, then theirs, then the
    cross-entropy of the whole row; backward returns the other ranks' gradients first and
    computes the local block's while the reduce-scatter runs."""

    @staticmethod
    def forward(ctx, qx, dx, c):
        rank, world = c.plan.rank, len(c.layout.parts)
        works = []
        pending = _start_gather(c.d, c.layout, c.group, works)
        local, local_argmax = _fwd(c, c.d, True)
        _mark("local_score")
        _wait(works)
        _mark("gather_wait")
        first = c.plan.first
        remote = None
        scores = local
        if world > 1:
            others = [s for s in range(world) if s != rank]
            remote, slot = _docs_of(_arrived(pending, c.layout), c.layout, others)
            remote_scores, remote_argmax = _fwd(c, remote, True)
            scores = torch.cat([remote_scores[:, :first], local, remote_scores[:, first:]], 1)
            remote = (remote, remote_argmax, slot)
        _mark("remote_score")
        loss, grad = c.ops.ce(scores, c.targets, c.scale)
        _mark("loss")
        ctx.call, ctx.saved = c, (grad, first, local_argmax, remote)
        return loss * c.share if c.share != 1.0 else loss

    @staticmethod
    def backward(ctx, grad_loss):
        c, (grad, first, local_argmax, remote) = ctx.call, ctx.saved
        grad = grad * (grad_loss * c.share if c.share != 1.0 else grad_loss)
        n, ld = c.d.x.shape[:2]
        works, mine, dq_remote = [], None, None
        if remote is not None:
            docs, argmax, slot = remote
            rest = torch.cat([grad[:, :first], grad[:, first + n:]], 1)
            dq_remote, dd_remote = _bwd(c, rest, docs, argmax)
            _mark("remote_backward")
            mine = _start_return([(dd_remote, slot)], c.layout, dd_remote, c.group, works,
                                 zero_block=c.plan.rank)
        dQ, dD = _bwd(c, grad[:, first:first + n].contiguous(), c.d, local_argmax)
        _mark("local_backward")
        _wait(works)
        _mark("reduce_scatter_wait")
        if remote is not None:
            dQ, dD = dQ + dq_remote, dD + mine[:n, :ld]
        return dQ, dD, None


def contrastive_loss(
    Q, D, q_mask=None, d_mask=None, *, q_lengths=None, d_lengths=None, targets=None,
    temperature=1.0, normalize=False, same_shapes=False, overlap=False, group=None,
    backend="auto",
):
    """Softmax cross-entropy of this rank's queries against the documents of every rank of
    ``group`` (in-batch negatives across devices), computed in fp32.

    Every rank of ``group`` calls it with its own ``Q [B_r, Lq, H]`` and ``D [N_r, Ld_r, H]`` (the
    counts and document lengths may differ between ranks) and masks / lengths as
    :func:`maxsim.maxsim`. The columns are the documents of rank 0, then rank 1, ...: ``targets``
    int ``[B_r]`` index them; None is the diagonal, rank ``r``'s query ``i`` against its own
    document ``i``. ``same_shapes=True`` promises that every rank has the same ``B``, ``N`` and
    ``Ld``, the same dtype, and document lengths / masks on all ranks or none; it saves a small
    all-gather of the shapes (and, on a group without gloo, the host sync of reading them).

    The documents are gathered with one all-gather of a flat buffer, then one op runs the whole
    step (scores, loss, and both gradients: :func:`maxsim.contrastive_step`); in backward the
    documents' gradients go back to their owners in one reduce-scatter, so every rank must run
    backward. ``overlap=True`` scores the local block while the other ranks' documents arrive and
    computes its gradient while the reduce-scatter runs (more launches, the transfers hidden).
    Returns this rank's share of the loss, scaled so that the mean over ranks is the loss of one
    process holding the whole batch and the mean of the ranks' gradients (what
    DistributedDataParallel applies) is that process's gradient.
    """
    _check_temperature(temperature)
    if not isinstance(D, torch.Tensor) or D.dim() != 3:
        raise ValueError(f"D: expected a tensor [N, Ld, H], got {getattr(D, 'shape', type(D))}")
    if normalize:  # once, before the gather, not once per block
        Q, D = F.normalize(Q, dim=-1), F.normalize(D, dim=-1)
    # This rank's inputs are checked before any collective: a bad one raises, it does not hang.
    q, d, _, _ = padded_sets(Q, D, q_mask, d_mask, False, q_lengths, d_lengths, backend)
    if d.lengths is not None:  # the gathers carry the documents' lengths as int32 bytes
        d = d._replace(lengths=check.int32(d.lengths))
    if q.scale is not None or d.scale is not None:
        raise ValueError("Q, D: expected float tensors (quantized tokens have no gradient here)")
    plan = _plan(q, d, group, same_shapes)
    targets = _global_targets(targets, q.x.size(0), d.x.size(0), plan, q.x.device)
    c = _Call(q, d, plan, targets, 1.0 / temperature, select_ops(q.x.device, backend))
    if not (torch.is_grad_enabled() and (q.x.requires_grad or d.x.requires_grad)):
        loss = _loss_only(c)
        return loss * plan.share if plan.share != 1.0 else loss
    return (_OverlappedStep if overlap else _FusedStep).apply(q.x, d.x, c)


def _global_targets(targets, nq, nd, plan, device):
    """``targets`` as column indices of the gathered scores; None: query ``i`` -> this rank's
    document ``i`` (column ``first + i``, made once per plan)."""
    if targets is None:
        if plan.diagonal is None:
            raise ValueError(
                f"targets: the diagonal default needs at least as many documents as queries on "
                f"every rank, got {nq} queries and {nd} documents; pass targets"
            )
        return plan.diagonal
    columns = sum(p[1] for p in plan.layout.parts)
    check.require_index("targets", targets, (nq,), device)
    if columns == 0 and nq:
        raise ValueError("D: expected at least one document across the ranks, got none")
    if check.values_checked(targets):
        check.check_range("targets", targets, 0, columns - 1, f"a document index in [0, {columns})")
    return targets


def retrieve(
    Q, shard, top_k, q_mask=None, d_mask=None, *, offset=None, group=None, chunk_size=None,
    backend="auto",
):
    """The ``top_k`` best documents of a corpus split across the ranks of ``group``, for every
    query, ties to the lower global document index: the result of :func:`maxsim.retrieve` on the
    whole corpus, on every rank.

    Every rank calls it with the same queries ``Q [Nq, Lq, H]`` and its own ``shard [N_r, Ld, H]``
    (a float tensor or :class:`maxsim.QuantizedTokens`), whose document ``j`` is the corpus's
    document ``offset + j``. ``offset`` None: the shards are the corpus in rank order (rank 0's
    first), found with one small all-gather of the shard sizes (over the host where the group has
    gloo). Each rank scans its shard with :func:`maxsim.retrieve`; one all-gather of every
    rank's ``top_k`` (score, id) pairs then merges them, with no host sync unless a shard is
    smaller than ``top_k``. Returns scores ``[Nq, top_k]`` fp32 descending and global indices
    int64.
    """
    top_k = check.integer("top_k", top_k, 0)
    n = shard.size(0)
    if offset is None:
        sizes = _all_ints((n,), Q.device, group)
        offset = sum(s[0] for s in sizes[: dist.get_rank(group)])
    offset = check.integer("offset", offset, 0)
    if offset + n > 0xFFFFFFFF:
        raise ValueError(f"offset: the global indices must stay below 2**32, got {offset + n}")
    scores, docs = _retrieve_local(Q, shard, min(top_k, n), q_mask, d_mask,
                                   chunk_size=chunk_size, backend=backend)
    _mark("local_scan")
    scores, keys = _merge(scores, _rank_keys(scores, docs + offset), top_k, group)
    _mark("merge")
    # Only a shard smaller than top_k can leave a slot empty (every rank's then is): the check,
    # and its host sync, stay on those ranks.
    if top_k > n and bool((keys[:, -1] == _NO_DOC).any()):
        raise ValueError(f"top_k: expected at most the corpus's document count, got {top_k}")
    return scores, _doc_of(keys)


def _merge(scores, keys, top_k, group):
    """The global ``top_k`` of every rank's ``(scores, keys)`` ``[Nq, <= top_k]``: one all-gather
    of the keys beside the scores' bits, then one top-k. Empty slots rank last (:data:`_NO_DOC`)."""
    missing = top_k - keys.size(1)
    keys = F.pad(keys, (0, missing), value=_NO_DOC)
    bits = F.pad(scores.view(torch.int32).long(), (0, missing))
    mine = torch.cat([keys, bits], dim=1)
    every = mine.new_empty((dist.get_world_size(group), *mine.shape))
    _gather_into(every.view(-1), mine.view(-1), group=group)
    keys, bits = every.split(top_k, dim=2)
    best, position = torch.topk(keys.permute(1, 0, 2).flatten(1), top_k, dim=1)
    scores = bits.permute(1, 0, 2).flatten(1).gather(1, position).int().view(torch.float32)
    return scores, best


__all__ = ["contrastive_loss", "retrieve"]
