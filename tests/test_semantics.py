"""The semantic contract (DESIGN.md section 4) on every backend: lengths, masks, padding, empty
segments, ties, NaN, output dtype."""

import maxsim
import pytest
import torch
from conftest import (
    DTYPES,
    assert_close_rel,
    assert_exact,
    fill_invalid,
    op_args,
    ops_for,
    prefix,
    random_mask,
    reference_of,
    token_set,
    values,
)
from maxsim.layouts import ALLPAIRS, GROUPED, PAIRS
from maxsim.reference import maxsim_reference_padded


def padded_inputs(device, dtype=torch.float32, nq=4, nd=6, lq=7, ld=11, h=16, data="grid"):
    return values((nq, lq, h), dtype, device, data), values((nd, ld, h), dtype, device, data)


def reference_scores(Q, D, q_valid, d_valid):
    return maxsim_reference_padded(Q[:, None], q_valid[:, None], D[None], d_valid[None])


def test_prefix_lengths(backend_device):
    backend, device = backend_device
    q = token_set("padded", 5, 9, 16, torch.float32, device, "grid", lengths=True, mask=False)
    d = token_set("padded", 6, 12, 16, torch.float32, device, "grid", lengths=True, mask=False)
    args = op_args(q, d, ALLPAIRS)
    assert_exact(*ops_for(backend_device).fwd(*args)[:2], *reference_of(args))


def test_masks_with_holes(backend_device):
    backend, device = backend_device
    Q, D = padded_inputs(device)
    q_mask = random_mask(Q.shape[:2], device)
    d_mask = random_mask(D.shape[:2], device, keep=0.4)
    d_mask[:, 0] = False  # holes at the start, not only at the end
    d_mask[0] = torch.arange(D.size(1), device=device) % 2 == 1
    Q, D = fill_invalid(Q, q_mask), fill_invalid(D, d_mask)
    scores, argmax = maxsim.maxsim_with_argmax(Q, D, q_mask, d_mask, backend=backend)
    ref_scores, ref_argmax = reference_scores(Q, D, q_mask, d_mask)
    assert_exact(scores, argmax, ref_scores, ref_argmax.to(torch.int32))


@pytest.mark.parametrize("mask_dtype", [torch.bool, torch.float32, torch.int64], ids=str)
def test_float_and_integer_masks_mean_nonzero(backend_device, mask_dtype):
    backend, device = backend_device
    Q, D = padded_inputs(device)
    d_mask = random_mask(D.shape[:2], device)
    expected = maxsim.maxsim(Q, D, d_mask=d_mask, backend=backend)
    got = maxsim.maxsim(Q, D, d_mask=d_mask.to(mask_dtype), backend=backend)
    torch.testing.assert_close(got, expected, rtol=0, atol=0)


@pytest.mark.parametrize("junk", ["large", "nan"])
@pytest.mark.parametrize("d_kind", ["padded", "packed"])
@pytest.mark.parametrize("q_kind", ["padded", "packed"])
def test_padding_never_read(backend_device, q_kind, d_kind, junk):
    """Scores and argmax do not change when the padding holds other values (huge, or NaN)."""
    device = backend_device[1]
    q = token_set(q_kind, 4, 8, 16, torch.float16, device, "grid")
    d = token_set(d_kind, 5, 10, 16, torch.float16, device, "grid")
    args = op_args(q, d, ALLPAIRS)
    ref = reference_of(args)
    for side in (q, d):
        valid = side_valid(side)
        side["x"] = fill_invalid(side["x"], valid, junk)
    args = op_args(q, d, ALLPAIRS)
    assert_exact(*ops_for(backend_device).fwd(*args), *ref)


def side_valid(side):
    x = side["x"]
    if x.dim() == 3:
        valid = torch.ones(x.shape[:2], dtype=torch.bool, device=x.device)
        if side["lengths"] is not None:
            valid &= prefix(side["lengths"], x.size(1))
    else:
        valid = torch.ones(x.shape[:1], dtype=torch.bool, device=x.device)
    return valid if side["mask"] is None else valid & side["mask"]


def test_empty_query_and_empty_document(backend_device):
    backend, device = backend_device
    Q, D = padded_inputs(device, nq=3, nd=3)
    q_len = torch.tensor([0, 7, 3], device=device)
    d_len = torch.tensor([11, 0, 5], device=device)
    scores, argmax = maxsim.score_candidates_padded_with_argmax(
        Q, D[None].expand(3, -1, -1, -1), q_len, d_len[None].expand(3, -1), backend=backend
    )
    assert torch.all(scores[0] == 0), "an empty query scores 0"
    assert torch.all(scores[:, 1] == 0), "an empty document contributes 0 per query token"
    assert torch.all(argmax[0] == -1) and torch.all(argmax[:, 1] == -1)
    assert torch.all(argmax[2, :, 3:] == -1), "query padding has argmax -1"
    assert torch.all(argmax[1:, [0, 2], :3] >= 0)


