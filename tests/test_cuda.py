"""GPU-only checks of the CUDA extension: graph capture, every output element written, large and
odd shapes, exact fp32. The backend-parametrised tests of the other files cover the semantics."""

import maxsim
import pytest
import torch
from conftest import HAS_CUDA_OPS, assert_close_rel, assert_exact, capture, random_mask, values
from maxsim.layouts import GROUPED, PAIRS
from maxsim.reference import maxsim_reference_padded, reference_fwd

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not HAS_CUDA_OPS, reason="the CUDA extension is not available"),
]
DEVICE = "cuda"


def test_forward_is_cuda_graph_capturable():
    Q = values((4, 32, 64), torch.float16, DEVICE)
    D = values((16, 100, 64), torch.float16, DEVICE)
    d_mask = random_mask((16, 100), DEVICE)
    q, q_off = values((50, 64), torch.bfloat16, DEVICE), torch.tensor([0, 20, 50], device=DEVICE)
    d, d_off = (
        values((70, 64), torch.bfloat16, DEVICE),
        torch.tensor([0, 30, 31, 70], device=DEVICE),
    )
    pair_q, pair_d = torch.tensor([0, 1, 1], device=DEVICE), torch.tensor([2, 0, 1], device=DEVICE)

    def step():
        return (
            maxsim.maxsim(Q, D, d_mask=d_mask, backend="cuda"),
            maxsim.score_pairs_packed(
                q, q_off, d, d_off, pair_q, pair_d, max_q_len=30, backend="cuda"
            ),
        )

    graph, captured = capture(step)
    Q.copy_(values(Q.shape, torch.float16, DEVICE))  # new inputs in the same buffers
    q.copy_(values(q.shape, torch.bfloat16, DEVICE))
    graph.replay()
    torch.cuda.synchronize()
    for got, want in zip(captured, step(), strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=0)


def poison_allocator():
    """Fill freed blocks of both caching-allocator pools with NaN, so unwritten outputs show."""
    blocks = [torch.full((2**17,), float("nan"), device=DEVICE) for _ in range(64)]  # small pool
    blocks.append(torch.full((2**26,), float("nan"), device=DEVICE))  # large pool
    del blocks


@pytest.mark.parametrize("mode", ["allpairs", "candidates", "pairs-packed", "contrastive"])
def test_every_output_element_is_written(mode):
    Q = values((5, 33, 40), torch.float16, DEVICE, "grid")
    D = values((10, 47, 40), torch.float16, DEVICE, "grid")
    d_len = torch.randint(0, 48, (10,), device=DEVICE)
    d_off = torch.cat([d_len.new_zeros(1), d_len.cumsum(0)])
    packed_d = values((int(d_off[-1]), 40), torch.float16, DEVICE, "grid")
    poison_allocator()
    if mode == "allpairs":
        got = maxsim.maxsim_with_argmax(Q, D, backend="cuda")
        want = reference_fwd(Q, D)
    elif mode == "candidates":
        got = maxsim.maxsim_with_argmax(Q, D.view(5, 2, 47, 40), backend="cuda")
        want = reference_fwd(Q, D, layout=GROUPED, group=2)
    elif mode == "contrastive":
        got = maxsim.score_contrastive_with_argmax(Q, packed_d, d_off, backend="cuda")
        want = reference_fwd(Q, packed_d, d_offsets=d_off)
    else:
        q_off = torch.tensor([0, 7, 7, 40], device=DEVICE)
        q = Q.reshape(-1, 40)[:40]
        pq, pd = (
            torch.randint(0, 3, (17,), device=DEVICE),
            torch.randint(0, 10, (17,), device=DEVICE),
        )
        got = maxsim.score_pairs_packed_with_argmax(
            q, q_off, packed_d, d_off, pq, pd, max_q_len=36, backend="cuda"
        )
        want = reference_fwd(
            q,
            packed_d,
            q_offsets=q_off,
            d_offsets=d_off,
            pair_q=pq,
            pair_d=pd,
            layout=PAIRS,
            max_lq=36,
        )
    assert_exact(*got, *want)


