"""State that lives across iterations of the forward shader, on the CPU harness: exact grid-value
cases whose documents span several 16-token tiles, whose queries take several 32-row passes, and
whose dims take the H > 128 restaging loop (and the resident-Q path below it), every dtype, padded
and packed, forward and backward. Then every reuse of threadgroup memory and every reset of
running state is planted wrong, one at a time, in a copy of the shader: each must fail a case."""

import metal_harness
import pytest
import torch
from conftest import assert_exact, op_args, reference_of, token_set, values
from maxsim import fallback, metal
from maxsim.layouts import ALLPAIRS, GROUPED
from metal_harness import HarnessLibrary, build_runner, compiler_available

pytestmark = [
    pytest.mark.metal,
    pytest.mark.skipif(not compiler_available(), reason="needs a C++20 compiler (g++)"),
]

FWD = metal_harness.REPO / "metal" / "maxsim_fwd.metal"
DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
# (H, Lq, Ld): Q resident (H <= 128) or restaged per chunk of 128 dims; 3 query passes (Lq > 64)
# or 2 (32 < Lq <= 64); 4 or 3 document tiles.
SHAPES = {"resident-q": (40, 70, 50), "restaged-q": (136, 45, 37)}


@pytest.fixture(scope="module")
def lib():
    return HarnessLibrary(build_runner(), lane_layout=1, schedule=2)


