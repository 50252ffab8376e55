"""GPU-only checks of the 8-bit (int8 / fp8 e4m3) tensor-core kernels: a quantized input must
stream its codes through ``fwd_scaled`` (never dequantize) and score like float64 arithmetic on
its dequantized values, with the float64 argmax wherever that argmax is clear of near-ties."""

import maxsim
import pytest
import torch
import torch.nn.functional as F
from conftest import capture, fill_invalid, offsets_of, prefix, random_lengths, random_mask
from maxsim import QuantizedTokens
from maxsim.emulation import device_capability
from maxsim.layouts import ALLPAIRS
from maxsim.quantize import scaled_operands

CUDA_OK = (
    torch.cuda.is_available()
    and maxsim.cuda_ops()[0] is not None
    and device_capability() >= (8, 0)
)
pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not CUDA_OK, reason="needs the CUDA extension on an sm_80+ GPU"),
]
DEVICE = "cuda"
FORMATS = ["int8", "fp8_e4m3"]
HALF = [torch.float16, torch.bfloat16]


@pytest.fixture
def kernel_route(monkeypatch):
    """Fails any call that dequantizes instead of taking the 8-bit kernels."""

    def refuse(*args, **kwargs):
        raise AssertionError("quantized tokens were dequantized instead of scored as codes")

    monkeypatch.setattr(QuantizedTokens, "dequantize", refuse)
    monkeypatch.setattr("maxsim.native.resolve", refuse)


def tokens(*shape):
    return F.normalize(torch.randn(shape), dim=-1)


def padded(n, width, h, masks=True):
    """Unit tokens ``[n, width, h]`` on the GPU, and with ``masks`` prefix lengths (0 and width
    among them), a mask with holes, and junk in the invalid tokens: ``x, lengths, mask, valid``."""
    x, lengths, mask = tokens(n, width, h), None, None
    valid = torch.ones(n, width, dtype=torch.bool)
    if masks:
        lengths, mask = random_lengths(n, width), random_mask((n, width))
        valid = prefix(lengths, width) & mask
        x = fill_invalid(x, valid)
    return tuple(None if t is None else t.to(DEVICE) for t in (x, lengths, mask, valid))


def deq(x):
    if isinstance(x, QuantizedTokens):
        return x.codes.double() * x.scale.double()[..., None]
    return x.double()


def reference(Q, D, q_valid=None, d_valid=None):
    """float64 MaxSim of every query with every document: scores ``[Nq, Nd]``, argmax
    ``[Nq, Nd, Lq]`` (first best index, -1 where nothing is valid), and where that argmax is
    clear (best over the next distinct value > 1e-5 of the row's magnitude)."""
    sim = torch.einsum("qih,djh->qdij", deq(Q), deq(D))
    if d_valid is not None:
        sim = sim.masked_fill(~d_valid[None, :, None, :], float("-inf"))
    best = sim.amax(-1)
    top = sim == best[..., None]
    argmax = torch.where(top, torch.arange(sim.size(-1), device=sim.device), sim.size(-1))
    argmax = argmax.amin(-1)
    second = sim.masked_fill(top, float("-inf")).amax(-1)
    clear = best - second > 1e-5 * torch.where(sim.isinf(), 0.0, sim).abs().amax(-1)
    empty = best.isinf()
    if q_valid is not None:
        empty = empty | ~q_valid[:, None, :]
    best, argmax = best.masked_fill(empty, 0.0), argmax.masked_fill(empty, -1)
    return best.sum(-1), argmax, clear | empty


def grouped(ref, k):
    """The reference restricted to query i with documents i*k .. i*k+k-1."""
    i = torch.arange(ref[0].size(0), device=ref[0].device)
    return tuple(r.view(r.size(0), -1, k, *r.shape[2:])[i, i] for r in ref)


def per_query(Q, D, q_valid, d_valid, k):
    """:func:`grouped` of :func:`reference`, one query at a time (no all-pairs tensor)."""
    parts = [
        reference(Q[i : i + 1], D[i * k : (i + 1) * k], q_valid[i : i + 1],
                  d_valid[i * k : (i + 1) * k])
        for i in range(q_valid.size(0))
    ]
    return tuple(torch.cat(p) for p in zip(*parts))


