"""Two rules of the op contract that no other test pins down, on every backend here:

* every valid similarity of a query token is -inf: the argmax is the document's first valid
  token, and the gradient goes to that token, never to a masked one (whatever it holds);
* a float or integer mask means nonzero = valid, whatever the value's sign or size.
"""

import maxsim
import pytest
import torch
from conftest import random_mask

H = 24


def _minus_inf_case(device):
    """One query token whose every product with a valid document token is -inf ([+inf, 0, ...]
    against tokens with a negative first entry) next to an ordinary query token; masked document
    tokens hold a positive first entry (their product +inf would win if they took part)."""
    q = torch.randn(2, 2, H, device=device)
    q[:, 0] = 0.0
    q[:, 0, 0] = float("inf")
    d = torch.randn(3, 7, H, device=device)
    d_mask = torch.ones(3, 7, dtype=torch.bool, device=device)
    d_mask[0, 0] = False  # first valid token: 1
    d_mask[1, :3] = False  # first valid token: 3
    d_mask[2, 1::2] = False  # first valid token: 0
    first_valid = torch.tensor([1, 3, 0], device=device)
    d[..., 0] = torch.where(d_mask, -(d[..., 0].abs() + 0.5), d[..., 0].abs() + 0.5)
    return q, d, d_mask, first_valid


def test_all_minus_inf_similarities_pick_the_first_valid_token(backend_device):
    backend, device = backend_device
    q, d, d_mask, first_valid = _minus_inf_case(device)
    scores, argmax = maxsim.maxsim_with_argmax(q, d, d_mask=d_mask, backend=backend)
    assert torch.equal(argmax[:, :, 0].cpu(), first_valid.expand(2, 3).int().cpu())
    assert (scores == float("-inf")).all()


def test_all_minus_inf_similarities_send_the_gradient_to_the_first_valid_token(backend_device):
    backend, device = backend_device
    q, d, d_mask, first_valid = _minus_inf_case(device)
    q.requires_grad_()
    d.requires_grad_()
    maxsim.maxsim(q, d, d_mask=d_mask, backend=backend).sum().backward()
    dd = d.grad.cpu()
    # The -inf query tokens' gradient [+inf, 0, ...] (two queries) lands on each document's first
    # valid token, and on no other: the ordinary query tokens add finite values only.
    rows = torch.arange(3)
    assert (dd[rows, first_valid.cpu(), 0] == float("inf")).all()
    others = torch.ones(3, 7, dtype=torch.bool)
    others[rows, first_valid.cpu()] = False
    assert torch.isfinite(dd[others]).all()
    assert (dd[~d_mask.cpu()] == 0).all(), "a masked token received gradient"
    # Each -inf query token's own gradient: the sum of the first valid tokens, one per document.
    expected = d.detach()[rows.to(device), first_valid].sum(0).cpu()
    torch.testing.assert_close(q.grad[:, 0].cpu(), expected.expand(2, H))


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_all_minus_inf_similarities_on_the_tensor_core_tiles(dtype):
    """The rule at a shape the tensor-core tiles take (the cases above run on the CUDA-core
    kernel): document k's first valid token is k or later, document 5 has none (0 and -1)."""
    if maxsim.cuda_ops()[0] is None:
        pytest.skip("the CUDA kernels are unavailable")
    q = torch.randn(32, 32, 64, device="cuda")
    q[:, 0] = 0.0
    q[:, 0, 0] = float("inf")
    d = torch.randn(64, 80, 64, device="cuda")
    d_mask = random_mask((64, 80), "cuda") & (torch.arange(80, device="cuda") >= torch.arange(
        64, device="cuda")[:, None])
    d_mask[5] = False
    d[..., 0] = torch.where(d_mask, -(d[..., 0].abs() + 0.5), d[..., 0].abs() + 0.5)
    q, d = q.to(dtype), d.to(dtype)
    has = d_mask.any(1)
    first_valid = torch.where(has, d_mask.int().argmax(1), -1)
    scores, argmax = maxsim.maxsim_with_argmax(q, d, d_mask=d_mask, backend="cuda")
    assert torch.equal(argmax[:, :, 0], first_valid.int().expand(32, 64))
    assert (scores[:, has] == float("-inf")).all() and scores[:, ~has].isfinite().all()
    q.requires_grad_()
    d.requires_grad_()
    maxsim.maxsim(q, d, d_mask=d_mask, backend="cuda").sum().backward()
    rows = torch.arange(64, device="cuda")[has]
    assert (d.grad[rows, first_valid[has], 0] == float("inf")).all()
    assert (d.grad[~d_mask] == 0).all(), "a masked token received gradient"


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.int64])
def test_float_and_integer_masks_mean_nonzero_is_valid(backend_device, dtype):
    backend, device = backend_device
    q = torch.randn(3, 5, H, device=device)
    d = torch.randn(4, 6, H, device=device)
    q_valid, d_valid = random_mask((3, 5), device), random_mask((4, 6), device)
    q_valid[:, 0] = True  # every query keeps a token
    d_valid[:, 0] = True

    def weights(valid):
        """Nonzero values of both signs, small and large, where valid; zeros elsewhere."""
        pick = torch.tensor([0.5, -2.0, 3.75, 1.0, -0.25], device=device)
        if not dtype.is_floating_point:
            pick = torch.tensor([2, -1, 7, 1, -3], device=device)
        w = pick[torch.randint(0, 5, valid.shape, device=device)]
        return torch.where(valid, w, torch.zeros_like(w)).to(dtype)

    for layout_d, d_m in ((d, weights(d_valid)), (d[None].expand(3, 4, 6, H),
                                                  weights(d_valid)[None].expand(3, 4, 6))):
        want = maxsim.maxsim_with_argmax(q, layout_d, q_valid, d_m != 0, backend=backend)
        got = maxsim.maxsim_with_argmax(q, layout_d, weights(q_valid), d_m, backend=backend)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
