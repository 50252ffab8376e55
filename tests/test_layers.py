"""maxsim.layers against sentence-transformers' scoring contract, point by point, with a float64
reference of their formula (written out here, not imported, so the test runs without them)."""

import pytest
import torch
from conftest import DEVICES
from maxsim import layers

EMPTY = -1e9


def their_formula(a, b, a_mask, b_mask, pairwise):
    """sentence-transformers 6.3 `_maxsim_score_documents` / `_maxsim_score_pairs` in float64."""
    a64, b64 = a.double(), b.double()
    if b.shape[1] == 0:
        shape = (b.shape[0],) if pairwise else (a.shape[0], b.shape[0])
        return torch.full(shape, EMPTY, dtype=torch.float64, device=b.device)
    sims = torch.einsum("bsh,bth->bst" if pairwise else "ash,bth->abst", a64, b64)
    if b_mask is not None:
        invalid = ~b_mask.bool()
        invalid = invalid.unsqueeze(1) if pairwise else invalid[None, :, None, :]
        sims = sims.masked_fill(invalid, torch.finfo(sims.dtype).min)
    maxima = sims.max(dim=-1).values
    if a_mask is not None:
        maxima = maxima * (a_mask.double() if pairwise else a_mask.double().unsqueeze(1))
    scores = maxima.sum(dim=-1)
    if b_mask is not None:
        empty = ~b_mask.bool().any(dim=-1)
        scores = scores.masked_fill(empty if pairwise else empty.unsqueeze(0), EMPTY)
    return scores


def layer(pairwise):
    return layers.MaxSimPairwise() if pairwise else layers.MaxSim()


def ragged(na, nb, lq, ld, h, device, pairwise=False, dtype=torch.float32, mask_dtype=torch.bool):
    g = torch.Generator().manual_seed(na * 1000 + ld)
    a = torch.randn(na, lq, h, generator=g).to(device, dtype)
    b = torch.randn(na if pairwise else nb, ld, h, generator=g).to(device, dtype)
    a_mask = torch.rand(a.shape[:2], generator=g) > 0.25
    b_mask = torch.rand(b.shape[:2], generator=g) > 0.3
    b_mask[0] = False  # a document with no valid token
    if mask_dtype.is_floating_point:
        a_mask = a_mask * torch.rand(a.shape[:2], generator=g) * 2  # weights, not only 0 / 1
    return a, b, a_mask.to(device), b_mask.to(device)


def check(got, a, b, a_mask, b_mask, pairwise, rtol=2e-6):
    """Relative to max(|score|, 1); CUDA's fp32 path is exact to about 1e-6 per similarity."""
    rtol = max(rtol, 1e-5) if got.is_cuda else rtol
    ref = their_formula(a, b, a_mask, b_mask, pairwise)
    assert got.dtype == torch.float32 and got.shape == ref.shape and got.device == ref.device
    scale = ref.abs().clamp(min=1).double()
    err = ((got.double() - ref).abs() / scale).max().item()
    assert err <= rtol, f"max relative error {err:.2e} > {rtol:.0e}"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("pairwise", [False, True])
@pytest.mark.parametrize("mask_dtype", [torch.bool, torch.float32])
@pytest.mark.parametrize("shape", [(3, 5, 7, 9, 16), (1, 1, 1, 1, 1), (4, 2, 33, 17, 96)])
def test_scores_fp32(device, pairwise, mask_dtype, shape):
    a, b, a_mask, b_mask = ragged(*shape, device, pairwise=pairwise, mask_dtype=mask_dtype)
    check(layer(pairwise)(a, b, a_mask, b_mask), a, b, a_mask, b_mask, pairwise)
    check(layer(pairwise)(a, b, None, None), a, b, None, None, pairwise)


@pytest.mark.parametrize("pairwise", [False, True])
def test_masked_tokens_never_win_over_negative_similarities(pairwise):
    a = torch.rand(2, 4, 8) + 0.1
    b = -(torch.rand(2, 6, 8) + 0.1)  # every valid similarity is negative
    b_mask = torch.ones(2, 6, dtype=torch.bool)
    b_mask[:, 4:] = False
    b[:, 4:] = 0  # padding that would win at 0 if masking multiplied by 0
    got = layer(pairwise)(a, b, None, b_mask)
    assert (got < 0).all()
    check(got, a, b, None, b_mask, pairwise)


