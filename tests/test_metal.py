"""metal/*.metal run on the CPU harness (tests/metal_harness), launched by maxsim.metal's own
launch plan, against the float64 reference: every layout, padded and packed token sets, fp32 /
fp16 / bf16, masks with holes, ties, NaN, empty segments, H / Lq / Ld tails. Every test runs under
two simdgroup_matrix lane layouts and two thread schedules."""

import metal_harness
import pytest
import torch
from conftest import (
    assert_close_rel,
    assert_exact,
    op_args,
    reference_of,
    token_set,
    values,
)
from maxsim import fallback, metal
from maxsim.layouts import ALLPAIRS, GROUPED, PAIRS
from metal_harness import HarnessLibrary, build_runner, compiler_available

pytestmark = [
    pytest.mark.metal,
    pytest.mark.skipif(not compiler_available(), reason="needs a C++20 compiler (g++)"),
]

LAYOUTS = {"allpairs": ALLPAIRS, "grouped": GROUPED, "pairs": PAIRS}
DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
# (lane layout, schedule): MLX's lanes with threads in descending order; permuted lanes with
# threads shuffled every phase.
LANES = {"mlx-lanes": (0, 1), "permuted-lanes": (1, 2)}


@pytest.fixture(scope="session")
def runner():
    return build_runner()


@pytest.fixture(params=list(LANES))
def lib(request, runner):
    layout, schedule = LANES[request.param]
    return HarnessLibrary(runner, lane_layout=layout, schedule=schedule)


def case(layout_name, q_kind, d_kind, dtype, data, h=20, lq=9, ld=13, nq=3, nd=4, group=2,
         **kinds):
    """fwd arguments of a random case (junk in every invalid token)."""
    layout = LAYOUTS[layout_name]
    nd = nq * group if layout == GROUPED else nd
    q = token_set(q_kind, nq, lq, h, dtype, "cpu", data, **kinds)
    d = token_set(d_kind, nd, ld, h, dtype, "cpu", data, **kinds)
    pair_q = pair_d = None
    if layout == PAIRS:
        pair_q, pair_d = torch.randint(0, nq, (7,)), torch.randint(0, nd, (7,))
    max_lq = None if q_kind == "padded" else lq + 2  # packed: argmax columns past the end too
    return op_args(q, d, layout, group if layout == GROUPED else 0, pair_q, pair_d, max_lq)


def metal_fwd(lib, args):
    return metal.launch_fwd(lib, *args[:-1])


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("kinds", ["padded-padded", "padded-packed", "packed-padded",
                                   "packed-packed"])
@pytest.mark.parametrize("layout_name", list(LAYOUTS))
def test_fwd_exact_on_grid_values(lib, layout_name, kinds, dtype):
    """Values k/8: every dtype is exact, so scores equal float64 and argmax (ties included)."""
    q_kind, d_kind = kinds.split("-")
    args = case(layout_name, q_kind, d_kind, DTYPES[dtype], "grid")
    scores, argmax = metal_fwd(lib, args)
    assert_exact(scores, argmax, *reference_of(args))


@pytest.mark.parametrize(
    "h, lq, ld",
    [(1, 1, 1), (7, 8, 9), (8, 33, 16), (17, 31, 17), (128, 32, 15), (127, 2, 31),
     (129, 5, 3), (200, 9, 19)],
    ids=lambda v: str(v),
)
def test_fwd_fp32_within_1e6_of_float64(lib, h, lq, ld):
    """Normal values: H, Lq, Ld at tile - 1, tile, tile + 1 and past the staged 128 dims."""
    args = case("allpairs", "padded", "packed", torch.float32, "normal", h=h, lq=lq, ld=ld,
                nq=2, nd=3)
    scores, argmax = metal_fwd(lib, args)
    ref_scores, ref_argmax = reference_of(args)
    assert_close_rel(scores, ref_scores, tol=1e-6)
    assert torch.equal(argmax, ref_argmax)


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_fwd_ties_take_the_lowest_index(lib, dtype):
    """Every document token equal: each query token's argmax is its first valid one."""
    q = values((2, 5, 12), DTYPES[dtype], kind="grid")
    d = values((3, 1, 12), DTYPES[dtype], kind="grid").expand(3, 10, 12).contiguous()
    d_mask = torch.rand(3, 10) < 0.6
    args = (q, d, None, None, None, None, None, d_mask, None, None, ALLPAIRS, 0, 5, True, False)
    scores, argmax = metal_fwd(lib, args)
    assert_exact(scores, argmax, *reference_of(args))


