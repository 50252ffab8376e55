"""GPU-only checks of the kernels' own index checks: the raw CUDA ops, called with index values
out of range (bypassing the Python checks), return NaN scores, -1 argmax and zero gradients where
documented, and leave the CUDA context usable. Every CUDA kernel family is reached: the
tensor-core tiles (short, 64-row and 128-row queries), the CUDA-core kernels (fp32), 8-bit
documents, the backward (dQ, sorted and packed dD) and the cross-entropy."""

import math

import maxsim
import pytest
import torch
from conftest import HAS_CUDA_OPS, values
from maxsim.emulation import device_capability
from maxsim.layouts import ALLPAIRS, GROUPED, PAIRS

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not HAS_CUDA_OPS, reason="the CUDA extension is not available"),
]
DEVICE = "cuda"
DTYPES = [torch.float16, torch.bfloat16, torch.float32]


def ops():
    return maxsim.cuda_ops()[0]


def i32(xs):
    return torch.tensor(xs, dtype=torch.int32, device=DEVICE)


def fwd(q, d, *, q_off=None, q_len=None, d_off=None, d_len=None, d_mask=None, pair_q=None,
        pair_d=None, layout=ALLPAIRS, group=0, max_lq=None, argmax=True):
    max_lq = q.size(1) if max_lq is None else max_lq
    out = ops().fwd(q, d, q_off, q_len, None, d_off, d_len, d_mask, pair_q, pair_d, layout, group,
                    max_lq, argmax, False)
    torch.cuda.synchronize()  # a fault surfaces here
    return out


def assert_nan_where(scores, bad, ref):
    """NaN exactly at `bad`; the other scores equal `ref`'s."""
    assert torch.isnan(scores[bad]).all(), scores
    assert torch.equal(scores[~bad], ref[~bad]), (scores, ref)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("lq", [32, 50, 130])
def test_padded_lengths_out_of_range_are_nan(dtype, lq):
    Q, D = values((3, lq, 128), dtype, DEVICE), values((40, 70, 128), dtype, DEVICE)
    good = torch.randint(1, 71, (40,), device=DEVICE, dtype=torch.int32)
    bad_len = good.clone()
    bad_len[[3, 17, 39]] = i32([-1, 71, 1 << 30])
    ref, ref_arg = fwd(Q, D, d_len=good)
    s, arg = fwd(Q, D, d_len=bad_len)
    bad = torch.zeros_like(ref, dtype=torch.bool)
    bad[:, [3, 17, 39]] = True
    assert_nan_where(s, bad, ref)
    assert (arg[bad] == -1).all() and torch.equal(arg[~bad], ref_arg[~bad])
    q_len = torch.full((3,), lq, device=DEVICE, dtype=torch.int32)
    q_len[1] = -5
    s, arg = fwd(Q, D, q_len=q_len, d_len=good)
    assert torch.isnan(s[1]).all() and (arg[1] == -1).all()
    assert torch.equal(s[[0, 2]], ref[[0, 2]])


@pytest.mark.parametrize("dtype", DTYPES)
def test_packed_offsets_out_of_range_or_order_are_nan(dtype):
    q, d = values((60, 64), dtype, DEVICE), values((300, 64), dtype, DEVICE)
    q_off = i32([0, 20, 45, 60])
    good = i32([0, 50, 120, 121, 200, 300])
    ref, _ = fwd(q, d, q_off=q_off, d_off=good, max_lq=25)
    for d_off, bad_docs, moved in [
        (i32([0, 50, 120, 121, 200, 301]), [4], []),  # past the total
        (i32([0, 50, 20, 121, 200, 300]), [1], [2]),  # decreasing (document 2 moved, valid)
        (i32([-7, 50, 120, 121, 200, 300]), [0], []),  # negative
        (i32([0, 50, 120, 1 << 30, 200, 300]), [2, 3], []),
    ]:
        s, arg = fwd(q, d, q_off=q_off, d_off=d_off, max_lq=25)
        bad = torch.zeros_like(ref, dtype=torch.bool)
        bad[:, bad_docs] = True
        assert torch.isnan(s[bad]).all() and (arg[bad] == -1).all()
        same = ~bad
        same[:, moved] = False
        assert torch.equal(s[same], ref[same]) and not torch.isnan(s[:, moved]).any()
    s, _ = fwd(q, d, q_off=i32([0, 20, 45, 61]), d_off=good, max_lq=25)
    assert torch.isnan(s[2]).all() and torch.equal(s[:2], ref[:2])


