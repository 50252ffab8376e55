"""CPU scoring without argmax, on both CPU paths: the PyTorch path's block GEMMs (all pairs,
grouped padded documents, packed documents folded row by row into their document) and the
compiled kernels' fp16 / bf16 conversion, against the float64 reference. Blocks are forced small
so that documents straddle them; junk padding (NaN included), NaN and inf tokens, ties, odd
shapes and empty token sets."""

import maxsim
import pytest
import torch
from conftest import (
    DTYPES,
    HAS_CPU_OPS,
    assert_close_rel,
    assert_exact,
    op_args,
    reference_of,
    token_set,
)
from maxsim import fallback_scores
from maxsim.fallback import _Segments
from maxsim.layouts import ALLPAIRS, GROUPED

BACKENDS = ["torch"] + (["cpu"] if HAS_CPU_OPS else [])
# (layout, q kind, d kind): the PyTorch path's fast cases
CASES = [
    (ALLPAIRS, "padded", "padded"),
    (ALLPAIRS, "packed", "padded"),
    (ALLPAIRS, "padded", "packed"),
    (ALLPAIRS, "packed", "packed"),
    (GROUPED, "padded", "padded"),
    (GROUPED, "packed", "padded"),
]
CASE_IDS = [f"{['allpairs', 'grouped'][c[0]]}-{c[1]}-{c[2]}" for c in CASES]


def make_args(layout, q_kind, d_kind, dtype, data, nq=3, nd=7, lq=5, ld=17, h=13, junk="nan",
              lengths=True, mask=True):
    group = 4 if layout == GROUPED else 0
    nd = nq * group if layout == GROUPED else nd
    q = token_set(q_kind, nq, lq, h, dtype, "cpu", data, junk=junk)
    d = token_set(d_kind, nd, ld, h, dtype, "cpu", data, lengths=lengths, mask=mask, junk=junk)
    max_lq = None if q_kind == "padded" else lq + 1
    return op_args(q, d, layout=layout, group=group, max_lq=max_lq, with_argmax=False)


def fwd(backend, args):
    scores, argmax = maxsim.select_ops(torch.device("cpu"), backend).fwd(*args)
    assert argmax.numel() == 0
    return scores


@pytest.fixture
def tiny_blocks(monkeypatch):
    """Blocks of a few rows: documents straddle blocks, queries come in several blocks."""
    monkeypatch.setattr(fallback_scores, "_MIN_ROWS", 3)
    monkeypatch.setenv("MAXSIM_TORCH_MEMORY_MB", "0.001")


def test_fast_path_takes_the_cases_it_claims():
    for layout, q_kind, d_kind in CASES:
        args = make_args(layout, q_kind, d_kind, torch.float32, "grid")
        queries = _Segments(args[0], args[2], args[3], args[4], width=args[12])
        documents = _Segments(args[1], args[5], args[6], args[7])
        assert fallback_scores.supported(queries, documents, layout), (layout, q_kind, d_kind)


@pytest.mark.parametrize("blocks", ["default", "tiny"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_torch_path_exact_on_grid_data(request, case, dtype, blocks):
    if blocks == "tiny":
        request.getfixturevalue("tiny_blocks")
    args = make_args(*case, dtype, "grid")
    assert_exact(fwd("torch", args), None, reference_of(args)[0], None)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_relative_error_on_normal_data(tiny_blocks, case, dtype, backend):
    """fp32 accumulation of the (cast) inputs: within 1e-6 of float64, odd shapes."""
    args = make_args(*case, dtype, "normal", nq=2, nd=11, lq=31, ld=67, h=129, junk="large")
    assert_close_rel(fwd(backend, args), reference_of(args)[0], tol=1e-6)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", CASES[:4], ids=CASE_IDS[:4])
def test_nan_and_inf_tokens(tiny_blocks, case, dtype, backend):
    """A NaN token makes its document's scores NaN; +inf / -inf ones score as IEEE says."""
    args = list(make_args(*case, dtype, "grid", lengths=False, mask=False))
    d = args[1].clone()
    rows = d.view(-1, d.size(-1))
    rows[1, 0] = float("nan")
    rows[min(5, rows.size(0) - 1), 2] = float("inf")
    rows[-1, 3] = float("-inf")
    args[1] = d
    scores = fwd(backend, args)
    ref = reference_of(tuple(args))[0]
    torch.testing.assert_close(scores, ref.float(), rtol=0, atol=0, equal_nan=True)
    assert scores.isnan().any()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_empty_and_single_token_sets(case, backend):
    for nq, nd, lq, ld, h in [(1, 1, 1, 1, 1), (2, 3, 1, 0, 8), (0, 3, 4, 5, 8), (2, 0, 4, 5, 8)]:
        if case[0] == GROUPED and (ld == 0 or nq == 0):
            continue
        if case[2] == "padded" and ld == 0:
            continue
        args = make_args(*case, torch.float32, "grid", nq=nq, nd=nd, lq=lq, ld=ld, h=h)
        assert_exact(fwd(backend, args), None, reference_of(args)[0], None)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_documents_without_valid_tokens_add_zero(dtype, backend):
    """All lengths 0 (padded) and all rows masked (packed): every score is 0."""
    q = token_set("padded", 2, 5, 16, dtype, "cpu", "grid")
    for d_kind in ("padded", "packed"):
        d = token_set(d_kind, 4, 6, 16, dtype, "cpu", "grid")
        if d_kind == "padded":
            d["lengths"] = torch.zeros(4, dtype=torch.int64)
        else:
            d["mask"] = torch.zeros_like(d["mask"])
        args = op_args(q, d, layout=ALLPAIRS, with_argmax=False)
        scores = fwd(backend, args)
        assert_exact(scores, None, reference_of(args)[0], None)
        assert (scores == 0).all()


def test_memory_budget_is_settable_and_respected(monkeypatch):
    """The similarity blocks follow MAXSIM_TORCH_MEMORY_MB: half the budget at most."""
    monkeypatch.setenv("MAXSIM_TORCH_MEMORY_MB", "2")
    assert fallback_scores._sim_bytes() == 2**20
    monkeypatch.setenv("MAXSIM_TORCH_MEMORY_MB", "4096")
    per_thread = fallback_scores._SIM_BLOCK_BYTES
    assert fallback_scores._sim_bytes() == per_thread * torch.get_num_threads()
