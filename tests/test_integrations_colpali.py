"""maxsim.integrations.colpali gives colpali-engine's own scores, losses and gradients."""

import importlib.metadata
import warnings

import pytest
import torch
from conftest import import_or_skip

import_or_skip("colpali_engine")

import maxsim  # noqa: E402
from colpali_engine import loss as colpali_losses  # noqa: E402
from colpali_engine.utils.processing_utils import BaseVisualRetrieverProcessor  # noqa: E402
from conftest import DEVICES, TOL, unpatched_around_each_test  # noqa: E402
from maxsim.integrations import UnsupportedVersionError  # noqa: E402
from maxsim.integrations import colpali as integration  # noqa: E402

clean_patch = unpatched_around_each_test(integration, "COLPALI_SCORES_BACKEND")



@pytest.fixture
def maxsim_calls(monkeypatch):
    calls = []
    function = maxsim.maxsim

    def spy(*args, **kwargs):
        calls.append("maxsim")
        return function(*args, **kwargs)

    monkeypatch.setattr(maxsim, "maxsim", spy)
    return calls


def embeddings(batch, length, dim=16, device="cpu", pad_left=False, sign=None, padding=True):
    """L2-normalised token embeddings with zero padding rows, as colpali-engine's collator and its
    cross-rank gather produce them (`pad_left`: padding first). Entries are positive before the
    sign: `sign=1` rows against `sign=-1` rows give only negative similarities."""
    x = torch.nn.functional.normalize(torch.rand(batch, length, dim, device=device) + 0.05, dim=-1)
    if sign is None:
        sign = torch.where(torch.rand(batch, length, 1, device=device) < 0.5, 1.0, -1.0)
    x = x * sign
    for b in range(batch if padding else 0):
        n_pad = int(torch.randint(0, length // 2 + 1, (1,)))
        rows = slice(0, n_pad) if pad_left else slice(length - n_pad, length)
        x[b, rows] = 0
    return x


def both(fn, *padded):
    """fn on colpali-engine's own code and on the patch: (values, grads) for each. The embeddings
    reach fn the way colpali-engine's models emit them, multiplied by the attention mask, so the
    gradients are those a model's parameters would see (see docs/INTEGRATIONS.md on ties)."""
    masks = [x.ne(0).any(-1, keepdim=True) for x in padded]
    raw = [torch.where(m, x, torch.randn_like(x)) for x, m in zip(padded, masks, strict=True)]
    results = []
    for patched in (False, True):
        integration.patch() if patched else integration.unpatch()
        leaves = [x.detach().clone().requires_grad_() for x in raw]
        out = fn(*[leaf * m for leaf, m in zip(leaves, masks, strict=True)])
        weights = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(out)
        (out * weights).sum().backward()
        results.append((out.detach(), [leaf.grad for leaf in leaves]))
    integration.unpatch()
    return results


def assert_same(results):
    (ref, ref_grads), (got, got_grads) = results
    assert got.dtype == ref.dtype and got.shape == ref.shape
    torch.testing.assert_close(got, ref, **TOL)
    for g, r in zip(got_grads, ref_grads, strict=True):
        torch.testing.assert_close(g, r, **TOL)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("pad_left", [False, True])
def test_inbatch_scores_with_zero_padding(device, pad_left):
    import colpali_engine.utils.maxsim as scoring

    q = embeddings(4, 6, device=device)
    d = embeddings(5, 9, device=device, pad_left=pad_left)
    assert_same(both(lambda q, d: scoring.maxsim_inbatch(q, d), q, d))


@pytest.mark.parametrize("device", DEVICES)
def test_zero_padding_wins_when_every_similarity_is_negative(device):
    import colpali_engine.utils.maxsim as scoring

    q = embeddings(3, 5, device=device, sign=1)
    d = embeddings(3, 7, device=device, sign=-1)
    d[0, :2] = 0  # left padding: its 0 wins, so the document scores 0
    d[1] = -torch.nn.functional.normalize(torch.rand(7, 16, device=device) + 0.05, dim=-1)
    results = both(lambda q, d: scoring.maxsim_inbatch(q, d), q, d)
    assert_same(results)
    got = results[1][0]
    assert torch.all(got[:, 0] == 0) and torch.all(got[:, 1] < 0)


def test_score_multi_vector(maxsim_calls):
    # Lists of different lengths are zero-padded per batch by colpali-engine itself; query 0 and
    # passage 1 have only negative similarities, so that padding decides their score.
    qs = [embeddings(1, n, sign=1 if n == 3 else None, padding=False)[0] for n in (3, 7, 5)]
    ps = [embeddings(1, n, sign=-1 if n == 4 else None, padding=False)[0] for n in (11, 4, 9, 2)]
    for q_in, p_in in ((qs, ps), (torch.nn.utils.rnn.pad_sequence(qs, batch_first=True), ps)):
        ref = BaseVisualRetrieverProcessor.score_multi_vector(
            q_in, p_in, batch_size=2, device="cpu"
        )
        integration.patch()
        got = BaseVisualRetrieverProcessor.score_multi_vector(
            q_in, p_in, batch_size=2, device="cpu"
        )
        integration.unpatch()
        assert got.dtype == torch.float32 and got.device.type == "cpu"
        torch.testing.assert_close(got, ref, **TOL)
    assert maxsim_calls


IN_BATCH = ["ColbertLoss", "ColbertPairwiseCELoss", "ColbertSigmoidLoss"]
WITH_NEGATIVES = ["ColbertNegativeCELoss", "ColbertPairwiseNegativeCELoss"]
OPTIONS = [
    dict(),
    dict(normalize_scores=False, temperature=0.5),
    dict(pos_aware_negative_filtering=True),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", IN_BATCH)
@pytest.mark.parametrize("options", OPTIONS, ids=["default", "raw", "filtering"])
@pytest.mark.parametrize("offset", [0, 3])
def test_in_batch_losses(device, name, options, offset, maxsim_calls):
    if name == "ColbertSigmoidLoss" and offset:
        pytest.skip("ColbertSigmoidLoss indexes a [B*B] mask with the offset: square batches only")
    loss = getattr(colpali_losses, name)(**options)
    q = embeddings(3, 6, device=device)
    d = embeddings(3 + offset, 9, device=device, pad_left=True)  # documents gathered from ranks
    assert_same(both(lambda q, d: loss(q, d, offset=offset).reshape(1), q, d))
    assert maxsim_calls


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", WITH_NEGATIVES)
@pytest.mark.parametrize(
    "options",
    OPTIONS + [dict(in_batch_term_weight=0.0)],
    ids=["default", "raw", "filtering", "no_in_batch"],
)
def test_losses_with_negatives(device, name, options, maxsim_calls):
    loss = getattr(colpali_losses, name)(**options)
    q = embeddings(4, 6, device=device)
    d = embeddings(4, 9, device=device)
    neg = embeddings(4 * 3, 8, device=device).reshape(4, 3, 8, 16)
    assert_same(both(lambda q, d, n: loss(q, d, n).reshape(1), q, d, neg))
    assert maxsim_calls


def test_smooth_max_keeps_colpali_path_and_warns_once(maxsim_calls):
    loss = colpali_losses.ColbertLoss(use_smooth_max=True)
    q, d = embeddings(3, 6), embeddings(3, 9)
    ref = loss(q, d)
    integration.patch()
    with pytest.warns(RuntimeWarning, match="use_smooth_max"):
        got = loss(q, d)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loss(q, d)
    torch.testing.assert_close(got, ref)
    assert maxsim_calls == []


def test_patch_reaches_every_import_time_copy():
    import colpali_engine.loss.late_interaction_losses as losses_module
    import colpali_engine.utils.maxsim as scoring
    import colpali_engine.utils.processing_utils as processing

    original = scoring.maxsim_inbatch, scoring.maxsim_kd
    assert integration.patch() is True
    assert integration.patch() is True
    assert scoring.maxsim_inbatch is not original[0] and scoring.maxsim_kd is not original[1]
    assert losses_module.maxsim_inbatch is scoring.maxsim_inbatch
    assert losses_module.maxsim_kd is scoring.maxsim_kd
    assert processing.maxsim_inbatch is scoring.maxsim_inbatch
    assert integration.unpatch() is True
    assert (scoring.maxsim_inbatch, scoring.maxsim_kd) == original
    assert losses_module.maxsim_inbatch is original[0] and processing.maxsim_inbatch is original[0]


def test_patch_wins_over_colpali_backend(monkeypatch, maxsim_calls):
    import colpali_engine.utils.maxsim as scoring

    monkeypatch.setenv("COLPALI_SCORES_BACKEND", "torch")
    integration.patch()
    scoring.maxsim_inbatch(embeddings(2, 3), embeddings(3, 4))
    assert maxsim_calls == ["maxsim"]


def test_disable_switch(monkeypatch):
    import colpali_engine.utils.maxsim as scoring

    monkeypatch.setenv("MAXSIM_DISABLE", "1")
    original = scoring.maxsim_inbatch
    assert integration.patch() is False
    assert scoring.maxsim_inbatch is original


def test_unsupported_version_is_a_clear_error(monkeypatch):
    real = importlib.metadata.version
    monkeypatch.setattr(
        importlib.metadata,
        "version",
        lambda name: "0.3.12" if name == "colpali-engine" else real(name),
    )
    with pytest.raises(UnsupportedVersionError, match=r"colpali-engine 0\.3\.12 "):
        integration.patch()
