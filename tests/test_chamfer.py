"""``chamfer``: squared-L2 Chamfer distance from MaxSim over augmented points, against a float64
computation over the full distance matrix."""

import maxsim
import pytest
import torch
from conftest import random_mask, values


def reference(X, Y, x_mask=None, y_mask=None, metric="l2_sq"):
    """float64 Chamfer distance per set from the full [N, M] distances."""
    out = []
    for b in range(X.size(0)):
        x, y = X[b].double(), Y[b].double()
        if x_mask is not None:
            x = x[x_mask[b]]
        if y_mask is not None:
            y = y[y_mask[b]]
        if len(x) == 0 or len(y) == 0:
            out.append(torch.tensor(float("nan"), dtype=torch.float64))
            continue
        diff = x[:, None, :] - y[None, :, :]
        d = diff.abs().sum(-1) if metric == "l1" else (diff**2).sum(-1)
        out.append(d.min(1).values.mean() + d.min(0).values.mean())
    return torch.stack(out)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_chamfer_matches_float64(backend_device, dtype):
    backend, device = backend_device
    X = values((4, 37, 3), dtype, device)
    Y = values((4, 23, 3), dtype, device)
    x_mask, y_mask = random_mask((4, 37), device), random_mask((4, 23), device)
    got = maxsim.chamfer(X, Y, x_mask, y_mask, backend=backend)
    ref = reference(X.cpu(), Y.cpu(), x_mask.cpu(), y_mask.cpu())
    assert got.dtype == torch.float32 and got.shape == (4,)
    torch.testing.assert_close(got.double().cpu(), ref, rtol=1e-5, atol=1e-5)
    plain = maxsim.chamfer(X, Y, backend=backend)
    torch.testing.assert_close(plain.double().cpu(), reference(X.cpu(), Y.cpu()), rtol=1e-5,
                               atol=1e-5)


def test_gradients_match_float64(backend_device):
    backend, device = backend_device
    X = values((3, 19, 5), torch.float32, device).requires_grad_()
    Y = values((3, 28, 5), torch.float32, device).requires_grad_()
    y_mask = random_mask((3, 28), device)
    (maxsim.chamfer(X, Y, y_mask=y_mask, backend=backend) * torch.arange(1.0, 4.0, device=device)
     ).sum().backward()
    X64 = X.detach().cpu().double().requires_grad_()
    Y64 = Y.detach().cpu().double().requires_grad_()
    (reference(X64, Y64, None, y_mask.cpu()) * torch.arange(1.0, 4.0, dtype=torch.float64)
     ).sum().backward()
    torch.testing.assert_close(X.grad.cpu().double(), X64.grad, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(Y.grad.cpu().double(), Y64.grad, rtol=1e-5, atol=1e-6)


def test_single_pair_empty_sets_and_identity(backend_device):
    backend, device = backend_device
    P = values((50, 3), torch.float32, device)
    assert maxsim.chamfer(P, P, backend=backend).abs() < 1e-5  # a set is at distance 0 from itself
    d = maxsim.chamfer(P, P.flip(0)[:20], backend=backend)
    assert d.dim() == 0
    ref = reference(P[None].cpu(), P.flip(0)[None, :20].cpu())[0]
    torch.testing.assert_close(d.double().cpu(), ref, rtol=1e-5, atol=1e-5)
    X, Y = values((2, 6, 3), torch.float32, device), values((2, 5, 3), torch.float32, device)
    y_mask = torch.ones(2, 5, dtype=torch.bool, device=device)
    y_mask[1] = False  # no point to be nearest to: undefined
    got = maxsim.chamfer(X, Y, y_mask=y_mask, backend=backend)
    assert torch.isfinite(got[0]) and torch.isnan(got[1])


def test_l1_chamfer_matches_float64(backend_device, monkeypatch):
    backend, device = backend_device
    monkeypatch.setenv("MAXSIM_TORCH_MEMORY_MB", "0.001")  # several blocks of points per set
    X = values((3, 29, 3), torch.float32, device).requires_grad_()
    Y = values((3, 17, 3), torch.float32, device)
    x_mask, y_mask = random_mask((3, 29), device), random_mask((3, 17), device)
    got = maxsim.chamfer(X, Y, x_mask, y_mask, metric="l1", backend=backend)
    X64 = X.detach().cpu().double().requires_grad_()
    ref = reference(X64, Y.cpu(), x_mask.cpu(), y_mask.cpu(), metric="l1")
    torch.testing.assert_close(got.double().cpu(), ref, rtol=1e-5, atol=1e-5)
    got.sum().backward()
    ref.sum().backward()
    torch.testing.assert_close(X.grad.cpu().double(), X64.grad, rtol=1e-5, atol=1e-6)


def test_chamfer_checks_its_arguments():
    X, Y = torch.randn(2, 5, 3), torch.randn(2, 4, 3)
    with pytest.raises(ValueError, match="Y"):
        maxsim.chamfer(X, Y[:1])
    with pytest.raises(ValueError, match="Y"):
        maxsim.chamfer(X, torch.randn(2, 4, 2))
    with pytest.raises(TypeError, match="Y"):
        maxsim.chamfer(X, Y.double())
    with pytest.raises(ValueError, match="x_mask"):
        maxsim.chamfer(X, Y, x_mask=torch.ones(2, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match="metric"):
        maxsim.chamfer(X, Y, metric="l2")