def long_case(shape, dtype, q_kind="padded", d_kind="padded", layout=ALLPAIRS, nq=2, nd=3):
    """fwd arguments; lengths and masks random, the longest query and document at full width."""
    h, lq, ld = SHAPES[shape]
    nd = nq * nd if layout == GROUPED else nd
    q = token_set(q_kind, nq, lq, h, dtype, "cpu", "grid")
    d = token_set(d_kind, nd, ld, h, dtype, "cpu", "grid")
    max_lq = None if q_kind == "padded" else lq
    return op_args(q, d, layout, nd // nq if layout == GROUPED else 0, max_lq=max_lq)


def fwd_and_bwd(lib, args):
    scores, argmax = metal.launch_fwd(lib, *args[:-1])
    grad = values(scores.shape, kind="grid")
    q, d, q_off, _, _, d_off, _, _, pq, pd, layout, group = args[:12]
    bwd_args = (grad, q, d, argmax, q_off, d_off, pq, pd, layout, group)
    return scores, argmax, metal.launch_bwd(lib, *bwd_args), fallback.bwd(*bwd_args)


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("kinds", ["padded-padded", "packed-packed"])
@pytest.mark.parametrize("shape", list(SHAPES))
def test_several_tiles_and_passes_exact(lib, shape, kinds, dtype):
    """Scores, argmax (ties included), dQ and dD bit-exact on grid values."""
    q_kind, d_kind = kinds.split("-")
    args = long_case(shape, DTYPES[dtype], q_kind, d_kind)
    assert max(SHAPES[shape][1:]) > 32
    scores, argmax, (dq, dd), (ref_dq, ref_dd) = fwd_and_bwd(lib, args)
    assert_exact(scores, argmax, *reference_of(args))
    assert torch.equal(dq, ref_dq) and torch.equal(dd, ref_dd)


def test_grouped_mixed_kinds_several_tiles_exact(lib):
    args = long_case("restaged-q", torch.float16, "packed", "padded", layout=GROUPED, nd=2)
    assert_exact(*metal.launch_fwd(lib, *args[:-1]), *reference_of(args))


def test_nan_in_a_later_tile_and_pass(lib):
    """The first NaN wins even when it sits in the third document tile and the query row is in
    the second pass; a NaN in an earlier masked token does not."""
    h, lq, ld = SHAPES["resident-q"]
    q, d = values((2, lq, h), kind="grid"), values((2, ld, h), kind="grid")
    d_mask = torch.ones(2, ld, dtype=torch.bool)
    d[0, 40, 3] = float("nan")  # tile 3, valid
    d[0, 45, 3] = float("nan")  # a later NaN
    d[1, 5, 2] = float("nan")
    d_mask[1, 5] = False  # masked
    args = (q, d, None, None, None, None, None, d_mask, None, None, ALLPAIRS, 0, lq, True, False)
    scores, argmax = metal.launch_fwd(lib, *args[:-1])
    ref_scores, ref_argmax = fallback.fwd(*args)
    torch.testing.assert_close(scores, ref_scores, rtol=0, atol=0, equal_nan=True)
    assert torch.equal(argmax, ref_argmax) and (argmax[:, 0, 33:] >= 0).all()


# ---- planted bugs: each turned on by MS_PLANT=k in one edited copy of the shader -----------------

PLANTS = {  # k: (what goes wrong, [(old text, new text)] applied in order)
    1: ("running max created once per pair, not once per query pass", [
        ("    RowMax row = {-INFINITY, -1, -1};\n",
         "    if (!MS_PLANT(1) || q0 == 0) row = RowMax{-INFINITY, -1, -1};\n"),
        ("  for (long q0 = 0; q0 < lq; q0 += kQueryRows) {\n",
         "  RowMax row = {-INFINITY, -1, -1};\n  for (long q0 = 0; q0 < lq; q0 += kQueryRows) {\n"),
    ]),
    2: ("accumulators zeroed once per pass, not once per document tile", [
        ("      simdgroup_float8x8 acc[4][2];\n", ""),
        ("    for (long j0 = 0; j0 < ld; j0 += kDocTokens) {\n",
         "    simdgroup_float8x8 acc[4][2];\n"
         "    for (long j0 = 0; j0 < ld; j0 += kDocTokens) {\n"),
        ("          acc[rt][ct] = make_filled",
         "          if (!MS_PLANT(2) || j0 == 0) acc[rt][ct] = make_filled"),
    ]),
    3: ("resident Q staged for the first pass only", [
        ("if (q_resident) stage_rows(", "if (q_resident && (!MS_PLANT(3) || q0 == 0)) stage_rows("),
    ]),
    4: ("Q restaged for the first 128 dims only", [
        ("if (!q_resident) stage_rows(q_tile",
         "if (!q_resident && (!MS_PLANT(4) || h0 == 0)) stage_rows(q_tile"),
    ]),
    5: ("a document tile staged for the first 128 dims only", [
        ("        stage_rows(d_tile,", "        if (!MS_PLANT(5) || h0 == 0) stage_rows(d_tile,"),
    ]),
    6: ("S written for the first document tile only", [
        ("if (rt < row_tiles && ct < col_tiles)\n",
         "if (rt < row_tiles && ct < col_tiles && (!MS_PLANT(6) || j0 == 0))\n"),
    ]),
    7: ("argmax counted from the tile, not the document", [
        ("int(j0 + j));", "int(MS_PLANT(7) ? j : j0 + j));"),
    ]),
    8: ("score total restarted every query pass", [
        ("    const int row_tiles =",
         "    if (MS_PLANT(8)) total = 0.0f;\n    const int row_tiles ="),
    ]),
}


def planted_text():
    text = FWD.read_text()
    for k in sorted(PLANTS):
        for old, new in PLANTS[k][1]:
            assert text.count(old) == 1, f"plant {k}: expected one {old!r}"
            text = text.replace(old, new)
    return text


@pytest.fixture(scope="module")
def planted_runner():
    return build_runner(edits={FWD: planted_text()})


def battery():
    """Small cases that reach every loop: resident and restaged Q, several passes and tiles."""
    return [long_case(shape, torch.float32, "padded", "padded", nq=2, nd=2) for shape in SHAPES]


def test_planted_copy_without_a_plant_is_exact(planted_runner, monkeypatch):
    monkeypatch.setenv("MS_PLANT", "0")
    lib = HarnessLibrary(planted_runner, lane_layout=1, schedule=2)
    for args in battery():
        assert_exact(*metal.launch_fwd(lib, *args[:-1]), *reference_of(args))


@pytest.mark.parametrize("plant", sorted(PLANTS), ids=lambda k: PLANTS[k][0])
def test_every_planted_state_bug_fails_a_case(plant, planted_runner, monkeypatch):
    monkeypatch.setenv("MS_PLANT", str(plant))
    lib = HarnessLibrary(planted_runner, lane_layout=1, schedule=2)
    wrong = 0
    for args in battery():
        scores, argmax = metal.launch_fwd(lib, *args[:-1])
        ref_scores, ref_argmax = reference_of(args)
        wrong += not (torch.equal(scores, ref_scores.float()) and torch.equal(argmax, ref_argmax))
    assert wrong, f"planted bug {plant} ({PLANTS[plant][0]}) passed every case"
