"""Backward on every backend: gradients equal float64 autograd through the reference, flow only to
argmax tokens, never to padding, and are bit-identical run after run."""

import maxsim
import pytest
import torch
from conftest import DTYPES, assert_close_rel, op_args, ops_for, reference_of, token_set, values
from maxsim.layouts import ALLPAIRS, GROUPED, PAIRS

LAYOUTS = {"allpairs": ALLPAIRS, "grouped": GROUPED, "pairs": PAIRS}


def grad_case(layout_name, q_kind, d_kind, dtype, device, data, junk="large", h=16):
    layout = LAYOUTS[layout_name]
    nq, group = 4, 3
    nd = nq * group if layout == GROUPED else 6
    q = token_set(q_kind, nq, 7, h, dtype, device, data, junk=junk)
    d = token_set(d_kind, nd, 9, h, dtype, device, data, junk=junk)
    extra = dict(layout=layout)
    if layout == GROUPED:
        extra["group"] = group
    if layout == PAIRS:
        extra["pair_q"] = torch.randint(0, nq, (10,), device=device)
        extra["pair_d"] = torch.randint(0, nd, (10,), device=device)
    return q, d, extra


def gradients(fn, args, upstream):
    """d(sum(upstream * scores)) / d(q, d) for ``fn`` applied to op arguments with fresh leaves."""
    q = args[0].detach().clone().requires_grad_()
    d = args[1].detach().clone().requires_grad_()
    scores = fn((q, d) + tuple(args[2:]))[0]
    (scores * upstream).sum().backward()
    return q.grad, d.grad


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("d_kind", ["padded", "packed"])
@pytest.mark.parametrize("q_kind", ["padded", "packed"])
@pytest.mark.parametrize("layout_name", list(LAYOUTS))
def test_gradients_match_float64_autograd(backend_device, layout_name, q_kind, d_kind, dtype):
    device = backend_device[1]
    ops = ops_for(backend_device)
    for data in ("grid", "normal"):
        q, d, extra = grad_case(layout_name, q_kind, d_kind, dtype, device, data)
        args = op_args(q, d, with_argmax=True, **extra)
        upstream = values(reference_of(args)[0].shape, torch.float32, device, data)
        dq, dd = gradients(lambda a: ops.fwd(*a), args, upstream)
        ref_dq, ref_dd = gradients(reference_of, args, upstream.double())
        assert dq.dtype == dtype and dd.dtype == dtype
        if (
            data == "grid"
        ):  # exact in fp32, then rounded once to the input dtype, like the reference
            torch.testing.assert_close(dq, ref_dq, rtol=0, atol=0)
            torch.testing.assert_close(dd, ref_dd, rtol=0, atol=0)
        else:
            tol = 1e-5 if dtype == torch.float32 else torch.finfo(dtype).eps
            assert_close_rel(dq, ref_dq, tol)
            assert_close_rel(dd, ref_dd, tol)


def test_padding_gets_zero_gradient_even_when_nan(backend_device):
    device = backend_device[1]
    q, d, extra = grad_case(
        "allpairs", "padded", "packed", torch.float32, device, "grid", junk="nan"
    )
    args = op_args(q, d, **extra)
    dq, dd = gradients(
        lambda a: ops_for(backend_device).fwd(*a), args, torch.ones(4, 6, device=device)
    )
    assert not dq.isnan().any() and not dd.isnan().any()
    q_valid = (torch.arange(7, device=device) < q["lengths"][:, None]) & q["mask"]
    assert torch.all(dq[~q_valid] == 0)
    assert torch.all(dd[~d["mask"]] == 0)


def test_only_winning_document_tokens_get_gradient(backend_device):
    backend, device = backend_device
    Q = values((2, 3, 8), torch.float32, device, "grid").requires_grad_()
    D = values((5, 6, 8), torch.float32, device, "grid").requires_grad_()
    scores, argmax = maxsim.maxsim_with_argmax(Q, D, backend=backend)
    scores.sum().backward()
    won = torch.zeros(5, 6, dtype=torch.bool, device=device)
    won[torch.arange(5, device=device)[None, :, None].expand_as(argmax), argmax.long()] = True
    assert torch.all(D.grad[~won] == 0)


@pytest.mark.parametrize("layout_name", list(LAYOUTS))
def test_backward_is_bit_identical_across_runs(backend_device, layout_name):
    """Many query tokens pick the same document tokens, so accumulation order would show."""
    device = backend_device[1]
    ops = ops_for(backend_device)
    q, d, extra = grad_case(layout_name, "packed", "padded", torch.float32, device, "normal", h=32)
    d["x"][:, 0] += 4.0  # a dominant first token: every query token collides on it
    args = op_args(q, d, **extra)
    upstream = torch.randn(reference_of(args)[0].shape, device=device)
    first = gradients(lambda a: ops.fwd(*a), args, upstream)
    for _ in range(4):
        again = gradients(lambda a: ops.fwd(*a), args, upstream)
        assert torch.equal(first[0], again[0]) and torch.equal(first[1], again[1])


