"""MaxSim across ranks on ``torch.distributed`` (NCCL on GPUs, gloo on CPU): a contrastive loss
whose negatives are every rank's documents, and ``retrieve`` over a corpus sharded across ranks.

Every rank calls the same function with its own part; the process group's collectives move the
data (nothing else). Results equal those of one process holding the whole batch or corpus.
"""

import torch
import torch.distributed as dist
import torch.nn.functional as F

from . import validation as check
from .dispatch import select_ops
from .losses import _check_temperature
from .native import maxsim
from .retrieve import _doc_of, _rank_keys
from .retrieve import retrieve as _retrieve_local

# torch renamed the tensor collectives; the old names stay for torch before the rename.
_gather_into = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor

_NO_DOC = torch.iinfo(torch.int64).min  # below every key of _rank_keys: a shard's empty slot


def _start_gather(x, group, works):
    """All ranks' ``x`` (same shape on every rank) concatenated ``[world * x.size(0), ...]``; the
    collective is started, its handle appended to ``works`` (wait before reading the result)."""
    out = x.new_empty((dist.get_world_size(group) * x.size(0), *x.shape[1:]))
    works.append(_gather_into(out, x.contiguous(), group=group, async_op=True))
    return out


def _gather_rows(x, group, works):
    """:func:`_start_gather` viewed ``[world, *x.shape]``."""
    return _start_gather(x, group, works).view(dist.get_world_size(group), *x.shape)


