"""The native surface (docs/API.md) on every backend, against the float64 reference."""

import maxsim
import pytest
import torch
import torch.nn.functional as F
from conftest import (
    DTYPES,
    assert_close_rel,
    assert_exact,
    offsets_of,
    random_lengths,
    random_mask,
    values,
)
from maxsim.layouts import ALLPAIRS, GROUPED, PAIRS
from maxsim.reference import maxsim_reference_padded, reference_fwd


def ones(*shape, device):
    return torch.ones(shape, dtype=torch.bool, device=device)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_maxsim_all_pairs_and_candidates(backend_device, dtype):
    backend, device = backend_device
    Q = values((4, 6, 24), dtype, device, "grid")
    D = values((5, 9, 24), dtype, device, "grid")
    D4 = values((4, 3, 9, 24), dtype, device, "grid")
    q_mask, d_mask, d4_mask = (
        random_mask((4, 6), device),
        random_mask((5, 9), device),
        random_mask((4, 3, 9), device),
    )
    scores, argmax = maxsim.maxsim_with_argmax(Q, D, q_mask, d_mask, backend=backend)
    ref = maxsim_reference_padded(Q[:, None], q_mask[:, None], D[None], d_mask[None])
    assert scores.shape == (4, 5) and argmax.shape == (4, 5, 6)
    assert_exact(scores, argmax, ref[0], ref[1].to(torch.int32))
    scores, argmax = maxsim.maxsim_with_argmax(Q, D4, q_mask, d4_mask, backend=backend)
    ref = maxsim_reference_padded(Q[:, None], q_mask[:, None], D4, d4_mask)
    assert scores.shape == (4, 3) and argmax.shape == (4, 3, 6)
    assert_exact(scores, argmax, ref[0], ref[1].to(torch.int32))
    torch.testing.assert_close(
        maxsim.maxsim(Q, D4, q_mask, d4_mask, backend=backend), scores, rtol=0, atol=0
    )


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_prefix_lengths_equal_prefix_masks(backend_device, dtype):
    """q_lengths / d_lengths mean the same as the prefix masks they describe (padding poisoned)."""
    backend, device = backend_device
    Q = values((4, 6, 24), dtype, device, "grid")
    D = values((5, 9, 24), dtype, device, "grid")
    D4 = values((4, 3, 9, 24), dtype, device, "grid")
    q_len, d_len = random_lengths(4, 6, device), random_lengths(5, 9, device)
    d4_len = random_lengths(12, 9, device).view(4, 3)
    prefix = lambda n, lengths: torch.arange(n, device=device) < lengths[..., None]  # noqa: E731
    for t, lengths in ((Q, q_len), (D, d_len), (D4, d4_len)):
        t.masked_fill_(~prefix(t.shape[-2], lengths)[..., None], float("nan"))
    got = maxsim.maxsim_with_argmax(Q, D, q_lengths=q_len, d_lengths=d_len, backend=backend)
    want = maxsim.maxsim_with_argmax(Q, D, prefix(6, q_len), prefix(9, d_len), backend=backend)
    assert_exact(got[0], got[1], want[0], want[1])
    got = maxsim.maxsim_with_argmax(Q, D4, q_lengths=q_len, d_lengths=d4_len, backend=backend)
    want = maxsim.maxsim_with_argmax(Q, D4, prefix(6, q_len), prefix(9, d4_len), backend=backend)
    assert_exact(got[0], got[1], want[0], want[1])
    with pytest.raises(ValueError, match="d_lengths"):
        maxsim.maxsim(Q, D4, d_lengths=d_len, backend=backend)


def test_maxsim_pairs_is_the_diagonal(backend_device):
    backend, device = backend_device
    Q = values((5, 7, 16), torch.bfloat16, device, "grid")
    D = values((5, 8, 16), torch.bfloat16, device, "grid")
    q_mask, d_mask = random_mask((5, 7), device), random_mask((5, 8), device)
    pairs = maxsim.maxsim_pairs(Q, D, q_mask, d_mask, backend=backend)
    full = maxsim.maxsim(Q, D, q_mask, d_mask, backend=backend)
    assert pairs.shape == (5,)
    torch.testing.assert_close(pairs, full.diagonal(), rtol=0, atol=0)


@pytest.mark.parametrize("mode", ["allpairs", "candidates", "pairs"])
def test_maxsim_varlen(backend_device, mode):
    backend, device = backend_device
    q_len, d_len = random_lengths(4, 7, device), random_lengths(8, 9, device)
    q_off, d_off = offsets_of(q_len), offsets_of(d_len)
    q = values((int(q_off[-1]), 16), torch.float16, device, "grid")
    d = values((int(d_off[-1]), 16), torch.float16, device, "grid")
    q_mask, d_mask = random_mask(q.shape[:1], device), random_mask(d.shape[:1], device)
    kwargs, ref_kwargs = {}, dict(layout=ALLPAIRS)
    if mode == "candidates":
        kwargs, ref_kwargs = dict(num_candidates=2), dict(layout=GROUPED, group=2)
    if mode == "pairs":
        pq, pd = torch.randint(0, 4, (9,), device=device), torch.randint(0, 8, (9,), device=device)
        kwargs, ref_kwargs = dict(pair_q=pq, pair_d=pd), dict(layout=PAIRS, pair_q=pq, pair_d=pd)
    scores = maxsim.maxsim_varlen(
        q, q_off, d, d_off, q_mask=q_mask, d_mask=d_mask, backend=backend, **kwargs
    )
    ref = reference_fwd(
        q, d, q_offsets=q_off, q_mask=q_mask, d_offsets=d_off, d_mask=d_mask, **ref_kwargs
    )[0]
    assert_exact(scores, None, ref, None)


