"""The Metal CPU harness itself: SIMD collectives across two simdgroups, and negative controls
that it must catch: an out-of-bounds read, a missing barrier or one that orders no memory
(mem_none), divergent barriers, a partial-simdgroup matrix load, too much threadgroup memory, and
the real forward shader with any one of its barriers removed or set to mem_none."""

import pytest
import torch
from conftest import op_args, reference_of, token_set, values
from maxsim import metal
from maxsim.layouts import ALLPAIRS
from metal_harness import HERE, REPO, HarnessError, HarnessLibrary, build_runner, compiler_available

pytestmark = [
    pytest.mark.metal,
    pytest.mark.skipif(not compiler_available(), reason="needs a C++20 compiler (g++)"),
]

SCHEDULES = {"mlx-lanes-descending": (0, 1), "permuted-lanes-shuffled": (1, 2)}
FWD = REPO / "metal" / "maxsim_fwd.metal"
# The forward shader's barriers, each named by the comment on its line. Not here: the one
# "before restaging", a write-after-read that the chunk's last collective already orders (the
# harness cannot tell it apart from a race).
FWD_BARRIERS = [
    "staged tiles visible to all lanes",
    "S complete before lanes read rows",
    "every row's value published",
]


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


def test_simd_collectives_in_two_simdgroups(broken):
    x = values((64,), kind="grid")
    y = torch.zeros(64, 4)
    broken.collectives_float(x, y, 0, threads=64, group_size=64)
    halves = x.view(2, 32)
    assert torch.equal(y[:, 0], halves.sum(1).repeat_interleave(32))
    assert torch.equal(y[:, 1], halves.amax(1).repeat_interleave(32))
    assert torch.equal(y[:, 2], halves.flip(1).reshape(64))
    assert torch.equal(y[:, 3], x.sum().expand(64))


@pytest.mark.parametrize("threads, group, message", [
    (2048, 2048, "threads per threadgroup must be 1 .. 1024"),
    (96, 64, "threads must be a multiple of group_size"),
])
def test_launch_geometry_is_checked(broken, threads, group, message):
    with pytest.raises(HarnessError, match=message):
        broken.collectives_float(torch.zeros(threads), torch.zeros(threads, 4), 0,
                                 threads=threads, group_size=group)


def test_out_of_bounds_read_is_reported(broken):
    with pytest.raises(HarnessError, match="AddressSanitizer: heap-buffer-overflow"):
        run(broken, "read_past_end_float", flag=64)


@pytest.mark.parametrize("flag", [0, 2], ids=["no-barrier", "mem_none-barrier"])
def test_missing_barrier_reads_garbage(broken, flag):
    """Without a barrier, or with one whose flags order no threadgroup memory (mem_none), the
    reads see what the schedule left there."""
    x, y = run(broken, "reverse_through_threadgroup_float", flag=1)
    assert torch.equal(y[:32], x[:32].flip(0))  # with its barrier the kernel is right
    x, y = run(broken, "reverse_through_threadgroup_float", flag=flag)
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


def with_barrier_broken(text, marker, how):
    """``text`` with the barrier on the one line that holds ``marker`` removed, or with flags
    that order no memory."""
    lines = text.splitlines(keepends=True)
    hits = [i for i, line in enumerate(lines) if marker in line]
    assert len(hits) == 1, f"expected one line with {marker!r}, found {len(hits)}"
    line = lines[hits[0]]
    assert "threadgroup_barrier(mem_flags::mem_threadgroup)" in line
    line = "" if how == "removed" else line.replace("mem_threadgroup)", "mem_none)")
    return "".join(lines[: hits[0]] + [line] + lines[hits[0] + 1:])


@pytest.mark.parametrize("how", ["removed", "mem_none"])
@pytest.mark.parametrize("barrier", FWD_BARRIERS)
def test_forward_without_any_one_barrier_fails(barrier, how):
    """The real forward shader with one of its barriers removed, or ordering no memory, gives
    wrong scores under the test matrix's schedules (every query and document token valid, so
    every row counts)."""
    runner = build_runner(edits={FWD: with_barrier_broken(FWD.read_text(), barrier, how)})
    q = token_set("padded", 2, 32, 24, torch.float32, "cpu", "grid", lengths=False, mask=False)
    d = token_set("padded", 2, 21, 24, torch.float32, "cpu", "grid", lengths=False, mask=False)
    args = op_args(q, d, ALLPAIRS)
    ref_scores, _ = reference_of(args)
    wrong = []
    for layout, schedule in SCHEDULES.values():
        lib = HarnessLibrary(runner, lane_layout=layout, schedule=schedule)
        scores, _ = metal.launch_fwd(lib, *args[:-1])
        wrong.append(not torch.equal(scores, ref_scores.float()))
    assert any(wrong), "the harness ran the shader without the barrier and saw nothing wrong"
