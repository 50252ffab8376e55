"""``retrieve``: the streamed top-k equals the top-k of the full score matrix, ties to the lower
document index."""

import maxsim
import pytest
import torch
from conftest import fill_invalid, prefix, random_lengths, random_mask, values


def full_ranking(scores, k):
    """Reference order: score descending, then document index ascending (a stable sort)."""
    order = torch.sort(scores, dim=1, descending=True, stable=True).indices[:, :k]
    return scores.gather(1, order), order


@pytest.mark.parametrize("chunk_size", [1, 3, 7, None, 1000])
def test_retrieve_equals_topk_of_full_scores(backend_device, chunk_size):
    """Grid data keeps every chunking exact; the order among equal scores is the stable one."""
    backend, device = backend_device
    Q = values((3, 5, 16), torch.float32, device, "grid")
    corpus = values((23, 9, 16), torch.float32, device, "grid")
    q_mask, d_mask = random_mask((3, 5), device), random_mask((23, 9), device)
    scores, indices = maxsim.retrieve(
        Q, corpus, 6, q_mask, d_mask, chunk_size=chunk_size, backend=backend
    )
    full = maxsim.maxsim(Q, corpus, q_mask, d_mask, backend=backend)
    assert scores.dtype == torch.float32 and indices.dtype == torch.int64
    torch.testing.assert_close(scores, torch.topk(full, 6).values, rtol=0, atol=0)
    ref_scores, ref_indices = full_ranking(full, 6)
    assert torch.equal(indices, ref_indices)


def test_ties_go_to_the_lower_document_index(backend_device):
    backend, device = backend_device
    Q = values((4, 5, 8), torch.bfloat16, device, "grid")
    distinct = values((6, 7, 8), torch.bfloat16, device, "grid")
    corpus = distinct[
        torch.tensor([3, 1, 3, 0, 1, 5, 3, 2, 4, 0], device=device)
    ]  # repeated documents
    q_mask = torch.ones(4, 5, dtype=torch.bool, device=device)
    q_mask[2] = False  # an empty query scores 0 everywhere: a tie across the whole corpus
    full = maxsim.maxsim(Q, corpus, q_mask, backend=backend)
    for chunk_size in (1, 4, None):
        scores, indices = maxsim.retrieve(
            Q, corpus, 7, q_mask, chunk_size=chunk_size, backend=backend
        )
        ref_scores, ref_indices = full_ranking(full, 7)
        torch.testing.assert_close(scores, ref_scores, rtol=0, atol=0)
        assert torch.equal(indices, ref_indices)
    assert torch.equal(indices[2], torch.arange(7, device=device))


def test_negative_scores_rank_correctly(backend_device):
    backend, device = backend_device
    Q = values((2, 3, 8), torch.float32, device, "grid").abs() + 0.125
    corpus = -values((9, 4, 8), torch.float32, device, "grid").abs() - 0.125  # every similarity < 0
    scores, indices = maxsim.retrieve(Q, corpus, 9, chunk_size=2, backend=backend)
    ref_scores, ref_indices = full_ranking(maxsim.maxsim(Q, corpus, backend=backend), 9)
    assert torch.all(scores < 0)
    torch.testing.assert_close(scores, ref_scores, rtol=0, atol=0)
    assert torch.equal(indices, ref_indices)


def test_top_k_edges(backend_device):
    backend, device = backend_device
    Q = values((2, 3, 8), torch.float32, device)
    corpus = values((5, 4, 8), torch.float32, device)
    scores, indices = maxsim.retrieve(Q, corpus, 0, backend=backend)
    assert scores.shape == (2, 0) and indices.shape == (2, 0)
    scores, indices = maxsim.retrieve(Q, corpus, 5, chunk_size=2, backend=backend)
    assert torch.equal(indices.sort(dim=1).values, torch.arange(5, device=device).expand(2, 5))


def test_retrieve_scores_are_differentiable(backend_device):
    backend, device = backend_device
    Q = values((2, 3, 8), torch.float32, device).requires_grad_()
    corpus = values((6, 4, 8), torch.float32, device)
    scores, indices = maxsim.retrieve(Q, corpus, 2, chunk_size=4, backend=backend)
    scores.sum().backward()
    Q2 = Q.detach().clone().requires_grad_()
    maxsim.maxsim(Q2, corpus, backend=backend).gather(1, indices).sum().backward()
    torch.testing.assert_close(Q.grad, Q2.grad)


@pytest.mark.parametrize("quantized", [False, True], ids=["fp32", "int8"])
@pytest.mark.parametrize("chunk_size", [4, None])
def test_lengths_by_keyword_equal_masks(backend_device, quantized, chunk_size):
    """``q_lengths=`` / ``d_lengths=`` as in ``maxsim()``, combined with masks; the padding past
    each length holds large values and must never be read."""
    backend, device = backend_device
    q_len, d_len = random_lengths(3, 5, device), random_lengths(11, 9, device)
    q_valid, d_valid = prefix(q_len, 5), prefix(d_len, 9)
    Q = fill_invalid(values((3, 5, 16), torch.float32, device, "grid"), q_valid)
    corpus = fill_invalid(values((11, 9, 16), torch.float32, device, "grid"), d_valid)
    d_mask = random_mask((11, 9), device)
    index = maxsim.quantize(corpus, "int8") if quantized else corpus
    scores, indices = maxsim.retrieve(
        Q, index, 4, d_mask=d_mask, q_lengths=q_len.int(), d_lengths=d_len.int(),
        chunk_size=chunk_size, backend=backend,
    )
    ref_scores, ref_indices = maxsim.retrieve(  # the same search with masks alone
        Q, index, 4, q_valid, d_valid & d_mask, chunk_size=chunk_size, backend=backend
    )
    torch.testing.assert_close(scores, ref_scores, rtol=0, atol=0)
    assert torch.equal(indices, ref_indices)
    if quantized:  # the two-stage search takes them too, for the scan and the rescoring
        scores, indices = maxsim.retrieve(
            Q, index, 4, d_mask=d_mask, q_lengths=q_len, d_lengths=d_len, rescore=corpus,
            candidates=11, backend=backend,
        )
        exact = maxsim.maxsim(Q, corpus, q_valid, d_valid & d_mask, backend=backend)
        ref_scores, ref_indices = full_ranking(exact, 4)
        torch.testing.assert_close(scores, ref_scores, rtol=0, atol=0)
        assert torch.equal(indices, ref_indices)


def test_lengths_of_the_wrong_shape_are_named(backend_device):
    backend, device = backend_device
    Q, corpus = values((2, 3, 8), device=device), values((5, 4, 8), device=device)
    with pytest.raises(ValueError, match="d_lengths"):
        maxsim.retrieve(Q, corpus, 2, d_lengths=torch.ones(4, dtype=torch.int32), backend=backend)
