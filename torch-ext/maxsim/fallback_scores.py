"""Scores without argmax on CPU, the PyTorch path's fast case: all pairs, and grouped padded
documents.

The similarities are computed as documents x queries (``D @ Q^T``, rows are document tokens),
the orientation CPU BLAS runs fastest for a few dozen query tokens, a block of rows at a time
(sized from ``MAXSIM_TORCH_MEMORY_MB``, the last-level cache and the thread count). Each
document's max is then one reduction over rows: ``amax`` over a padded block's token axis
(invalid tokens reset to -inf first, padding may hold anything), or for packed documents a fold
of the rows into their document (``_fold_rows``), so no row is gathered and no padding is
multiplied. fp16 / bf16 rows are upcast one block at a time. Same semantics as ``fallback.fwd``
(NaN wins, a query token with no valid document token adds 0); ``fallback.fwd`` keeps every
other case.
"""

import warnings

import torch

from .layouts import ALLPAIRS, GROUPED
from .settings import memory_budget_bytes

# Largest similarity block per thread: one that stays in a core's share of the last-level cache
# is reduced from cache; more threads take larger blocks, since every multi-threaded op pays for
# waking and joining them (a cost that grows when other processes hold a core).
_SIM_BLOCK_BYTES = 8 * 2**20
# Rows of a packed block folded by one amax before the row-by-row fold into their documents.
_RUN = 16
# Fewest document rows a block should have, so a call's fixed cost stays small next to its GEMM.
_MIN_ROWS = 256


def supported(queries, documents, layout) -> bool:
    """Whether ``score`` takes this call: CPU tensors, all pairs (packed documents with offsets
    in order) or grouped padded documents."""
    if documents.x.device.type != "cpu":
        return False
    if not documents.packed and documents.width == 0:
        return False
    if layout == GROUPED:
        return not documents.packed
    if layout != ALLPAIRS:
        return False
    if not documents.packed or documents.starts.numel() < 2:
        return True
    return bool((documents.starts[1:] >= documents.starts[:-1]).all())


def score(queries, documents, layout, group, scores):
    """Fill ``scores`` (fp32 ``[Nq, Nd]`` or ``[Nq, group]``) for a call ``supported`` takes."""
    if layout == GROUPED:
        _grouped(queries, documents, group, scores)
    elif documents.packed:
        _allpairs_packed(queries, documents, scores)
    else:
        _allpairs_padded(queries, documents, scores)


