"""maxsim.integrations.sentence_transformers gives sentence-transformers' own multi-vector scores
and gradients (sentence-transformers >= 6; older versions have no multi-vector similarity)."""

import contextlib
import importlib.metadata
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import import_or_skip

st_package = import_or_skip("sentence_transformers")

from conftest import DEVICES, TOL, unpatched_around_each_test  # noqa: E402
from maxsim.integrations import UnsupportedVersionError  # noqa: E402
from maxsim.integrations import sentence_transformers as integration  # noqa: E402

HAS_MULTI_VECTOR = int(st_package.__version__.split(".")[0]) >= 6
needs_multi_vector = pytest.mark.skipif(
    not HAS_MULTI_VECTOR, reason=f"sentence-transformers {st_package.__version__} < 6.0"
)

clean_patch = unpatched_around_each_test(integration)


@pytest.fixture
def similarity():
    return pytest.importorskip("sentence_transformers.util.similarity")


def both(fn, *tensors):
    """fn with sentence-transformers' own code and with the patch: (values, grads) for each.
    Lists of tensors are flattened into leaves and rebuilt for fn."""
    results = []
    for patched in (False, True):
        integration.patch() if patched else integration.unpatch()
        leaves = [t.detach().clone().requires_grad_() for t in tensors]
        out = fn(*leaves)
        weights = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(out)
        (out * weights).sum().backward()
        results.append((out.detach(), [leaf.grad for leaf in leaves]))
    integration.unpatch()
    return results


def assert_same(results):
    (ref, ref_grads), (got, got_grads) = results
    assert got.dtype == ref.dtype == torch.float32 and got.shape == ref.shape
    assert got.device == ref.device
    torch.testing.assert_close(got, ref, **TOL)
    for g, r in zip(got_grads, ref_grads, strict=True):
        if r is None:
            assert g is None or not g.any()
        else:
            torch.testing.assert_close(g, r, **TOL)


@needs_multi_vector
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mask_dtype", [None, torch.bool, torch.float32])
@pytest.mark.parametrize("length_normalize", [False, True])
def test_maxsim_padded(similarity, device, mask_dtype, length_normalize):
    a = torch.randn(4, 6, 16, device=device)
    b = torch.randn(5, 9, 16, device=device)
    b[1, 6:] = 0  # zero rows: padding when no mask is given
    a[2, 4:] = 0
    a_mask = b_mask = None
    if mask_dtype is not None:
        a_mask = (torch.rand(4, 6, device=device) > 0.3).to(mask_dtype)
        b_mask = (torch.rand(5, 9, device=device) > 0.3).to(mask_dtype)
        b_mask[3] = False  # a document with no valid token scores -1e9
    assert_same(
        both(
            lambda a, b: similarity.maxsim(a, b, a_mask, b_mask, length_normalize=length_normalize),
            a,
            b,
        )
    )


@needs_multi_vector
@pytest.mark.parametrize("device", DEVICES)
def test_masked_tokens_never_win_even_when_every_similarity_is_negative(similarity, device):
    a = torch.rand(2, 4, 8, device=device) + 0.1
    b = -(torch.rand(3, 5, 8, device=device) + 0.1)
    b[0, 3:] = 0  # padding rows, masked by their zeros
    assert_same(both(lambda a, b: similarity.maxsim(a, b), a, b))


@needs_multi_vector
@pytest.mark.parametrize("device", DEVICES)
def test_maxsim_lists(similarity, device):
    a = [torch.randn(n, 16, device=device) for n in (3, 7)]
    b = [torch.randn(n, 16, device=device) for n in (5, 1, 8)]
    results = both(
        lambda *t: similarity.maxsim(list(t[:2]), list(t[2:]), length_normalize=True), *a, *b
    )
    assert_same(results)
    single = both(lambda a, b: similarity.maxsim(a, b), a[0], b[0])  # 2-D: a batch of one
    assert_same(single)


@needs_multi_vector
@pytest.mark.parametrize("device", DEVICES)
def test_maxsim_pairwise(similarity, device):
    a = torch.randn(4, 6, 16, device=device)
    b = torch.randn(4, 9, 16, device=device)
    b_mask = torch.rand(4, 9, device=device) > 0.3
    b_mask[2] = False
    assert_same(both(lambda a, b: similarity.maxsim_pairwise(a, b, b_mask=b_mask), a, b))
    a_list = [torch.randn(n, 16, device=device) for n in (2, 5, 3)]
    b_list = [torch.randn(n, 16, device=device) for n in (6, 1, 4)]
    assert_same(
        both(
            lambda *t: similarity.maxsim_pairwise(list(t[:3]), list(t[3:]), length_normalize=True),
            *a_list,
            *b_list,
        )
    )


