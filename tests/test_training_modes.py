"""Training the way models are trained: under autocast, with gradient checkpointing, and with a
GradCache-style loss computed chunk by chunk over cached embeddings."""

import maxsim
import pytest
import torch
import torch.nn.functional as F
from conftest import values
from torch.utils.checkpoint import checkpoint


def leaves(*xs):
    return [x.detach().clone().requires_grad_() for x in xs]


def test_autocast_runs_both_sides_in_the_autocast_dtype(backend_device):
    backend, device = backend_device
    dtype = torch.bfloat16
    Q, D = values((4, 6, 32), torch.float32, device), values((5, 7, 32), torch.float32, device)
    q, d = leaves(Q, D)
    with torch.autocast(device_type=torch.device(device).type, dtype=dtype):
        scores = maxsim.maxsim(q, d.to(torch.float16), backend=backend)  # mixed dtypes inside
    scores.sum().backward()
    assert scores.dtype == torch.float32
    q2, d2 = leaves(Q.to(dtype), D.to(torch.float16).to(dtype))
    want = maxsim.maxsim(q2, d2, backend=backend)
    want.sum().backward()
    torch.testing.assert_close(scores, want)
    assert q.grad.dtype == torch.float32 and d.grad.dtype == torch.float32
    torch.testing.assert_close(q.grad, q2.grad.float())


def test_without_autocast_mixed_dtypes_are_an_error():
    with pytest.raises(TypeError, match="dtype"):
        maxsim.maxsim(torch.randn(2, 3, 8), torch.randn(2, 4, 8, dtype=torch.float16))


def test_gradient_checkpointing_gives_the_same_gradients(backend_device):
    backend, device = backend_device
    Q, D = values((4, 6, 32), torch.float32, device), values((5, 7, 32), torch.float32, device)

    def loss_of(q, d):
        return maxsim.contrastive_loss(q, d, temperature=0.5, backend=backend)

    q, d = leaves(Q, D)
    checkpoint(loss_of, q, d, use_reentrant=False).backward()
    q2, d2 = leaves(Q, D)
    loss_of(q2, d2).backward()
    assert torch.equal(q.grad, q2.grad) and torch.equal(d.grad, d2.grad)


def test_gradcache_chunked_loss_equals_the_full_loss(backend_device):
    """GradCache / PyLate's CachedContrastive: embeddings are cached without grad, the loss is
    taken over query chunks against all documents; the chunk gradients add up to the full one."""
    backend, device = backend_device
    Q, D = values((6, 5, 16), torch.float32, device), values((9, 7, 16), torch.float32, device)
    targets = torch.tensor([0, 3, 2, 8, 4, 1], device=device)
    q, d = leaves(Q, D)
    full = F.cross_entropy(maxsim.maxsim(q, d, backend=backend), targets)
    full.backward()
    qc, dc = leaves(Q, D)
    total = 0.0
    for start in range(0, 6, 4):
        chunk = slice(start, start + 4)
        scores = maxsim.maxsim(qc[chunk], dc, backend=backend)
        loss = F.cross_entropy(scores, targets[chunk], reduction="sum") / 6
        loss.backward()
        total += float(loss)
    assert abs(total - float(full)) < 1e-6
    # fp32, and the chunked loss sums in another order: a few ulps apart, not bit for bit.
    torch.testing.assert_close(qc.grad, q.grad, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(dc.grad, d.grad, rtol=1e-5, atol=1e-6)