def check(scores, argmax, ref, tol=1e-5):
    want, want_argmax, clear = ref
    assert scores.dtype == torch.float32 and scores.shape == want.shape
    err = float((scores.double() - want).abs().max() / want.abs().max().clamp_min(1e-30))
    assert err <= tol, f"relative error {err:.2e} > {tol:.0e}"
    if argmax is not None:
        assert argmax.dtype == torch.int32 and argmax.shape == want_argmax.shape
        assert torch.equal(argmax[clear].long(), want_argmax[clear]), "argmax differs"


@pytest.mark.parametrize("fmt", FORMATS)
def test_which_calls_take_the_8bit_kernels(fmt):
    route = dict(normalize=False, ops=maxsim.cuda_ops()[0])
    Q, qD = tokens(2, 5, 64).to(DEVICE), maxsim.quantize(tokens(3, 7, 64).to(DEVICE), fmt)
    for dtype in HALF:
        assert scaled_operands(Q.to(dtype), qD, **route) is not None
        assert scaled_operands(maxsim.quantize(Q, fmt), qD.dequantize(dtype), **route) is not None
    both = scaled_operands(maxsim.quantize(Q, fmt), qD, **route)
    # int8 x int8 keeps the queries' codes for the integer tensor cores; fp8 ones become fp16
    assert both[0].dtype == (torch.int8 if fmt == "int8" else torch.float16)
    assert scaled_operands(Q, qD, **route) is None  # fp32 queries
    assert scaled_operands(Q.half(), qD, normalize=True, ops=route["ops"]) is None
    assert scaled_operands(Q.half().requires_grad_(), qD, **route) is None
    q40, d40 = tokens(2, 5, 40).to(DEVICE).half(), tokens(3, 7, 40).to(DEVICE)
    assert scaled_operands(q40, maxsim.quantize(d40, fmt), **route) is None  # dim % 16 != 0


@pytest.mark.parametrize("case", ["dim40", "fp32-queries"])
@pytest.mark.parametrize("fmt", FORMATS)
def test_unrouted_calls_dequantize_exactly(fmt, case):
    h, dtype = (40, torch.float16) if case == "dim40" else (64, torch.float32)
    Q, q_len, q_mask, q_valid = padded(3, 33, h)
    D, d_len, d_mask, d_valid = padded(5, 70, h)
    Q, qD = Q.to(dtype), maxsim.quantize(D, fmt)
    assert scaled_operands(Q, qD, normalize=False, ops=maxsim.cuda_ops()[0]) is None
    got = maxsim.maxsim_with_argmax(Q, qD, q_mask, d_mask, q_lengths=q_len, d_lengths=d_len)
    check(*got, reference(Q, qD, q_valid, d_valid))


SHAPES = [  # Nq, Lq, Nd, Ld, H
    (3, 1, 5, 1, 16),
    (3, 31, 5, 17, 48),
    (2, 32, 4, 64, 128),
    (2, 33, 4, 65, 144),
    (2, 64, 3, 300, 256),
    (2, 96, 3, 1030, 128),
    (2, 130, 3, 1030, 16),
    (1, 32, 2, 4000, 128),  # few long documents: one short wave
    (16, 32, 300, 65, 128),  # many short queries: the 128-row all-pairs tile
    (64, 32, 600, 140, 128),  # enough of them for Hopper's wgmma tile
    (64, 32, 1200, 140, 64),  # the wgmma tile with one 64-dim atom
]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("masks", [False, True], ids=["dense", "masked"])
@pytest.mark.parametrize("queries", ["float16", "bfloat16", "int8"])
@pytest.mark.parametrize("fmt", FORMATS)
def test_allpairs(fmt, queries, masks, shape, kernel_route):
    """Float queries against 8-bit documents, and int8 queries too (int8 documents: the integer
    tensor cores; fp8 documents: the queries' codes as fp16)."""
    nq, lq, nd, ld, h = shape
    Q, q_len, q_mask, q_valid = padded(nq, lq, h, masks)
    D, d_len, d_mask, d_valid = padded(nd, ld, h, masks)
    Q = maxsim.quantize(Q, "int8") if queries == "int8" else Q.to(getattr(torch, queries))
    qD = maxsim.quantize(D, fmt)
    kw = dict(q_mask=q_mask, d_mask=d_mask, q_lengths=q_len, d_lengths=d_len)
    ref = reference(Q, qD, q_valid if masks else None, d_valid if masks else None)
    check(maxsim.maxsim(Q, qD, **kw), None, ref)
    check(*maxsim.maxsim_with_argmax(Q, qD, **kw), ref)


