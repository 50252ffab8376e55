"""The first-use gate of the Metal kernels (maxsim.metal.MetalGate), proven on the CPU: a gate for
CPU tensors whose "device library" is a fake ``torch.mps.compile_shader`` (the CPU harness running
the real shaders, a planted bug, or a library that breaks one way). Every failure lands on the
PyTorch path with exactly one warning and correct scores, through the public API and the
integrations' patched entry points; a library that passes serves the calls."""

import itertools
import warnings

import maxsim
import metal_harness
import pytest
import torch
from conftest import values
from maxsim import metal, metal_selftest
from maxsim.integrations import colpali as colpali_patch
from maxsim.integrations import pylate as pylate_patch
from metal_harness import HarnessLibrary, build_runner, compiler_available

pytestmark = [
    pytest.mark.metal,
    pytest.mark.skipif(not compiler_available(), reason="needs a C++20 compiler (g++)"),
]

FWD = metal_harness.REPO / "metal" / "maxsim_fwd.metal"
_NAMES = itertools.count()
OFF = "Metal kernels are off"


@pytest.fixture(scope="module")
def runner():
    return build_runner()


@pytest.fixture(scope="module")
def runner_without_pass_reset():
    """The forward shader with the running max created once per pair instead of once per query
    pass: right for Lq <= 32, wrong from the second pass on."""
    text = FWD.read_text()
    reset = "    RowMax row = {-INFINITY, -1, -1};\n"
    loop = "  for (long q0 = 0; q0 < lq; q0 += kQueryRows) {\n"
    assert text.count(reset) == 1 and text.count(loop) == 1
    return build_runner(edits={FWD: text.replace(reset, "").replace(loop, reset[2:] + loop)})


class MissingKernel:
    """A library without one kernel (a host name lost in compilation)."""

    def __init__(self, lib, missing):
        self._lib, self._missing = lib, missing

    def __getattr__(self, name):
        if name == self._missing:
            raise RuntimeError(f"Failed to create function state object for: {name}")
        return getattr(self._lib, name)


class FailingLaunch:
    """A library whose kernels resolve but whose launches raise (as the binding's checks do)."""

    def __getattr__(self, name):
        def launch(*args, threads, group_size):
            raise RuntimeError("A command encoder is already encoding to this command buffer")

        return launch


def fake_compile_shader(kind, runner, broken_runner):
    def compile_shader(source):
        assert "maxsim_fwd" in source  # the real shader text reaches it
        if kind == "compile-error":
            raise RuntimeError("Failed to create metal library: program_source:12:3: error: "
                               "unknown type name 'bfloat'")
        if kind == "missing-kernel":
            return MissingKernel(HarnessLibrary(runner), "maxsim_gather_rows_bfloat")
        if kind == "launch-error":
            return FailingLaunch()
        if kind == "wrong-answer":
            return HarnessLibrary(broken_runner, lane_layout=1, schedule=2)
        return HarnessLibrary(runner, lane_layout=1, schedule=2)

    return compile_shader


@pytest.fixture
def install_gate(monkeypatch):
    """Make CPU tensors go through a fresh gate whose library comes from ``compile_shader``."""

    def install(compile_shader):
        if compile_shader is None:
            monkeypatch.delattr(torch.mps, "compile_shader", raising=False)
        else:
            monkeypatch.setattr(torch.mps, "compile_shader", compile_shader, raising=False)
        gate = metal.MetalGate(device="cpu", dispatch_key="CPU",
                               namespace=f"maxsim_metal_gate{next(_NAMES)}",
                               missing=lambda: None)
        monkeypatch.setattr(metal, "GATE", gate)
        # PyLate's own tensor conversion, for inputs that are tensors already (PyLate is optional).
        monkeypatch.setattr(pylate_patch, "_convert", lambda x: x)
        return gate

    return install


def integration_entry_points():
    """The functions the integrations put in place of PyLate's and colpali-engine's, over stand-in
    originals that must not be reached for these inputs."""

    def unreachable(*args, **kwargs):
        raise AssertionError("the patch fell back to the library's own code")

    return {
        "pylate colbert_scores": pylate_patch._masked_scores(unreachable, 3),
        "pylate colbert_scores_pairwise": pylate_patch._colbert_scores_pairwise(unreachable),
        "colpali maxsim_inbatch": colpali_patch._maxsim_inbatch(unreachable),
    }