@pytest.mark.parametrize("dtype", DTYPES)
def test_max_lq_below_a_packed_query_is_nan(dtype):
    q, d = values((90, 128), dtype, DEVICE), values((500, 128), dtype, DEVICE)
    q_off, d_off = i32([0, 10, 50, 75]), i32([0, 100, 250, 500])
    ref, _ = fwd(q, d, q_off=q_off, d_off=d_off, max_lq=40)
    s, arg = fwd(q, d, q_off=q_off, d_off=d_off, max_lq=30)  # query 1 has 40 rows
    assert torch.isnan(s[1]).all() and (arg[1] == -1).all()
    # another max_lq may take another tile (another order of the row sums)
    torch.testing.assert_close(s[[0, 2]], ref[[0, 2]], rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("dtype", DTYPES)
def test_pair_ids_out_of_range_are_nan(dtype):
    Q, D = values((4, 32, 128), dtype, DEVICE), values((9, 60, 128), dtype, DEVICE)
    pq, pd = i32([0, 1, 3, 2, 0]), i32([8, 0, 4, 4, 1])
    ref, ref_arg = fwd(Q, D, pair_q=pq, pair_d=pd, layout=PAIRS)
    bq, bd = pq.clone(), pd.clone()
    bq[1], bd[2], bq[4], bd[4] = -1, 9, 1 << 30, -(1 << 30)
    s, arg = fwd(Q, D, pair_q=bq, pair_d=bd, layout=PAIRS)
    bad = torch.tensor([False, True, True, False, True], device=DEVICE)
    assert_nan_where(s, bad, ref)
    assert (arg[bad] == -1).all() and torch.equal(arg[~bad], ref_arg[~bad])


def test_grouped_and_8bit_documents_with_bad_lengths_are_nan():
    Q = values((2, 32, 128), torch.float16, DEVICE)
    D = values((2 * 64, 96, 128), torch.float16, DEVICE)
    d_len = torch.randint(0, 97, (128,), device=DEVICE, dtype=torch.int32)
    bad_len = d_len.clone()
    bad_len[[5, 70]] = i32([97, -2])
    ref, _ = fwd(Q, D, d_len=d_len, layout=GROUPED, group=64, argmax=False)
    s, _ = fwd(Q, D, d_len=bad_len, layout=GROUPED, group=64, argmax=False)
    bad = torch.zeros_like(ref, dtype=torch.bool)
    bad[0, 5] = bad[1, 6] = True
    assert_nan_where(s, bad, ref)
    if device_capability() < (8, 0):  # 8-bit codes take the tensor cores only, sm_80+
        return
    codes = maxsim.quantize(D, "int8")
    for argmax in (False, True):
        args = (Q, None, codes.codes, codes.scale.float().contiguous(), None, None, None, None)
        tail = (None, None, GROUPED, 64, 32, argmax)
        ref = ops().fwd_scaled(*args, d_len, None, *tail)[0]
        s = ops().fwd_scaled(*args, bad_len, None, *tail)[0]
        torch.cuda.synchronize()
        assert_nan_where(s, bad, ref)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("packed", [False, True])
def test_backward_ignores_argmax_out_of_range(dtype, packed):
    Q, D = values((3, 20, 64), dtype, DEVICE), values((5, 40, 64), dtype, DEVICE)
    d_len = i32([40, 7, 0, 33, 12])
    s, arg = fwd(Q, D, d_len=d_len)
    grad = values(s.shape, torch.float32, DEVICE)
    q_off = d_off = None
    if packed:
        q_off, d_off = i32([0, 20, 40, 60]), i32([0, 40, 47, 47, 80, 92])
        Q, D = Q.reshape(60, 64), torch.cat([D[j, : int(n)] for j, n in enumerate(d_len)])
    garbage = arg.clone()
    hit = torch.rand(arg.shape, device=DEVICE) < 0.3
    garbage[hit] = torch.randint(-(1 << 30), 1 << 30, (int(hit.sum()),), device=DEVICE,
                                 dtype=torch.int32)
    lens = d_len[None, :, None].expand_as(arg)
    noop = (garbage < 0) | (garbage >= lens)  # entries that must add nothing
    clean = torch.where(noop, torch.full_like(garbage, -1), garbage)
    dq, dd = ops().bwd(grad, Q, D, garbage, q_off, d_off, None, None, ALLPAIRS, 0)
    dq_clean, dd_clean = ops().bwd(grad, Q, D, clean, q_off, d_off, None, None, ALLPAIRS, 0)
    torch.cuda.synchronize()
    assert torch.equal(dq, dq_clean) and torch.equal(dd, dd_clean)
    assert torch.isfinite(dq).all() and torch.isfinite(dd).all()


@pytest.mark.parametrize("dtype", DTYPES)
def test_backward_of_packed_documents_with_bad_offsets(dtype):
    """dD of packed documents (the sorted path) whose offsets are out of range or order: finite,
    the same run after run, and the rows of documents that the bad offsets leave alone equal to
    the good offsets' (a document past an out-of-order offset may get none: docs/API.md)."""
    q, d = values((3, 20, 64), dtype, DEVICE), values((300, 64), dtype, DEVICE)
    good = i32([0, 50, 120, 121, 200, 300])
    s, arg = fwd(q, d, d_off=good)
    grad = values(s.shape, torch.float32, DEVICE)
    _, ref = ops().bwd(grad, q, d, arg, None, good, None, None, ALLPAIRS, 0)
    for d_off, kept in [
        (i32([0, 50, 120, 121, 200, 301]), [0, 1, 2, 3]),  # past the total
        (i32([0, 50, 20, 121, 200, 300]), [3, 4]),  # decreasing: documents 0 and 2 overlap
        (i32([-7, 50, 120, 121, 200, 300]), [1, 2, 3, 4]),  # negative
        (i32([0, 50, 120, 1 << 30, 200, 300]), [0, 1]),
        (i32([300, 0, 0, 0, 0, 0]), []),
    ]:
        _, dd = ops().bwd(grad, q, d, arg, None, d_off, None, None, ALLPAIRS, 0)
        _, again = ops().bwd(grad, q, d, arg, None, d_off, None, None, ALLPAIRS, 0)
        torch.cuda.synchronize()
        assert torch.isfinite(dd).all() and torch.equal(dd, again)
        for j in kept:
            rows = slice(int(good[j]), int(good[j + 1]))
            assert torch.equal(dd[rows], ref[rows]), (d_off, j)


def test_backward_of_pairs_out_of_range_adds_nothing():
    Q, D = values((3, 16, 64), torch.float16, DEVICE), values((4, 30, 64), torch.float16, DEVICE)
    pq, pd = i32([0, 2, -1, 1, 5]), i32([1, 3, 0, 9, 2])
    s, arg = fwd(Q, D, pair_q=pq, pair_d=pd, layout=PAIRS)
    grad = values(s.shape, torch.float32, DEVICE)
    keep = torch.tensor([True, True, False, False, False], device=DEVICE)
    assert (arg[~keep] == -1).all()
    arg[~keep] = 3  # a token in range of every document: only the ids are out of range
    dq, dd = ops().bwd(grad, Q, D, arg, None, None, pq, pd, PAIRS, 0)
    dq_ref, dd_ref = ops().bwd(grad[keep], Q, D, arg[keep], None, None, pq[keep], pd[keep], PAIRS, 0)
    torch.cuda.synchronize()
    assert torch.equal(dq, dq_ref) and torch.equal(dd, dd_ref)


def test_ce_targets_out_of_range_give_nan_loss_and_zero_gradient():
    scores = values((6, 9), torch.float32, DEVICE)
    targets = torch.tensor([0, 8, -1, 9, 1 << 40, 3], device=DEVICE)
    loss, grad = ops().ce(scores, targets, 20.0)
    torch.cuda.synchronize()
    assert math.isnan(loss.item())
    assert (grad[[2, 3, 4]] == 0).all() and torch.isfinite(grad).all()
    ok = torch.tensor([0, 1, 5], device=DEVICE)
    _, grad_ok = ops().ce(scores[ok], targets[ok], 20.0)
    assert torch.allclose(grad[ok] * 6, grad_ok * 3)  # the mean's divisor is the row count


def test_index_tensors_of_the_wrong_size_are_errors():
    Q, D = values((2, 8, 64), torch.float16, DEVICE), values((3, 10, 64), torch.float16, DEVICE)
    with pytest.raises(RuntimeError, match="lengths must have one entry per segment"):
        fwd(Q, D, d_len=i32([10, 10]))
    s, arg = fwd(Q, D)
    with pytest.raises(RuntimeError, match="argmax must be"):
        ops().bwd(torch.ones_like(s), Q, D, arg[:1], None, None, None, None, ALLPAIRS, 0)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_int64_index_values_read_as_int32_and_saturated(dtype):
    # The op reads int64 lengths, offsets and pair ids itself: the same scores and gradients as
    # int32, and a value past the int32 range is out of range (NaN), never wrapped into it.
    wide = 1 << 32
    Q, D = values((3, 32, 128), dtype, DEVICE), values((40, 70, 128), dtype, DEVICE)
    d_len = torch.randint(1, 71, (40,), device=DEVICE, dtype=torch.int32)
    ref, ref_arg = fwd(Q, D, d_len=d_len)
    s, arg = fwd(Q, D, d_len=d_len.long())
    assert torch.equal(s, ref) and torch.equal(arg, ref_arg)
    bad_len = d_len.long()
    bad_len[[3, 17]] = torch.tensor([wide + 5, -wide + 5], device=DEVICE)  # wrap to 5 in int32
    s, _ = fwd(Q, D, d_len=bad_len)
    bad = torch.zeros_like(ref, dtype=torch.bool)
    bad[:, [3, 17]] = True
    assert_nan_where(s, bad, ref)
    q, d = values((60, 64), dtype, DEVICE), values((300, 64), dtype, DEVICE)
    q_off, d_off = i32([0, 20, 45, 60]), i32([0, 50, 120, 121, 200, 300])
    ref, _ = fwd(q, d, q_off=q_off, d_off=d_off, max_lq=25)
    s, arg = fwd(q, d, q_off=q_off.long(), d_off=d_off.long(), max_lq=25)
    assert torch.equal(s, ref)
    grad = values(tuple(s.shape), torch.float32, DEVICE)
    dq_ref, dd_ref = ops().bwd(grad, q, d, arg, q_off, d_off, None, None, ALLPAIRS, 0)
    dq, dd = ops().bwd(grad, q, d, arg, q_off.long(), d_off.long(), None, None, ALLPAIRS, 0)
    assert torch.equal(dq, dq_ref) and torch.equal(dd, dd_ref)
    pq, pd = i32([0, 1, 2, 2]), i32([8, 0, 4, 39])
    ref, arg = fwd(Q, D, pair_q=pq, pair_d=pd, layout=PAIRS)
    grad = values(tuple(ref.shape), torch.float32, DEVICE)
    dq_ref, dd_ref = ops().bwd(grad, Q, D, arg, None, None, pq, pd, PAIRS, 0)
    dq, dd = ops().bwd(grad, Q, D, arg, None, None, pq.long(), pd.long(), PAIRS, 0)
    assert torch.equal(dq, dq_ref) and torch.equal(dd, dd_ref)
    wide_pd = pd.long()
    wide_pd[1] = wide  # would wrap to document 0
    s, _ = fwd(Q, D, pair_q=pq.long(), pair_d=wide_pd, layout=PAIRS)
    assert_nan_where(s, torch.tensor([False, True, False, False], device=DEVICE), ref)


def test_context_survives_every_case_above():  # run last in this file
    x = torch.ones(4, device=DEVICE)
    assert (x + 1).sum().item() == 8
