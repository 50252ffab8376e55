"""The compatibility surface (``erikkaum/maxsim`` names and shapes) against its reference twins."""

import maxsim
import pytest
import torch
from conftest import DTYPES, assert_close_rel, assert_exact, offsets_of, random_lengths, values


def candidates_case(device, dtype, b=3, k=4, lq=13, ld=10, h=20):
    queries = values((b, lq, h), dtype, device, "grid")
    documents = values((b, k, ld, h), dtype, device, "grid")
    query_lengths = random_lengths(b, lq, device)
    doc_lengths = torch.stack([random_lengths(k, ld, device) for _ in range(b)])
    return queries, documents, query_lengths, doc_lengths


def packed_case(device, dtype, nq=4, nd=5, lq=7, ld=9, h=20):
    q_off, d_off = (
        offsets_of(random_lengths(nq, lq, device)),
        offsets_of(random_lengths(nd, ld, device)),
    )
    queries = values((int(q_off[-1]), h), dtype, device, "grid")
    documents = values((int(d_off[-1]), h), dtype, device, "grid")
    pair_q, pair_d = (
        torch.randint(0, nq, (8,), device=device),
        torch.randint(0, nd, (8,), device=device),
    )
    return queries, q_off, documents, d_off, pair_q, pair_d


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_score_candidates_padded(backend_device, dtype):
    backend, device = backend_device
    args = candidates_case(device, dtype)
    scores, argmax = maxsim.score_candidates_padded_with_argmax(*args, backend=backend)
    ref_scores, ref_argmax = maxsim.score_candidates_padded_with_argmax_reference(*args)
    assert scores.shape == (3, 4) and argmax.shape == (3, 4, 13)
    assert ref_scores.dtype == torch.float32 and ref_argmax.dtype == torch.int32
    assert_exact(scores, argmax, ref_scores, ref_argmax)
    torch.testing.assert_close(
        maxsim.score_candidates_padded(*args, backend=backend), scores, rtol=0, atol=0
    )
    torch.testing.assert_close(
        maxsim.score_candidates_padded_reference(*args), ref_scores, rtol=0, atol=0
    )
    query_lengths = args[2]
    padding = torch.arange(13, device=device) >= query_lengths[:, None]
    assert torch.all(argmax[padding[:, None, :].expand_as(argmax)] == -1), "padding slots hold -1"


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_score_contrastive(backend_device, dtype):
    backend, device = backend_device
    queries = values((3, 6, 20), dtype, device, "grid")
    _, _, documents, d_off, _, _ = packed_case(device, dtype)
    scores, argmax = maxsim.score_contrastive_with_argmax(
        queries, documents, d_off, backend=backend
    )
    ref_scores, ref_argmax = maxsim.score_contrastive_with_argmax_reference(
        queries, documents, d_off
    )
    assert scores.shape == (3, 5) and argmax.shape == (3, 5, 6)
    assert_exact(scores, argmax, ref_scores, ref_argmax)
    torch.testing.assert_close(
        maxsim.score_contrastive(queries, documents, d_off, backend=backend), scores, rtol=0, atol=0
    )
    torch.testing.assert_close(
        maxsim.score_contrastive_reference(queries, documents, d_off), ref_scores
    )


@pytest.mark.parametrize("max_q_len", [None, 7, 11])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_score_pairs_packed(backend_device, dtype, max_q_len):
    backend, device = backend_device
    args = packed_case(device, dtype)
    scores, argmax = maxsim.score_pairs_packed_with_argmax(
        *args, max_q_len=max_q_len, backend=backend
    )
    ref_scores, ref_argmax = maxsim.score_pairs_packed_with_argmax_reference(*args, max_q_len)
    width = max_q_len if max_q_len is not None else int((args[1][1:] - args[1][:-1]).max())
    assert scores.shape == (8,) and argmax.shape == (8, width)
    assert_exact(scores, argmax, ref_scores, ref_argmax)
    plain = maxsim.score_pairs_packed(*args, max_q_len=max_q_len, backend=backend)
    torch.testing.assert_close(plain, scores, rtol=0, atol=0)
    torch.testing.assert_close(maxsim.score_pairs_packed_reference(*args), ref_scores)