def use_everything():
    """Public calls and patched entry points on CPU tensors, each checked against the PyTorch
    reference; returns how many calls ran."""
    q, d = values((3, 37, 40), kind="grid"), values((4, 21, 40), kind="grid")
    d_lengths = torch.tensor([[21, 3, 0, 17]] * 3)
    want = maxsim.maxsim(q, d, backend="torch")
    for _ in range(2):  # the second call must not decide (or warn) again
        torch.testing.assert_close(maxsim.maxsim(q, d), want, rtol=0, atol=0)
    got = maxsim.maxsim(q, d[None].expand(3, 4, 21, 40), d_lengths=d_lengths)
    want_4d = maxsim.maxsim(q, d[None].expand(3, 4, 21, 40), d_lengths=d_lengths, backend="torch")
    torch.testing.assert_close(got, want_4d, rtol=0, atol=0)
    q_train = q.clone().requires_grad_()
    maxsim.maxsim(q_train, d).sum().backward()
    q_ref = q.clone().requires_grad_()
    maxsim.maxsim(q_ref, d, backend="torch").sum().backward()
    torch.testing.assert_close(q_train.grad, q_ref.grad, rtol=0, atol=0)
    entry = integration_entry_points()
    torch.testing.assert_close(entry["pylate colbert_scores"](q, d), want, rtol=0, atol=0)
    torch.testing.assert_close(entry["colpali maxsim_inbatch"](q, d), want, rtol=0, atol=0)
    pairs = entry["pylate colbert_scores_pairwise"](q, d[:3])
    torch.testing.assert_close(pairs, maxsim.maxsim_pairs(q, d[:3], backend="torch"))
    return 7


def metal_warnings(caught):
    return [w for w in caught if OFF in str(w.message)]


@pytest.mark.parametrize("kind, reason", [
    ("no-compile-shader", "compile_shader is missing"),
    ("compile-error", "unknown type name 'bfloat'"),
    ("missing-kernel", "kernel maxsim_gather_rows_bfloat not found"),
    ("launch-error", "command encoder is already encoding"),
    ("wrong-answer", "values differ"),
])
def test_each_failure_falls_back_with_one_warning(kind, reason, install_gate, runner,
                                                  runner_without_pass_reset):
    compile_shader = None if kind == "no-compile-shader" else fake_compile_shader(
        kind, runner, runner_without_pass_reset)
    gate = install_gate(compile_shader)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        use_everything()
        assert maxsim.select_ops(torch.device("cpu")) is maxsim.select_ops(torch.device("cpu"),
                                                                           "torch")
    said = metal_warnings(caught)
    assert len(said) == 1, [str(w.message) for w in said]
    assert reason in str(said[0].message)
    ops, why = gate.verdict()
    assert ops is None and reason in why
    with pytest.raises(RuntimeError, match="backend='metal'.*" + reason.split()[0]):
        maxsim.select_ops(torch.device("cpu"), "metal")


def test_kernels_that_pass_serve_every_call(install_gate, runner):
    """The real shaders on the harness pass the self-test; calls then launch them."""
    launches = []

    def compile_shader(source):
        lib = HarnessLibrary(runner, lane_layout=1, schedule=2)
        launches.append(lib)
        return lib

    gate = install_gate(compile_shader)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        use_everything()
    assert not metal_warnings(caught)
    ops, why = gate.verdict()
    assert ops is not None and "passed" in why
    assert maxsim.select_ops(torch.device("cpu")) is ops
    self_test = 3 * 3  # per dtype: one forward, two gathers
    assert len(launches) == 1 and len(launches[0].launches) > self_test


def test_maxsim_no_metal_skips_the_library(install_gate, monkeypatch):
    def compile_shader(source):
        raise AssertionError("MAXSIM_NO_METAL=1 must not compile anything")

    gate = install_gate(compile_shader)
    monkeypatch.setenv("MAXSIM_NO_METAL", "1")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        use_everything()
    assert not metal_warnings(caught)
    assert gate.verdict() == (None, "MAXSIM_NO_METAL is set")


def test_info_says_which_path_and_why(install_gate, runner):
    from maxsim import info

    install_gate(fake_compile_shader("compile-error", runner, None))
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        backend, why = info.mps_path()
    assert backend == "torch fallback" and "self-test at first use failed" in why
    assert "unknown type name 'bfloat'" in why


def test_self_test_case_covers_every_loop():
    """The known case reaches three query passes, three document tiles, the second chunk of
    dims, NaN and inf in valid tokens, empty segments; and no two valid tokens tie."""
    q, d, _, q_lengths, q_mask, d_offsets, _, d_mask = metal_selftest.known_case(
        torch.float32, "cpu")[:8]
    assert q.size(-1) > 128 and int(q_lengths.max()) > 64 and 0 in q_lengths.tolist()
    seg = d_offsets.diff()
    assert int(seg.max()) > 32 and 0 in seg.tolist()
    assert d[d_mask].isnan().any() and d[d_mask].isinf().any() and d[~d_mask].isnan().any()
    sims = torch.einsum("qh,dh->qd", q[0, :5].double(), d[:40].double())[:, d_mask[:40]]
    finite = sims.isfinite().all(dim=0)
    for row in sims[:, finite]:
        assert row.unique().numel() == row.numel()


def test_first_use_under_torch_compile(install_gate, runner):
    """The first call may come inside torch.compile(fullgraph=True): the gate decides eagerly at
    trace time (one warning), and the graph runs the PyTorch path without a break."""
    install_gate(fake_compile_shader("compile-error", runner, None))
    q, d = values((2, 9, 16), kind="grid"), values((3, 7, 16), kind="grid")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        compiled = torch.compile(lambda q, d: maxsim.maxsim(q, d), fullgraph=True)
        got = compiled(q, d)
    assert len(metal_warnings(caught)) == 1
    torch.testing.assert_close(got, maxsim.maxsim(q, d, backend="torch"), rtol=0, atol=0)
