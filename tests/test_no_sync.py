"""No entry point reads device values on the host outside debug mode (so calls stay CUDA-graph
capturable and never stall the stream).

On CPU the Tensor methods that read values are made to raise during the call; on CUDA the sync
debug mode does the same for real syncs.
"""

import contextlib

import maxsim
import pytest
import torch
from conftest import values
from maxsim import validation

READS = ("item", "tolist", "__bool__", "__int__", "__float__", "__index__", "numpy")


@contextlib.contextmanager
def no_host_reads(monkeypatch, device):
    def refuse(name):
        def read(*args, **kwargs):
            raise AssertionError(f"Tensor.{name} was called: a device->host read")

        return read

    with monkeypatch.context() as patch:
        patch.delenv("MAXSIM_DEBUG", raising=False)  # debug checks read values by design
        if device == "cpu":  # CPU index values are checked by design (free); CUDA's are not
            patch.setattr(validation, "values_checked", lambda t: False)
        for name in READS:
            patch.setattr(torch.Tensor, name, refuse(name))
        if device == "cuda":
            torch.cuda.set_sync_debug_mode("error")
        try:
            yield
        finally:
            if device == "cuda":
                torch.cuda.set_sync_debug_mode("default")


def padded_calls(device, grad):
    Q = values((3, 5, 16), torch.float16, device).requires_grad_(grad)
    D = values((4, 7, 16), torch.float16, device).requires_grad_(grad)
    D4 = values((3, 2, 7, 16), torch.float16, device).requires_grad_(grad)
    q_mask = torch.rand(3, 5, device=device) > 0.2
    d_mask = torch.rand(4, 7, device=device) > 0.2
    q_len = torch.tensor([5, 0, 3], device=device)
    d_len = torch.tensor([[7, 1], [0, 7], [2, 3]], device=device)
    return {
        "maxsim": lambda b: maxsim.maxsim(Q, D, q_mask, d_mask, normalize=True, backend=b),
        "maxsim 4-D": lambda b: maxsim.maxsim(Q, D4, q_mask, backend=b),
        "maxsim_with_argmax": lambda b: maxsim.maxsim_with_argmax(Q, D, d_mask=d_mask, backend=b)[
            0
        ],
        "maxsim_pairs": lambda b: maxsim.maxsim_pairs(Q, D[:3], backend=b),
        "MaxSimScorer": lambda b: maxsim.MaxSimScorer(backend=b)(Q, D),
        "score_candidates_padded": lambda b: maxsim.score_candidates_padded(
            Q, D4, q_len, d_len, backend=b
        ),
        "score_candidates_padded_with_argmax": lambda b: maxsim.score_candidates_padded_with_argmax(
            Q, D4, q_len, d_len, backend=b
        )[0],
    }


def packed_calls(device, grad):
    """Packed queries come with their bound (``max_q_len`` / ``max_seqlen_q``): without it the
    longest query is read once, as documented."""
    q = values((9, 16), torch.float32, device).requires_grad_(grad)
    d = values((12, 16), torch.float32, device).requires_grad_(grad)
    q_off = torch.tensor([0, 4, 4, 9], device=device)
    d_off = torch.tensor([0, 5, 12], device=device)
    pq, pd = torch.tensor([0, 2, 1], device=device), torch.tensor([1, 1, 0], device=device)
    q3 = values((3, 5, 16), torch.float32, device).requires_grad_(grad)
    cand_off = torch.tensor([0, 3, 5, 5, 8, 9, 12], device=device)
    calls = {
        "score_contrastive": lambda b: maxsim.score_contrastive(q3, d, d_off, backend=b),
        "score_pairs_packed": lambda b: maxsim.score_pairs_packed(
            q, q_off, d, d_off, pq, pd, max_q_len=6, backend=b
        ),
        "score_pairs_packed_with_argmax": lambda b: maxsim.score_pairs_packed_with_argmax(
            q, q_off, d, d_off, pq, pd, max_q_len=5, backend=b
        )[0],
        "maxsim_varlen": lambda b: maxsim.maxsim_varlen(
            q, q_off, d, cand_off, num_candidates=2, max_seqlen_q=5, backend=b
        ),
    }
    return calls


@pytest.mark.parametrize("grad", [False, True], ids=["inference", "training"])
def test_padded_entry_points_never_sync(backend_device, monkeypatch, grad):
    backend, device = backend_device
    for name, call in padded_calls(device, grad).items():
        with no_host_reads(monkeypatch, device):
            out = call(backend)
            if grad:
                out.float().sum().backward()
        assert out.dtype == torch.float32, name


@pytest.mark.parametrize("grad", [False, True], ids=["inference", "training"])
def test_packed_entry_points_never_sync(backend_device, monkeypatch, grad):
    """The PyTorch fallback reads the longest packed segment (documented): kernels only."""
    backend, device = backend_device
    if backend == "torch":
        pytest.skip("the fallback reads the longest packed segment on the host")
    for name, call in packed_calls(device, grad).items():
        with no_host_reads(monkeypatch, device):
            out = call(backend)
            if grad:
                out.sum().backward()
        assert out.dtype == torch.float32, name


def test_fallback_backward_of_packed_sets_never_syncs(monkeypatch):
    """Only the fallback's forward reads a segment length; its backward reads nothing."""
    q = values((9, 16)).requires_grad_()
    d = values((12, 16)).requires_grad_()
    q_off, d_off = torch.tensor([0, 4, 4, 9]), torch.tensor([0, 5, 12])
    scores = maxsim.score_pairs_packed(
        q, q_off, d, d_off, torch.tensor([0, 2]), torch.tensor([1, 0]), max_q_len=5, backend="torch"
    )
    with no_host_reads(monkeypatch, "cpu"):
        scores.sum().backward()
    assert q.grad is not None and d.grad is not None


def test_the_refusal_works(monkeypatch):
    with no_host_reads(monkeypatch, "cpu"), pytest.raises(AssertionError, match="device->host"):
        torch.ones(1).item()
