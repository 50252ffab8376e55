"""Benchmark workloads: a registry of shapes, one setup factory per workload, floors and references.

A workload names a *kind* (how inputs are laid out and what is computed) and its shape. The kind
owns everything that does not depend on the implementation under test:

* ``meta``: lengths, masks, offsets and index lists, drawn once per (workload, dtype) and shared
  by every input set, so all sets have the same shape and the same floor;
* ``make_set``: one set of random inputs (several sets are rotated while timing so that a
  timing is not an L2 hit);
* ``work``: the fewest bytes and flops any implementation must spend (the floor);
* ``reference``: float64 results on the same cast inputs, and ``check`` against them;
* ``naive``: the plain PyTorch baseline (einsum + max + sum).

Inputs: every token vector is L2-normalised; padding holds random (normalised) values, never
zeros; queries use all ``Lq`` tokens (ColBERT query expansion pads queries with ``[MASK]``
tokens that all take part); padded documents have random lengths in ``[Ld_min, Ld]``, where
``Ld_min`` defaults to ``Ld/2`` (``Ld_min=Ld`` in a workload's params makes them fixed-length).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.nn.functional as F

H = 128  # embedding dim of every workload
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}

# Elements of a float64 similarity block the reference materialises at once (512 MB).
_REF_BLOCK = 1 << 26


class Unsupported(Exception):
    """An implementation has no entry point that computes this workload; the message says why."""


# ----------------------------------------------------------------------------------------------
# Input generation
# ----------------------------------------------------------------------------------------------


def tokens(shape, dtype, gen, device) -> torch.Tensor:
    """Random L2-normalised token vectors, generated in slabs to bound fp32 scratch memory."""
    out = torch.empty(*shape, dtype=dtype, device=device)
    flat = out.view(-1, shape[-1])
    step = max(1, (1 << 26) // shape[-1])
    for s in range(0, flat.shape[0], step):
        n = min(step, flat.shape[0] - s)
        x = torch.randn(n, shape[-1], generator=gen, device=device, dtype=torch.float32)
        flat[s : s + n] = F.normalize(x, dim=-1).to(dtype)
    return out


def _lengths(n, lo, hi, cpu_gen) -> torch.Tensor:
    """``n`` int64 lengths uniform in ``[lo, hi]`` (host tensor)."""
    return torch.randint(lo, hi + 1, (n,), generator=cpu_gen, dtype=torch.int64)


def _prefix_mask(lengths: torch.Tensor, L: int) -> torch.Tensor:
    return torch.arange(L, device=lengths.device) < lengths.unsqueeze(-1)


def _offsets(lengths: torch.Tensor) -> torch.Tensor:
    return torch.cat([lengths.new_zeros(1), lengths.cumsum(0)])


def _gather_index(lengths: torch.Tensor, offsets: torch.Tensor, L: int) -> torch.Tensor:
    """[N, L] row indices into a packed tensor; padding slots point at the segment's first row."""
    pos = torch.arange(L).unsqueeze(0)
    return (offsets[:-1].unsqueeze(1) + torch.where(pos < lengths.unsqueeze(1), pos, 0)).long()


# ----------------------------------------------------------------------------------------------
# Scoring helpers shared by the naive baseline (input dtype) and the reference (float64)
# ----------------------------------------------------------------------------------------------


def padded_scores(Q, D, q_mask=None, d_mask=None, grouped=False) -> torch.Tensor:
    """einsum + masked_fill(-inf) + max + sum; the sum runs in fp32 (float64 for float64 inputs).

    Shapes: Q [Nq, Lq, H]; all pairs: D [Nd, Ld, H], d_mask [Nd, Ld] -> [Nq, Nd];
    grouped: D [Nq, K, Ld, H], d_mask [Nq, K, Ld] -> [Nq, K]; q_mask [Nq, Lq].
    """
    if grouped:
        sim = torch.einsum("bid,bkjd->bkij", Q, D)
        dm = None if d_mask is None else d_mask[:, :, None, :]
    else:
        sim = torch.einsum("qid,njd->qnij", Q, D)
        dm = None if d_mask is None else d_mask[None, :, None, :]
    if dm is not None:
        sim = sim.masked_fill(~dm, float("-inf"))
    best = sim.amax(dim=-1)
    if best.dtype != torch.float64:
        best = best.float()
    if q_mask is not None:
        best = best.masked_fill(~q_mask[:, None, :], 0.0)
    return best.sum(dim=-1)