@pytest.mark.parametrize("d_kind", [*FORMATS, "float16", "bfloat16"])
@pytest.mark.parametrize("q_fmt", FORMATS)
def test_quantized_queries(q_fmt, d_kind, kernel_route):
    Q, q_len, q_mask, q_valid = padded(3, 33, 96)
    D, d_len, d_mask, d_valid = padded(5, 70, 96)
    qQ = maxsim.quantize(Q, q_fmt)
    D = maxsim.quantize(D, d_kind) if d_kind in FORMATS else D.to(getattr(torch, d_kind))
    got = maxsim.maxsim_with_argmax(qQ, D, q_mask, d_mask, q_lengths=q_len, d_lengths=d_len)
    check(*got, reference(qQ, D, q_valid, d_valid))


@pytest.mark.parametrize(
    "shape", [(4, 32, 8, 300, 128), (2, 32, 3, 700, 128), (3, 130, 3, 1030, 48)], ids=str
)
@pytest.mark.parametrize("dtype", HALF, ids=str)
@pytest.mark.parametrize("fmt", FORMATS)
def test_candidates_with_argmax(fmt, dtype, shape, kernel_route):
    nq, lq, k, ld, h = shape
    Q, q_len, q_mask, q_valid = padded(nq, lq, h)
    D, d_len, d_mask, d_valid = padded(nq * k, ld, h)
    Q, qD = Q.to(dtype), maxsim.quantize(D, fmt)
    cand = QuantizedTokens(qD.codes.view(nq, k, ld, h), qD.scale.view(nq, k, ld))
    got = maxsim.maxsim_with_argmax(
        Q, cand, q_mask, d_mask.view(nq, k, ld), q_lengths=q_len, d_lengths=d_len.view(nq, k)
    )
    check(*got, grouped(reference(Q, qD, q_valid, d_valid), k))


@pytest.mark.parametrize("k", [120, 300])
@pytest.mark.parametrize("h", [64, 128])
@pytest.mark.parametrize("layout", ["padded", "packed"])
@pytest.mark.parametrize("queries", ["float16", "int8"])
@pytest.mark.parametrize("fmt", FORMATS)
def test_many_candidates_of_skewed_lengths(fmt, queries, layout, h, k, kernel_route):
    """Enough candidates for several per block, of very uneven lengths: mostly short documents
    (empty ones among them) and a few long ones. Scores with and without argmax (Hopper streams
    D = 128 without argmax by warps)."""
    nq, lq, ld = 4, 16, 700
    Q, q_len, q_mask, q_valid = padded(nq, lq, h)
    d_len = torch.randint(0, 11, (nq * k,), device=DEVICE)
    d_len[torch.randperm(nq * k, device=DEVICE)[:12]] = ld
    d_valid = prefix(d_len, ld)
    D = fill_invalid(tokens(nq * k, ld, h).to(DEVICE), d_valid)
    qQ = maxsim.quantize(Q, "int8") if queries == "int8" else Q.half()
    qD = maxsim.quantize(D, fmt)
    want = grouped(reference(qQ, qD, q_valid, d_valid), k)
    if layout == "padded":
        cand = QuantizedTokens(qD.codes.view(nq, k, ld, h), qD.scale.view(nq, k, ld))
        kw = dict(q_lengths=q_len, d_lengths=d_len.view(nq, k))
        check(*maxsim.maxsim_with_argmax(qQ, cand, q_mask, **kw), want)
        check(maxsim.maxsim(qQ, cand, q_mask, **kw), None, want)
    else:
        q_in = prefix(q_len, lq)
        packed_q = (
            QuantizedTokens(qQ.codes[q_in], qQ.scale[q_in]) if queries == "int8" else qQ[q_in]
        )
        packed_d = QuantizedTokens(qD.codes[d_valid], qD.scale[d_valid])
        got = maxsim.maxsim_varlen(
            packed_q, offsets_of(q_len).int(), packed_d, offsets_of(d_len).int(),
            num_candidates=k, max_seqlen_q=lq, q_mask=q_mask[q_in],
        )
        check(got, None, want)


