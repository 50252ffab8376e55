"""A seeded corpus of malformed calls to every public entry point, shared by the CPU tests
(tests/test_fuzz.py) and the GPU memcheck run (scripts/sanitize_cases.py --fuzz).

Every case is one call, built on the CPU and moved to a device (index tensors included), with what
must come back (docs/API.md, "Bad input"):

- ``error`` set: a shape, dtype, device or Python value that is wrong on every device raises that
  error type, its message naming ``name``;
- ``error`` None: index values (lengths, offsets, ids, hints, targets). Where their values are
  checked (the CPU; MAXSIM_DEBUG=1 elsewhere) a bad one raises ValueError naming ``name``; where
  they are not, the call returns and its scores are NaN exactly where ``nan`` says (argmax -1
  there, a loss NaN when any is), finite elsewhere. ``nan`` comes from the rule written out
  plainly below, not from the library. ``name`` is None when every value is valid.
"""

import random
from dataclasses import dataclass, field
from typing import Callable, NamedTuple, Optional

import maxsim
import torch
from fuzz_mutations import Elsewhere, static_mutations, value_mutation

H = 16  # a multiple of 16: quantized calls take the 8-bit kernels on CUDA
INT32_MAX = 2**31 - 1


class Layout(NamedTuple):
    """Which scores a call gives: ``mode`` allpairs / grouped / pairs; the arguments holding the
    queries' and documents' lengths or offsets (None: none); segment counts; ``group`` K."""

    mode: str
    q_arg: Optional[str]
    d_arg: Optional[str]
    nq: int
    nd: int
    group: int = 0


@dataclass
class Case:
    entry: str  # the public function
    what: str  # the mutation
    fn: Callable
    kwargs: dict
    name: Optional[str]  # the argument an error names (None: a valid call)
    error: Optional[type] = None  # raised on every device
    nan: Optional[torch.Tensor] = None  # value cases: where the scores are NaN (bool, CPU)
    loss: bool = False  # the output is a loss: NaN when any score or target is bad
    argmax: bool = False  # the output is (scores, argmax)
    checks: list = field(default_factory=list)  # value checks in the library's order

    def arguments(self, device) -> dict:
        """The keyword arguments on ``device`` (tensors of :class:`Elsewhere` on another one)."""
        device = torch.device(device)
        other = torch.device("meta" if device.type == "cpu" else "cpu")
        return {k: _moved(v, device, other) for k, v in self.kwargs.items()}

    def run(self, device):
        return self.fn(**self.arguments(device))


def _moved(v, device, other):
    if isinstance(v, Elsewhere):
        return _moved(v.tensor, other, other)
    if isinstance(v, torch.Tensor):
        return v.to(device)
    if isinstance(v, maxsim.QuantizedTokens):
        return maxsim.QuantizedTokens(v.codes.to(device), v.scale.to(device))
    if isinstance(v, maxsim.Corpus):
        return v.to(device)
    return v


# ---- the rule, written out: which segments and pairs are bad ----


def _bad_lengths(lengths, width):
    return [not 0 <= n <= width for n in lengths]


def _bad_offsets(offsets, total, hint=None):
    return [
        a < 0 or b > total or b < a or (hint is not None and b - a > hint)
        for a, b in zip(offsets[:-1], offsets[1:])
    ]


def _offsets_checked(offsets, total):
    """The CPU's offsets check: starts at 0, non-decreasing, ends at ``total``."""
    steps = all(b >= a for a, b in zip(offsets[:-1], offsets[1:]))
    return offsets[0] == 0 and steps and offsets[-1] == total


def _nan_of(layout, q_bad, d_bad, group=0, pairs=None):
    nq, nd = len(q_bad), len(d_bad)
    if layout == "allpairs":
        return torch.tensor([[q_bad[i] or d_bad[j] for j in range(nd)] for i in range(nq)],
                            dtype=torch.bool).view(nq, nd)
    if layout == "grouped":
        return torch.tensor(
            [[q_bad[i] or d_bad[i * group + k] for k in range(group)] for i in range(nq)],
            dtype=torch.bool,
        ).view(nq, group)
    return torch.tensor(
        [not (0 <= a < nq and 0 <= b < nd) or q_bad[a] or d_bad[b] for a, b in zip(*pairs)],
        dtype=torch.bool,
    )