def _blocked(n_total, per_item) -> int:
    return max(1, min(n_total, _REF_BLOCK // max(1, per_item)))


def ref_allpairs(Q, D, q_mask, d_mask) -> torch.Tensor:
    """float64 all-pairs scores [Nq, Nd], in document blocks."""
    Q64, Nd = Q.double(), D.shape[0]
    step = _blocked(Nd, Q.shape[0] * Q.shape[1] * D.shape[1])
    parts = []
    for s in range(0, Nd, step):
        dm = None if d_mask is None else d_mask[s : s + step]
        parts.append(padded_scores(Q64, D[s : s + step].double(), q_mask, dm))
    return torch.cat(parts, dim=1)


def ref_grouped(Q, D, q_mask, d_mask) -> torch.Tensor:
    """float64 per-query candidate scores [Nq, K], in query blocks."""
    Nq = Q.shape[0]
    step = _blocked(Nq, D.shape[1] * Q.shape[1] * D.shape[2])
    parts = []
    for s in range(0, Nq, step):
        qm = None if q_mask is None else q_mask[s : s + step]
        dm = None if d_mask is None else d_mask[s : s + step]
        q, d = Q[s : s + step].double(), D[s : s + step].double()
        parts.append(padded_scores(q, d, qm, dm, grouped=True))
    return torch.cat(parts, dim=0)


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    out = out.detach().double().cpu()
    num = torch.linalg.vector_norm(out - ref)
    den = torch.linalg.vector_norm(ref)
    return float(num / den) if float(den) > 0 else float(num)


def topk_agree(out: torch.Tensor, ref: torch.Tensor, k: int = 10) -> float:
    """Fraction of rows whose top-k index set equals the reference's."""
    k = min(k, ref.shape[-1])
    a = out.detach().double().cpu().topk(k, dim=-1).indices.sort(dim=-1).values
    b = ref.topk(k, dim=-1).indices.sort(dim=-1).values
    return float((a == b).all(dim=-1).double().mean())


# ----------------------------------------------------------------------------------------------
# Kinds
# ----------------------------------------------------------------------------------------------


@dataclass
class Work:
    bytes: float
    flops: float
    rate: str | None = None  # the tensor-core rate that bounds the flops: "int8", "fp8" or dtype's


class Kind:
    """How one family of workloads lays out its inputs and what it computes."""

    name = ""
    train = False

    def make_meta(self, p: dict, cpu_gen, device) -> dict:
        raise NotImplementedError

    def make_set(self, p: dict, meta: dict, dtype, gen, device) -> dict:
        raise NotImplementedError

    def work(self, p: dict, meta: dict, dtype) -> Work:
        raise NotImplementedError

    def reference(self, s: dict, meta: dict) -> dict:
        raise NotImplementedError

    def naive(self, s: dict, meta: dict) -> Callable[[], object]:
        raise NotImplementedError

    def naive_bytes(self, p: dict, meta: dict, dtype) -> float:
        """A lower bound of the naive baseline's scratch memory (to skip certain OOMs)."""
        return 0.0

    def check(self, out, ref: dict) -> tuple[float | None, float | None, str]:
        """(rel_err, top10_agree, note) of an implementation's output against the reference."""
        scores = out
        if not torch.isfinite(scores).all():
            return None, None, "non-finite scores"
        return rel_err(scores, ref["scores"]), topk_agree(scores, ref["scores"]), ""


def _esize(dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


_CODE_LIMIT = {"int8": 127.0, "fp8": 448.0}


def quantize_tokens(x: torch.Tensor, fmt: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric per-token 8-bit codes and fp32 scales (token = codes * scale), the stored-index
    format of ``maxsim.quantize``: int8 codes in [-127, 127] rounded to nearest, or float8 e4m3."""
    scale = x.float().abs().amax(dim=-1) / _CODE_LIMIT[fmt]
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))[..., None]
    if fmt == "int8":
        codes = torch.round(x.float() / safe).clamp_(-127, 127).to(torch.int8)
    else:
        codes = (x.float() / safe).clamp_(-448, 448).to(torch.float8_e4m3fn)
    return codes.contiguous(), scale.contiguous()


def dequantized(s: dict, dtype=torch.float64, side: str = "D") -> torch.Tensor:
    return s[f"{side}_codes"].to(dtype) * s[f"{side}_scale"].to(dtype)[..., None]


def queries(s: dict, dtype=None) -> torch.Tensor:
    """The set's queries: as given, or dequantized (float64 unless ``dtype``) where they are
    int8 codes too."""
    if "Q_codes" in s:
        return dequantized(s, dtype or torch.float64, "Q")
    return s["Q"] if dtype is None else s["Q"].to(dtype)


class _PaddedDocs(Kind):
    """Padded queries against padded documents with prefix lengths. Subclasses name the query
    count and the leading document shape: [Nd] (every query with every document) or [B, K]
    (each query with its own K candidates, ``grouped``).

    ``holes`` in a workload's params masks out that share of the real tokens (a skiplist): the
    documents are then given as that mask alone, not as lengths, and the floor counts the mask's
    bytes and the real tokens outside the holes. ``quant`` ("int8" or "fp8") stores the documents
    as 8-bit codes with one fp32 scale per token (``D_codes``, ``D_scale``; no float copy);
    queries stay in the row's dtype, or with ``quant_q`` are int8 codes too (``Q_codes``,
    ``Q_scale``; ``Q`` keeps the float queries they were made from, for peers that quantize their
    own way). The floor counts the codes and scales, and the reference is float64 on the
    dequantized tokens."""

    grouped = False

    def n_queries(self, p) -> int:
        raise NotImplementedError

    def doc_shape(self, p) -> tuple:
        raise NotImplementedError

    def n_pairs(self, p) -> int:
        docs = math.prod(self.doc_shape(p))
        return docs if self.grouped else self.n_queries(p) * docs

    def make_meta(self, p, cpu_gen, device):
        shape, Ld = self.doc_shape(p), p["Ld"]
        d_len = _lengths(math.prod(shape), p.get("Ld_min", max(1, Ld // 2)), Ld, cpu_gen)
        d_len = d_len.view(shape)
        d_mask = _prefix_mask(d_len, Ld)
        if p.get("holes"):  # skiplist holes: that share of the real tokens masked out
            d_mask &= torch.rand(d_mask.shape, generator=cpu_gen) >= p["holes"]
        return {
            "d_len": d_len.to(device=device, dtype=torch.int32),
            "d_mask": d_mask.to(device),
            "valid_d": int(d_mask.sum()),
        }

    def make_set(self, p, meta, dtype, gen, device):
        s = {"Q": tokens((self.n_queries(p), p["Lq"], H), dtype, gen, device)}
        D = tokens((*self.doc_shape(p), p["Ld"], H), dtype, gen, device)
        if p.get("quant"):
            s["D_codes"], s["D_scale"] = quantize_tokens(D, p["quant"])
        else:
            s["D"] = D
        if p.get("quant_q"):
            s["Q_codes"], s["Q_scale"] = quantize_tokens(s["Q"], p["quant_q"])
        return s

    def work(self, p, meta, dtype):
        nq, e = self.n_queries(p), _esize(dtype)
        queries_per_doc = 1 if self.grouped else nq
        doc_token_bytes = H + 4 if p.get("quant") else H * e  # codes + scale
        query_token_bytes = H + 4 if p.get("quant_q") else H * e
        # With holes the documents come as a mask alone: its bytes count, the holes' rows do not.
        mask_bytes = math.prod(self.doc_shape(p)) * p["Ld"] if p.get("holes") else 0
        # Both sides 8-bit codes of one format: products on the 8-bit tensor cores.
        both_8bit = p.get("quant_q") is not None and p.get("quant_q") == p.get("quant")
        return Work(
            bytes=nq * p["Lq"] * query_token_bytes + meta["valid_d"] * doc_token_bytes
            + mask_bytes + self.n_pairs(p) * 4,
            flops=2.0 * H * queries_per_doc * p["Lq"] * meta["valid_d"],
            rate=p["quant"] if both_8bit else None,
        )

    def reference(self, s, meta):
        ref = ref_grouped if self.grouped else ref_allpairs
        D = dequantized(s) if "D_codes" in s else s["D"]
        return {"scores": ref(queries(s), D, None, meta["d_mask"]).cpu()}

    def naive(self, s, meta):
        Q, dm, grouped = s["Q"], meta["d_mask"], self.grouped
        if "D_codes" in s:  # dequantize (in the queries' dtype) inside the timed call
            return lambda: padded_scores(queries(s, Q.dtype), dequantized(s, Q.dtype), None, dm,
                                         grouped=grouped)
        D = s["D"]
        return lambda: padded_scores(Q, D, None, dm, grouped=grouped)

    def naive_bytes(self, p, meta, dtype):
        return 2.0 * self.n_pairs(p) * p["Lq"] * p["Ld"] * _esize(dtype)

    def quant(self, case) -> str | None:
        return case.params.get("quant")


class Rerank(_PaddedDocs):
    """Per-query candidates, padded: Q [B, Lq, H] x D [B, K, Ld, H] -> [B, K]."""

    name = "rerank"
    grouped = True

    def n_queries(self, p):
        return p["B"]

    def doc_shape(self, p):
        return (p["B"], p["K"])


class AllPairs(_PaddedDocs):
    """Every query with every document, padded: Q [Nq, Lq, H] x D [Nd, Ld, H] -> [Nq, Nd]."""

    name = "allpairs"

    def n_queries(self, p):
        return p["Nq"]

    def doc_shape(self, p):
        return (p["Nd"],)


class Varlen(Kind):
    """Packed queries and documents; query i is scored with documents i*K .. i*K+K-1 -> [Nq, K]."""

    name = "varlen"

    def make_meta(self, p, cpu_gen, device):
        Nq, K = p["Nq"], p["K"]
        q_len = _lengths(Nq, p["Lq_min"], p["Lq_max"], cpu_gen)
        d_len = _lengths(Nq * K, p["Ld_min"], p["Ld_max"], cpu_gen)
        cu_q, cu_d = _offsets(q_len), _offsets(d_len)
        max_q, max_d = int(q_len.max()), int(d_len.max())
        pair_q = torch.arange(Nq).repeat_interleave(K)
        # Each pair's own copy of its query's rows (for APIs that score pair i = (query i, doc i)).
        rep_len = q_len[pair_q]
        rep_rows = torch.cat([torch.arange(cu_q[i], cu_q[i + 1]) for i in pair_q.tolist()])
        to_dev = lambda t, dt=torch.int32: t.to(device=device, dtype=dt)  # noqa: E731
        return {
            "q_len": q_len,
            "d_len": d_len,
            "max_q": max_q,
            "max_d": max_d,
            "Tq": int(cu_q[-1]),
            "Td": int(cu_d[-1]),
            "cu_q": to_dev(cu_q),
            "cu_d": to_dev(cu_d),
            "pair_q": to_dev(pair_q),
            "pair_d": to_dev(torch.arange(Nq * K)),
            "rep_rows": to_dev(rep_rows, torch.int64),
            "cu_q_rep": to_dev(_offsets(rep_len)),
            "q_index": to_dev(_gather_index(q_len, cu_q, max_q), torch.int64),
            "d_index": to_dev(_gather_index(d_len, cu_d, max_d), torch.int64),
            "q_mask": _prefix_mask(q_len, max_q).to(device),
            "d_mask": _prefix_mask(d_len, max_d).view(Nq, K, max_d).to(device),
            "pair_tokens": int((q_len[pair_q] * d_len).sum()),
        }

    def make_set(self, p, meta, dtype, gen, device):
        return {
            "q": tokens((meta["Tq"], H), dtype, gen, device),
            "d": tokens((meta["Td"], H), dtype, gen, device),
        }

    def work(self, p, meta, dtype):
        e = _esize(dtype)
        return Work(
            bytes=(meta["Tq"] + meta["Td"]) * H * e + p["Nq"] * p["K"] * 4,
            flops=2.0 * H * meta["pair_tokens"],
        )

    def _padded(self, s, meta, Nq, K):
        Qp = s["q"][meta["q_index"]]
        Dp = s["d"][meta["d_index"]].view(Nq, K, meta["max_d"], H)
        return Qp, Dp

    def reference(self, s, meta):
        Nq, K = meta["q_mask"].shape[0], meta["d_mask"].shape[1]
        Qp, Dp = self._padded(s, meta, Nq, K)
        return {"scores": ref_grouped(Qp, Dp, meta["q_mask"], meta["d_mask"]).cpu()}

    def naive(self, s, meta):
        Nq, K = meta["q_mask"].shape[0], meta["d_mask"].shape[1]

        def call():
            Qp, Dp = self._padded(s, meta, Nq, K)  # unpack to padded tensors (part of the cost)
            return padded_scores(Qp, Dp, meta["q_mask"], meta["d_mask"], grouped=True)

        return call

    def naive_bytes(self, p, meta, dtype):
        return 2.0 * p["Nq"] * p["K"] * meta["max_q"] * meta["max_d"] * _esize(dtype)


class Train(Kind):
    """One contrastive step: all-pairs scores [Nq, Nb], cross-entropy with diagonal targets,
    backward to queries and documents. Outputs are (dQ, dD)."""

    name = "train"
    train = True

    def make_meta(self, p, cpu_gen, device):
        Nb, Ld = p["Nb"], p["Ld"]
        d_len = _lengths(Nb, p.get("Ld_min", max(1, Ld // 2)), Ld, cpu_gen)
        return {
            "d_len": d_len.to(device=device, dtype=torch.int32),
            "d_mask": _prefix_mask(d_len, Ld).to(device),
            "valid_d": int(d_len.sum()),
            "targets": torch.arange(p["Nq"], device=device),
        }

    def make_set(self, p, meta, dtype, gen, device):
        return {
            "Q": tokens((p["Nq"], p["Lq"], H), dtype, gen, device).requires_grad_(),
            "D": tokens((p["Nb"], p["Ld"], H), dtype, gen, device).requires_grad_(),
        }

    def work(self, p, meta, dtype):
        e = _esize(dtype)
        read = (p["Nq"] * p["Lq"] + meta["valid_d"]) * H * e
        # Every element of both gradients is written (padding rows hold zeros).
        write = (p["Nq"] * p["Lq"] + p["Nb"] * p["Ld"]) * H * e
        fwd = 2.0 * H * p["Nq"] * p["Lq"] * meta["valid_d"]
        return Work(bytes=read + write, flops=fwd + 4.0 * p["Nq"] * p["Nb"] * p["Lq"] * H)

    def reference(self, s, meta):
        """float64 autograd through the reference, one block of queries at a time (the
        cross-entropy of a row depends only on that row's scores, so the blocks add up)."""
        Q64 = s["Q"].detach().double().requires_grad_()
        D64 = s["D"].detach().double().requires_grad_()
        Nq, Lq = Q64.shape[:2]
        Nb, Ld = D64.shape[:2]
        step = _blocked(Nq, Nb * Lq * Ld)
        tgt = meta["targets"]
        for st in range(0, Nq, step):
            scores = padded_scores(Q64[st : st + step], D64, None, meta["d_mask"])
            loss = F.cross_entropy(scores, tgt[st : st + step], reduction="sum") / Nq
            loss.backward()
        return {"dq": Q64.grad.cpu(), "dd": D64.grad.cpu()}

    def naive(self, s, meta):
        Q, D, dm, tgt = s["Q"], s["D"], meta["d_mask"], meta["targets"]
        return lambda: train_step(lambda: padded_scores(Q, D, None, dm), Q, D, tgt)

    def naive_bytes(self, p, meta, dtype):
        return 3.0 * p["Nq"] * p["Nb"] * p["Lq"] * p["Ld"] * _esize(dtype)

    def check(self, out, ref):
        dq, dd = out
        if not (torch.isfinite(dq).all() and torch.isfinite(dd).all()):
            return None, None, "non-finite gradients"
        eq, ed = rel_err(dq, ref["dq"]), rel_err(dd, ref["dd"])
        return max(eq, ed), None, f"dq {eq:.1e}, dd {ed:.1e}"


def floor_scores(Q, D):
    """The torch-floor stand-in's scores: one matmul of the queries' tokens, flattened, against as
    many tokens of each document: scores of MaxSim's shape ([Nq, Nb] or [B, K]) from one GEMM
    kernel in the input dtype (not MaxSim; views only, no copy)."""
    lq = Q.shape[-2]
    if D.shape[-2] < lq:
        raise Unsupported(f"the stand-in takes Ld >= Lq ({D.shape[-2]} < {lq})")
    q = Q.flatten(-2)
    d = D[..., :lq, :].flatten(-2)
    if D.dim() == 3:  # all pairs
        return q @ d.transpose(-1, -2)
    return (d @ q.unsqueeze(-1)).squeeze(-1)  # per-query candidates [B, K, Ld, H]


def train_step(scores_fn, Q, D, targets):
    """Forward scores, mean cross-entropy with diagonal targets, gradients to Q and D."""
    loss = F.cross_entropy(scores_fn(), targets)
    return torch.autograd.grad(loss, (Q, D))


KINDS: dict[str, Kind] = {k.name: k for k in (Rerank(), AllPairs(), Varlen(), Train())}


# ----------------------------------------------------------------------------------------------
# Registry
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Workload:
    name: str
    kind: str
    params: dict
    smoke: dict  # tiny shape used by --smoke
    dtypes: tuple = ("fp16", "bf16")
    sweep: bool = False  # sweep rows feed the README plots
    about: str = ""
    host_floor: bool = False  # also time the torch-floor stand-in (what one PyTorch call costs)

    def shape(self, smoke=False) -> dict:
        return dict(self.smoke if smoke else self.params)


@dataclass
class Case:
    """One (workload, dtype): shared metadata plus the rotated input sets. Built once by
    ``setup`` and used for the memory call, the timing and the correctness check alike."""

    workload: Workload
    kind: Kind
    dtype: torch.dtype
    dtype_name: str
    params: dict
    meta: dict
    sets: list = field(default_factory=list)

    @property
    def set_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.sets[0].values())


def setup(wl: Workload, dtype_name: str, device, *, smoke=False, l2_bytes=50 << 20, seed=0,
          max_sets=256) -> Case:
    """The setup factory of every workload: metadata, then enough input sets that together they
    span at least three L2s (one set when a single set already does)."""
    kind = KINDS[wl.kind]
    p = wl.shape(smoke)
    cpu_gen = torch.Generator().manual_seed(seed)
    gen = torch.Generator(device=device).manual_seed(seed + 1)
    dtype = DTYPES[dtype_name]
    meta = kind.make_meta(p, cpu_gen, device)
    case = Case(wl, kind, dtype, dtype_name, p, meta)
    case.sets.append(kind.make_set(p, meta, dtype, gen, device))
    n_sets = min(max_sets, max(1, math.ceil(3 * l2_bytes / max(1, case.set_bytes))))
    for _ in range(n_sets - 1):
        case.sets.append(kind.make_set(p, meta, dtype, gen, device))
    return case


def _registry() -> list[Workload]:
    w = []
    add = w.append
    # One query's few candidates: the call's host work, not the kernel, sets its time.
    add(Workload("call_tiny", "rerank", dict(B=1, K=8, Lq=32, Ld=32),
                 dict(B=1, K=8, Lq=4, Ld=6), dtypes=("fp16",), host_floor=True,
                 about="one tiny call"))
    add(Workload("rerank", "rerank", dict(B=32, K=50, Lq=32, Ld=180),
                 dict(B=2, K=12, Lq=4, Ld=10), about="ColBERT reranking"))
    add(Workload("rerank_heavy", "rerank", dict(B=32, K=100, Lq=32, Ld=256),
                 dict(B=2, K=12, Lq=5, Ld=16), about="more, longer candidates"))
    # Attention masks with skiplist holes (one real token in ten), given as the mask alone, as
    # PyLate-style callers hold them; flash-maxsim takes prefix lengths only.
    add(Workload("rerank_heavy_mask", "rerank", dict(B=32, K=100, Lq=32, Ld=256, holes=0.1),
                 dict(B=2, K=12, Lq=5, Ld=16, holes=0.1), dtypes=("fp16",),
                 about="more, longer candidates, masks with holes"))
    add(Workload("rerank_colpali", "rerank", dict(B=8, K=100, Lq=32, Ld=1024),
                 dict(B=2, K=12, Lq=4, Ld=33), about="page reranking (ColPali)"))
    add(Workload("corpus", "allpairs", dict(Nq=16, Nd=10_000, Lq=32, Ld=1024),
                 dict(Nq=3, Nd=40, Lq=4, Ld=17), about="all-pairs over a corpus"))
    add(Workload("varlen", "varlen",
                 dict(Nq=32, K=100, Lq_min=8, Lq_max=32, Ld_min=32, Ld_max=300),
                 dict(Nq=3, K=12, Lq_min=2, Lq_max=6, Ld_min=3, Ld_max=20),
                 about="packed, per-query candidates"))
    add(Workload("allpairs_large", "allpairs", dict(Nq=128, Nd=128, Lq=128, Ld=1024),
                 dict(Nq=4, Nd=5, Lq=8, Ld=24), about="all-pairs, ColPali shapes"))
    # PyLate's fp32 contrastive forward at batch 128 (queries against 2B documents): fp32 inputs
    # take the exact CUDA-core kernels, the naive path cuBLAS's fp32 GEMM (no TF32).
    add(Workload("allpairs_fp32", "allpairs", dict(Nq=128, Nd=256, Lq=32, Ld=180),
                 dict(Nq=3, Nd=5, Lq=4, Ld=9), dtypes=("fp32",), about="all-pairs, fp32 inputs"))
    add(Workload("train_small", "train", dict(Nq=32, Nb=32, Lq=32, Ld=80),
                 dict(Nq=3, Nb=3, Lq=4, Ld=9), host_floor=True, about="contrastive step"))
    # Every document full length: the one case flash-maxsim's fused step takes.
    add(Workload("train_small_full", "train", dict(Nq=32, Nb=32, Lq=32, Ld=80, Ld_min=80),
                 dict(Nq=3, Nb=3, Lq=4, Ld=9, Ld_min=9), about="contrastive step, full documents"))
    add(Workload("train_medium", "train", dict(Nq=64, Nb=64, Lq=32, Ld=128),
                 dict(Nq=4, Nb=4, Lq=4, Ld=12), about="contrastive step"))
    add(Workload("train_colpali", "train", dict(Nq=128, Nb=128, Lq=128, Ld=1024),
                 dict(Nq=3, Nb=3, Lq=6, Ld=20), dtypes=("bf16",), about="contrastive step"))
    # Documents stored as 8-bit codes (see quantize_tokens); queries in fp16, or int8 codes too
    # (the x8 rows: integer tensor cores).
    for name, base, fmt, q_fmt in (("rerank_heavy_int8", "rerank_heavy", "int8", None),
                                   ("rerank_colpali_int8", "rerank_colpali", "int8", None),
                                   ("rerank_colpali_fp8", "rerank_colpali", "fp8", None),
                                   ("corpus_int8", "corpus", "int8", None),
                                   ("rerank_heavy_int8x8", "rerank_heavy", "int8", "int8"),
                                   ("rerank_colpali_int8x8", "rerank_colpali", "int8", "int8"),
                                   ("corpus_int8x8", "corpus", "int8", "int8")):
        src = next(x for x in w if x.name == base)
        extra = dict(quant=fmt, **({"quant_q": q_fmt} if q_fmt else {}))
        what = f"{fmt} queries and documents" if q_fmt else f"{fmt} documents"
        add(Workload(name, src.kind, dict(src.params, **extra), dict(src.smoke, **extra),
                     dtypes=("fp16",), about=f"{src.about}, {what}"))
    for ld in (128, 256, 512, 1024, 2048):
        add(Workload(f"rerank_ld{ld}", "rerank", dict(B=8, K=100, Lq=32, Ld=ld),
                     dict(B=2, K=12, Lq=4, Ld=max(4, ld // 64)), dtypes=("fp16",), sweep=True,
                     about="reranking, Ld sweep"))
    for b in (16, 32, 64, 128):
        add(Workload(f"train_mem_b{b}", "train", dict(Nq=b, Nb=b, Lq=32, Ld=256),
                     dict(Nq=max(2, b // 16), Nb=max(2, b // 16), Lq=4, Ld=8),
                     dtypes=("bf16",), sweep=True, about="contrastive step, batch sweep"))
    return w


REGISTRY: list[Workload] = _registry()
BY_NAME: dict[str, Workload] = {w.name: w for w in REGISTRY}


def describe(kind: str, p: dict) -> str:
    """Short shape string for tables, e.g. ``B32 K50 Lq32 Ld180``."""
    if kind == "varlen":
        return (f"Nq{p['Nq']} K{p['K']} Lq{p['Lq_min']}-{p['Lq_max']} "
                f"Ld{p['Ld_min']}-{p['Ld_max']}")
    tags = {"quant": "D:", "quant_q": "Q:"}
    return " ".join(f"{tags.get(k, k)}{v}" for k, v in p.items())