@pytest.mark.parametrize("k", [100, 400])
@pytest.mark.parametrize("masks", [False, True], ids=["lengths", "lengths+mask"])
@pytest.mark.parametrize("ld", [200, 600], ids=lambda n: f"ld{n}")
@pytest.mark.parametrize("queries", ["float16", "int8"])
@pytest.mark.parametrize("fmt", FORMATS)
def test_ragged_candidates_sharing_blocks(fmt, queries, ld, masks, k, kernel_route):
    """More candidates than streaming blocks, of every length from empty to full (multiples of
    the tile and one row either side among them): each block streams several documents of
    different lengths back to back (64- and 128-row tiles of codes; without argmax, 32-row tiles
    split over warps). Scores and argmax against float64, query by query."""
    nq, lq, h = 4, 32, 128
    Q, q_len, q_mask, q_valid = padded(nq, lq, h)
    d_len = torch.randint(0, ld + 1, (nq * k,), device=DEVICE)
    edges = torch.tensor([0, 1, 31, 32, 33, 63, 64, 65, 127, 128, 129], device=DEVICE).clamp(max=ld)
    every7 = torch.arange(0, nq * k, 7, device=DEVICE)
    d_len[every7] = edges[torch.arange(every7.numel(), device=DEVICE) % edges.numel()]
    d_valid = prefix(d_len, ld)
    d_mask = None
    if masks:
        d_mask = random_mask((nq * k, ld), device=DEVICE, keep=0.9)
        d_valid = d_valid & d_mask
    D = fill_invalid(tokens(nq * k, ld, h).to(DEVICE), d_valid)
    qQ = maxsim.quantize(Q, "int8") if queries == "int8" else Q.half()
    qD = maxsim.quantize(D, fmt)
    cand = QuantizedTokens(qD.codes.view(nq, k, ld, h), qD.scale.view(nq, k, ld))
    kw = dict(q_lengths=q_len, d_lengths=d_len.view(nq, k))
    c_mask = None if d_mask is None else d_mask.view(nq, k, ld)
    want = per_query(qQ, qD, q_valid, d_valid, k)
    check(*maxsim.maxsim_with_argmax(qQ, cand, q_mask, c_mask, **kw), want)
    check(maxsim.maxsim(qQ, cand, q_mask, c_mask, **kw), None, want)


@pytest.mark.parametrize("layout", ["candidates", "allpairs"])
@pytest.mark.parametrize("queries", ["float16", "int8"])
@pytest.mark.parametrize("fmt", FORMATS)
def test_ragged_documents_several_per_streaming_block(fmt, queries, layout, kernel_route):
    """More ragged documents than streaming blocks (on Hopper, warps splitting each block's
    tiles): ColPali-like pages of 0 to 1024 rows against their own queries, and 200 documents
    shared by two queries (all pairs), equal lengths among them. Scores against float64."""
    nq, k, ld, h = (8, 100, 1024, 128) if layout == "candidates" else (2, 200, 200, 128)
    n = nq * k if layout == "candidates" else k
    Q, q_len, q_mask, q_valid = padded(nq, 32, h)
    d_len = torch.randint(0, ld + 1, (n,), device=DEVICE)
    d_len[:6] = torch.tensor([0, 1, 32, 33, ld, ld], device=DEVICE)
    d_valid = prefix(d_len, ld)
    D = fill_invalid(tokens(n, ld, h).to(DEVICE), d_valid)
    qQ = maxsim.quantize(Q, "int8") if queries == "int8" else Q.half()
    qD = maxsim.quantize(D, fmt)
    if layout == "allpairs":
        got = maxsim.maxsim(qQ, qD, q_mask, q_lengths=q_len, d_lengths=d_len)
        check(got, None, reference(qQ, qD, q_valid, d_valid))
        return
    cand = QuantizedTokens(qD.codes.view(nq, k, ld, h), qD.scale.view(nq, k, ld))
    got = maxsim.maxsim(qQ, cand, q_mask, q_lengths=q_len, d_lengths=d_len.view(nq, k))
    check(got, None, per_query(qQ, qD, q_valid, d_valid, k))


