"""Shared fixtures and data builders for the test suite.

Data rules: fresh random data per case (the seed comes from the test id), padding filled with
large random values (never zeros), and two kinds of values: ``grid`` values (multiples of 1/8
in [-1, 1], exact in every dtype, so every backend must match the float64 reference bit for bit,
exact ties included) and ``normal`` values (compared by relative norm).
"""

import importlib
import os
import zlib

import maxsim
import pytest
import torch
from maxsim.reference import reference_fwd

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
HAS_CUDA = torch.cuda.is_available()
HAS_CUDA_OPS = maxsim.cuda_ops()[0] is not None
HAS_CPU_OPS = maxsim.cpu_ops()[0] is not None


def pytest_configure(config):
    config.addinivalue_line("markers", "cuda: needs a CUDA GPU (skipped without one)")
    config.addinivalue_line(
        "markers", "slow: slower than a second or two; deselect with -m 'not slow'"
    )


def pytest_collection_modifyitems(config, items):
    if HAS_CUDA:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if item.get_closest_marker("cuda") is not None:
            item.add_marker(skip)


def pytest_terminal_summary(terminalreporter):
    """Say what most skips are: on a machine without a GPU, the CUDA tests."""
    skipped = terminalreporter.stats.get("skipped", [])
    cuda = sum(1 for rep in skipped if "cuda" in getattr(rep, "keywords", ()))
    if cuda and not HAS_CUDA:
        terminalreporter.write_line(f"{cuda} CUDA test{'s' * (cuda != 1)} skipped: no GPU")


@pytest.fixture(autouse=True)
def seeded_rng(request):
    """A reproducible seed per test case: fresh data for each case, the same data on a rerun."""
    torch.manual_seed(zlib.crc32(request.node.nodeid.encode()))
    yield
    if HAS_CUDA:
        torch.cuda.empty_cache()


def _backend_params():
    params = [pytest.param(("torch", "cpu"), id="torch-cpu")]
    if HAS_CPU_OPS:
        params.append(pytest.param(("cpu", "cpu"), id="cpu"))
    if HAS_CUDA:
        params.append(pytest.param(("torch", "cuda"), id="torch-cuda", marks=pytest.mark.cuda))
    if HAS_CUDA_OPS:
        params.append(pytest.param(("cuda", "cuda"), id="cuda", marks=pytest.mark.cuda))
    return params


BACKEND_PARAMS = _backend_params()

# The integration tests: devices (CUDA skipped without a GPU) and the tolerance of fp32 results.
DEVICES = [
    "cpu",
    pytest.param(
        "cuda",
        marks=[
            pytest.mark.cuda,
            pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU"),
        ],
    ),
]
TOL = dict(rtol=1e-5, atol=1e-5)


def import_or_skip(name):
    """``pytest.importorskip(name)``, except with ``MAXSIM_TEST_INTEGRATIONS=1`` (CI, and the
    ``integ`` stage of scripts/gpu_check.sh), which installs the optional libraries: there a
    library that does not import fails the test instead of skipping it."""
    if os.environ.get("MAXSIM_TEST_INTEGRATIONS") == "1":
        return importlib.import_module(name)
    return pytest.importorskip(name)


def unpatched_around_each_test(integration, scores_backend_env=None):
    """An autouse fixture for a test module of ``integration``: the switch off, a fixed seed, and
    the library unpatched before and after every test. ``scores_backend_env`` names the library's
    own backend switch, set to "torch": the unpatched reference must be its PyTorch path, not a
    peer kernel it may pick on CUDA."""

    @pytest.fixture(autouse=True)
    def clean_patch(monkeypatch):
        monkeypatch.delenv("MAXSIM_DISABLE", raising=False)
        if scores_backend_env:
            monkeypatch.setenv(scores_backend_env, "torch")
        torch.manual_seed(0)
        integration.unpatch()
        yield
        integration.unpatch()

    return clean_patch


@pytest.fixture(params=BACKEND_PARAMS)
def backend_device(request):
    """``(backend, device)`` for every backend available on this machine."""
    return request.param


def ops_for(backend_device):
    backend, device = backend_device
    return maxsim.select_ops(torch.device(device), backend)


# ---- data builders ----


def values(shape, dtype=torch.float32, device="cpu", kind="normal"):
    """Random token values: ``normal`` (N(0, 1)) or ``grid`` (k/8 with k in [-8, 8], exact in
    fp16 / bf16 / fp32)."""
    if kind == "grid":
        return (torch.randint(-8, 9, shape, device=device).float() / 8).to(dtype)
    return torch.randn(shape, device=device).to(dtype)


