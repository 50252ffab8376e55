"""``retrieve(..., rescore=)``: an 8-bit scan for candidates, then their exact scores."""

import maxsim
import pytest
import torch
from conftest import random_mask, values
from test_retrieve import full_ranking


def clustered(n, length, dim, device, centres, generator):
    """L2-normalised tokens drawn around shared topic centres: near-ties a coarse scan can swap."""
    pick = torch.randint(0, centres.size(0), (n, length), generator=generator)
    x = centres[pick] + 0.35 * torch.randn(n, length, dim, generator=generator)
    return torch.nn.functional.normalize(x, dim=-1).to(device)


@pytest.mark.parametrize("fmt", ["int8", "fp8_e4m3"])
def test_all_candidates_give_the_exact_ranking(backend_device, fmt):
    """With every document a candidate, the result is the full-precision top-k, ties included
    (grid values: every summation order gives the same fp32 scores)."""
    backend, device = backend_device
    Q = values((3, 5, 16), torch.float32, device, "grid")
    corpus = values((23, 9, 16), torch.float32, device, "grid")
    corpus[7] = corpus[2]  # a tie, which must go to the lower index
    q_mask, d_mask = random_mask((3, 5), device), random_mask((23, 9), device)
    d_mask[7] = d_mask[2]
    scores, indices = maxsim.retrieve(
        Q, maxsim.quantize(corpus, fmt), 6, q_mask, d_mask, rescore=corpus, candidates=23,
        backend=backend,
    )
    ref_scores, ref_indices = full_ranking(maxsim.maxsim(Q, corpus, q_mask, d_mask,
                                                         backend=backend), 6)
    torch.testing.assert_close(scores, ref_scores, rtol=0, atol=0)
    assert torch.equal(indices, ref_indices)


def test_scores_are_the_exact_scores_of_the_candidates(backend_device):
    backend, device = backend_device
    # grid values: the pairs kernel and the all-pairs one sum to the same fp32 scores
    Q = values((6, 8, 32), torch.float16, device, "grid")
    corpus = values((200, 20, 32), torch.float16, device, "grid")
    index = maxsim.quantize(corpus, "int8")
    scores, indices = maxsim.retrieve(Q, index, 5, rescore=corpus, candidates=12, backend=backend,
                                      chunk_size=64)
    _, coarse = maxsim.retrieve(Q, index, 12, backend=backend)
    exact = maxsim.maxsim(Q, corpus, backend=backend)
    assert scores.shape == (6, 5) and indices.dtype == torch.int64
    torch.testing.assert_close(scores, exact.gather(1, indices), rtol=0, atol=0)
    for i in range(6):  # the top 5 of the 12 candidates by exact score, ties to the lower index
        cand = coarse[i].sort().values
        ref_scores, ref_order = full_ranking(exact[i, cand][None], 5)
        torch.testing.assert_close(scores[i], ref_scores[0], rtol=0, atol=0)
        assert torch.equal(indices[i], cand[ref_order[0]])


def test_rescoring_recovers_the_full_precision_top_k(backend_device):
    """Where the 8-bit scan alone swaps near-ties, the default candidates restore the top-10."""
    backend, device = backend_device
    g = torch.Generator().manual_seed(0)
    centres = torch.randn(16, 64, generator=g)
    Q = clustered(16, 8, 64, device, centres, g)
    corpus = clustered(600, 24, 64, device, centres, g)
    _, exact = maxsim.retrieve(Q, corpus, 10, backend=backend)
    index = maxsim.quantize(corpus, "fp8_e4m3")
    _, coarse = maxsim.retrieve(Q, index, 10, backend=backend)
    _, rescored = maxsim.retrieve(Q, index, 10, rescore=corpus, backend=backend)

    def overlap(found):
        hits = sum(len(set(a.tolist()) & set(b.tolist())) for a, b in zip(found, exact))
        return hits / exact.numel()

    # The scan alone moves the ranking here; rescored, at most a near-tie at rank 10 may differ
    # by rounding between two kernels.
    print(f"top-10 overlap: scan {overlap(coarse):.3f}, rescored {overlap(rescored):.3f}")
    assert overlap(coarse) < 0.98
    assert overlap(rescored) >= 0.99


def test_two_stage_checks_its_arguments(backend_device):
    backend, device = backend_device
    Q = values((2, 3, 8), torch.float16, device)
    corpus = values((5, 4, 8), torch.float16, device)
    index = maxsim.quantize(corpus, "int8")
    with pytest.raises(ValueError, match="candidates"):
        maxsim.retrieve(Q, index, 3, rescore=corpus, candidates=2, backend=backend)
    with pytest.raises(ValueError, match="candidates"):
        maxsim.retrieve(Q, index, 3, candidates=4, backend=backend)
    with pytest.raises(ValueError, match="rescore"):
        maxsim.retrieve(Q, index, 3, rescore=corpus[:, :3], backend=backend)
    with pytest.raises(TypeError, match="rescore"):
        maxsim.retrieve(Q, index, 3, rescore=corpus.float(), backend=backend)
    scores, indices = maxsim.retrieve(Q, index, 0, rescore=corpus, backend=backend)
    assert scores.shape == (2, 0) and indices.shape == (2, 0)


def test_quantized_queries_are_rescored_dequantized(backend_device):
    backend, device = backend_device
    Q = values((2, 3, 16), torch.float16, device)
    corpus = values((9, 4, 16), torch.float16, device)
    q8, d8 = maxsim.quantize(Q, "int8"), maxsim.quantize(corpus, "int8")
    scores, indices = maxsim.retrieve(q8, d8, 3, rescore=corpus, candidates=9, backend=backend)
    ref_scores, ref_indices = full_ranking(
        maxsim.maxsim(q8.dequantize(torch.float16), corpus, backend=backend), 3)
    # The pairs and the padded layout may sum a query's rows in another order on a GPU.
    torch.testing.assert_close(scores, ref_scores, rtol=1e-6, atol=1e-6)
    assert torch.equal(indices, ref_indices)