@pytest.mark.parametrize("fmt", FORMATS)
def test_nan_in_a_valid_token_makes_its_score_nan(fmt, kernel_route):
    """A NaN scale on a valid token makes its document's score NaN (the max keeps NaN, as
    torch's does); NaN scales past a document's length change nothing. Enough candidates that
    blocks stream several documents."""
    nq, lq, k, ld, h = 4, 32, 90, 100, 128
    Q = tokens(nq, lq, h).to(DEVICE).half()
    d_len = torch.randint(1, ld + 1, (nq * k,), device=DEVICE)
    qD = maxsim.quantize(tokens(nq * k, ld, h).to(DEVICE), fmt)
    scale = qD.scale.clone()
    scale[~prefix(d_len, ld)] = float("nan")
    bad = torch.tensor([3, 100, 271], device=DEVICE)
    scale[bad, d_len[bad] - 1] = float("nan")
    cand = QuantizedTokens(qD.codes.view(nq, k, ld, h), scale.view(nq, k, ld))
    got = maxsim.maxsim(Q, cand, d_lengths=d_len.view(nq, k))
    want = grouped(reference(Q, QuantizedTokens(qD.codes, scale), None, prefix(d_len, ld)), k)[0]
    assert torch.equal(got.isnan(), want.isnan()) and int(got.isnan().sum()) == 3
    ok = ~want.isnan()
    check(got[ok], None, (want[ok], None, None))


@pytest.mark.parametrize("dtype", HALF, ids=str)
@pytest.mark.parametrize("fmt", FORMATS)
def test_pairs(fmt, dtype, kernel_route):
    Q, _, _, q_valid = padded(6, 40, 128)
    D, _, _, d_valid = padded(6, 200, 128)
    Q, qD = Q.to(dtype), maxsim.quantize(D, fmt)
    got = maxsim.maxsim_pairs(Q, qD, q_valid, d_valid)
    check(got.view(-1, 1), None, grouped(reference(Q, qD, q_valid, d_valid), 1))


@pytest.mark.parametrize("mode", ["allpairs", "candidates", "pairs"])
@pytest.mark.parametrize("dtype", HALF, ids=str)
@pytest.mark.parametrize("fmt", FORMATS)
def test_varlen(fmt, dtype, mode, kernel_route):
    nq, k, lq, ld, h = 4, 3, 40, 90, 128
    Q, q_len, q_mask, q_valid = padded(nq, lq, h)
    D, d_len, d_mask, d_valid = padded(nq * k, ld, h)
    Q, qD = Q.to(dtype), maxsim.quantize(D, fmt)
    q_in, d_in = prefix(q_len, lq), prefix(d_len, ld)  # the tokens that get packed
    packed = QuantizedTokens(qD.codes[d_in], qD.scale[d_in])
    cu_q, cu_d = offsets_of(q_len).int(), offsets_of(d_len).int()
    kw = dict(max_seqlen_q=lq, q_mask=q_mask[q_in], d_mask=d_mask[d_in])
    want = reference(Q, qD, q_valid, d_valid)
    if mode == "allpairs":
        got = maxsim.maxsim_varlen(Q[q_in], cu_q, packed, cu_d, **kw)
    elif mode == "candidates":
        got = maxsim.maxsim_varlen(Q[q_in], cu_q, packed, cu_d, num_candidates=k, **kw)
        want = grouped(want, k)
    else:
        pq = torch.randint(0, nq, (7,), device=DEVICE)
        pd = torch.randint(0, nq * k, (7,), device=DEVICE)
        got = maxsim.maxsim_varlen(Q[q_in], cu_q, packed, cu_d, pair_q=pq, pair_d=pd, **kw)
        want = tuple(r[pq, pd] for r in want)
    check(got, None, want)


