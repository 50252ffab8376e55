"""GPU-only checks of fp32 inputs on the TF32 tensor-core tiles (on Hopper's all-pairs tile, their
fp16 parts): split products (the default, fp32 accuracy: within 1e-6 of float64) and single
TF32 (opt-in, within 3e-3). Calls of 2^24 or
more multiply-adds take these tiles, smaller ones the CUDA-core kernels (test_cuda.py); the shapes
here are sized above that. Grid values are exact in TF32, so on them both modes must match
float64 bit for bit, ties and masks included, whatever layout, packing or row tiling."""

import maxsim
import pytest
import torch
from conftest import (
    HAS_CUDA_OPS,
    assert_close_rel,
    assert_exact,
    op_args,
    reference_of,
    token_set,
    values,
)
from maxsim.emulation import device_capability
from maxsim.layouts import ALLPAIRS, GROUPED, PAIRS

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not HAS_CUDA_OPS, reason="the CUDA extension is not available"),
]
DEVICE = "cuda"
MODES = [pytest.param(False, id="split-tf32"), pytest.param(True, id="tf32")]
KINDS = [("padded", "padded"), ("packed", "packed"), ("padded", "packed")]


def ops():
    return maxsim.cuda_ops()[0]


def run(args, tf32):
    return ops().fwd(*args[:-1], tf32)


def call_args(layout, kinds, data, junk="nan", h=100, lq=37, with_argmax=True):
    """fwd arguments of a call above the tensor cores' threshold (odd dim and lengths, random
    prefix lengths and masks, invalid tokens filled with ``junk``)."""
    nq, nd, group = 5, {ALLPAIRS: 60, GROUPED: 200, PAIRS: 70}[layout], 0
    q = token_set(kinds[0], nq, lq, h, torch.float32, DEVICE, data, junk=junk)
    d = token_set(kinds[1], nd, 130, h, torch.float32, DEVICE, data, junk=junk)
    pair_q = pair_d = None
    if layout == GROUPED:
        group = nd // nq
    if layout == PAIRS:
        pair_q = torch.randint(0, nq, (300,), device=DEVICE)
        pair_d = torch.randint(0, nd, (300,), device=DEVICE)
    return op_args(q, d, layout, group, pair_q, pair_d, with_argmax=with_argmax)


@pytest.mark.parametrize("tf32", MODES)
@pytest.mark.parametrize("kinds", KINDS, ids="-".join)
@pytest.mark.parametrize("layout", [ALLPAIRS, GROUPED, PAIRS], ids=["allpairs", "grouped", "pairs"])
def test_grid_values_are_exact_in_both_modes(layout, kinds, tf32):
    """Layouts, packed sets, prefix lengths, masks, frequent ties (the lowest index wins) and NaN
    in every invalid token (none may reach a score)."""
    args = call_args(layout, kinds, "grid")
    assert_exact(*run(args, tf32), *reference_of(args))


@pytest.mark.parametrize("tf32", MODES)
@pytest.mark.parametrize("lq", [1, 31, 32, 33, 64, 65, 128, 129, 300])
def test_query_lengths_and_row_tiles_are_exact(lq, tf32):
    """Every row tile: one short query per block, several per 128-row tile, 64-row tiles, and
    long queries cut into row tiles whose partial sums a second kernel adds."""
    q = token_set("padded", 3, lq, 128, torch.float32, DEVICE, "grid", junk="nan")
    d = token_set("padded", 50, 1100, 128, torch.float32, DEVICE, "grid", junk="nan")
    args = op_args(q, d, ALLPAIRS)
    assert_exact(*run(args, tf32), *reference_of(args))


@pytest.mark.parametrize("h", [4, 8, 12, 64, 124, 128, 132, 256])
def test_embedding_dims_are_exact(h):
    """Dims that are a multiple of 4 (16-byte rows), zero-filled to the k step of 8, up to 256."""
    q = token_set("padded", 4, 32, h, torch.float32, DEVICE, "grid", junk="nan")
    d = token_set("padded", 40, 2000, h, torch.float32, DEVICE, "grid", junk="nan")
    args = op_args(q, d, ALLPAIRS)
    assert_exact(*run(args, False), *reference_of(args))