@needs_multi_vector
@pytest.mark.parametrize("device", DEVICES)
def test_multi_vector_scoring_functions(device):
    scoring = pytest.importorskip("sentence_transformers.multi_vector_encoder.scoring")
    q = torch.randn(3, 6, 16, device=device)
    d = torch.randn(3, 2, 9, 16, device=device)
    q_mask = torch.rand(3, 6, device=device) > 0.2
    d_mask = torch.rand(3, 2, 9, device=device) > 0.3
    assert_same(both(lambda q, d: scoring.colbert_scores(q, d, q_mask, d_mask), q, d))
    assert_same(both(lambda q, d: scoring.colbert_kd_scores(q, d, q_mask, d_mask), q, d))


@needs_multi_vector
def test_patch_reaches_every_import_time_copy(similarity):
    import sentence_transformers.multi_vector_encoder.scoring.colbert as scoring
    import sentence_transformers.util as util

    original = similarity.maxsim, similarity.maxsim_pairwise
    assert integration.patch() is True
    for module in (similarity, util, scoring):
        assert module.maxsim is not original[0] and module.maxsim_pairwise is not original[1]
    assert integration.unpatch() is True
    for module in (similarity, util, scoring):
        assert (module.maxsim, module.maxsim_pairwise) == original


def test_disable_switch(monkeypatch):
    monkeypatch.setenv("MAXSIM_DISABLE", "1")
    assert integration.patch() is False


def test_versions_without_multi_vector_similarity_are_a_clear_error(monkeypatch):
    real = importlib.metadata.version
    monkeypatch.setattr(
        importlib.metadata,
        "version",
        lambda name: "5.3.0" if name == "sentence-transformers" else real(name),
    )
    with pytest.raises(UnsupportedVersionError, match=r"sentence-transformers 5\.3\.0 .*from 6\.0"):
        integration.patch()


# --- sentence-transformers' hub kernel layers (6.3+): their scorer, through a KernelConfig, runs
# maxsim.layers from a variant that scripts/build_variant.py builds, loaded by `kernels`.

ROOT = Path(__file__).resolve().parents[1]
ST_VERSION = tuple(int(p) for p in st_package.__version__.split(".")[:2])
def needs_kernel_layers(test):
    """sentence-transformers 6.3+, and a hub variant loaded by `kernels` (kernels_hub)."""
    version = pytest.mark.skipif(
        ST_VERSION < (6, 3), reason=f"sentence-transformers {st_package.__version__} < 6.3"
    )
    return pytest.mark.kernels_hub(version(test))
EMPTY = -1e9


@pytest.fixture(scope="module")
def variant():
    """(path, package) of this checkout's variant for the running torch, which
    build_variant.py (re)builds under MAXSIM_ST_VARIANT or build/ (ninja keeps the compiled
    objects there, so a rebuild only lays the package out again)."""
    import_or_skip("kernels")
    script = ROOT / "scripts" / "build_variant.py"
    spec = importlib.util.spec_from_file_location("build_variant", script)
    build = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(build)
    out = Path(os.environ.get("MAXSIM_ST_VARIANT", ROOT / "build"))
    subprocess.run(
        [sys.executable, str(script), "--out", str(out)],
        check=True, capture_output=True,
    )
    path = out / build.variant_name(torch)
    return path, import_or_skip("kernels").get_local_kernel(path)


def scorers(variant_path):
    from sentence_transformers.multi_vector_encoder.scoring.colbert import _MaxSimScorer
    from transformers import KernelConfig

    config = KernelConfig(
        {"STMaxSim": f"{variant_path}:MaxSim",
         "STMaxSimPairwise": f"{variant_path}:MaxSimPairwise"},
        use_local_kernel=True,
    )
    return _MaxSimScorer(), _MaxSimScorer(config)


@contextlib.contextmanager
def counting_kernel_calls(package):
    """Counts the variant's kernel-path calls (its layers' `kernel_score`): kernelize keeps
    sentence-transformers' own forward, silently, on any mismatch, so equal scores alone prove
    nothing."""
    layers = package.layers
    original, calls = layers.kernel_score, []

    def counted(*args, **kwargs):
        calls.append(args[0].device.type)
        return original(*args, **kwargs)

    layers.kernel_score = counted
    try:
        yield calls
    finally:
        layers.kernel_score = original


def ragged_batch(device, dtype, pairwise, grid=False, weights=True):
    """Lists of ragged queries and documents (sentence-transformers pads them and derives the
    masks), one zero-length document, and explicit masks over the padded widths: a float query
    mask (weights, or 0 / 1 without ``weights``) and a fully masked document. Drawn on the CPU,
    so that every device scores the same values."""
    def values(n):
        if grid:  # halves in [-1, 1]: every similarity (quarters up to 16) is exact in bf16
            return torch.randint(-2, 3, (n, 16)) / 2
        return torch.randn(n, 16)

    a = [values(n).to(device, dtype) for n in (5, 1, 9, 3)]
    b = [values(n).to(device, dtype) for n in (7, 12, 0, 2, 31)]
    a_mask = (torch.rand(4, 9) > 0.2).float()
    if weights:  # grid weights scale a bf16 query exactly
        a_mask *= torch.tensor([0.5, 1.0, 2.0])[torch.randint(0, 3, (4, 9))] if grid else (
            torch.rand(4, 9) * 2)
    b_mask = torch.rand(5, 31) > 0.3
    b_mask[3] = False
    if pairwise:  # one document per query
        b, b_mask = b[:4], b_mask[:4, :12]
    return a, b, a_mask.to(device), b_mask.to(device)