def expected(case: Case):
    """``(name, nan)``: the argument whose values the CPU rejects first (None: all valid) and the
    scores that are NaN where values are not checked."""
    kw, first = case.kwargs, None
    bad = {}
    for arg, kind, extent in case.checks:
        value = kw.get(arg)
        if value is None or isinstance(value, Elsewhere):
            continue
        values = value.flatten().tolist() if isinstance(value, torch.Tensor) else value
        if kind == "lengths":
            bad[arg] = _bad_lengths(values, extent)
            wrong = any(bad[arg])
        elif kind == "offsets":
            bad[arg] = _bad_offsets(values, extent)
            wrong = not _offsets_checked(values, extent)
        elif kind == "hint":  # extent: the offsets' argument
            offsets = kw[extent].tolist()
            bad[extent] = [x or y for x, y in zip(bad[extent], _bad_offsets(offsets, 1 << 62,
                                                                             values))]
            wrong = any(b - a > values for a, b in zip(offsets[:-1], offsets[1:]))
        else:  # ids or targets in [0, extent)
            wrong = any(not 0 <= v < extent for v in values)
            bad[arg] = [not 0 <= v < extent for v in values]
        if wrong and first is None:
            first = arg
    return first, bad


# ---- random valid inputs ----


class _Draw:
    def __init__(self, seed):
        self.rng = random.Random(seed)
        self.gen = torch.Generator().manual_seed(seed)

    def int(self, low, high):
        return self.rng.randint(low, high)

    def tokens(self, *shape):
        return torch.nn.functional.normalize(torch.randn(*shape, H, generator=self.gen), dim=-1)

    def lengths(self, shape, width, dtype=torch.int32):
        return torch.randint(0, width + 1, shape, generator=self.gen).to(dtype)

    def mask(self, *shape):
        return torch.rand(*shape, generator=self.gen) < 0.8

    def offsets(self, n, longest):
        sizes = [self.int(0, longest) for _ in range(n)]
        out = [0]
        for s in sizes:
            out.append(out[-1] + s)
        return torch.tensor(out, dtype=self.rng.choice([torch.int32, torch.int64]))

    def ids(self, p, n):
        return torch.tensor([self.int(0, n - 1) for _ in range(p)], dtype=torch.int32)


# ---- entry points: a valid call, its value checks (in the library's order), its layout ----


def _padded(d):
    nq, nd, lq, ld = d.int(1, 4), d.int(1, 5), d.int(1, 6), d.int(1, 9)
    kw = dict(Q=d.tokens(nq, lq), D=d.tokens(nd, ld), d_lengths=d.lengths((nd,), ld))
    return kw, [("d_lengths", "lengths", ld)], Layout("allpairs", None, "d_lengths", nq, nd)


def _padded_full(d):
    kw, checks, layout = _padded(d)
    (nq, lq), (nd, ld) = kw["Q"].shape[:2], kw["D"].shape[:2]
    kw.update(q_lengths=d.lengths((nq,), lq, torch.int64), q_mask=d.mask(nq, lq),
              d_mask=d.mask(nd, ld))
    return kw, [("q_lengths", "lengths", lq)] + checks, layout._replace(q_arg="q_lengths")


def _candidates(d):
    nq, k, lq, ld = d.int(1, 3), d.int(1, 4), d.int(1, 6), d.int(1, 9)
    kw = dict(Q=d.tokens(nq, lq), D=d.tokens(nq, k, ld), d_lengths=d.lengths((nq, k), ld),
              d_mask=d.mask(nq, k, ld))
    return kw, [("d_lengths", "lengths", ld)], Layout("grouped", None, "d_lengths", nq, nq * k, k)


def _diagonal(d):
    b, lq, ld = d.int(1, 4), d.int(1, 6), d.int(1, 9)
    kw = dict(Q=d.tokens(b, lq), D=d.tokens(b, ld), q_mask=d.mask(b, lq), d_mask=d.mask(b, ld))
    return kw, [], None


def _with_targets(base):
    def build(d):
        kw, checks, layout = base(d)
        cols = layout.group or layout.nd
        kw["targets"] = torch.tensor([d.int(0, cols - 1) for _ in range(layout.nq)])
        return kw, checks + [("targets", "ids", cols)], layout
    return build


