"""Negative controls of the Metal CPU harness: broken shaders that it must catch (an
out-of-bounds read, a missing barrier, divergent barriers, a partial-simdgroup matrix load, too
much threadgroup memory), and the real forward shader with its staging barrier removed."""

import pytest
import torch
from conftest import op_args, reference_of, token_set
from maxsim import metal
from maxsim.layouts import ALLPAIRS
from metal_harness import HERE, REPO, HarnessError, HarnessLibrary, build_runner, compiler_available

pytestmark = [
    pytest.mark.metal,
    pytest.mark.skipif(not compiler_available(), reason="needs a C++20 compiler (g++)"),
]

SCHEDULES = {"mlx-lanes-descending": (0, 1), "permuted-lanes-shuffled": (1, 2)}
FWD = REPO / "metal" / "maxsim_fwd.metal"
STAGING_BARRIER = (
    "        threadgroup_barrier(mem_flags::mem_threadgroup);"
    "  // staged tiles visible to all lanes\n"
)


@pytest.fixture(scope="module", params=list(SCHEDULES))
def broken(request):
    layout, schedule = SCHEDULES[request.param]
    return HarnessLibrary(build_runner([HERE / "broken.metal"]), lane_layout=layout,
                          schedule=schedule)


def run(lib, kernel, flag=1, n=64):
    x = torch.randn(n)
    y = torch.zeros(n)
    getattr(lib, kernel)(x, y, flag, threads=32, group_size=32)
    return x, y


def test_out_of_bounds_read_is_reported(broken):
    with pytest.raises(HarnessError, match="AddressSanitizer: heap-buffer-overflow"):
        run(broken, "read_past_end_float", flag=64)


def test_missing_barrier_reads_garbage(broken):
    x, y = run(broken, "reverse_through_threadgroup_float", flag=1)
    assert torch.equal(y[:32], x[:32].flip(0))  # with its barrier the kernel is right
    x, y = run(broken, "reverse_through_threadgroup_float", flag=0)
    assert not torch.equal(y[:32], x[:32].flip(0))


@pytest.mark.parametrize(
    "kernel, message",
    [
        ("divergent_barrier_float", "exited while others wait at a barrier"),
        ("partial_simdgroup_load_float", "lanes of a simdgroup reached different collectives"),
        ("too_much_threadgroup_memory_float", "more than 32 KB"),
    ],
)
def test_rule_breaks_abort(broken, kernel, message):
    with pytest.raises(HarnessError, match=message):
        run(broken, kernel)


@pytest.mark.parametrize("lanes", list(SCHEDULES))
def test_forward_without_its_staging_barrier_fails(lanes):
    """The real forward kernel, one barrier removed: its scores go wrong under the harness."""
    text = FWD.read_text()
    assert text.count(STAGING_BARRIER) == 1
    runner = build_runner(edits={FWD: text.replace(STAGING_BARRIER, "")})
    layout, schedule = SCHEDULES[lanes]
    lib = HarnessLibrary(runner, lane_layout=layout, schedule=schedule)
    q = token_set("padded", 2, 9, 20, torch.float32, "cpu", "grid")
    d = token_set("padded", 2, 13, 20, torch.float32, "cpu", "grid")
    args = op_args(q, d, ALLPAIRS)
    scores, _ = metal.launch_fwd(lib, *args[:-1])
    ref_scores, _ = reference_of(args)
    assert not torch.equal(scores, ref_scores.float())