def score_both(variant, fn, leaves):
    """fn(scorer, *leaves) with their scorer, then with ours: (scores, grads) for each."""
    path, name = variant
    results = []
    for scorer in scorers(path):
        own = [x.detach().clone().requires_grad_(x.requires_grad) for x in leaves]
        out = fn(scorer, *own)
        grads = None
        if out.requires_grad:
            (out * (out > EMPTY)).sum().backward()
            grads = [x.grad for x in own]
        results.append((out.detach(), grads))
    return results


@needs_kernel_layers
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("training", [False, True], ids=["inference", "training"])
@pytest.mark.parametrize("pairwise", [False, True], ids=["documents", "pairs"])
@pytest.mark.parametrize("masks", [False, True], ids=["derived-masks", "explicit-masks"])
def test_their_scorer_runs_our_layer_fp32(variant, device, training, pairwise, masks):
    a, b, a_mask, b_mask = ragged_batch(device, torch.float32, pairwise)
    kwargs = {"a_mask": a_mask, "b_mask": b_mask} if masks else {}

    def run(scorer, *x):
        call = scorer.pairwise if pairwise else scorer
        return call(list(x[: len(a)]), list(x[len(a):]), chunk_elements=4000, **kwargs)

    leaves = [x.requires_grad_(training) for x in a + b]
    with torch.set_grad_enabled(training), counting_kernel_calls(variant[1]) as calls:
        (theirs, their_grads), (ours, our_grads) = score_both(variant, run, leaves)
    assert calls and set(calls) == {torch.device(device).type}, "their own forward ran"
    assert ours.dtype == theirs.dtype == torch.float32 and ours.shape == theirs.shape
    assert (ours == EMPTY).equal(theirs == EMPTY) and (theirs == EMPTY).any()
    real = theirs > EMPTY
    print(f"fp32 max |ours - theirs| {(ours - theirs)[real].abs().max().item():.2e}"
          f" of max |score| {theirs[real].abs().max().item():.2f}", end="")
    rtol = 1e-5 if ours.is_cuda else 2e-6  # CUDA's fp32 path: exact to about 1e-6 per similarity
    torch.testing.assert_close(ours, theirs, rtol=rtol, atol=2e-5)
    if training:
        for got, ref in zip(our_grads, their_grads):
            torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-6)
        worst = max((g - r).abs().max().item() for g, r in zip(our_grads, their_grads) if g.numel())
        print(f", gradients max |ours - theirs| {worst:.2e}", end="")
    print()


@needs_kernel_layers
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("pairwise", [False, True], ids=["documents", "pairs"])
@pytest.mark.parametrize("grid", [True, False], ids=["grid", "random"])
def test_their_scorer_runs_our_layer_bf16(variant, device, pairwise, grid):
    """bf16 on grid values (every similarity exact in bf16): equal to fp32 rounding, gradients
    too. On random values (0 / 1 query weights: a weight other than a power of two rounds the
    weighted bf16 query) their einsum rounds each similarity to bf16 before the max and ours
    does not: ours is closer to the float64 scores, and within that rounding of theirs."""
    a, b, a_mask, b_mask = ragged_batch(device, torch.bfloat16, pairwise, grid=grid, weights=grid)

    def run(scorer, *x):
        call = scorer.pairwise if pairwise else scorer
        return call(list(x[: len(a)]), list(x[len(a):]), a_mask=a_mask, b_mask=b_mask)

    leaves = [x.requires_grad_(grid) for x in a + b]
    with torch.set_grad_enabled(grid), counting_kernel_calls(variant[1]) as calls:
        (theirs, their_grads), (ours, our_grads) = score_both(variant, run, leaves)
    assert calls, "their own forward ran"
    assert ours.dtype == torch.float32 and (ours == EMPTY).equal(theirs == EMPTY)
    if grid:
        torch.testing.assert_close(ours, theirs, rtol=2e-6, atol=1e-5)
        for got, ref in zip(our_grads, their_grads):
            torch.testing.assert_close(got, ref, rtol=0, atol=0)
        return
    exact = scorers(variant[0])[0]
    call = exact.pairwise if pairwise else exact
    ref = call([x.double() for x in a], [x.double() for x in b], a_mask=a_mask.double(),
               b_mask=b_mask).double()
    real = ref > EMPTY
    our_err = (ours.double() - ref)[real].abs().max().item()
    their_err = (theirs.double() - ref)[real].abs().max().item()
    # their rounding: half a bf16 ulp (2^-9 relative) of each of at most 9 weighted maxima
    largest = torch.cat([x.double().norm(dim=-1) for x in a + b]).max().item() ** 2
    bound = 9 * 2.0**-9 * largest
    print(f"bf16 random: |ours - fp64| {our_err:.3e}, |theirs - fp64| {their_err:.3e}")
    assert our_err <= their_err
    assert (ours.double() - theirs.double())[real].abs().max().item() <= bound
