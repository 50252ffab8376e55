"""``maxsim.Corpus``: a packed corpus that ``retrieve`` scans without padding, exactly like the
float64 reference over the ragged documents; saved and loaded with safetensors."""

import maxsim
import pytest
import torch
from conftest import random_mask, values
from test_retrieve import full_ranking


def ragged(lengths, dim, dtype, device, kind="normal"):
    return [values((n, dim), dtype, device, kind) for n in lengths]


def reference_scores(Q, docs, q_mask=None):
    """float64 MaxSim of every query against every ragged document (an empty document: 0)."""
    q = Q.double()
    valid = torch.ones(q.shape[:2], dtype=torch.bool) if q_mask is None else q_mask.cpu()
    out = torch.zeros(q.size(0), len(docs), dtype=torch.float64)
    for j, d in enumerate(docs):
        if d.size(0) == 0:
            continue
        best = torch.einsum("qih,jh->qij", q.cpu(), d.double().cpu()).amax(-1)
        out[:, j] = torch.where(valid, best, 0.0).sum(-1)
    return out


@pytest.mark.parametrize("dim", [7, 16, 33])
@pytest.mark.parametrize("chunk_size", [1, 5, None])
def test_packed_scan_equals_reference_top_k(backend_device, dim, chunk_size):
    """Grid values: every summation order gives the same scores, so the ranking must match the
    float64 one exactly, ties (repeated and empty documents) to the lower index."""
    backend, device = backend_device
    lengths = [0, 5, 1, 12, 3, 0, 9, 5, 2, 7, 11, 4, 6]
    docs = ragged(lengths, dim, torch.float32, device, "grid")
    docs[7] = docs[1].clone()  # a repeated document: an exact tie
    Q = values((4, 6, dim), torch.float32, device, "grid")
    q_mask = random_mask((4, 6), device)
    q_mask[3] = False  # an empty query: every document scores 0
    corpus = maxsim.Corpus.from_embeddings(docs, dtype=torch.float32)
    scores, indices = maxsim.retrieve(Q, corpus, 6, q_mask, chunk_size=chunk_size,
                                      backend=backend)
    ref_scores, ref_indices = full_ranking(reference_scores(Q, docs, q_mask).float(), 6)
    torch.testing.assert_close(scores.cpu(), ref_scores, rtol=0, atol=0)
    assert torch.equal(indices.cpu(), ref_indices)
    assert torch.equal(indices[3].cpu(), torch.arange(6))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_corpus_matches_reference(backend_device, dtype):
    backend, device = backend_device
    docs = ragged([3, 17, 1, 8, 30, 2, 9], 16, dtype, device)
    Q = values((3, 5, 16), dtype, device)
    corpus = maxsim.Corpus.from_embeddings(docs, dtype=dtype)
    scores, indices = maxsim.retrieve(Q, corpus, 7, chunk_size=3, backend=backend)
    ref = reference_scores(Q, docs)
    exact = ref.gather(1, indices.cpu())
    torch.testing.assert_close(scores.cpu().double(), exact, rtol=2e-3, atol=2e-3)
    ref_top = ref.topk(7).values
    torch.testing.assert_close(scores.cpu().double(), ref_top, rtol=2e-3, atol=2e-3)


def test_nan_token_makes_its_document_nan(backend_device):
    backend, device = backend_device
    docs = ragged([4, 6, 3, 5], 8, torch.float32, device, "grid")
    docs[2][1, 3] = float("nan")
    Q = values((2, 3, 8), torch.float32, device, "grid")
    corpus = maxsim.Corpus.from_embeddings(docs, dtype=torch.float32)
    scores, indices = maxsim.retrieve(Q, corpus, 4, chunk_size=2, backend=backend)
    # torch.topk ranks NaN above every number
    assert torch.equal(indices[:, 0].cpu(), torch.tensor([2, 2]))
    assert scores[:, 0].isnan().all() and not scores[:, 1:].isnan().any()