def test_fwd_nan_wins_and_padding_never_does(lib):
    """A NaN in a valid document token makes the score NaN with the first NaN as argmax; NaN
    and inf in masked tokens change nothing; all -inf similarities pick the first valid token, all
    NaN ones the first valid token too."""
    q = values((2, 4, 9), kind="grid")
    d = values((4, 7, 9), kind="grid")
    d_mask = torch.ones(4, 7, dtype=torch.bool)
    d[0, 3, 2] = float("nan")  # valid: wins
    d[0, 5, 1] = float("nan")  # a later NaN: not the argmax
    d[1, 2] = float("nan")
    d_mask[1, 2] = False  # masked NaN: ignored
    d[2, 4] = float("inf")
    d_mask[2, 4] = False  # masked inf: ignored
    q[1, 0] = 0.0
    q[1, 0, 0] = float("inf")  # products -inf or NaN with every token
    q[0, 1] = float("nan")  # a valid token whose every similarity is NaN
    args = (q, d, None, None, None, None, None, d_mask, None, None, ALLPAIRS, 0, 4, True, False)
    scores, argmax = metal_fwd(lib, args)
    ref_scores, ref_argmax = fallback.fwd(*args)
    torch.testing.assert_close(scores, ref_scores, rtol=0, atol=0, equal_nan=True)
    assert torch.equal(argmax, ref_argmax)
    assert scores[:, 0].isnan().all() and argmax[0, 0, 0] == 3


def test_fwd_packed_queries_longer_than_max_lq(lib):
    """A packed query longer than max_lq scores NaN (never truncated), as on every backend."""
    q = token_set("packed", 4, 11, 16, torch.float16, "cpu", "grid")
    d = token_set("padded", 3, 9, 16, torch.float16, "cpu", "grid")
    args = op_args(q, d, ALLPAIRS, max_lq=4)
    scores, argmax = metal_fwd(lib, args)
    ref_scores, ref_argmax = fallback.fwd(*args)
    torch.testing.assert_close(scores, ref_scores, rtol=0, atol=0, equal_nan=True)
    assert torch.equal(argmax, ref_argmax)
    assert scores.isnan().any(dim=1).sum() > 0 and (argmax[scores.isnan()] == -1).all()


@pytest.mark.parametrize(
    "shape", ["no-queries", "no-documents", "empty-tokens", "no-pairs", "no-dims"]
)
def test_fwd_empty(lib, shape):
    nq, nd, lq, ld, h = {"no-queries": (0, 3, 4, 5, 8), "no-documents": (2, 0, 4, 5, 8),
                         "empty-tokens": (2, 3, 0, 0, 8), "no-pairs": (2, 3, 4, 5, 8),
                         "no-dims": (2, 3, 4, 5, 0)}[shape]
    q, d = values((nq, lq, h)), values((nd, ld, h))
    layout, pq = (PAIRS, torch.zeros(0, dtype=torch.int32)) if shape == "no-pairs" else (
        ALLPAIRS, None)
    args = (q, d, None, None, None, None, None, None, pq, pq, layout, 0, lq, True, False)
    scores, argmax = metal_fwd(lib, args)
    ref_scores, ref_argmax = fallback.fwd(*args)
    assert torch.equal(scores, ref_scores) and torch.equal(argmax, ref_argmax)