def test_native_api_gradients_with_normalize(backend_device):
    backend, device = backend_device
    Q = values((3, 5, 16), torch.float32, device).requires_grad_()
    D = values((4, 6, 16), torch.float32, device).requires_grad_()
    q_mask = torch.rand(3, 5, device=device) > 0.3
    maxsim.maxsim(Q, D, q_mask, normalize=True, backend=backend).square().sum().backward()
    Qr, Dr = Q.detach().double().requires_grad_(), D.detach().double().requires_grad_()
    reference = maxsim.reference.maxsim_reference_padded(
        torch.nn.functional.normalize(Qr, dim=-1)[:, None],
        q_mask[:, None],
        torch.nn.functional.normalize(Dr, dim=-1)[None],
        torch.ones(1, 4, 6, dtype=torch.bool, device=device),
    )[0]
    reference.square().sum().backward()
    assert_close_rel(Q.grad, Qr.grad)
    assert_close_rel(D.grad, Dr.grad)


def test_grad_for_one_input_only(backend_device):
    backend, device = backend_device
    Q = values((2, 4, 8), torch.float16, device).requires_grad_()
    D = values((2, 3, 5, 8), torch.float16, device)
    maxsim.maxsim(Q, D, backend=backend).sum().backward()
    assert Q.grad is not None and Q.grad.dtype == torch.float16 and D.grad is None


def test_no_argmax_is_computed_without_grad(backend_device):
    backend, device = backend_device
    Q = values((2, 4, 8), torch.float32, device).requires_grad_()
    with torch.no_grad():
        _, argmax = maxsim.dispatch.forward(
            maxsim.validation.TokenSet(Q),
            maxsim.validation.TokenSet(Q),
            ALLPAIRS,
            max_lq=4,
            want_argmax=False,
            backend=backend,
        )
    assert argmax.numel() == 0


def test_backward_without_argmax_raises():
    q = torch.randn(2, 3, 8, requires_grad=True)
    scores, _ = torch.ops.maxsim_torch.fwd(
        q, q, None, None, None, None, None, None, None, None, ALLPAIRS, 0, 3, False, False
    )
    with pytest.raises(RuntimeError, match="with_argmax=True"):
        scores.sum().backward()


def test_sorted_accumulation_matches_and_is_stable():
    """The device-agnostic accumulation (used where CPU / CUDA shortcuts do not apply)."""
    from maxsim.fallback import _add_rows_sorted

    target = torch.randint(0, 6, (300,))
    target[::7] = 6  # the scratch row
    rows = values((300, 5), torch.float32, "cpu", "grid")
    rows[target == 6] = float("nan")  # whatever the scratch row gets must stay there
    expected = torch.zeros(7, 5).index_add_(0, target, rows)
    got = torch.zeros(7, 5)
    _add_rows_sorted(got, target, rows)
    torch.testing.assert_close(got[:6], expected[:6], rtol=0, atol=0)
    again = torch.zeros(7, 5)
    _add_rows_sorted(again, target, rows)
    assert torch.equal(got[:6], again[:6])


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("layout_name", list(LAYOUTS))
def test_packed_and_padded_documents_give_the_same_gradient_bits(backend_device, layout_name,
                                                                  dtype):
    """The same documents padded (the backward sees every padded row) and packed by offsets, with
    the padded forward's argmax: dQ and dD bit for bit (packed rows against the valid rows; the
    padding and the rows after the last document zero). Lengths 0 / 1 / 63 / 64 / 65, a token many
    query rows pick, NaN padding."""
    device = backend_device[1]
    ops = ops_for(backend_device)
    layout = LAYOUTS[layout_name]
    lens = torch.tensor([65, 0, 1, 63, 64, 7], dtype=torch.int32, device=device)
    nd, h, lq = len(lens), 24, 9
    valid = torch.arange(65, device=device)[None, :] < lens[:, None]
    D = values((nd, 65, h), torch.float32, device)
    D[:, 2] *= 4  # a dominant token
    D[~valid] = float("nan")
    D = D.to(dtype)
    nq, group, pq, pd = 3, 0, None, None
    if layout == GROUPED:
        nq, group = 2, 3
    if layout == PAIRS:
        pq = torch.randint(0, nq, (8,), dtype=torch.int32, device=device)
        pd = torch.randint(0, nd, (8,), dtype=torch.int32, device=device)
    Q = values((nq, lq, h), dtype, device)
    scores, argmax = ops.fwd(Q, D, None, None, None, None, lens, None, pq, pd, layout, group, lq,
                             True, False)
    grad = values(scores.shape, torch.float32, device)
    dq, dd = ops.bwd(grad, Q, D, argmax, None, None, pq, pd, layout, group)
    offsets = torch.cat([lens.new_zeros(1), lens.cumsum(0, dtype=torch.int32)])
    packed = torch.cat([D[valid], values((3, h), dtype, device)])  # 3 rows after the last
    dq_p, dd_p = ops.bwd(grad, Q, packed, argmax, None, offsets, pq, pd, layout, group)
    total = int(offsets[-1])
    assert torch.equal(dq_p, dq)
    assert torch.equal(dd_p[:total], dd[valid])
    assert not dd[~valid].any() and not dd_p[total:].any()