def test_varlen_agrees_with_padded(backend_device):
    backend, device = backend_device
    lengths = torch.tensor([3, 7, 1], device=device)
    Q = values((3, 7, 8), torch.float32, device, "grid")
    D = values((4, 5, 8), torch.float32, device, "grid")
    valid = torch.arange(7, device=device) < lengths[:, None]
    padded = maxsim.maxsim(Q, D, valid, backend=backend)
    varlen = maxsim.maxsim_varlen(
        Q[valid],
        offsets_of(lengths),
        D.reshape(-1, 8),
        offsets_of(torch.full((4,), 5, device=device)),
        backend=backend,
    )
    torch.testing.assert_close(varlen, padded, rtol=0, atol=0)


def test_varlen_training_without_max_seqlen(backend_device):
    backend, device = backend_device
    q = values((9, 8), torch.float32, device).requires_grad_()
    d = values((10, 8), torch.float32, device)
    q_off = torch.tensor([0, 4, 9], device=device)
    d_off = torch.tensor([0, 6, 10], device=device)
    maxsim.maxsim_varlen(q, q_off, d, d_off, backend=backend).sum().backward()
    q_ref = q.detach().clone().requires_grad_()
    reference_fwd(q_ref, d, q_offsets=q_off, d_offsets=d_off)[0].sum().backward()
    assert_close_rel(q.grad, q_ref.grad)


def test_normalize_equals_normalizing_first(backend_device):
    backend, device = backend_device
    Q = values((3, 5, 16), torch.float32, device) * 3
    D = values((4, 6, 16), torch.float32, device) * 3
    got = maxsim.maxsim(Q, D, normalize=True, backend=backend)
    want = maxsim.maxsim(F.normalize(Q, dim=-1), F.normalize(D, dim=-1), backend=backend)
    torch.testing.assert_close(got, want)
    assert got.max() <= 5 + 1e-4  # cosine similarities: at most 1 per query token


def test_maxsim_scorer_module(backend_device):
    backend, device = backend_device
    scorer = maxsim.MaxSimScorer(normalize=True, backend=backend)
    assert list(scorer.parameters()) == [] and "normalize=True" in repr(scorer)
    Q = values((2, 4, 8), torch.float32, device)
    D = values((3, 5, 8), torch.float32, device)
    d_mask = random_mask((3, 5), device)
    torch.testing.assert_close(
        scorer(Q, D, d_mask=d_mask),
        maxsim.maxsim(Q, D, d_mask=d_mask, normalize=True, backend=backend),
    )


def test_auto_backend_picks_by_device(backend_device):
    backend, device = backend_device
    chosen = maxsim.select_ops(torch.device(device), "auto")
    ops = maxsim.cuda_ops()[0] if device == "cuda" else maxsim.cpu_ops()[0]
    expected = ops if ops is not None else torch.ops.maxsim_torch
    assert chosen is expected
    assert maxsim.select_ops(torch.device(device), "torch") is torch.ops.maxsim_torch


def test_public_names():
    assert maxsim.__version__ == "0.1.0"
    for name in maxsim.__all__:
        assert hasattr(maxsim, name), name
    for base in ("score_candidates_padded", "score_contrastive", "score_pairs_packed"):
        for suffix in ("", "_with_argmax", "_train", "_reference", "_with_argmax_reference"):
            assert base + suffix in maxsim.__all__


ODD_SIZES = (1, 7, 15, 16, 17, 31, 33, 83, 127)


@pytest.mark.parametrize("size", ODD_SIZES)
@pytest.mark.parametrize("dim", ["Lq", "Ld", "H"])
def test_odd_shapes_are_exact(backend_device, dim, size):
    """Tile-boundary and prime sizes of Lq, Ld and H: none is refused, all are exact."""
    backend, device = backend_device
    shape = dict(Lq=9, Ld=12, H=24)
    shape[dim] = size
    lq, ld, h = shape["Lq"], shape["Ld"], shape["H"]
    Q = values((2, lq, h), torch.float16, device, "grid")
    D = values((3, ld, h), torch.float16, device, "grid")
    q_mask, d_mask = random_mask((2, lq), device), random_mask((3, ld), device)
    scores, argmax = maxsim.maxsim_with_argmax(Q, D, q_mask, d_mask, backend=backend)
    ref = maxsim_reference_padded(Q[:, None], q_mask[:, None], D[None], d_mask[None])
    assert_exact(scores, argmax, ref[0], ref[1].to(torch.int32))