def test_fwd_pair_ids_out_of_range_score_nan(lib):
    """No id can make the kernel read outside its inputs: a bad pair scores NaN, argmax -1."""
    q, d = values((2, 3, 8)), values((3, 4, 8))
    pair_q = torch.tensor([0, 2, -1, 1], dtype=torch.int32)
    pair_d = torch.tensor([1, 0, 0, 3], dtype=torch.int32)
    args = (q, d, None, None, None, None, None, None, pair_q, pair_d, PAIRS, 0, 3, True, False)
    scores, argmax = metal_fwd(lib, args)
    assert not scores[0].isnan() and scores[1:].isnan().all()
    assert (argmax[1:] == -1).all()


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("layout_name", list(LAYOUTS))
def test_bwd_matches_reference_and_is_bit_stable(lib, layout_name, dtype):
    """dQ and dD against the fp32 fallback (itself exact on grid values), twice, bit for bit."""
    args = case(layout_name, "packed", "padded", DTYPES[dtype], "grid")
    q, d, q_off, _, _, d_off, _, _, pq, pd, layout, group = args[:12]
    scores, argmax = metal_fwd(lib, args)
    grad = values(scores.shape, kind="grid")
    bwd_args = (grad, q, d, argmax, q_off, d_off, pq, pd, layout, group)
    dq, dd = metal.launch_bwd(lib, *bwd_args)
    ref_dq, ref_dd = fallback.bwd(*bwd_args)
    torch.testing.assert_close(dq, ref_dq, rtol=0, atol=0)
    torch.testing.assert_close(dd, ref_dd, rtol=0, atol=0)
    again = metal.launch_bwd(lib, *bwd_args)
    assert torch.equal(again[0], dq) and torch.equal(again[1], dd)


def test_bwd_fp32_normal_values_within_1e6(lib):
    args = case("allpairs", "padded", "padded", torch.float32, "normal", h=33, lq=6, ld=9)
    q, d = args[0], args[1]
    scores, argmax = metal_fwd(lib, args)
    grad = torch.randn(scores.shape)
    dq, dd = metal.launch_bwd(lib, grad, q, d, argmax, None, None, None, None, ALLPAIRS, 0)
    ref = fallback.bwd(grad.double(), q.double(), d.double(), argmax, None, None, None, None,
                       ALLPAIRS, 0)
    assert_close_rel(dq, ref[0], tol=1e-6)
    assert_close_rel(dd, ref[1], tol=1e-6)