def test_train_variants_are_autograd_aware(backend_device):
    backend, device = backend_device
    queries, documents, q_len, d_len = candidates_case(device, torch.float32)
    queries.requires_grad_()
    documents.requires_grad_()
    maxsim.score_candidates_padded_train(
        queries, documents, q_len, d_len, backend=backend
    ).sum().backward()
    q_ref = queries.detach().clone().requires_grad_()
    d_ref = documents.detach().clone().requires_grad_()
    maxsim.score_candidates_padded_reference(q_ref, d_ref, q_len, d_len).sum().backward()
    torch.testing.assert_close(queries.grad, q_ref.grad, rtol=0, atol=0)
    torch.testing.assert_close(documents.grad, d_ref.grad, rtol=0, atol=0)

    q, q_off, d, d_off, pq, pd = packed_case(device, torch.float32)
    q.requires_grad_()
    d.requires_grad_()
    maxsim.score_pairs_packed_train(q, q_off, d, d_off, pq, pd, backend=backend).sum().backward()
    q_ref, d_ref = q.detach().clone().requires_grad_(), d.detach().clone().requires_grad_()
    maxsim.score_pairs_packed_reference(q_ref, q_off, d_ref, d_off, pq, pd).sum().backward()
    torch.testing.assert_close(q.grad, q_ref.grad, rtol=0, atol=0)
    torch.testing.assert_close(d.grad, d_ref.grad, rtol=0, atol=0)

    queries = values((3, 6, 20), torch.float32, device).requires_grad_()
    maxsim.score_contrastive_train(queries, d.detach(), d_off, backend=backend).sum().backward()
    q_ref = queries.detach().clone().requires_grad_()
    maxsim.score_contrastive_reference(q_ref, d.detach(), d_off).sum().backward()
    assert_close_rel(queries.grad, q_ref.grad)


def test_accepts_what_the_peer_refused(backend_device):
    """Zero lengths, int64 or int32 indices, Lq and D not multiples of 16."""
    backend, device = backend_device
    queries, documents, q_len, d_len = candidates_case(device, torch.float16, lq=5, h=7)
    q_len[0], d_len[1, 2] = 0, 0
    for index_dtype in (torch.int32, torch.int64):
        scores = maxsim.score_candidates_padded(
            queries, documents, q_len.to(index_dtype), d_len.to(index_dtype), backend=backend
        )
        torch.testing.assert_close(
            scores,
            maxsim.score_candidates_padded_reference(queries, documents, q_len, d_len),
            rtol=0,
            atol=0,
        )
    assert torch.all(scores[0] == 0) and scores[1, 2] == 0


def test_single_pair_reference():
    q, d = values((4, 8)), values((6, 8))
    score, argmax = maxsim.maxsim_reference_with_argmax(q, d)
    sim = q.double() @ d.double().T
    torch.testing.assert_close(score, sim.max(1).values.sum().float())
    assert torch.equal(argmax, sim.argmax(1).to(torch.int32))
    assert maxsim.maxsim_reference(q, d) == score


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_raw_backward_ops_equal_autograd(dtype):
    """That project's raw backward ops (maxsim._ops.ops): float32 (dq, dd) equal to the autograd
    gradients of the forward whose argmax they take, for each layout."""
    from maxsim._ops import ops

    device = "cuda" if torch.cuda.is_available() else "cpu"

    def autograd(fn, q, d, dscore, *rest):
        q, d = q.detach().clone().requires_grad_(), d.detach().clone().requires_grad_()
        (fn(q, d, *rest) * dscore).sum().backward()
        return q.grad.float(), d.grad.float()

    queries, documents, q_len, d_len = candidates_case(device, dtype)
    (b, lq, h), (_, k, ld, _) = queries.shape, documents.shape
    _, argmax = maxsim.score_candidates_padded_with_argmax(queries, documents, q_len, d_len)
    dscore = values((b, k), torch.float32, device, "grid")
    dq, dd = ops.maxsim_padded_backward(
        dscore.flatten(), queries.reshape(b * lq, h), documents.reshape(-1, h), q_len,
        d_len.flatten(), argmax.reshape(b * k, lq), lq, ld, k,
    )
    want = autograd(lambda q, d: maxsim.score_candidates_padded_train(q, d, q_len, d_len),
                    queries, documents, dscore)
    assert dq.dtype == dd.dtype == torch.float32
    torch.testing.assert_close((dq.view(b, lq, h), dd.view(b, k, ld, h)), want, rtol=0, atol=0)

    q, q_off, d, d_off, pq, pd = packed_case(device, dtype)
    _, argmax = maxsim.score_pairs_packed_with_argmax(q, q_off, d, d_off, pq, pd)
    dscore = values((pq.numel(),), torch.float32, device, "grid")
    got = ops.maxsim_packed_backward(dscore, q, q_off, d, d_off, pq, pd, argmax,
                                     argmax.shape[-1])
    want = autograd(lambda q, d: maxsim.score_pairs_packed_train(q, q_off, d, d_off, pq, pd),
                    q, d, dscore)
    torch.testing.assert_close(got, want, rtol=0, atol=0)

    queries = values((3, 6, h), dtype, device, "grid")
    _, argmax = maxsim.score_contrastive_with_argmax(queries, d, d_off)
    dscore = values((3, d_off.numel() - 1), torch.float32, device, "grid")
    got = ops.maxsim_contrastive_backward(dscore, queries, d, d_off, argmax)
    want = autograd(lambda q, d: maxsim.score_contrastive_train(q, d, d_off), queries, d, dscore)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