def _varlen(mode):
    def build(d):
        nq, nd, lq = d.int(1, 4), d.int(1, 5), d.int(1, 6)
        if mode == "grouped":
            nd = nq * d.int(1, 3)
        cu_q, cu_d = d.offsets(nq, lq), d.offsets(nd, 9)
        tq, td = int(cu_q[-1]), int(cu_d[-1])
        kw = dict(q=d.tokens(tq), cu_seqlens_q=cu_q, d=d.tokens(td), cu_seqlens_d=cu_d,
                  max_seqlen_q=lq, q_mask=d.mask(tq))
        checks = [("cu_seqlens_q", "offsets", tq), ("cu_seqlens_d", "offsets", td)]
        if mode == "grouped":
            kw["num_candidates"] = nd // nq
        if mode == "pairs":
            p = d.int(1, 6)
            kw.update(pair_q=d.ids(p, nq), pair_d=d.ids(p, nd))
            checks += [("pair_q", "ids", nq), ("pair_d", "ids", nd)]
        checks.append(("max_seqlen_q", "hint", "cu_seqlens_q"))
        return kw, checks, Layout(mode, "cu_seqlens_q", "cu_seqlens_d", nq, nd, nd // nq)
    return build


def _compat_candidates(d):
    b, k, lq, ld = d.int(1, 3), d.int(1, 4), d.int(1, 6), d.int(1, 9)
    kw = dict(queries=d.tokens(b, lq), documents=d.tokens(b, k, ld),
              query_lengths=d.lengths((b,), lq), doc_lengths=d.lengths((b, k), ld, torch.int64))
    checks = [("query_lengths", "lengths", lq), ("doc_lengths", "lengths", ld)]
    return kw, checks, Layout("grouped", "query_lengths", "doc_lengths", b, b * k, k)


def _compat_contrastive(d):
    nq, nb, lq = d.int(1, 4), d.int(1, 5), d.int(1, 6)
    offsets = d.offsets(nb, 9)
    total = int(offsets[-1])
    kw = dict(queries=d.tokens(nq, lq), documents=d.tokens(total), document_offsets=offsets)
    checks = [("document_offsets", "offsets", total)]
    return kw, checks, Layout("allpairs", None, "document_offsets", nq, nb)


def _compat_pairs(d):
    nq, nd, lq, p = d.int(1, 4), d.int(1, 5), d.int(1, 6), d.int(1, 6)
    q_off, d_off = d.offsets(nq, lq), d.offsets(nd, 9)
    tq, td = int(q_off[-1]), int(d_off[-1])
    kw = dict(queries=d.tokens(tq), query_offsets=q_off, documents=d.tokens(td),
              document_offsets=d_off, pair_query_ids=d.ids(p, nq),
              pair_document_ids=d.ids(p, nd), max_q_len=lq)
    checks = [("query_offsets", "offsets", tq), ("document_offsets", "offsets", td),
              ("pair_query_ids", "ids", nq), ("pair_document_ids", "ids", nd),
              ("max_q_len", "hint", "query_offsets")]
    return kw, checks, Layout("pairs", "query_offsets", "document_offsets", nq, nd)


def _quantized(base):
    def build(d):
        kw, checks, layout = base(d)
        kw["D"] = maxsim.quantize(kw["D"].half(), d.rng.choice(["int8", "fp8_e4m3"]))
        kw["Q"] = kw["Q"].half()
        return kw, checks, layout
    return build


def _scorer(**kw):
    return maxsim.MaxSimScorer()(**kw)


def _retrieve(d):
    nq, nd, lq, ld = d.int(1, 4), d.int(2, 6), d.int(1, 6), d.int(1, 9)
    kw = dict(Q=d.tokens(nq, lq), corpus=d.tokens(nd, ld), top_k=d.int(1, nd),
              d_mask=d.mask(nd, ld), chunk_size=d.int(1, 3))
    return kw, [], None


def _two_stage(d):
    kw, checks, _ = _retrieve(d)
    kw["rescore"] = kw["corpus"]
    kw["corpus"] = maxsim.quantize(kw["corpus"])
    return kw, checks, None


def _packed_corpus(d):
    lengths = torch.tensor([d.int(0, 6) for _ in range(d.int(1, 5))])
    offsets = torch.cat([lengths.new_zeros(1), lengths.cumsum(0)])
    return dict(offsets=offsets, tokens=d.tokens(int(offsets[-1]))), [], None


def _retrieve_packed(d):
    kw, _, _ = _packed_corpus(d)
    corpus = maxsim.Corpus(**kw)
    kw = dict(Q=d.tokens(d.int(1, 4), d.int(1, 6)), corpus=corpus, top_k=d.int(1, len(corpus)),
              chunk_size=d.int(1, 3))
    return kw, [], None


def _segments(d):
    nq, lq, n, total = d.int(1, 3), d.int(1, 5), d.int(1, 5), d.int(6, 30)
    starts = sorted(d.int(0, total - 1) for _ in range(n))
    lengths = [b - a for a, b in zip(starts, starts[1:] + [total])]
    kw = dict(Q=d.tokens(nq, lq), tokens=d.tokens(total), starts=torch.tensor(starts),
              lengths=torch.tensor(lengths, dtype=torch.int32))
    return kw, [], None


def _chamfer(d):
    b, n, m = d.int(1, 3), d.int(1, 6), d.int(1, 6)
    kw = dict(X=d.tokens(b, n), Y=d.tokens(b, m), x_mask=d.mask(b, n), y_mask=d.mask(b, m))
    return kw, [], None


def _quantize(d):
    return dict(x=d.tokens(d.int(1, 3), d.int(1, 5)), dtype="int8"), [], None


def _quantized_tokens(d):
    q = maxsim.quantize(d.tokens(d.int(1, 3), d.int(1, 5)))
    return dict(codes=q.codes, scale=q.scale), [], None


def _dequantize(d):
    return dict(q=maxsim.quantize(d.tokens(d.int(1, 3), d.int(1, 5)))), [], None


# entry: (function, builder, output: scores / argmax / loss, or static: no index values)
ENTRIES = {
    "maxsim": (maxsim.maxsim, _padded, "scores"),
    "maxsim[masks, lengths]": (maxsim.maxsim, _padded_full, "scores"),
    "maxsim[candidates]": (maxsim.maxsim, _candidates, "scores"),
    "maxsim_with_argmax": (maxsim.maxsim_with_argmax, _padded_full, "argmax"),
    "maxsim_pairs": (maxsim.maxsim_pairs, _diagonal, "static"),
    "MaxSimScorer": (_scorer, _diagonal, "static"),
    "maxsim_varlen": (maxsim.maxsim_varlen, _varlen("allpairs"), "scores"),
    "maxsim_varlen[num_candidates]": (maxsim.maxsim_varlen, _varlen("grouped"), "scores"),
    "maxsim_varlen[pairs]": (maxsim.maxsim_varlen, _varlen("pairs"), "scores"),
    "maxsim_segments": (maxsim.maxsim_segments, _segments, "static"),
    "retrieve": (maxsim.retrieve, _retrieve, "static"),
    "retrieve[rescore]": (maxsim.retrieve, _two_stage, "static"),
    "retrieve[Corpus]": (maxsim.retrieve, _retrieve_packed, "static"),
    "Corpus": (maxsim.Corpus, _packed_corpus, "static"),
    "contrastive_loss": (maxsim.contrastive_loss, _with_targets(_padded), "loss"),
    "contrastive_loss[candidates]": (maxsim.contrastive_loss, _with_targets(_candidates), "loss"),
    "contrastive_step": (maxsim.contrastive_step, _with_targets(_padded), "loss"),
    "contrastive_step[candidates]": (maxsim.contrastive_step, _with_targets(_candidates), "loss"),
    "chamfer": (maxsim.chamfer, _chamfer, "static"),
    "quantize": (maxsim.quantize, _quantize, "static"),
    "QuantizedTokens": (maxsim.QuantizedTokens, _quantized_tokens, "static"),
    "dequantize": (maxsim.dequantize, _dequantize, "static"),
    "maxsim[quantized]": (maxsim.maxsim, _quantized(_padded), "scores"),
    "maxsim[quantized candidates]": (maxsim.maxsim, _quantized(_candidates), "scores"),
    "score_candidates_padded": (maxsim.score_candidates_padded, _compat_candidates, "scores"),
    "score_candidates_padded_with_argmax": (
        maxsim.score_candidates_padded_with_argmax, _compat_candidates, "argmax"),
    "score_candidates_padded_train": (
        maxsim.score_candidates_padded_train, _compat_candidates, "scores"),
    "score_contrastive": (maxsim.score_contrastive, _compat_contrastive, "scores"),
    "score_contrastive_with_argmax": (
        maxsim.score_contrastive_with_argmax, _compat_contrastive, "argmax"),
    "score_contrastive_train": (maxsim.score_contrastive_train, _compat_contrastive, "scores"),
    "score_pairs_packed": (maxsim.score_pairs_packed, _compat_pairs, "scores"),
    "score_pairs_packed_with_argmax": (
        maxsim.score_pairs_packed_with_argmax, _compat_pairs, "argmax"),
    "score_pairs_packed_train": (maxsim.score_pairs_packed_train, _compat_pairs, "scores"),
}

VALUE_MUTATIONS = 24  # random index values per valid call


def corpus(seed: int = 0, variants: int = 3) -> list:
    """Every case: for each entry point, ``variants`` random valid calls, each with every static
    mutation of its arguments and :data:`VALUE_MUTATIONS` random index values."""
    cases = []
    for e, (entry, (fn, build, output)) in enumerate(ENTRIES.items()):
        for v in range(variants):
            draw = _Draw(seed * 1_000_003 + e * 101 + v)
            kw, checks, layout = build(draw)
            for what, mutated, name, error in static_mutations(entry, kw, draw):
                cases.append(Case(entry, what, fn, mutated, name, error))
            if output == "static":
                continue
            for _ in range(VALUE_MUTATIONS):
                what, mutated = value_mutation(kw, checks, draw)
                case = Case(entry, what, fn, mutated, None, loss=output == "loss",
                            argmax=output == "argmax", checks=checks)
                case.name, case.nan = _expected_nan(case, layout)
                cases.append(case)
    return cases


def _expected_nan(case, layout):
    name, bad = expected(case)
    q_bad = bad.get(layout.q_arg) or [False] * layout.nq
    d_bad = bad.get(layout.d_arg) or [False] * layout.nd
    pairs = None
    if layout.mode == "pairs":
        ids = [arg for arg, kind, _ in case.checks if kind == "ids"]
        pairs = (case.kwargs[ids[0]].tolist(), case.kwargs[ids[1]].tolist())
    nan = _nan_of(layout.mode, q_bad, d_bad, layout.group, pairs)
    if case.loss:
        nan = (nan.any() | any(bad.get("targets", []))).view(())
    return name, nan


# ---- running a case ----


def outcome(case: Case, device, values_checked: bool):
    """``(kind, detail)``: kind "error" (raised as it must), "answer" (returned what the rule
    says) or "mismatch" (anything else; detail says what). ``values_checked``: whether the
    call's index values are checked where it runs (the CPU; MAXSIM_DEBUG=1)."""
    must_raise = case.error or (ValueError if case.name and values_checked else None)
    try:
        out = case.run(device)
    except Exception as exc:  # noqa: BLE001 - the type is what is checked
        message = str(exc)
        if must_raise is None:
            return "mismatch", f"raised {type(exc).__name__}: {message}"
        if not isinstance(exc, must_raise) or f"{case.name}:" not in message:
            return "mismatch", f"expected {must_raise.__name__} naming {case.name}, got " \
                               f"{type(exc).__name__}: {message}"
        return "error", message
    if must_raise is not None:
        return "mismatch", f"expected {must_raise.__name__} naming {case.name}, got no error"
    if case.nan is None:
        return "answer", ""
    return _compare(case, out)


def _compare(case, out):
    if case.loss:
        scores = (out[0] if isinstance(out, tuple) else out).detach().cpu()
    else:
        scores = (out[0] if case.argmax else out).detach().cpu()
    if scores.shape != case.nan.shape:
        return "mismatch", f"shape {tuple(scores.shape)}, expected {tuple(case.nan.shape)}"
    nan = scores.isnan()
    if not torch.equal(nan, case.nan):
        return "mismatch", f"NaN at {nan.nonzero().tolist()}, expected at " \
                           f"{case.nan.nonzero().tolist()}"
    if not bool(scores[~nan].isfinite().all()):
        return "mismatch", "an infinite score"
    if case.argmax:
        argmax = out[1].cpu()
        if not bool((argmax[case.nan] == -1).all()):
            return "mismatch", "argmax of a NaN score is not -1"
    return "answer", ""