@pytest.mark.parametrize("pairwise", [False, True])
def test_a_mask_weights_the_maxima_negative_weights_included(pairwise):
    a, b, _, b_mask = ragged(3, 3, 6, 8, 16, "cpu", pairwise=pairwise)
    weights = torch.randn(3, 6)  # signed: a weight multiplies the max, it does not mask the query
    check(layer(pairwise)(a, b, weights, b_mask), a, b, weights, b_mask, pairwise)
    ints = torch.randint(0, 3, (3, 6))  # a tokenizer's int64 attention mask, or counts
    check(layer(pairwise)(a, b, ints, b_mask), a, b, ints, b_mask, pairwise)


@pytest.mark.parametrize("pairwise", [False, True])
def test_empty_and_zero_width_documents(pairwise):
    a, b, a_mask, b_mask = ragged(3, 4, 5, 6, 8, "cpu", pairwise=pairwise)
    got = layer(pairwise)(a, b, a_mask, b_mask)
    assert (got[..., 0] == EMPTY).all() if not pairwise else got[0] == EMPTY
    zero_width = b[:, :0]
    got = layer(pairwise)(a, zero_width, a_mask, b_mask[:, :0])
    assert got.dtype == torch.float32 and (got == EMPTY).all()
    assert got.shape == ((3,) if pairwise else (3, 4))
    zero_query = layer(pairwise)(a[:, :0], b, a_mask[:, :0], b_mask)  # the exact path's case
    check(zero_query, a[:, :0], b, a_mask[:, :0], b_mask, pairwise)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("pairwise", [False, True])
def test_half_inputs_accumulate_in_fp32(dtype, pairwise):
    # 64 query tokens of maxima near 1: a half-precision sum would be off by whole units.
    a, b, a_mask, b_mask = ragged(2, 3, 64, 40, 32, "cpu", pairwise, dtype=dtype)
    got = layer(pairwise)(a, b, a_mask, b_mask)
    check(got, a, b, a_mask, b_mask, pairwise, rtol=1e-5)  # exact products, fp32 sums


@pytest.mark.parametrize("pairwise", [False, True])
def test_gradients_match_the_formula(pairwise):
    a, b, a_mask, b_mask = ragged(3, 4, 5, 9, 16, "cpu", pairwise, mask_dtype=torch.float32)
    grads = []
    for fn in (lambda *x: layer(pairwise)(*x), lambda *x: their_formula(*x, pairwise)):
        leaves = [a.clone().requires_grad_(), b.clone().requires_grad_()]
        out = fn(*leaves, a_mask, b_mask)
        valid = out > EMPTY  # the fill is a constant: no gradient, in both
        (out.double() * valid).sum().backward()
        grads.append([leaf.grad for leaf in leaves])
    for got, ref in zip(*grads):
        torch.testing.assert_close(got, ref.float(), rtol=1e-5, atol=1e-5)


def test_the_kernels_take_plain_calls_and_the_rest_goes_to_the_exact_path(monkeypatch):
    calls = []
    monkeypatch.setattr(layers, "maxsim", lambda *x: calls.append(x) or torch.zeros(3, 4))
    a, b, a_mask, b_mask = ragged(3, 4, 5, 6, 8, "cpu")
    layers.MaxSim()(a, b, a_mask, b_mask)
    assert len(calls) == 1
    layers.MaxSim()(a.double(), b.double(), a_mask, b_mask)  # float64: not a kernel dtype
    layers.MaxSim()(a, b.half(), a_mask, b_mask)  # mixed dtypes
    assert len(calls) == 1


def test_layers_follow_the_hub_rules():
    for cls in (layers.MaxSim, layers.MaxSimPairwise):
        own = {k for k in vars(cls) if not k.startswith("__") or k == "__init__"}
        assert own == {"forward", "has_backward", "can_torch_compile"}
        assert list(cls.forward.__code__.co_varnames[:5]) == ["self", "a", "b", "a_mask", "b_mask"]
        assert not list(cls().parameters()) and not list(cls().buffers())


@pytest.mark.parametrize("pairwise", [False, True])
def test_compiles_without_graph_breaks(pairwise):
    a, b, a_mask, b_mask = ragged(2, 3, 5, 6, 8, "cpu", pairwise=pairwise)
    torch._dynamo.reset()
    compiled = torch.compile(layer(pairwise), fullgraph=True, backend="aot_eager")
    check(compiled(a, b, a_mask, b_mask), a, b, a_mask, b_mask, pairwise)
