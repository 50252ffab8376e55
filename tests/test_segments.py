"""``maxsim_segments``: documents read in place from one token tensor by (start, length)."""

import maxsim
import pytest
import torch
from conftest import random_mask, values


def gathered(Q, tokens, starts, lengths, q_mask=None):
    """Reference: each segment copied out, padded, scored with maxsim's padded path."""
    width = max(1, int(lengths.max())) if lengths.numel() else 1
    D = torch.zeros(len(starts), width, tokens.size(1), dtype=tokens.dtype, device=tokens.device)
    for i, (s, n) in enumerate(zip(starts.tolist(), lengths.tolist())):
        D[i, :n] = tokens[s:s + n]
    return maxsim.maxsim(Q, D, q_mask, d_lengths=lengths.to(torch.int32), backend="torch")


def test_segments_in_any_order_with_gaps(backend_device):
    backend, device = backend_device
    tokens = values((300, 16), torch.float32, device, "grid")
    starts = torch.tensor([120, 5, 200, 60, 59, 290], device=device)
    lengths = torch.tensor([40, 30, 0, 50, 1, 10], device=device)  # empty; touching; at the end
    Q = values((3, 7, 16), torch.float32, device, "grid")
    q_mask = random_mask((3, 7), device)
    got = maxsim.maxsim_segments(Q, tokens, starts, lengths, q_mask, backend=backend)
    assert got.shape == (3, 6) and got.dtype == torch.float32
    torch.testing.assert_close(got, gathered(Q, tokens, starts, lengths, q_mask), rtol=0, atol=0)
    one = maxsim.maxsim_segments(Q[1], tokens, starts, lengths, q_mask[1], backend=backend)
    torch.testing.assert_close(one, got[1], rtol=0, atol=0)


def test_overlapping_or_outside_segments_score_nan(backend_device, monkeypatch):
    backend, device = backend_device
    tokens = values((50, 8), torch.float32, device)
    Q = values((2, 4, 8), torch.float32, device)
    starts = torch.tensor([0, 10, 15, 45, 30], device=device)
    lengths = torch.tensor([10, 8, 5, 9, 5], device=device)  # 10..18 overlaps 15..20; 45..54 leaves
    got = maxsim.maxsim_segments(Q, tokens, starts, lengths, backend=backend)
    bad = torch.tensor([False, True, False, True, False], device=device)
    assert torch.isnan(got[:, bad]).all() and torch.isfinite(got[:, ~bad]).all()
    ok = ~bad
    ref = gathered(Q, tokens, starts[ok], lengths[ok])
    torch.testing.assert_close(got[:, ok], ref, rtol=1e-6, atol=1e-6)
    monkeypatch.setenv("MAXSIM_DEBUG", "1")
    with pytest.raises(ValueError, match="segment 1"):
        maxsim.maxsim_segments(Q, tokens, starts, lengths, backend=backend)


def test_segments_are_differentiable(backend_device):
    backend, device = backend_device
    tokens = values((40, 8), torch.float32, device, "grid").requires_grad_()
    Q = values((2, 3, 8), torch.float32, device, "grid").requires_grad_()
    starts = torch.tensor([20, 2, 31], device=device)
    lengths = torch.tensor([9, 12, 4], device=device)
    maxsim.maxsim_segments(Q, tokens, starts, lengths, backend=backend).sum().backward()
    Q2, t2 = Q.detach().clone().requires_grad_(), tokens.detach().clone().requires_grad_()
    D = torch.stack([torch.cat([t2[s:s + n], t2.new_zeros(12 - n, 8)])
                     for s, n in zip(starts.tolist(), lengths.tolist())])
    maxsim.maxsim(Q2, D, d_lengths=lengths.to(torch.int32), backend=backend).sum().backward()
    torch.testing.assert_close(Q.grad, Q2.grad, rtol=0, atol=0)
    torch.testing.assert_close(tokens.grad, t2.grad, rtol=0, atol=0)


def test_segments_check_their_arguments():
    Q, tokens = torch.randn(2, 3, 8), torch.randn(20, 8)
    starts, lengths = torch.tensor([0, 5]), torch.tensor([5, 5])
    with pytest.raises(ValueError, match="starts"):
        maxsim.maxsim_segments(Q, tokens, starts[None], lengths)
    with pytest.raises(ValueError, match="lengths"):
        maxsim.maxsim_segments(Q, tokens, starts, lengths[:1])
    with pytest.raises(ValueError, match="tokens"):
        maxsim.maxsim_segments(Q, tokens[None], starts, lengths)
    with pytest.raises(TypeError, match="tokens"):
        maxsim.maxsim_segments(Q, tokens.double(), starts, lengths)
    empty = maxsim.maxsim_segments(Q, tokens, starts[:0], lengths[:0])
    assert empty.shape == (2, 0)