@pytest.mark.parametrize("layout_name", ["allpairs", "grouped"])
def test_contrastive_step_matches_fallback(lib, layout_name):
    args = case(layout_name, "padded", "packed", torch.float32, "grid")
    q, d, q_off, q_len, q_mask, d_off, d_len, d_mask, _, _, layout, group, max_lq = args[:13]
    nq = q.size(0)
    targets = None if layout == ALLPAIRS else torch.randint(0, group, (nq,))  # grouped: any column
    step = (q, d, q_off, q_len, q_mask, d_off, d_len, d_mask, layout, group, max_lq, targets, 20.0)
    loss, dq, dd = metal.launch_contrastive_step(lib, *step)
    ref_loss, ref_dq, ref_dd = fallback.contrastive_step(*step)
    torch.testing.assert_close(loss, ref_loss, rtol=1e-6, atol=0)
    torch.testing.assert_close(dq, ref_dq, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(dd, ref_dd, rtol=1e-6, atol=1e-7)


def test_launch_grids_are_whole_simdgroups(lib):
    """What a Mac's compile_shader receives: group sizes of whole simdgroups, <= 1024 threads,
    grids a multiple of the group, one kernel name per dtype."""
    args = case("pairs", "packed", "packed", torch.float16, "grid")
    scores, argmax = metal_fwd(lib, args)
    metal.launch_bwd(lib, torch.ones_like(scores), args[0], args[1], argmax, args[2], args[5],
                     args[8], args[9], PAIRS, 0)
    names = [name for name, _, _ in lib.launches]
    assert names == ["maxsim_fwd_half", "maxsim_gather_rows_half", "maxsim_gather_rows_half"]
    for _, threads, group in lib.launches:
        size = group[0] * group[1] * group[2]
        assert size % 32 == 0 and size <= 1024
        assert all(t % g == 0 for t, g in zip(threads, group))


@pytest.fixture(scope="module")
def harness_ops(runner):
    """The op set as maxsim.metal.define_ops registers it for MPS, here for CPU tensors on the
    harness (permuted lanes, shuffled threads)."""
    lib = HarnessLibrary(runner, lane_layout=1, schedule=2)
    # Kept for the whole process: the fake kernels and autograd registered with the ops outlive
    # a deleted Library, and torch.compile's later imports trip over the orphans.
    _LIBRARIES.append(metal.define_ops("maxsim_metal_harness", lambda: lib, "CPU"))
    return torch.ops.maxsim_metal_harness


_LIBRARIES = []


def test_registered_ops_run_autograd_through_the_kernels(harness_ops):
    """Autograd of the registered fwd reaches the registered bwd, whose gradients match the
    fallback's; the contrastive step runs."""
    args = list(case("grouped", "padded", "padded", torch.float32, "grid"))
    q, d = args[0].requires_grad_(), args[1].requires_grad_()
    scores, _ = harness_ops.fwd(*args)
    (scores * 0.25).sum().backward()
    ref_q, ref_d = q.detach(), d.detach()
    ref_scores, ref_argmax = fallback.fwd(ref_q, ref_d, *args[2:])
    ref = fallback.bwd(torch.full_like(ref_scores, 0.25), ref_q, ref_d, ref_argmax, None, None,
                       None, None, args[10], args[11])
    assert torch.equal(scores.detach(), ref_scores)
    assert torch.equal(q.grad, ref[0]) and torch.equal(d.grad, ref[1])
    targets = torch.zeros(q.size(0), dtype=torch.int64)
    step = harness_ops.contrastive_step(*args[:8], args[10], args[11], args[12], targets, 10.0)
    loss, dq, dd = step
    assert torch.isfinite(loss) and dq.shape == q.shape and dd.shape == d.shape


def test_registered_ops_pass_opcheck(harness_ops):
    """Schemas, fake kernels and autograd registration as torch.compile needs them."""
    args = case("pairs", "packed", "padded", torch.float32, "grid", nq=2, nd=3)
    torch.library.opcheck(harness_ops.fwd.default, args)
    scores, argmax = harness_ops.fwd(*args)
    bwd_args = (torch.ones_like(scores), args[0], args[1], argmax, args[2], args[5], args[8],
                args[9], PAIRS, 0)
    torch.library.opcheck(harness_ops.bwd.default, bwd_args)


def test_metal_backend_needs_mps():
    """Off Apple Silicon the Metal namespace is not loaded, and asking for it says why."""
    import maxsim

    if torch.backends.mps.is_available():
        pytest.skip("MPS present: tests/test_mps.py covers it")
    with pytest.raises(RuntimeError, match="backend='metal'.*mps"):
        maxsim.select_ops(torch.device("cpu"), "metal")
    # CPU tensors run the compiled CPU kernels where they load, else the PyTorch ops (docs/CPU.md).
    cpu = torch.device("cpu")
    assert maxsim.select_ops(cpu, "auto") is (maxsim.cpu_ops()[0] or maxsim.select_ops(cpu, "torch"))


def test_compile_shader_text_is_one_self_contained_unit():
    """The text torch.mps.compile_shader gets (header inlined, no include path) builds and runs
    as one translation unit."""
    text = metal.shader_source()
    assert '#include "maxsim_common.h"' not in text
    for kernel in ("maxsim_fwd_float", "maxsim_fwd_half", "maxsim_fwd_bfloat",
                   "maxsim_gather_rows_float", "maxsim_gather_rows_half",
                   "maxsim_gather_rows_bfloat"):
        assert f"MS_KERNEL_INSTANCE({kernel}," in text
    whole = metal_harness.REPO / "metal" / "compile_shader_source.metal"
    lib = HarnessLibrary(build_runner([whole], edits={whole: text}), lane_layout=1, schedule=2)
    args = case("pairs", "packed", "packed", torch.bfloat16, "grid")
    assert_exact(*metal_fwd(lib, args), *reference_of(args))


def test_hub_binding_convention_runs_the_same_plan(runner):
    """The Hub build's launch op gets Python ints and floats as one-element CPU tensors (the
    binding passes those by value): a stand-in op that binds them the same way runs the plan."""
    lib = HarnessLibrary(runner, lane_layout=1, schedule=2)

    def launch(kernel, tensors, threads, group_size):
        assert isinstance(threads, list) and isinstance(group_size, list)
        args = [t.item() if t.device.type == "cpu" and t.dim() == 1 and t.numel() == 1
                and t.dtype in (torch.int64, torch.float32) else t for t in tensors]
        getattr(lib, kernel)(*args, threads=threads, group_size=group_size)

    args = case("allpairs", "packed", "padded", torch.float16, "grid")
    assert_exact(*metal_fwd(metal._ExtensionLibrary(launch), args), *reference_of(args))