def test_zero_sized_inputs(backend_device):
    backend, device = backend_device
    Q, D = padded_inputs(device, nq=0, nd=3)
    assert maxsim.maxsim(Q, D, backend=backend).shape == (0, 3)
    Q, D = padded_inputs(device, nq=2, nd=0)
    assert maxsim.maxsim(Q, D, backend=backend).shape == (2, 0)
    Q, D = padded_inputs(device, nq=2, nd=3, lq=0, ld=0)
    scores, argmax = maxsim.maxsim_with_argmax(Q, D, backend=backend)
    assert torch.all(scores == 0) and argmax.shape == (2, 3, 0)
    q = torch.zeros(0, 16, device=device)
    offsets = torch.zeros(3, dtype=torch.int32, device=device)
    assert torch.all(maxsim.maxsim_varlen(q, offsets, q, offsets, backend=backend) == 0)


def test_ties_go_to_the_lowest_index(backend_device):
    backend, device = backend_device
    h = 16
    Q = values((3, 5, h), torch.float32, device, "grid")
    D = values((4, 12, h), torch.float32, device, "grid") * 0.25
    # Every document holds each query-0 token twice (and a scaled-down copy earlier), so the best
    # match is an exact tie between two positions; the lower must win.
    D[:, 7] = Q[0, 0]
    D[:, 2] = Q[0, 0]
    D[:, 9] = Q[0, 1]
    D[:, 4] = Q[0, 1]
    D[:, 1] = 0.5 * Q[0, 1]
    scores, argmax = maxsim.maxsim_with_argmax(Q, D, backend=backend)
    ref_scores, ref_argmax = reference_scores(
        Q,
        D,
        torch.ones(3, 5, dtype=torch.bool, device=device),
        torch.ones(4, 12, dtype=torch.bool, device=device),
    )
    assert_exact(scores, argmax, ref_scores, ref_argmax.to(torch.int32))
    assert torch.all(argmax[0, :, 0] == 2) and torch.all(argmax[0, :, 1] == 4)
    # All-equal similarities: index 0 (the first valid token when the first ones are masked).
    zeros_d = torch.zeros(2, 6, h, device=device)
    mask = torch.tensor([[True] * 6, [False, False, True, True, True, True]], device=device)
    _, argmax = maxsim.maxsim_with_argmax(Q, zeros_d, d_mask=mask, backend=backend)
    assert torch.all(argmax[:, 0] == 0) and torch.all(argmax[:, 1] == 2)


@pytest.mark.parametrize("where", ["query", "document"])
def test_nan_propagates(backend_device, where):
    backend, device = backend_device
    Q, D = padded_inputs(device, nq=2, nd=3)
    d_mask = torch.ones(D.shape[:2], dtype=torch.bool, device=device)
    d_mask[:, 0] = False  # the first *valid* token is 1
    if where == "query":
        Q[0, 2, 5] = float("nan")
    else:
        D[1, 6, 3] = float("nan")
        D[1, 8, 0] = float("nan")
    scores, argmax = maxsim.maxsim_with_argmax(Q, D, d_mask=d_mask, backend=backend)
    if where == "query":
        assert torch.all(scores[0].isnan()) and not scores[1].isnan().any()
        assert torch.all(argmax[0, :, 2] == 1), (
            "a NaN query token's argmax is the first valid (NaN) token"
        )
    else:
        assert torch.all(scores[:, 1].isnan()) and not scores[:, [0, 2]].isnan().any()
        assert torch.all(argmax[:, 1] == 6), "the first NaN document token is the argmax"
    ref_scores, ref_argmax = reference_scores(
        Q, D, torch.ones(2, 7, dtype=torch.bool, device=device), d_mask
    )
    assert_exact(scores, argmax, ref_scores, ref_argmax.to(torch.int32))


def test_masked_nan_query_token_is_ignored(backend_device):
    backend, device = backend_device
    Q, D = padded_inputs(device, nq=2, nd=3)
    q_mask = torch.ones(Q.shape[:2], dtype=torch.bool, device=device)
    q_mask[0, 2] = False
    Q[0, 2] = float("nan")
    scores = maxsim.maxsim(Q, D, q_mask, backend=backend)
    assert not scores.isnan().any()


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_scores_are_fp32_for_every_dtype(backend_device, dtype):
    backend, device = backend_device
    Q, D = padded_inputs(device, dtype, data="normal")
    scores = maxsim.maxsim(Q, D, backend=backend)
    assert scores.dtype == torch.float32
    assert (
        maxsim.maxsim(Q, D[:4, None].expand(4, 2, -1, -1), backend=backend).dtype == torch.float32
    )
    assert maxsim.maxsim_pairs(Q, D[:4], backend=backend).dtype == torch.float32
    full = torch.ones(Q.shape[:2], dtype=torch.bool, device=device)
    assert_close_rel(
        scores,
        reference_scores(Q, D, full, torch.ones(D.shape[:2], dtype=torch.bool, device=device))[0],
    )


@pytest.mark.parametrize("layout", [GROUPED, PAIRS], ids=["grouped", "pairs"])
def test_every_pair_layout_handles_empty_segments(backend_device, layout):
    device = backend_device[1]
    q = token_set("packed", 4, 6, 8, torch.bfloat16, device, "grid")
    d = token_set("packed", 8, 6, 8, torch.bfloat16, device, "grid")
    pairs = (
        dict(group=2)
        if layout == GROUPED
        else dict(
            pair_q=torch.tensor([0, 1, 0, 3], device=device),
            pair_d=torch.tensor([1, 0, 7, 1], device=device),
        )
    )
    args = op_args(q, d, layout, **pairs)
    assert_exact(*ops_for(backend_device).fwd(*args), *reference_of(args))