@pytest.mark.parametrize("lq, nd, ld", [(32, 256, 180), (32, 1000, 64), (200, 40, 300), (32, 1000, 300)])
def test_split_tf32_is_within_fp32_accuracy(lq, nd, ld):
    """Normal values: split TF32 within 1e-6 of float64 (norm-wise, and each score within 1e-5 of
    the largest), single TF32 within 3e-3 and visibly not exact."""
    q = token_set("padded", 16, lq, 128, torch.float32, DEVICE, junk="nan")
    d = token_set("padded", nd, ld, 128, torch.float32, DEVICE, junk="nan")
    args = op_args(q, d, ALLPAIRS, with_argmax=False)
    ref = reference_of(args)[0]
    exact, rounded = run(args, False)[0], run(args, True)[0]
    assert_close_rel(exact, ref, 1e-6)
    assert (exact.double() - ref).abs().max() <= 1e-5 * ref.abs().max()
    assert_close_rel(rounded, ref, 3e-3)
    if device_capability() >= (8, 0):  # below sm_80 no TF32 tile exists: both modes are fp32
        assert not torch.equal(rounded, exact), "tf32=True took the split products"


@pytest.mark.parametrize("tf32", MODES)
def test_argmax_is_a_maximum_on_normal_values(tf32):
    q = token_set("padded", 8, 32, 128, torch.float32, DEVICE, junk="nan")
    d = token_set("padded", 64, 200, 128, torch.float32, DEVICE, junk="nan")
    args = op_args(q, d, ALLPAIRS)
    _, argmax = run(args, tf32)
    _, ref_argmax = reference_of(args)
    assert torch.equal(argmax < 0, ref_argmax < 0)
    sim = torch.einsum("ith,jsh->ijts", q["x"].double(), d["x"].double())
    at = sim.gather(-1, argmax.long().clamp(min=0)[..., None])[..., 0]
    best = sim.gather(-1, ref_argmax.long().clamp(min=0)[..., None])[..., 0]
    tol = 1e-2 if tf32 else 1e-6
    assert torch.all((best - at)[argmax >= 0] <= tol * best.abs().clamp_min(1)[argmax >= 0])


# (queries, documents, document length): a few row tiles, and all pairs with enough document
# tiles for the compute-bound block tile (on Hopper the transposed wgmma tile, whose split keeps
# Inf products apart where a query holds Inf).
SIZES = [pytest.param((4, 64, 300), id="stream"), pytest.param((32, 300, 230), id="block")]


@pytest.mark.parametrize("tf32", MODES)
@pytest.mark.parametrize("kinds", KINDS, ids="-".join)
@pytest.mark.parametrize("h", [64, 128])
def test_block_tile_grid_values_are_exact(h, kinds, tf32):
    """All pairs on the block tile: packed sets, prefix lengths, masks, ties, NaN junk."""
    q = token_set(kinds[0], 32, 32, h, torch.float32, DEVICE, "grid", junk="nan")
    d = token_set(kinds[1], 300, 230, h, torch.float32, DEVICE, "grid", junk="nan")
    args = op_args(q, d, ALLPAIRS)
    assert_exact(*run(args, tf32), *reference_of(args))


@pytest.mark.parametrize("tf32", MODES)
@pytest.mark.parametrize("size", SIZES)
def test_nan_in_a_valid_token_makes_the_score_nan(size, tf32):
    """Whatever the rounding to TF32 makes of a NaN's bits, its products stay NaN."""
    nq, nd, ld = size
    Q = values((nq, 32, 64), device=DEVICE, kind="grid")
    D = values((nd, ld, 64), device=DEVICE, kind="grid")
    # NaNs of every payload: CUDA's own (0x7fffffff), its negative (0xffffffff), PyTorch's
    D.view(torch.int32)[5, 17, 3] = 0x7FFFFFFF
    D.view(torch.int32)[6, 0, 0] = -1
    Q[2, 9, 60] = float("nan")
    scores, argmax = run(op_args(dict(x=Q, offsets=None, lengths=None, mask=None),
                                 dict(x=D, offsets=None, lengths=None, mask=None), ALLPAIRS), tf32)
    nan = torch.zeros_like(scores, dtype=torch.bool)
    nan[:, 5:7] = True
    nan[2, :] = True
    assert torch.equal(scores.isnan(), nan)
    assert (argmax[:, 5, 0] == 17).all() and (argmax[:, 6, 0] == 0).all()