@pytest.mark.parametrize("fmt", ["int8", "fp8_e4m3"])
def test_codes_only_scan_scores_the_dequantized_tokens(backend_device, fmt):
    backend, device = backend_device
    docs = ragged([5, 1, 9, 0, 13, 4, 7, 2], 32, torch.float16, device)
    Q = values((3, 6, 32), torch.float16, device)
    corpus = maxsim.Corpus.from_embeddings(docs, codes=fmt, keep_tokens=False)
    assert corpus.tokens is None and corpus.codes.format == fmt
    scores, indices = maxsim.retrieve(Q, corpus, 8, chunk_size=3, backend=backend)
    deq = corpus.codes.dequantize().cpu()
    cuts = corpus.host_offsets.tolist()
    ref = reference_scores(Q, [deq[a:b] for a, b in zip(cuts[:-1], cuts[1:])])
    torch.testing.assert_close(scores.cpu().double(), ref.gather(1, indices.cpu()),
                               rtol=2e-3, atol=2e-3)


def test_two_stage_returns_exact_scores_of_the_tokens(backend_device):
    """Grid values: the pairs kernel (rescore) and the all-pairs one (scan) give the same fp32
    scores, so the two-stage search over every document is the exact scan, ties included."""
    backend, device = backend_device
    docs = ragged([int(n) for n in torch.randint(0, 20, (60,))], 32, torch.float16, device, "grid")
    Q = values((5, 7, 32), torch.float16, device, "grid")
    corpus = maxsim.Corpus.from_embeddings(docs, codes="int8")
    scores, indices = maxsim.retrieve(Q, corpus, 5, rescore=True, candidates=60,
                                      chunk_size=16, backend=backend)
    exact, exact_idx = maxsim.retrieve(Q, corpus.tokens_only(), 5, backend=backend)
    assert torch.equal(indices, exact_idx)
    # the rescore scores pairs, the exact scan all pairs: other tiles, fp32 sums in another order
    torch.testing.assert_close(scores, exact, rtol=1e-6, atol=1e-6)
    _, few = maxsim.retrieve(Q, corpus, 3, rescore=True, candidates=6, backend=backend)
    ref = reference_scores(Q, docs)
    assert (few.cpu() < 60).all() and few.shape == (5, 3)
    torch.testing.assert_close(ref.gather(1, few.cpu()).float(),
                               ref.gather(1, few.cpu()).float().sort(1, descending=True).values)


def test_save_and_load_round_trip(tmp_path):
    pytest.importorskip("safetensors")
    docs = ragged([3, 0, 8, 5], 16, torch.float16, "cpu")
    corpus = maxsim.Corpus.from_embeddings(docs, codes="int8")
    corpus.save(tmp_path / "c.safetensors")
    back = maxsim.Corpus.load(tmp_path / "c.safetensors")
    assert torch.equal(back.tokens, corpus.tokens) and torch.equal(back.offsets, corpus.offsets)
    assert torch.equal(back.codes.codes, corpus.codes.codes)
    assert torch.equal(back.codes.scale, corpus.codes.scale)
    assert len(back) == 4 and back.num_tokens == 16 and back.dim == 16
    assert torch.equal(back.lengths(), torch.tensor([3, 0, 8, 5]))