class _GatherWithGrad(torch.autograd.Function):
    """:func:`_start_gather` whose backward sums every rank's gradient of a block into its owner
    (one reduce-scatter)."""

    @staticmethod
    def forward(ctx, x, group, works):
        ctx.group = group
        return _start_gather(x, group, works)

    @staticmethod
    def backward(ctx, grad):
        out = grad.new_empty((grad.size(0) // dist.get_world_size(ctx.group), *grad.shape[1:]))
        _reduce_scatter(out, grad.contiguous(), group=ctx.group)
        return out, None, None


def _shapes(Q, D, group, same_shapes):
    """Every rank's ``(queries, documents, document length)``: from one small all-gather, or
    this rank's own when the caller says they are the same everywhere."""
    mine = (Q.size(0), D.size(0), D.size(1))
    world = dist.get_world_size(group)
    if same_shapes:
        return [mine] * world
    sizes = torch.tensor(mine, dtype=torch.int64, device=D.device)
    out = sizes.new_empty(world * 3)
    _gather_into(out, sizes, group=group)
    return [tuple(row) for row in out.view(world, 3).tolist()]


def _padded_to(x, rows, cols, value=0):
    """``x [N, L, ...]`` padded at the end of its first two dims to ``[rows, cols, ...]``."""
    pad = [0, 0] * (x.dim() - 2) + [0, cols - x.size(1), 0, rows - x.size(0)]
    return F.pad(x, pad, value=value) if any(pad) else x


def contrastive_loss(
    Q, D, q_mask=None, d_mask=None, *, q_lengths=None, d_lengths=None, targets=None,
    temperature=1.0, normalize=False, same_shapes=False, overlap=True, group=None,
    backend="auto",
):
    """Softmax cross-entropy of this rank's queries against the documents of every rank of
    ``group`` (in-batch negatives across devices), computed in fp32.

    Every rank of ``group`` calls it with its own ``Q [B_r, Lq, H]`` and ``D [N_r, Ld_r, H]`` (the
    counts and document lengths may differ between ranks) and masks / lengths as
    :func:`maxsim.maxsim`. The columns are the documents of rank 0, then rank 1, ...: ``targets``
    int ``[B_r]`` index them; None is the diagonal, rank ``r``'s query ``i`` against its own
    document ``i``. ``same_shapes=True`` promises that every rank has the same ``B``, ``N`` and
    ``Ld``, which saves a small all-gather (and its host sync) per call.

    The documents are gathered with one asynchronous all-gather while the local block is scored
    (``overlap=False``, where every rank has the same shapes: after the gather, every block in one
    call, fewer launches for no overlap); in backward, each rank's gradient of the other ranks'
    documents returns to them in one reduce-scatter, so every rank must run backward. Returns this
    rank's share of the loss, scaled so that the mean over ranks is the loss of one process
    holding the whole batch and the mean of the ranks' gradients (what DistributedDataParallel
    applies) is that process's gradient.
    """
    _check_temperature(temperature)
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    shapes = _shapes(Q, D, group, same_shapes)
    if normalize:  # once, before the gather, not once per block
        Q, D = F.normalize(Q, dim=-1), F.normalize(D, dim=-1)
    scores = _gathered_scores(Q, D, q_mask, d_mask, q_lengths, d_lengths, shapes, overlap, group,
                              backend)
    first = sum(s[1] for s in shapes[:rank])
    targets = _global_targets(targets, Q.size(0), first, D.size(0), scores.size(1), Q.device)
    loss = select_ops(scores.device, backend).ce(scores, targets, 1.0 / temperature)[0]
    return loss * (Q.size(0) * world / max(sum(s[0] for s in shapes), 1))


def _gathered_scores(Q, D, q_mask, d_mask, q_lengths, d_lengths, shapes, overlap, group,
                     backend):
    """This rank's queries against every rank's documents: ``[B_r, sum N]`` fp32, rank-major."""
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    rows, cols = max(s[1] for s in shapes), max(s[2] for s in shapes)
    works = []
    gathered = _GatherWithGrad.apply(_padded_to(D, rows, cols), group, works)
    gathered = gathered.view(world, rows, cols, D.size(2))
    lengths = masks = None
    if d_lengths is not None:
        lengths = _gather_rows(_padded_to(d_lengths.to(torch.int32)[:, None], rows, 1), group,
                               works)[..., 0]
    if d_mask is not None:
        masks = _gather_rows(_padded_to(d_mask.bool(), rows, cols), group, works)
    if not overlap and all(s[1:] == shapes[0][1:] for s in shapes):
        for work in works:
            work.wait()
        flat = lambda x: None if x is None else x.flatten(0, 1)  # noqa: E731
        return maxsim(Q, flat(gathered), q_mask, flat(masks), q_lengths=q_lengths,
                      d_lengths=flat(lengths), backend=backend)
    # The local block needs nothing from the others: it is scored while they arrive.
    local = maxsim(Q, D, q_mask, d_mask, q_lengths=q_lengths, d_lengths=d_lengths,
                   backend=backend)
    for work in works:
        work.wait()
    blocks = []
    for source, (_, n, length) in enumerate(shapes):
        if source == rank:
            blocks.append(local)
            continue
        blocks.append(maxsim(
            Q, gathered[source, :n, :length], q_mask,
            None if masks is None else masks[source, :n, :length], q_lengths=q_lengths,
            d_lengths=None if lengths is None else lengths[source, :n], backend=backend,
        ))
    return torch.cat(blocks, dim=1)


def _global_targets(targets, nq, first, nd, columns, device):
    """``targets`` as column indices of the gathered scores; None: query ``i`` -> this rank's
    document ``i`` (column ``first + i``)."""
    if targets is None:
        if nd < nq:
            raise ValueError(
                f"targets: the diagonal default needs at least as many documents as queries on "
                f"every rank, got {nq} queries and {nd} documents; pass targets"
            )
        return torch.arange(first, first + nq, device=device)
    check.require_index("targets", targets, (nq,), device)
    if columns == 0 and nq:
        raise ValueError("D: expected at least one document across the ranks, got none")
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
    first), found with one small all-gather of the shard sizes. Each rank scans its shard with
    :func:`maxsim.retrieve`; one all-gather of every rank's ``top_k`` (score, id) pairs then
    merges them. Returns scores ``[Nq, top_k]`` fp32 descending and global indices int64.
    """
    world = dist.get_world_size(group)
    top_k = check.integer("top_k", top_k, 0)
    n = shard.size(0)
    if offset is None:
        sizes = torch.tensor([n], dtype=torch.int64, device=Q.device)
        every = sizes.new_empty(world)
        _gather_into(every, sizes, group=group)
        offset = int(every[: dist.get_rank(group)].sum())
    offset = check.integer("offset", offset, 0)
    if offset + n > 0xFFFFFFFF:
        raise ValueError(f"offset: the global indices must stay below 2**32, got {offset + n}")
    scores, docs = _retrieve_local(Q, shard, min(top_k, n), q_mask, d_mask,
                                   chunk_size=chunk_size, backend=backend)
    keys = _rank_keys(scores, docs + offset)
    missing = top_k - keys.size(1)  # a shard smaller than top_k: empty slots rank last
    keys = F.pad(keys, (0, missing), value=_NO_DOC)
    bits = F.pad(scores.view(torch.int32).long(), (0, missing))
    works = []  # the scores travel as their bits next to the keys: one collective
    every = _gather_rows(torch.cat([keys, bits], dim=1), group, works)
    works[0].wait()
    keys, bits = every.split(top_k, dim=2)
    best, position = torch.topk(keys.permute(1, 0, 2).flatten(1), top_k, dim=1)
    if top_k and bool((best[:, -1] == _NO_DOC).any()):
        raise ValueError(f"top_k: expected at most the corpus's document count, got {top_k}")
    scores = bits.permute(1, 0, 2).flatten(1).gather(1, position).int().view(torch.float32)
    return scores, _doc_of(best)


__all__ = ["contrastive_loss", "retrieve"]