def _sim_bytes() -> int:
    """Bytes of similarities a block may hold: half the memory budget at most."""
    per_thread = _SIM_BLOCK_BYTES * torch.get_num_threads()
    return max(1, min(memory_budget_bytes() // 2, per_thread))


def _block_rows(documents, columns: int) -> int:
    """Document rows a block may take: its similarities (``columns`` each) within the cache-sized
    cap, and with the fp32 copy of fp16 / bf16 rows, within half the memory budget."""
    convert = 0 if documents.x.dtype == torch.float32 else 4 * documents.x.size(-1)
    memory = memory_budget_bytes() // 2 // (4 * columns + convert)
    return max(1, min(_sim_bytes() // (4 * columns), memory))


def _query_block(queries, nq: int, ndocs_out: int) -> int:
    """Queries per block: as many as keep a block of at least ``_MIN_ROWS`` rows, and the
    per-document maxima of ``ndocs_out`` documents, within the similarity budget."""
    lw = max(queries.width, 1)
    per_query = lw * 4 * max(_MIN_ROWS, ndocs_out)
    return max(1, min(nq, _sim_bytes() // per_query))


class _Scratch:
    """A call's reused block buffers: a fresh multi-MB tensor per block costs its page faults
    again every time (about as much as the copy that fills it), a reused one only once."""

    def __init__(self):
        self.buffers = {}

    def take(self, name: str, shape) -> torch.Tensor:
        """A contiguous fp32 tensor of ``shape`` (contents undefined)."""
        numel = 1
        for size in shape:
            numel *= size
        buf = self.buffers.get(name)
        if buf is None or buf.numel() < numel:
            buf = self.buffers[name] = torch.empty(numel, dtype=torch.float32)
        return buf[:numel].view(shape)

    def fp32(self, rows: torch.Tensor) -> torch.Tensor:
        """``rows`` as fp32: itself when it is fp32, else converted into the reused buffer."""
        if rows.dtype == torch.float32:
            return rows
        return self.take("rows", rows.shape).copy_(rows)

    def mm(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        """``a @ b`` (2-D or batched 3-D) into the reused similarity buffer."""
        shape = (*a.shape[:-1], b.size(-1))
        return torch.matmul(a, b, out=self.take("sim", shape))


def _token_scores(best, q_valid, d_any):
    """Scores ``[b, a]`` from per-token maxima ``best [b, a, Lq]``: a query token adds its max
    where it is valid and its document has a valid token, else 0."""
    keep = q_valid[None] & d_any[:, None, None]
    return torch.where(keep, best, 0.0).sum(-1)


def _padded_valid(documents, ids):
    """Validity ``[b, L]`` of padded documents ``ids`` (a slice), or None when all are valid."""
    lengths, mask = documents.lengths, documents.mask
    if lengths is None and mask is None:
        return None
    valid = None
    if lengths is not None:
        valid = torch.arange(documents.width) < lengths[ids, None]
    if mask is not None:
        valid = mask[ids] if valid is None else valid & mask[ids]
    return valid


def _allpairs_padded(queries, documents, scores):
    """Padded documents ``[Nd, L, H]``: blocks of whole documents, ``amax`` over their tokens."""
    scratch = _Scratch()
    nq, nd = scores.shape
    width, h = documents.width, documents.x.size(-1)
    bq = _query_block(queries, nq, 1)
    for i0 in range(0, nq, bq):
        q_tokens, q_valid = queries.gather(slice(i0, i0 + bq))
        a, lw = q_valid.shape
        q_t = q_tokens.reshape(a * lw, h).T.contiguous()
        bd = max(1, min(nd, _block_rows(documents, a * lw) // max(width, 1)))
        for j0 in range(0, nd, bd):
            ids = slice(j0, j0 + bd)
            rows = documents.x[ids]
            b = rows.size(0)
            sim = scratch.mm(scratch.fp32(rows.reshape(b * width, h)), q_t)
            sim = sim.view(b, width, a * lw)
            valid = _padded_valid(documents, ids)
            if valid is None:
                d_any = torch.full((b,), width > 0)
            else:  # invalid tokens may hold anything, NaN included: reset, never multiplied out
                sim.masked_fill_(~valid[..., None], float("-inf"))
                d_any = valid.any(-1)
            best = sim.amax(1).view(b, a, lw)
            scores[i0 : i0 + a, ids] = _token_scores(best, q_valid, d_any).T


def _allpairs_packed(queries, documents, scores):
    """Packed documents ``[T, H]`` with offsets in order: blocks of rows, each row's similarities
    folded into its document's maxima by ``index_reduce_`` (invalid rows into a scratch row)."""
    scratch = _Scratch()
    nq, nd = scores.shape
    h = documents.x.size(-1)
    first = int(documents.starts[0])
    last = int(documents.starts[-1] + documents.lengths[-1])
    ends = documents.starts + documents.lengths
    d_any = _packed_any(documents, ends)
    bq = _query_block(queries, nq, nd + 1)
    for i0 in range(0, nq, bq):
        q_tokens, q_valid = queries.gather(slice(i0, i0 + bq))
        a, lw = q_valid.shape
        q_t = q_tokens.reshape(a * lw, h).T.contiguous()
        best = torch.full((nd + 1, a * lw), float("-inf"))
        block = max(_MIN_ROWS, _block_rows(documents, a * lw))
        for r0 in range(first, last, block):
            r1 = min(r0 + block, last)
            sim = scratch.mm(scratch.fp32(documents.x[r0:r1]), q_t)
            if documents.mask is not None:  # masked rows may hold anything, NaN included
                sim.masked_fill_(~documents.mask[r0:r1, None], float("-inf"))
            _fold_rows(best, sim, ends, r0)
        best = best[:nd].view(nd, a, lw)
        scores[i0 : i0 + a] = _token_scores(best, q_valid, d_any).T


def _fold_rows(best, sim, ends, r0):
    """``best[d] = max(best[d], sim[r])`` for every row ``r`` of the block starting at row ``r0``
    and its document ``d``, the number of documents that end at or before it.

    ``index_reduce_`` runs row by row, so ``amax`` first folds runs of ``_RUN`` rows of one
    document into one row; only the rows of runs that straddle a document boundary go one by
    one. Shapes: ``best [Nd + 1, R]`` (row Nd: scratch), ``sim [n, R]``, ``ends [Nd]``
    non-decreasing.
    """
    n, runs = sim.size(0), sim.size(0) // _RUN
    run_start = torch.arange(r0, r0 + runs * _RUN, _RUN)
    owner = torch.searchsorted(ends, run_start, right=True)
    whole = owner == torch.searchsorted(ends, run_start + (_RUN - 1), right=True)
    loose = torch.ones(n, dtype=torch.bool)
    loose[: runs * _RUN] = (~whole).repeat_interleave(_RUN)
    loose = loose.nonzero().squeeze(1)
    run_max = sim[: runs * _RUN].view(runs, _RUN, sim.size(1)).amax(1)
    loose_owner = torch.searchsorted(ends, loose + r0, right=True)
    # index_reduce_ is marked beta (its amax, tested against float64, is what this needs, and
    # runs faster than scatter_reduce_): its warning is silenced here, not in the user's filters.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"index_reduce\(\) is in beta")
        best.index_reduce_(0, owner.masked_fill_(~whole, best.size(0) - 1), run_max, "amax")
        best.index_reduce_(0, loose_owner, sim[loose], "amax")


def _packed_any(documents, ends):
    """Whether each packed document has a valid token (bool ``[Nd]``)."""
    if documents.mask is None:
        return documents.lengths > 0
    counts = torch.zeros(documents.x.size(0) + 1, dtype=torch.int64)
    torch.cumsum(documents.mask, 0, out=counts[1:])
    return counts[ends] > counts[documents.starts]


def _grouped(queries, documents, group, scores):
    """GROUPED, padded documents ``[Nq * group, L, H]``: one batched GEMM per block of queries,
    each query against the rows of its own ``group`` documents."""
    scratch = _Scratch()
    nq = scores.size(0)
    width, h = documents.width, documents.x.size(-1)
    lw = max(queries.width, 1)
    bq = max(1, min(nq, _block_rows(documents, lw) // max(group * width, 1)))
    for i0 in range(0, nq, bq):
        q_tokens, q_valid = queries.gather(slice(i0, i0 + bq))
        a = q_valid.size(0)
        ids = slice(i0 * group, (i0 + a) * group)
        rows = scratch.fp32(documents.x[ids].reshape(a, group * width, h))
        sim = scratch.mm(rows, q_tokens.transpose(1, 2)).view(a * group, width, -1)
        valid = _padded_valid(documents, ids)
        if valid is None:
            d_any = torch.full((a * group,), width > 0)
        else:
            sim.masked_fill_(~valid[..., None], float("-inf"))
            d_any = valid.any(-1)
        best = sim.amax(1).view(a, group, -1)
        keep = q_valid[:, None] & d_any.view(a, group, 1)
        scores[i0 : i0 + a] = torch.where(keep, best, 0.0).sum(-1)