@pytest.mark.parametrize("tf32", MODES)
@pytest.mark.parametrize("size", SIZES)
def test_infinite_products_follow_fp32(size, tf32):
    """A query token [inf, 0, ...] against tokens whose first entry is positive: every product is
    +inf (never NaN, though the remainders of the zeros, or of exact values, are 0), so each score
    is +inf and the token's argmax is its document's first valid token (a tie of every valid
    token); masked tokens, whose first entry is negative, would give -inf."""
    nq, nd, ld = size
    Q, D = values((nq, 32, 128), device=DEVICE), values((nd, ld, 128), device=DEVICE)
    Q[:, 0] = 0.0
    Q[:, 0, 0] = float("inf")
    d_mask = torch.rand(nd, ld, device=DEVICE) < 0.8
    d_mask[:, 0] = False
    d_mask[:, 1] = True
    D[..., 0] = torch.where(d_mask, D[..., 0].abs() + 0.5, -(D[..., 0].abs() + 0.5))
    args = op_args(dict(x=Q, offsets=None, lengths=None, mask=None),
                   dict(x=D, offsets=None, lengths=None, mask=d_mask), ALLPAIRS)
    scores, argmax = run(args, tf32)
    assert (scores == float("inf")).all()
    assert (argmax[:, :, 0] == 1).all()


# All pairs of enough document tiles for Hopper's 16-bit wgmma tile, scores only: the rows go as
# fp16 parts with a power-of-two scale per token.
def parts_call(kinds, h, data="grid", junk="nan"):
    q = token_set(kinds[0], 32, 32, h, torch.float32, DEVICE, data, junk=junk)
    d = token_set(kinds[1], 640, 230, h, torch.float32, DEVICE, data, junk=junk)
    return op_args(q, d, ALLPAIRS, with_argmax=False)


@pytest.mark.parametrize("tf32", MODES)
@pytest.mark.parametrize("kinds", KINDS, ids="-".join)
@pytest.mark.parametrize("h", [64, 128])
def test_fp16_parts_grid_values_are_exact(h, kinds, tf32):
    """Packed sets, prefix lengths, masks, ties and NaN junk: grid values split exactly (the TF32
    mode's one product of the hi parts too)."""
    args = parts_call(kinds, h)
    assert_exact(run(args, tf32)[0], None, reference_of(args)[0], None)


@pytest.mark.parametrize("h", [64, 128])
def test_fp16_parts_keep_fp32_accuracy_across_magnitudes(h):
    """Queries scaled by 2^-60 .. 2^20, documents by 2^-30 .. 2^60, their tokens by 2^-8 .. 2^8
    and values by 2^-12 .. 1 (each token takes its own scale): within 1e-6 of float64 norm-wise,
    and every score within 2e-6 of the same scores on the values' magnitudes (the size of the
    products it sums)."""
    g = torch.Generator(device=DEVICE).manual_seed(7)

    def exp2(low, high, shape):
        return torch.exp2(torch.randint(low, high, shape, device=DEVICE, generator=g).float())

    args = parts_call(("padded", "padded"), h, data="normal")
    Q, D = args[0], args[1]
    Q.mul_(exp2(-60, 20, (Q.size(0), 1, 1)))
    D.mul_(exp2(-30, 60, (D.size(0), 1, 1)) * exp2(-8, 8, (*D.shape[:2], 1)) * exp2(-12, 1, D.shape))
    ref = reference_of(args)[0]
    scores = run(args, False)[0]
    assert_close_rel(scores, ref, 1e-6)
    sizes = reference_of((Q.abs(), D.abs(), *args[2:]))[0]
    assert ((scores.double() - ref).abs() <= 2e-6 * sizes).all()


def test_fp16_parts_grouped_long_queries_are_exact():
    """Grouped documents against queries of two row tiles (partial sums), with the argmax and
    lengths on both sides, grid values: bit for bit."""
    q = token_set("padded", 4, 200, 128, torch.float32, DEVICE, "grid", mask=False, junk="nan")
    d = token_set("padded", 280, 1024, 128, torch.float32, DEVICE, "grid", mask=False, junk="nan")
    args = op_args(q, d, GROUPED, group=70)
    assert_exact(*run(args, False), *reference_of(args))


@pytest.mark.skipif(
    not HAS_CUDA_OPS or device_capability()[0] != 9,
    reason="the fp16 parts are Hopper's all-pairs tile; other GPUs split on their TF32 tiles",
)
def test_fp16_parts_scratch_is_the_inputs_size_and_half_that_in_the_tf32_mode():
    """The exact mode's split copies (hi and lo) take the inputs' size; the TF32 mode stores the
    hi parts alone, half that."""
    args = parts_call(("padded", "padded"), 128, data="normal")
    inputs = (args[0].numel() + args[1].numel()) * 4
    grew = {}
    for tf32 in (False, True):
        run(args, tf32)
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        run(args, tf32)
        torch.cuda.synchronize()
        grew[tf32] = torch.cuda.max_memory_allocated() - base
    assert inputs <= grew[False] < 1.1 * inputs, grew
    assert inputs / 2 <= grew[True] < 0.55 * inputs, grew