@pytest.mark.parametrize("mode", ["candidates", "pairs", "varlen-pairs", "long-query"])
def test_int8_queries_int8_documents(mode, kernel_route):
    """The integer tensor-core path through the other layouts (all pairs: test_allpairs)."""
    nq, k, lq, ld, h = 4, 3, 40, 90, 128
    if mode == "long-query":
        lq = 300  # row tiles whose partial sums a second kernel adds
    Q, q_len, q_mask, q_valid = padded(nq, lq, h)
    D, d_len, d_mask, d_valid = padded(nq * k, ld, h)
    qQ, qD = maxsim.quantize(Q, "int8"), maxsim.quantize(D, "int8")
    want = reference(qQ, qD, q_valid, d_valid)
    if mode in ("candidates", "long-query"):
        cand = QuantizedTokens(qD.codes.view(nq, k, ld, h), qD.scale.view(nq, k, ld))
        got = maxsim.maxsim_with_argmax(
            qQ, cand, q_mask, d_mask.view(nq, k, ld), q_lengths=q_len,
            d_lengths=d_len.view(nq, k),
        )
        check(*got, grouped(want, k))
    elif mode == "pairs":
        got = maxsim.maxsim_pairs(qQ, qD[:nq], q_valid, d_valid[:nq])
        check(got.view(-1, 1), None, grouped(reference(qQ, qD[:nq], q_valid, d_valid[:nq]), 1))
    else:
        q_in, d_in = prefix(q_len, lq), prefix(d_len, ld)
        packed_q = QuantizedTokens(qQ.codes[q_in], qQ.scale[q_in])
        packed_d = QuantizedTokens(qD.codes[d_in], qD.scale[d_in])
        cu_q, cu_d = offsets_of(q_len).int(), offsets_of(d_len).int()
        pq = torch.randint(0, nq, (7,), device=DEVICE)
        pd = torch.randint(0, nq * k, (7,), device=DEVICE)
        got = maxsim.maxsim_varlen(
            packed_q, cu_q, packed_d, cu_d, pair_q=pq, pair_d=pd, max_seqlen_q=lq,
            q_mask=q_mask[q_in], d_mask=d_mask[d_in],
        )
        check(got, None, tuple(r[pq, pd] for r in want))


@pytest.mark.parametrize("dtype", HALF, ids=str)
@pytest.mark.parametrize("fmt", FORMATS)
def test_retrieve(fmt, dtype, kernel_route):
    torch.manual_seed(7)  # data whose top-11 scores are well apart
    Q, q_valid = padded(4, 32, 128, masks=False)[0], random_mask((4, 32)).to(DEVICE)
    D, _, _, d_valid = padded(60, 40, 128)  # document 0 is empty
    Q, qD = Q.to(dtype), maxsim.quantize(D, fmt)
    ref_scores = reference(Q, qD, q_valid, d_valid)[0]
    ranked = ref_scores.sort(dim=1, descending=True).values[:, :11]
    assert float((ranked[:, :-1] - ranked[:, 1:]).min()) > 3e-5 * float(ranked.abs().max())
    scores, idx = maxsim.retrieve(Q, qD, 10, q_valid, d_valid, chunk_size=7)
    want_scores, want_idx = ref_scores.topk(10, dim=1)
    assert torch.equal(idx, want_idx)
    check(scores, None, (want_scores, None, None))


@pytest.mark.parametrize("ld", [50, 4000])
@pytest.mark.parametrize("queries", ["float16", "int8"])
@pytest.mark.parametrize("fmt", FORMATS)
def test_duplicated_tokens_give_the_first_index(fmt, queries, ld, kernel_route):
    Q = tokens(3, 32, 64).to(DEVICE).half()
    if queries == "int8":
        Q = maxsim.quantize(Q, "int8")
    distinct = tokens(2, 6, 64)  # each document: 6 distinct tokens, repeated all over
    D = distinct[torch.arange(2)[:, None], torch.randint(0, 6, (2, ld))]
    qD = maxsim.quantize(D.to(DEVICE), fmt)
    check(*maxsim.maxsim_with_argmax(Q, qD), reference(Q, qD))


