"""The fused contrastive loss: equal to torch's cross-entropy over float64 MaxSim scores, with
the same gradients, on every backend; deterministic; clear errors."""

import maxsim
import pytest
import torch
import torch.nn.functional as F
from conftest import HAS_CUDA_OPS, capture, random_lengths, values

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def reference_loss(Q, D, d_lengths, targets, temperature):
    """float64 autograd: einsum, masked max, sum, cross-entropy."""
    sim = torch.einsum("qih,djh->qdij", Q.double(), D.double())
    if d_lengths is not None:
        valid = torch.arange(D.size(1), device=D.device) < d_lengths[:, None]
        sim = sim.masked_fill(~valid[None, :, None, :], float("-inf"))
    best = sim.max(-1).values
    scores = torch.where(torch.isinf(best), 0.0, best).sum(-1)
    t = torch.arange(Q.size(0), device=Q.device) if targets is None else targets
    return F.cross_entropy(scores / temperature, t)


def leaves(*xs):
    return [x.detach().clone().requires_grad_() for x in xs]


@pytest.mark.parametrize("temperature", [1.0, 0.05])
@pytest.mark.parametrize("with_targets", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
def test_loss_and_gradients_match_float64(backend_device, dtype, with_targets, temperature):
    backend, device = backend_device
    nq, nd, h = 6, 9, 24
    Q = values((nq, 11, h), dtype, device)
    D = values((nd, 13, h), dtype, device)
    d_len = random_lengths(nd, 13, device)
    targets = torch.randperm(nd, device=device)[:nq] if with_targets else None
    q, d = leaves(Q, D)
    loss = maxsim.contrastive_loss(
        q, d, d_lengths=d_len, targets=targets, temperature=temperature, backend=backend
    )
    loss.backward()
    q64, d64 = leaves(Q.double(), D.double())
    ref = reference_loss(q64, d64, d_len, targets, temperature)
    ref.backward()
    assert loss.dtype == torch.float32 and loss.dim() == 0
    assert abs(loss.item() - ref.item()) <= 1e-5 * max(1.0, abs(ref.item()))
    # fp32: the scores' own rounding (~1e-7 relative) reaches the softmax scaled by 1/temperature.
    tol = {torch.float32: 1e-5 / temperature, torch.float16: 1e-3, torch.bfloat16: 4e-3}[dtype]
    for got, want in ((q.grad, q64.grad), (d.grad, d64.grad)):
        assert got.dtype == dtype
        err = (got.double() - want).norm() / want.norm().clamp_min(1e-30)
        assert err <= tol, float(err)


def test_grouped_candidates_with_targets(backend_device):
    backend, device = backend_device
    Q = values((4, 5, 16), torch.float32, device)
    D = values((4, 3, 7, 16), torch.float32, device)
    targets = torch.tensor([0, 2, 1, 0], device=device)
    loss = maxsim.contrastive_loss(Q, D, targets=targets, backend=backend)
    scores = maxsim.maxsim(Q, D, backend=backend)
    assert torch.allclose(loss, F.cross_entropy(scores, targets), rtol=1e-6, atol=1e-6)


def test_nan_scores_give_a_nan_loss(backend_device):
    backend, device = backend_device
    Q = values((3, 4, 8), torch.float32, device)
    D = values((3, 5, 8), torch.float32, device)
    D[1, 2, 3] = float("nan")
    assert torch.isnan(maxsim.contrastive_loss(Q, D, backend=backend))


def test_errors_name_the_argument():
    Q, D = torch.randn(3, 4, 8), torch.randn(5, 6, 8)
    with pytest.raises(ValueError, match="temperature"):
        maxsim.contrastive_loss(Q, D, temperature=0.0)
    with pytest.raises(ValueError, match="targets"):
        maxsim.contrastive_loss(Q, torch.randn(3, 2, 6, 8))
    with pytest.raises(ValueError, match="targets"):
        maxsim.contrastive_loss(Q, torch.randn(2, 6, 8))
    with pytest.raises(ValueError, match="targets"):
        maxsim.contrastive_loss(Q, D, targets=torch.tensor([0, 1]))
    with pytest.raises(TypeError, match="targets"):
        maxsim.contrastive_loss(Q, D, targets=torch.tensor([0.0, 1.0, 2.0]))


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA_OPS, reason="needs the CUDA extension")
def test_cuda_gradients_are_bit_identical_run_after_run():
    Q = values((32, 32, 128), torch.bfloat16, "cuda")
    D = values((32, 80, 128), torch.bfloat16, "cuda")
    runs = []
    for _ in range(5):
        q, d = leaves(Q, D)
        loss = maxsim.contrastive_loss(q, d, backend="cuda")
        loss.backward()
        runs.append((loss.detach(), q.grad, d.grad))
    for loss, dq, dd in runs[1:]:
        assert torch.equal(loss, runs[0][0])
        assert torch.equal(dq, runs[0][1]) and torch.equal(dd, runs[0][2])


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA_OPS, reason="needs the CUDA extension")
def test_cuda_step_captures_in_a_cuda_graph():
    Q = values((16, 8, 64), torch.float16, "cuda")
    D = values((16, 20, 64), torch.float16, "cuda")
    q, d = leaves(Q, D)

    def step():
        loss = maxsim.contrastive_loss(q, d, backend="cuda")
        return (loss,) + torch.autograd.grad(loss, (q, d))

    # The eager reference runs after the capture: a backward run on the default stream before it
    # leaves autograd state that ties the captured backward to that stream.
    graph, captured = capture(step, warmup=3)
    eager = step()
    graph.replay()
    torch.cuda.synchronize()
    for a, b in zip(captured, eager):
        assert torch.equal(a, b)


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA_OPS, reason="needs the CUDA extension")
def test_replayed_step_follows_new_inputs_copied_in():
    # The README's pattern: capture once on static inputs, then copy each batch in and replay.
    static = [values((32, 32, 128), torch.float16, "cuda"),
              values((32, 80, 128), torch.float16, "cuda"), random_lengths(32, 80, "cuda")]
    graph, (loss, dq, dd) = capture(
        lambda: maxsim.contrastive_step(static[0], static[1], d_lengths=static[2]), warmup=2)
    for _ in range(2):
        new = [values((32, 32, 128), torch.float16, "cuda"),
               values((32, 80, 128), torch.float16, "cuda"), random_lengths(32, 80, "cuda")]
        for s, x in zip(static, new):
            s.copy_(x)
        graph.replay()
        eager = maxsim.contrastive_step(new[0], new[1], d_lengths=new[2])
        for a, b in zip((loss, dq, dd), eager):
            assert torch.equal(a, b)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("nd", [8, 1100])  # on CUDA, the loss fused into the backward or not