def fill_invalid(x, valid, how="large"):
    """Overwrite tokens where ``valid`` is False: large random values, or NaN."""
    junk = (
        torch.full_like(x, float("nan"))
        if how == "nan"
        else (torch.randn_like(x.float()) * 1e4).to(x.dtype)
    )
    return torch.where(valid[..., None], x, junk)


def random_lengths(n, width, device="cpu"):
    """Prefix lengths in [0, width], with 0 and width present whenever n allows."""
    lengths = torch.randint(0, width + 1, (n,), device=device)
    if n >= 2:
        lengths[0], lengths[1] = 0, width
    return lengths


def random_mask(shape, device="cpu", keep=0.7):
    return torch.rand(shape, device=device) < keep


def prefix(lengths, width):
    return torch.arange(width, device=lengths.device) < lengths[:, None]


def offsets_of(lengths):
    return torch.cat([lengths.new_zeros(1), lengths.cumsum(0)])


def token_set(
    kind, n, width, h, dtype, device, data="normal", lengths=True, mask=True, junk="large"
):
    """One side of an op call: ``x``, ``offsets``, ``lengths``, ``mask``, invalid tokens junked.

    ``kind`` "padded": ``x [n, width, h]``; "packed": ``x [T, h]``, segments of at most ``width``.
    """
    seg_lengths = random_lengths(n, width, device) if lengths or kind == "packed" else None
    if kind == "padded":
        x = values((n, width, h), dtype, device, data)
        valid = (
            prefix(seg_lengths, width)
            if seg_lengths is not None
            else torch.ones(n, width, dtype=torch.bool, device=device)
        )
        m = random_mask((n, width), device) if mask else None
        if m is not None:
            valid = valid & m
        side = dict(x=fill_invalid(x, valid, junk), offsets=None, lengths=seg_lengths, mask=m)
    else:
        offsets = offsets_of(seg_lengths)
        total = int(offsets[-1])
        x = values((total, h), dtype, device, data)
        m = random_mask((total,), device) if mask else None
        valid = m if m is not None else torch.ones(total, dtype=torch.bool, device=device)
        side = dict(x=fill_invalid(x, valid, junk), offsets=offsets, lengths=None, mask=m)
    return side


def op_args(q, d, layout, group=0, pair_q=None, pair_d=None, max_lq=None, with_argmax=True):
    """Positional arguments of ``fwd`` from two token sets (indices as int32, masks as bool)."""

    def i32(t):
        return None if t is None else t.to(torch.int32)

    if max_lq is None:
        max_lq = q["x"].size(1) if q["x"].dim() == 3 else longest(q["offsets"])
    return (
        q["x"],
        d["x"],
        i32(q["offsets"]),
        i32(q["lengths"]),
        q["mask"],
        i32(d["offsets"]),
        i32(d["lengths"]),
        d["mask"],
        i32(pair_q),
        i32(pair_d),
        layout,
        group,
        max_lq,
        with_argmax,
        False,
    )


def longest(offsets):
    return int((offsets[1:] - offsets[:-1]).max()) if offsets.numel() > 1 else 0


def reference_of(args):
    """float64 reference of ``fwd`` arguments (as built by :func:`op_args`)."""
    (q, d, q_off, q_len, q_mask, d_off, d_len, d_mask, pq, pd, layout, group, max_lq, _, _) = args
    return reference_fwd(
        q, d, q_off, q_len, q_mask, d_off, d_len, d_mask, pq, pd, layout, group, max_lq
    )


def rel_err(actual, expected):
    actual, expected = actual.double().cpu(), expected.double().cpu()
    return float((actual - expected).norm() / expected.norm().clamp_min(1e-30))


def assert_close_rel(actual, expected, tol=1e-5):
    err = rel_err(actual, expected)
    assert err <= tol, f"relative norm error {err:.3e} > {tol:.1e}"


def assert_exact(scores, argmax, ref_scores, ref_argmax):
    """Grid data: scores equal the float64 reference (cast to fp32) and argmax matches exactly."""
    assert scores.dtype == torch.float32
    torch.testing.assert_close(
        scores.cpu(), ref_scores.float().cpu(), rtol=0, atol=0, equal_nan=True
    )
    if argmax is not None:
        assert argmax.dtype == torch.int32
        assert torch.equal(argmax.cpu(), ref_argmax.cpu()), "argmax differs from the reference"


def capture(step, warmup=1):
    """``(graph, outputs)``: ``step`` run ``warmup`` times on a side stream (allocations and
    one-time set-up stay out of the capture), then captured in a CUDA graph. Run any eager
    reference of a backward after this, not before: see test_losses."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmup):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outputs = step()
    return graph, outputs