@pytest.mark.parametrize("q_size", [1e-3, 30.0])
@pytest.mark.parametrize("dtype", HALF, ids=str)
@pytest.mark.parametrize("fmt", FORMATS)
def test_large_and_small_magnitudes(fmt, dtype, q_size, kernel_route):
    Q = (tokens(3, 40, 128) * q_size).to(DEVICE, dtype)
    size = 10.0 ** (3 * torch.randint(-1, 2, (6, 70, 1)))  # 1e-3, 1 or 1e3 per token
    size[0], size[1] = 1e-3, 1e3  # and two documents all small / all large
    qD = maxsim.quantize((tokens(6, 70, 128) * size).to(DEVICE), fmt)
    scores, argmax = maxsim.maxsim_with_argmax(Q, qD)
    want = reference(Q, qD)
    check(scores, argmax, want)
    for j in range(6):  # each document relative to its own magnitude
        check(scores[:, j], None, (want[0][:, j], None, None))


def test_raw_op_errors_name_maxsim():
    ops = maxsim.cuda_ops()[0]
    q = torch.randn(2, 8, 32, device=DEVICE).half()
    d = torch.randint(-127, 128, (3, 8, 32), device=DEVICE, dtype=torch.int8)
    scale = torch.rand(3, 8, device=DEVICE)

    def call(q, d, d_scale):
        none = (None,) * 8
        return ops.fwd_scaled(q, None, d, d_scale, *none, ALLPAIRS, 0, q.size(1), False)

    with pytest.raises(RuntimeError, match="maxsim"):
        call(q.cpu(), d.cpu(), scale.cpu())
    with pytest.raises(RuntimeError, match="maxsim.*devices"):
        call(q, d.cpu(), scale)
    with pytest.raises(RuntimeError, match="maxsim.*embedding dim"):
        call(q, d[..., :16].contiguous(), scale)
    with pytest.raises(RuntimeError, match="maxsim.*float16, bfloat16 or int8"):
        call(q.float(), d, scale)
    with pytest.raises(RuntimeError, match="maxsim.*d_scale"):
        call(q, d, None)
    q8 = torch.randint(-127, 128, (2, 8, 32), device=DEVICE, dtype=torch.int8)
    q_scale = torch.rand(2, 8, device=DEVICE)
    with pytest.raises(RuntimeError, match="maxsim.*q_scale"):
        call(q8, d, scale)
    with pytest.raises(RuntimeError, match="maxsim.*int8 documents"):
        ops.fwd_scaled(q8, q_scale, d.view(torch.float8_e4m3fn), scale, *(None,) * 8, ALLPAIRS, 0, 8, False)


@pytest.mark.parametrize("queries", ["float16", "int8"])
@pytest.mark.parametrize("fmt", FORMATS)
def test_cuda_graph_capture_matches_eager(fmt, queries, kernel_route):
    Q = tokens(4, 32, 128).to(DEVICE).half()
    if queries == "int8":
        Q = maxsim.quantize(Q, "int8")
    qD = maxsim.quantize(tokens(16, 100, 128).to(DEVICE), fmt)
    d_mask = random_mask((16, 100), DEVICE)

    def step():
        return maxsim.maxsim(Q, qD, d_mask=d_mask, backend="cuda")

    graph, captured = capture(step)
    for _ in range(3):  # replays rerun the captured launches on new inputs, their scratch reused
        fresh = tokens(4, 32, 128).to(DEVICE).half()  # new inputs in the same buffers
        if queries == "int8":
            fresh = maxsim.quantize(fresh, "int8")
            Q.codes.copy_(fresh.codes)
            Q.scale.copy_(fresh.scale)
        else:
            Q.copy_(fresh)
        graph.replay()
        torch.cuda.synchronize()
        torch.testing.assert_close(captured, step(), rtol=0, atol=0)