def test_step_equals_the_autograd_loss(backend_device, dtype, nd):
    backend, device = backend_device
    Q = values((5, 7, 32), dtype, device)
    D = values((nd, 10, 32), dtype, device)
    d_len = random_lengths(nd, 10, device)
    targets = torch.tensor([7, 0, 3, 3, 1], device=device)
    loss, dq, dd = maxsim.contrastive_step(
        Q, D, d_lengths=d_len, targets=targets, temperature=0.1, backend=backend
    )
    q, d = leaves(Q, D)
    ref = maxsim.contrastive_loss(
        q, d, d_lengths=d_len, targets=targets, temperature=0.1, backend=backend
    )
    ref.backward()
    assert torch.equal(loss, ref.detach())
    assert dq.dtype == dtype and dd.shape == D.shape
    assert torch.equal(dq, q.grad) and torch.equal(dd, d.grad)


def test_step_on_grouped_candidates(backend_device):
    backend, device = backend_device
    Q = values((3, 4, 16), torch.float32, device)
    D = values((3, 5, 6, 16), torch.float32, device)
    targets = torch.tensor([0, 0, 4], device=device)
    loss, dq, dd = maxsim.contrastive_step(Q, D, targets=targets, backend=backend)
    q, d = leaves(Q, D)
    ref = F.cross_entropy(maxsim.maxsim(q, d, backend=backend), targets)
    ref.backward()
    assert torch.allclose(loss, ref, rtol=1e-6)
    assert torch.allclose(dq, q.grad, atol=1e-6) and torch.allclose(dd, d.grad, atol=1e-6)


def test_step_with_masks_and_lengths_equals_the_autograd_loss(backend_device):
    backend, device = backend_device
    Q = values((4, 6, 16), torch.float32, device)
    D = values((4, 3, 9, 16), torch.float32, device)
    q_mask = torch.rand(4, 6, device=device) > 0.3
    d_mask = torch.rand(4, 3, 9, device=device) > 0.2
    d_len = torch.randint(0, 10, (4, 3), device=device)
    q_len = torch.randint(1, 7, (4,), device=device, dtype=torch.int32)
    targets = torch.tensor([2, 0, 1, 1], device=device, dtype=torch.int32)
    kw = dict(q_lengths=q_len, d_lengths=d_len, targets=targets, temperature=0.3, backend=backend)
    loss, dq, dd = maxsim.contrastive_step(Q, D, q_mask, d_mask, **kw)
    q, d = leaves(Q, D)
    ref = maxsim.contrastive_loss(q, d, q_mask, d_mask, **kw)
    ref.backward()
    assert torch.equal(loss, ref.detach())
    assert torch.equal(dq, q.grad) and torch.equal(dd, d.grad)


def test_no_queries_give_a_nan_loss_and_empty_gradients(backend_device):
    backend, device = backend_device
    Q = values((0, 5, 8), torch.float32, device)
    D = values((3, 4, 8), torch.float32, device)
    loss, dq, dd = maxsim.contrastive_step(Q, D, backend=backend)
    assert torch.isnan(loss) and dq.shape == Q.shape
    assert torch.equal(dd, torch.zeros_like(D))
