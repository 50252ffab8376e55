"""This checkout's variant, built by scripts/build_variant.py, loaded the ways users load a Hub
kernel with `kernels` 0.19: get_local_kernel, get_kernel through LOCAL_KERNELS, and a
LayerRepository that kernelize swaps into a module (the kernels_ci subset: under a minute with
the build's objects in place, `pytest -m kernels_ci`), and `kernels benchmark` on our script."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import import_or_skip

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.kernels_hub
REPO_ID = "kernels-test/maxsim"


@pytest.fixture(scope="module")
def kernels():
    return import_or_skip("kernels")


@pytest.fixture(scope="module")
def build_dir(kernels):
    """build/ (or MAXSIM_ST_VARIANT) with this checkout's variant for the running torch, built or
    refreshed by build_variant.py (ninja reuses the compiled objects there)."""
    out = Path(os.environ.get("MAXSIM_ST_VARIANT", ROOT / "build"))
    subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "build_variant.py"), "--out", str(out)],
        check=True, capture_output=True,
    )
    return out


def exercise(package):
    """The loaded package scores, and through its own extension's ops."""
    q, d = torch.randn(3, 5, 16), torch.randn(4, 7, 16)
    expected = torch.einsum("ash,bth->abst", q, d).max(-1).values.sum(-1)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        got = package.maxsim(q, d)
        layer = package.layers.MaxSim()(q, d, None, None)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(layer, expected, rtol=1e-5, atol=1e-5)
    own_op = package._ops.add_op_namespace_prefix("fwd")  # the variant's extension, not the JIT's
    ran = [e.name for e in prof.events() if e.name.endswith("::fwd")]
    assert ran and set(ran) == {own_op}, ran


@pytest.mark.kernels_ci
def test_get_local_kernel(kernels, build_dir):
    package = kernels.get_local_kernel(build_dir.parent if build_dir.name == "build" else build_dir)
    assert package.__all__ and {"maxsim", "layers"} <= set(package.__all__)
    exercise(package)


@pytest.mark.kernels_ci
def test_get_kernel_through_local_kernels(kernels, build_dir, monkeypatch):
    monkeypatch.setenv("LOCAL_KERNELS", f"{REPO_ID}={build_dir}")
    exercise(kernels.get_kernel(REPO_ID, version=2))


@pytest.mark.kernels_ci
def test_layer_repository_kernelizes_a_module(kernels, build_dir, monkeypatch):
    monkeypatch.setenv("LOCAL_KERNELS", f"{REPO_ID}={build_dir}")

    @kernels.use_kernel_forward_from_hub("MaxSimLayer")
    class Scores(torch.nn.Module):
        def forward(self, a, b, a_mask, b_mask):
            return torch.zeros(a.shape[0], b.shape[0])  # replaced by the layer's forward

    mapping = {
        "MaxSimLayer": {
            "cpu": kernels.LayerRepository(repo_id=REPO_ID, layer_name="MaxSim", version=2)
        }
    }
    model = torch.nn.Sequential(Scores())
    with kernels.use_kernel_mapping(mapping, inherit_mapping=False):
        model = kernels.kernelize(model, mode=kernels.Mode.INFERENCE, device="cpu")
    q, d = torch.randn(2, 4, 8), torch.randn(3, 6, 8)
    d_mask = torch.rand(3, 6) > 0.3
    d_mask[1] = False
    got = model[0](q, d, None, d_mask)
    assert got[:, 1].eq(-1e9).all() and got[:, 0].ne(0).all()


def test_kernels_benchmark_runs_our_script(kernels, build_dir):
    """`kernels benchmark` on benchmarks/benchmark.py: each workload runs and matches its
    reference (the runner raises on a mismatch)."""
    runner = import_or_skip("kernels._internals.cli.benchmark")
    if runner.MISSING_DEPS:
        pytest.skip(f"`kernels benchmark` needs {runner.MISSING_DEPS}")
    root = build_dir.parent if build_dir.name == "build" else build_dir
    results, _ = runner.run_benchmark_script(
        ROOT / "benchmarks" / "benchmark.py", iterations=1, warmup=0, cwd=ROOT,
        repo_id=str(root), is_local=True, revision="local",
    )
    assert {name.split(".")[1] for name in results} == {
        "rerank", "rerank_colpali", "allpairs_fp32", "st_maxsim", "train_small"
    }
    assert all(timing.verified for timing in results.values())


def test_readme_example(build_dir):
    out = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "readme_example.py"), "--build", str(build_dir)],
        capture_output=True, text=True, timeout=300,
    )
    assert out.returncode == 0, out.stderr
    error = float(out.stdout.split("max |error| ")[1].split()[0])
    assert error < 1e-4 and "empty document: -1000000000.0" in out.stdout
