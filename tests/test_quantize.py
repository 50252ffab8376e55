"""8-bit token embeddings: quantize / dequantize bounds, and every inference entry point scoring a
quantized input exactly as float64 arithmetic on its dequantized values."""

import maxsim
import pytest
import torch
from conftest import random_lengths

FORMATS = ["int8", "fp8_e4m3"]


def normalized(shape, device="cpu"):
    return torch.nn.functional.normalize(torch.randn(shape, device=device), dim=-1)


def ref_allpairs(Q, D, d_len=None):
    sim = torch.einsum("qih,djh->qdij", Q.double(), D.double())
    if d_len is not None:
        valid = torch.arange(D.size(1), device=D.device) < d_len[:, None]
        sim = sim.masked_fill(~valid[None, :, None, :], float("-inf"))
    best = sim.max(-1).values
    return torch.where(torch.isinf(best), 0.0, best).sum(-1)


def rel(a, b):
    return float((a.double() - b).abs().max() / b.abs().max().clamp_min(1e-30))


@pytest.mark.parametrize("fmt", FORMATS)
def test_roundtrip_error_is_one_rounding(fmt):
    x = normalized((7, 11, 64)) * torch.rand(7, 11, 1) * 3
    x[2, 3] = 0.0  # an all-zero token
    q = maxsim.quantize(x, fmt)
    assert q.codes.dtype == {"int8": torch.int8, "fp8_e4m3": torch.float8_e4m3fn}[fmt]
    assert q.format == fmt
    assert q.scale.shape == (7, 11) and q.scale.dtype == torch.float32
    assert q.nbytes < x.numel() * 2  # smaller than fp16
    back = maxsim.dequantize(q)
    assert torch.equal(back[2, 3], torch.zeros(64))
    err = (back - x).abs() / x.abs().amax(-1, keepdim=True).clamp_min(1e-30)
    assert float(err.max()) <= (0.5 / 127 if fmt == "int8" else 2.0**-4) + 1e-6


@pytest.mark.parametrize("fmt", FORMATS)
def test_entry_points_score_the_dequantized_values_exactly(backend_device, fmt):
    backend, device = backend_device
    Q = normalized((3, 9, 32), device)
    D = normalized((12, 17, 32), device)
    d_len = random_lengths(12, 17, device)
    qd, qq = maxsim.quantize(D, fmt), maxsim.quantize(Q, fmt)
    Dd, Qd = qd.dequantize(), qq.dequantize()
    full = ref_allpairs(Q, Dd, d_len)
    # all pairs, quantized documents; then both sides quantized
    assert rel(maxsim.maxsim(Q, qd, d_lengths=d_len, backend=backend), full) <= 1e-5
    both = ref_allpairs(Qd, Dd, d_len)
    assert rel(maxsim.maxsim(qq, qd, d_lengths=d_len, backend=backend), both) <= 1e-5
    # per-query candidates (4-D), with argmax
    q4 = qd[torch.arange(12).view(3, 4)]
    scores, argmax = maxsim.maxsim_with_argmax(Q, q4, backend=backend)
    want = torch.stack([ref_allpairs(Q[i:i + 1], Dd[4 * i:4 * i + 4])[0] for i in range(3)])
    assert rel(scores, want) <= 1e-5 and argmax.shape == (3, 4, 9)
    # packed pairs
    cu_q = torch.arange(0, 28, 9, dtype=torch.int32, device=device)
    cu_d = torch.arange(0, 12 * 17 + 1, 17, dtype=torch.int32, device=device)
    pq, pd = torch.tensor([0, 2, 1], device=device), torch.tensor([5, 0, 11], device=device)
    got = maxsim.maxsim_varlen(
        maxsim.QuantizedTokens(qq.codes.reshape(-1, 32), qq.scale.reshape(-1)), cu_q,
        maxsim.QuantizedTokens(qd.codes.reshape(-1, 32), qd.scale.reshape(-1)), cu_d,
        max_seqlen_q=9, pair_q=pq, pair_d=pd, backend=backend,
    )
    assert rel(got, ref_allpairs(Qd, Dd)[pq, pd]) <= 1e-5
    # corpus top-k, dequantized one chunk at a time
    top, idx = maxsim.retrieve(Q, qd, 5, chunk_size=5, backend=backend)
    ref_top, ref_idx = ref_allpairs(Q, Dd).topk(5, dim=1)
    assert rel(top, ref_top) <= 1e-5 and torch.equal(idx.cpu(), ref_idx.cpu())


def test_errors_name_the_argument():
    with pytest.raises(ValueError, match="dtype"):
        maxsim.quantize(torch.randn(2, 8), "int4")
    with pytest.raises(ValueError, match="dim"):
        maxsim.quantize(torch.randn(2, 8), "int8", dim=0)
    with pytest.raises(ValueError, match="finite"):
        maxsim.quantize(torch.tensor([[1.0, float("nan")]]), "int8")
    with pytest.raises(TypeError, match="x"):
        maxsim.quantize(torch.ones(2, 8, dtype=torch.int32))


def test_repr_is_a_one_line_summary():
    index = maxsim.quantize(normalized((50, 7, 16)), "int8")
    assert repr(index) == "QuantizedTokens(int8, shape=[50, 7, 16], device=cpu, 7,000 bytes)"