def argmax_is_a_maximum(Q, D, argmax, tol):
    """The similarity at the kernel's argmax is the float64 maximum, up to rounding."""
    sim = torch.einsum("ith,jsh->ijts", Q.double(), D.double())
    best = sim.max(-1).values
    at = sim.gather(-1, argmax.long().clamp(min=0)[..., None])[..., 0]
    scale = Q.double().norm(dim=-1)[:, None, :] * D.double().norm(dim=-1).max()
    assert torch.all((argmax >= 0) & (best - at <= tol * scale))


SWEEP = [  # (Lq, Ld, H): every Lq and H of the sweep, Ld up to 8192
    (1, 8192, 8),
    (31, 4096, 24),
    (96, 1000, 64),
    (128, 8192, 100),
    (300, 777, 128),
    (1024, 2048, 256),
    (128, 513, 512),
    (31, 8192, 512),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("lq, ld, h", SWEEP)
def test_large_and_odd_shapes(lq, ld, h, dtype):
    Q = values((2, lq, h), dtype, DEVICE)
    D = values((3, ld, h), dtype, DEVICE)
    d_mask = random_mask((3, ld), DEVICE, keep=0.9)
    scores, argmax = maxsim.maxsim_with_argmax(Q, D, backend="cuda")
    full = torch.ones(3, ld, dtype=torch.bool, device=DEVICE)
    ref = maxsim_reference_padded(
        Q[:, None], torch.ones(2, 1, lq, dtype=torch.bool, device=DEVICE), D[None], full[None]
    )[0]
    assert_close_rel(scores, ref)
    argmax_is_a_maximum(Q, D, argmax, 1e-5)
    masked = maxsim.maxsim(Q, D, d_mask=d_mask, backend="cuda")
    ref = maxsim_reference_padded(
        Q[:, None], torch.ones(2, 1, lq, dtype=torch.bool, device=DEVICE), D[None], d_mask[None]
    )[0]
    assert_close_rel(masked, ref)


def test_fp32_is_exact_fp32_not_tf32():
    """Long fp32 dot products: TF32 would lose ~1e-3 relative; exact fp32 stays within 1e-5."""
    Q = values((3, 64, 512), torch.float32, DEVICE)
    D = values((4, 8192, 512), torch.float32, DEVICE)
    scores = maxsim.maxsim(Q, D, backend="cuda")
    full = torch.ones(1, 1, 8192, dtype=torch.bool, device=DEVICE)
    ref = maxsim_reference_padded(
        Q[:, None],
        torch.ones(3, 1, 64, dtype=torch.bool, device=DEVICE),
        D[None],
        full.expand(1, 4, -1),
    )[0]
    assert_close_rel(scores, ref, 1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
def test_long_documents_are_exact(dtype):
    """Documents of up to 8192 tokens on grid values: scores and argmax equal float64 bit for bit
    (the products and their sums are exact in fp32), and planted tokens win at each document's
    first, middle and last valid position, so a kernel that skips any one token fails."""
    lq, ld, h = 31, 8192, 128
    Q = values((3, lq, h), dtype, DEVICE, "grid")
    D = values((3, ld, h), dtype, DEVICE, "grid")
    d_len = torch.tensor([ld, ld - 1, 4099], device=DEVICE)
    spots = torch.stack([torch.zeros_like(d_len), d_len // 2, d_len - 1])  # [where, document]
    for where in range(3):
        for j in range(3):  # twice the query token: the largest product by far
            D[j, spots[where, j]] = 2 * Q[where, j]
    d_mask = random_mask((3, ld), DEVICE, keep=0.9)
    d_mask[torch.arange(3, device=DEVICE)[None].expand(3, 3), spots] = True
    for kwargs in (dict(d_lengths=d_len), dict(d_lengths=d_len, d_mask=d_mask)):
        got = maxsim.maxsim_with_argmax(Q, D, backend="cuda", **kwargs)
        assert_exact(*got, *reference_fwd(Q, D, **kwargs))
        planted = got[1][torch.arange(3)[:, None], torch.arange(3)[None], torch.arange(3)[None]]
        assert torch.equal(planted, spots.to(torch.int32)), "a planted winner was skipped"


def masked_argmax_is_a_maximum(sim, valid, argmax, tol):
    """``sim [..., Lq, Ld]`` float64, ``valid [..., Ld]``: the kernel's argmax is a valid token
    whose similarity is the maximum up to rounding, and never the later copy of a tied token."""
    sim = sim.masked_fill(~valid[..., None, :], float("-inf"))
    best = sim.max(-1).values
    at = sim.gather(-1, argmax.long().clamp(min=0)[..., None])[..., 0]
    assert torch.all((argmax >= 0) & (best - at <= tol * best.abs().clamp_min(1)))


@pytest.mark.parametrize("ld", [256, 1030])
@pytest.mark.parametrize("h", [64, 128])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_streaming_tiles(dtype, h, ld):
    """Reranking shapes (short queries, each against its own padded candidates): the 4-warp
    64-column tile below 512 document tokens, the 8-warp swizzled 128-column one from 512 on.
    Grid values make every score exact and ties frequent (the lowest index must win); prefix
    lengths (0 included) and mask holes cut the documents."""
    Q = values((6, 32, h), dtype, DEVICE, "grid")
    D = values((6, 5, ld, h), dtype, DEVICE, "grid")
    lengths = torch.randint(0, ld + 1, (6, 5), device=DEVICE)
    lengths[0, 0] = 0
    d_mask = random_mask((6, 5, ld), DEVICE, keep=0.8)
    got = maxsim.maxsim_with_argmax(Q, D, d_mask=d_mask, d_lengths=lengths, backend="cuda")
    want = reference_fwd(
        Q, D.flatten(0, 1), d_lengths=lengths.flatten(), d_mask=d_mask.flatten(0, 1),
        layout=GROUPED, group=5,
    )
    assert_exact(*got, *want)


# One wave of short documents, several per streaming block (on Hopper the transposed wgmma tile,
# its first tile and query by TMA): every document scored, and by its own block, eagerly and in
# CUDA-graph replays with new queries in the same buffers.
ONE_WAVE = {
    # name: (queries, candidates per query or 0 for every document, documents, Ld)
    "rerank_ragged": (32, 50, 1600, 180),
    "one_tile_docs": (16, 100, 1600, 40),  # documents of at most one tile
    "allpairs": (3, 0, 700, 100),
}


@pytest.mark.parametrize("case", ONE_WAVE)
def test_one_wave_of_short_documents_scores_each_once(case):
    nq, k, nd, ld = ONE_WAVE[case]
    h = 128
    Q = values((nq, 32, h), torch.float16, DEVICE, "grid")
    shape = (nq, k, ld) if k else (nd, ld)
    D = values((*shape, h), torch.float16, DEVICE, "grid")
    lengths = torch.randint(0, ld + 1, shape[:-1], device=DEVICE)
    lengths.view(-1)[:3] = torch.tensor([0, 1, ld])
    d_mask = random_mask(shape, DEVICE, keep=0.9)
    past = torch.arange(ld, device=DEVICE) >= lengths[..., None]
    D = D.masked_fill(past[..., None], float("nan"))  # a read past a length would show

    def step():  # the scores-only kernel and the one with the argmax
        kw = dict(d_mask=d_mask, d_lengths=lengths, backend="cuda")
        return (maxsim.maxsim(Q, D, **kw), *maxsim.maxsim_with_argmax(Q, D, **kw))

    layout = dict(layout=GROUPED, group=k) if k else {}
    want = reference_fwd(
        Q, D.flatten(0, 1) if k else D, d_lengths=lengths.flatten(),
        d_mask=d_mask.flatten(0, 1) if k else d_mask, **layout,
    )
    scores, *with_argmax = step()
    assert_exact(scores, None, want[0], None)
    assert_exact(*with_argmax, *want)
    graph, captured = capture(step)
    for _ in range(3):
        Q.copy_(values(Q.shape, torch.float16, DEVICE, "grid"))  # new queries in the same buffer
        captured[0].fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        for got, eager in zip(captured, step(), strict=True):
            torch.testing.assert_close(got, eager, rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("ld", [200, 1030])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, "int8"], ids=str)
def test_masks_alone_skip_the_padding_after_each_document(dtype, ld):
    """Documents described by a mask only: the forward first finds where each one's last
    masked-in token is and reads nothing past it. Extents at the scan's 32-token steps and at
    the ends, an empty document, holes; the padding past each extent is NaN, so a read of it
    that leaked into a score would show."""
    nq, k, h = 3, 12, 64
    ends = torch.tensor([0, 1, 31, 32, 33, 63, 64, 65, ld - 1, ld, 100, 150], device=DEVICE)
    ends = ends.repeat(nq, 1)
    d_mask = random_mask((nq, k, ld), DEVICE, keep=0.8)
    d_mask &= torch.arange(ld, device=DEVICE) < ends[..., None]
    d_mask[0, 2, :] = False  # extent 0 though the mask is ld long
    d_mask[1, 1, 0] = True  # only its first token
    Q = values((nq, 32, h), torch.float16 if dtype == "int8" else dtype, DEVICE, "grid")
    D = values((nq, k, ld, h), Q.dtype, DEVICE, "grid")
    D = D.masked_fill((torch.arange(ld, device=DEVICE) >= ends[..., None])[..., None], float("nan"))
    if dtype == "int8":
        Dq = maxsim.quantize(D.nan_to_num(0.0))
        got = maxsim.maxsim_with_argmax(Q, Dq, d_mask=d_mask, backend="cuda")
        want = maxsim.maxsim_with_argmax(Q, Dq, d_mask=d_mask, d_lengths=ends, backend="cuda")
        assert_exact(*got, *want)
        return
    got = maxsim.maxsim_with_argmax(Q, D, d_mask=d_mask, backend="cuda")
    want = reference_fwd(
        Q, D.flatten(0, 1), d_mask=d_mask.flatten(0, 1), layout=GROUPED, group=k
    )
    assert_exact(*got, *want)


def test_stale_stage_rows_never_reach_a_score():
    """Rows past a document's valid tokens are not copied into shared memory, so a stage still
    holds an earlier document's rows there. Long documents with a NaN row alternate with short
    ones (NaN padding too), enough of them that blocks take several documents each: the short
    documents' scores must equal float64 exactly, the long ones' be NaN."""
    nd, ld, h = 12000, 40, 64
    Q = values((1, 7, h), torch.float16, DEVICE, "grid")
    D = values((nd, ld, h), torch.float16, DEVICE, "grid")
    lengths = torch.full((nd,), ld, device=DEVICE)
    lengths[1::2] = torch.randint(1, 9, (nd // 2,), device=DEVICE)
    D[0::2, 30] = float("nan")
    D[1::2, 20:] = float("nan")  # padding of the short documents
    scores = maxsim.maxsim(Q, D, d_lengths=lengths, backend="cuda")[0]
    assert torch.all(scores[0::2].isnan())
    short = D[1::2].double()
    sim = torch.einsum("th,dsh->dts", Q[0].double(), short)
    valid = torch.arange(ld, device=DEVICE) < lengths[1::2, None]
    ref = sim.masked_fill(~valid[:, None, :], float("-inf")).amax(-1).sum(-1)
    torch.testing.assert_close(scores[1::2].double(), ref, rtol=0, atol=0)


@pytest.mark.parametrize("ld", [180, 600])
@pytest.mark.parametrize("lq", [17, 32])
def test_query_tile_rows_past_the_query_never_reach_a_score(lq, ld):
    """On Hopper the stream tiles load a padded query's 32-row tile as one box, so the rows past
    a shorter query are the next query's. Odd queries hold NaN (their scores are NaN), even ones
    NaN past their lengths: the even queries' scores must equal float64 exactly, against their
    own candidates and against every document."""
    nq, k, h = 6, 5, 128
    Q = values((nq, lq, h), torch.float16, DEVICE, "grid")
    q_len = torch.randint(1, lq + 1, (nq,), device=DEVICE)
    Q[1::2, 0] = float("nan")
    Q = Q.masked_fill((torch.arange(lq, device=DEVICE) >= q_len[:, None])[..., None], float("nan"))
    D = values((nq, k, ld, h), torch.float16, DEVICE, "grid")
    d_len = torch.randint(1, ld + 1, (nq, k), device=DEVICE)
    got = maxsim.maxsim(Q, D, q_lengths=q_len, d_lengths=d_len, backend="cuda")
    want = reference_fwd(
        Q, D.flatten(0, 1), q_lengths=q_len, d_lengths=d_len.flatten(), layout=GROUPED, group=k
    )
    assert torch.all(got[1::2].isnan()) and torch.all(got[0::2].isfinite())
    assert_exact(got, None, want[0], None)
    docs = D[0]
    got = maxsim.maxsim(Q, docs, q_lengths=q_len, d_lengths=d_len[0], backend="cuda")
    want = reference_fwd(Q, docs, q_lengths=q_len, d_lengths=d_len[0])
    assert torch.all(got[1::2].isnan()) and torch.all(got[0::2].isfinite())
    assert_exact(got, None, want[0], None)


@pytest.mark.parametrize("h", [64, 128])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_compute_bound_tiles(dtype, h):
    """Calls big enough for the compute-bound tile (on Hopper, the wgmma one): all-pairs with short
    queries sharing row tiles and grouped with long queries cut into row tiles, against float64,
    with mask holes, a partial last tile and exactly tied tokens (copies: the lower index wins)."""
    Q = values((32, 32, h), dtype, DEVICE)
    D = values((70, 1000, h), dtype, DEVICE)
    D[:, 600:640] = D[:, 100:140]  # ties: the copies must never win
    d_mask = random_mask((70, 1000), DEVICE, keep=0.9)
    d_mask[:, 100:140] = True
    scores, argmax = maxsim.maxsim_with_argmax(Q, D, d_mask=d_mask, backend="cuda")
    q_all = torch.ones(32, 1, 32, dtype=torch.bool, device=DEVICE)
    ref = maxsim_reference_padded(Q[:, None], q_all, D[None], d_mask[None])[0]
    assert_close_rel(scores, ref, 1e-6)
    sim = torch.einsum("ith,jsh->ijts", Q.double(), D.double())
    masked_argmax_is_a_maximum(sim, d_mask[None], argmax, 1e-6)
    assert not torch.any((argmax >= 600) & (argmax < 640)), "a tied copy beat its original"
    del sim

    Qg = values((4, 200, h), dtype, DEVICE)
    Dg = values((4, 70, 1024, h), dtype, DEVICE)
    g_mask = random_mask((4, 70, 1024), DEVICE, keep=0.9)
    scores, argmax = maxsim.maxsim_with_argmax(Qg, Dg, d_mask=g_mask, backend="cuda")
    ref = maxsim_reference_padded(
        Qg[:, None], torch.ones(4, 1, 200, dtype=torch.bool, device=DEVICE), Dg, g_mask
    )[0]
    assert_close_rel(scores, ref, 1e-6)
    sim = torch.einsum("bth,bksh->bkts", Qg.double(), Dg.double())
    masked_argmax_is_a_maximum(sim, g_mask, argmax, 1e-6)