def test_bad_input_names_the_argument():
    tokens = torch.randn(10, 8)
    with pytest.raises(ValueError, match="offsets"):
        maxsim.Corpus(torch.tensor([0, 4, 3, 10]), tokens)
    with pytest.raises(ValueError, match="offsets"):
        maxsim.Corpus(torch.tensor([0, 4, 9]), tokens)
    with pytest.raises(ValueError, match="neither"):
        maxsim.Corpus(torch.tensor([0, 10]))
    with pytest.raises(ValueError, match=r"embeddings\[1\]"):
        maxsim.Corpus.from_embeddings([torch.randn(3, 8), torch.randn(2, 9)])
    corpus = maxsim.Corpus(torch.tensor([0, 4, 10]), tokens)
    with pytest.raises(ValueError, match="d_mask"):
        maxsim.retrieve(torch.randn(1, 2, 8), corpus, 1, d_mask=torch.ones(2, 5, dtype=bool))
    with pytest.raises(ValueError, match="codes and tokens"):
        maxsim.retrieve(torch.randn(1, 2, 8), corpus, 1, rescore=True)
    with pytest.raises(ValueError, match="top_k"):
        maxsim.retrieve(torch.randn(1, 2, 8), corpus, 3)
    with pytest.raises(ValueError, match="last dim"):
        maxsim.retrieve(torch.randn(1, 2, 7), corpus, 1)


def test_gather_packs_the_chosen_documents():
    docs = ragged([3, 0, 8, 5, 1, 7], 16, torch.float16, "cpu")
    corpus = maxsim.Corpus.from_embeddings(docs)
    ids = torch.tensor([4, 1, 2, 4, 0])
    tokens, offsets = corpus.gather(ids, "cpu")
    assert offsets.tolist() == [0, 1, 1, 9, 10, 13]
    for j, i in enumerate(ids.tolist()):
        assert torch.equal(tokens[offsets[j]:offsets[j + 1]], docs[i])


@pytest.mark.cuda
def test_codes_on_the_gpu_tokens_in_host_memory():
    """The scan reads codes on the GPU; only the candidates' tokens are copied for the rescore,
    which gives the same exact result as a corpus held wholly on the GPU."""
    docs = ragged([int(n) for n in torch.randint(1, 40, (300,))], 64, torch.float16, "cpu")
    host = maxsim.Corpus.from_embeddings(docs).with_codes("int8", device="cuda")
    assert host.tokens.device.type == "cpu" and host.codes.device.type == "cuda"
    on_gpu = maxsim.Corpus.from_embeddings(docs, device="cuda", codes="int8")
    Q = values((9, 32, 64), torch.float16, "cuda")
    scores, ids = maxsim.retrieve(Q, host, 10, rescore=True, chunk_size=64)
    ref_scores, ref_ids = maxsim.retrieve(Q, on_gpu, 10, rescore=True, chunk_size=64)
    assert torch.equal(ids, ref_ids)
    torch.testing.assert_close(scores, ref_scores, rtol=0, atol=0)
    exact = reference_scores(Q, docs).gather(1, ids.cpu())
    torch.testing.assert_close(scores.cpu().double(), exact, rtol=2e-3, atol=2e-3)


@pytest.mark.cuda
def test_int8_scan_on_cuda_rescored_matches_the_fp16_scan():
    """Int8 queries x int8 codes (integer tensor cores) over a packed corpus, then exact
    rescoring: the fp16 scan's top-10 with its scores, where the candidates hold it."""
    docs = ragged([int(n) for n in torch.randint(8, 300, (2000,))], 96, torch.float16, "cuda")
    corpus = maxsim.Corpus.from_embeddings(docs, codes="int8")
    Q = torch.stack([d[torch.randint(0, d.size(0), (32,))] for d in docs[:16]])
    Q = (Q + 0.3 * torch.randn_like(Q)).half()
    exact, exact_ids = maxsim.retrieve(Q, corpus.tokens_only(), 10)
    scores, ids = maxsim.retrieve(Q, corpus, 10, rescore=True, candidates=100)
    # the pairs kernel and the all-pairs one may sum in another order: near-ties may swap
    torch.testing.assert_close(scores, exact, rtol=1e-5, atol=1e-5)
    overlap = (ids[:, :, None] == exact_ids[:, None, :]).any(1).float().mean()
    assert overlap >= 0.99, (ids, exact_ids)
    codes_scores, _ = maxsim.retrieve(maxsim.quantize(Q), corpus.codes_only(), 10)
    assert (codes_scores - exact).abs().max() < 0.05 * exact.abs().max()