@pytest.mark.parametrize("side", ["queries", "documents"])
def test_fp16_parts_infinite_products_follow_fp32(side):
    """An Inf on either side times every part of the other side's values: +-Inf, never NaN (the
    other side then takes the split whose parts carry the value's sign), and the scores of rows
    without an Inf stay exact on grid values."""
    args = parts_call(("padded", "padded"), 128, junk="large")
    Q, D = args[0], args[1]
    if side == "queries":
        Q[3, 5, :] = 0.0
        Q[3, 5, 7] = float("inf")
        D[..., 7] = D[..., 7].abs() + 0.25
    else:
        D[11, :, 7] = float("-inf")
        Q[..., 7] = Q[..., 7].abs() + 0.25
    ref = reference_of(args)[0]
    scores = run(args, False)[0]
    assert_exact(scores, None, ref, None)


@pytest.mark.parametrize("tf32", MODES)
def test_index_values_out_of_range_are_nan(tf32):
    """Bad document lengths and pair ids on the fp32 tiles: NaN scores and -1 argmax there, the
    other scores untouched."""
    Q, D = values((3, 32, 128), device=DEVICE), values((60, 120, 128), device=DEVICE)
    good = torch.randint(1, 121, (60,), device=DEVICE, dtype=torch.int32)
    bad_len = good.clone()
    bad_len[[3, 17, 59]] = torch.tensor([-1, 121, 1 << 30], device=DEVICE, dtype=torch.int32)

    def call(lengths, pair_q=None, pair_d=None, layout=ALLPAIRS):
        return ops().fwd(Q, D, None, None, None, None, lengths, None, pair_q, pair_d, layout, 0,
                         32, True, tf32)

    ref, ref_arg = call(good)
    scores, argmax = call(bad_len)
    bad = torch.zeros_like(ref, dtype=torch.bool)
    bad[:, [3, 17, 59]] = True
    assert torch.isnan(scores[bad]).all() and torch.equal(scores[~bad], ref[~bad])
    assert (argmax[bad] == -1).all() and torch.equal(argmax[~bad], ref_arg[~bad])
    pair_q = torch.randint(0, 3, (500,), device=DEVICE, dtype=torch.int32)
    pair_d = torch.randint(0, 60, (500,), device=DEVICE, dtype=torch.int32)
    pair_q[7], pair_d[9], pair_q[11] = 3, -2, -1
    scores, argmax = call(good, pair_q, pair_d, PAIRS)
    bad = torch.zeros(500, dtype=torch.bool, device=DEVICE)
    bad[[7, 9, 11]] = True
    ok = ~bad
    want = ref[pair_q[ok].long(), pair_d[ok].long()]
    assert torch.isnan(scores[bad]).all()
    torch.testing.assert_close(scores[ok], want, rtol=1e-6, atol=1e-4)
    assert (argmax[bad] == -1).all()


def test_the_tf32_switches_reach_the_kernels(monkeypatch):
    """MAXSIM_FP32 decides; unset, torch.backends.cuda.matmul.allow_tf32 does."""
    Q, D = values((16, 32, 128), device=DEVICE), values((128, 180, 128), device=DEVICE)
    monkeypatch.delenv("MAXSIM_FP32", raising=False)
    exact = ops().fwd(Q, D, *([None] * 8), ALLPAIRS, 0, 32, False, False)[0]
    rounded = ops().fwd(Q, D, *([None] * 8), ALLPAIRS, 0, 32, False, True)[0]
    assert torch.equal(maxsim.maxsim(Q, D, backend="cuda"), exact)
    monkeypatch.setenv("MAXSIM_FP32", "tf32")
    assert torch.equal(maxsim.maxsim(Q, D, backend="cuda"), rounded)
    monkeypatch.delenv("MAXSIM_FP32")
    old = torch.backends.cuda.matmul.fp32_precision
    try:
        torch.backends.cuda.matmul.fp32_precision = "tf32"
        assert torch.equal(maxsim.maxsim(Q, D, backend="cuda"), rounded)
        monkeypatch.setenv("MAXSIM_FP32", "exact")
        assert torch.equal(maxsim.maxsim(Q, D, backend="cuda"), exact)
    finally:
        torch.backends.cuda.matmul.fp32_precision = old
