"""The ``fwd`` op of every backend against the float64 reference: all layouts, token-set kinds,
dtypes, with and without argmax."""

import pytest
import torch
from conftest import (
    DTYPES,
    assert_close_rel,
    assert_exact,
    op_args,
    ops_for,
    reference_of,
    token_set,
)
from maxsim.layouts import ALLPAIRS, GROUPED, PAIRS

LAYOUTS = {"allpairs": ALLPAIRS, "grouped": GROUPED, "pairs": PAIRS}


def build_case(layout_name, q_kind, d_kind, dtype, device, data, h=24, lq=9, ld=13, nq=5, group=3):
    layout = LAYOUTS[layout_name]
    nd = nq * group if layout == GROUPED else 7
    q = token_set(q_kind, nq, lq, h, dtype, device, data)
    d = token_set(d_kind, nd, ld, h, dtype, device, data)
    pair_q = pair_d = None
    if layout == PAIRS:
        pair_q = torch.randint(0, nq, (11,), device=device)
        pair_d = torch.randint(0, nd, (11,), device=device)
    # Packed queries get a loose bound: argmax columns past a query's end must hold -1.
    max_lq = None if q_kind == "padded" else lq + 2
    return (
        q,
        d,
        dict(
            layout=layout,
            group=group if layout == GROUPED else 0,
            pair_q=pair_q,
            pair_d=pair_d,
            max_lq=max_lq,
        ),
    )


@pytest.mark.parametrize("with_argmax", [True, False], ids=["argmax", "scores"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("d_kind", ["padded", "packed"])
@pytest.mark.parametrize("q_kind", ["padded", "packed"])
@pytest.mark.parametrize("layout_name", list(LAYOUTS))
def test_fwd_matches_reference_exactly(
    backend_device, layout_name, q_kind, d_kind, dtype, with_argmax
):
    q, d, layout = build_case(layout_name, q_kind, d_kind, dtype, backend_device[1], "grid")
    args = op_args(q, d, with_argmax=with_argmax, **layout)
    scores, argmax = ops_for(backend_device).fwd(*args)
    ref_scores, ref_argmax = reference_of(args)
    assert scores.shape == ref_scores.shape
    if with_argmax:
        assert_exact(scores, argmax, ref_scores, ref_argmax)
    else:
        assert argmax.shape == (0,) and argmax.dtype == torch.int32
        assert_exact(scores, None, ref_scores, None)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("d_kind", ["padded", "packed"])
@pytest.mark.parametrize("q_kind", ["padded", "packed"])
@pytest.mark.parametrize("layout_name", list(LAYOUTS))
def test_fwd_relative_error(backend_device, layout_name, q_kind, d_kind, dtype):
    """Normal data: fp32 accumulation of the cast inputs stays within 1e-5 of float64."""
    q, d, layout = build_case(layout_name, q_kind, d_kind, dtype, backend_device[1], "normal", h=64)
    args = op_args(q, d, with_argmax=False, **layout)
    scores, _ = ops_for(backend_device).fwd(*args)
    assert scores.dtype == torch.float32
    assert_close_rel(scores, reference_of(args)[0])


@pytest.mark.parametrize("h", [24, 200], ids=["h24", "h200"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("q_kind", ["padded", "packed"])
@pytest.mark.parametrize("layout_name", list(LAYOUTS))
def test_fwd_tiles_of_every_size(backend_device, layout_name, q_kind, dtype, h):
    """Queries and documents longer than a kernel tile (several row tiles, document tiles and,
    at h 200, embedding-dim slices), packed queries with argmax columns past their ends."""
    q, d, layout = build_case(
        layout_name, q_kind, "padded", dtype, backend_device[1], "grid", h=h, lq=70, ld=100
    )
    args = op_args(q, d, **layout)
    scores, argmax = ops_for(backend_device).fwd(*args)
    assert_exact(scores, argmax, *reference_of(args))


def test_tf32_flag_still_exact_for_fp32(backend_device):
    """The fallback ignores ``tf32``; a kernel that honours it must stay close on grid data."""
    q, d, layout = build_case(
        "allpairs", "padded", "padded", torch.float32, backend_device[1], "grid"
    )
    args = list(op_args(q, d, **layout))
    args[-1] = True
    scores, argmax = ops_for(backend_device).fwd(*args)
    assert_exact(scores, argmax, *reference_of(tuple(args)))


@pytest.mark.parametrize("d_kind", ["padded", "packed"])
@pytest.mark.parametrize("q_kind", ["padded", "packed"])
@pytest.mark.parametrize("layout_name", list(LAYOUTS))
def test_fallback_chunking_changes_nothing(monkeypatch, layout_name, q_kind, d_kind):
    """A budget small enough for one pair per chunk gives the same scores, argmax and gradients."""
    q, d, layout = build_case(layout_name, q_kind, d_kind, torch.bfloat16, "cpu", "grid")
    args = op_args(q, d, **layout)
    leaves = [args[0].detach().requires_grad_(), args[1].detach().requires_grad_()]

    def run():
        for leaf in leaves:
            leaf.grad = None
        scores, argmax = torch.ops.maxsim_torch.fwd(*leaves, *args[2:])
        scores.sum().backward()
        return scores, argmax, leaves[0].grad, leaves[1].grad

    whole = run()
    monkeypatch.setenv("MAXSIM_TORCH_MEMORY_MB", "0.001")
    for got, want in zip(run(), whole, strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
