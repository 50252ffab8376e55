"""maxsim.integrations.sentence_transformers gives sentence-transformers' own multi-vector scores
and gradients (sentence-transformers >= 6; older versions have no multi-vector similarity)."""

import importlib.metadata

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
