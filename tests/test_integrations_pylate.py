"""maxsim.integrations.pylate gives PyLate's own scores, losses and gradients."""

import importlib.metadata

import pytest
import torch
from conftest import import_or_skip

import_or_skip("pylate")
import_or_skip("transformers")

import maxsim  # noqa: E402
import pylate.evaluation.colbert_triplet  # noqa: E402
import pylate.losses.distillation  # noqa: E402
import pylate.rank.rank  # noqa: E402
import pylate.scores.similarity_functions  # noqa: E402
from conftest import DEVICES, TOL, unpatched_around_each_test  # noqa: E402
from maxsim.integrations import UnsupportedVersionError  # noqa: E402
from maxsim.integrations import pylate as integration  # noqa: E402
from pylate import losses, models, rank, scores  # noqa: E402

clean_patch = unpatched_around_each_test(integration, "PYLATE_SCORES_BACKEND")



@pytest.fixture
def maxsim_calls(monkeypatch):
    """Counts calls into maxsim, to show that a patched path really uses it."""
    calls = []
    for name in ("maxsim", "maxsim_pairs"):
        function = getattr(maxsim, name)

        def spy(*args, _function=function, _name=name, **kwargs):
            calls.append(_name)
            return _function(*args, **kwargs)

        monkeypatch.setattr(maxsim, name, spy)
    return calls


def both(fn, *tensors):
    """fn(*tensors) with PyLate's own code and with the patch: (values, grads) for each."""
    results = []
    for patched in (False, True):
        integration.patch() if patched else integration.unpatch()
        leaves = [t.detach().clone().requires_grad_(t.is_floating_point()) for t in tensors]
        out = fn(*leaves)
        weights = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(out)
        (out * weights).sum().backward()
        results.append((out.detach(), [leaf.grad for leaf in leaves if leaf.is_floating_point()]))
    integration.unpatch()
    return results


def assert_same(results, tol=TOL):
    (ref, ref_grads), (got, got_grads) = results
    assert got.dtype == ref.dtype and got.shape == ref.shape
    torch.testing.assert_close(got, ref, **tol)
    for g, r in zip(got_grads, ref_grads, strict=True):
        torch.testing.assert_close(g, r, **tol)


def holes(*shape, device="cpu", p=0.3):
    """A mask with holes in the middle (a punctuation skiplist) and a padded tail."""
    mask = torch.rand(*shape, device=device) > p
    mask[..., -2:] = False
    return mask


def call(fn, *args, **kwargs):
    """Look the function up at call time, as PyLate's callers do through their module globals."""
    return lambda *tensors: getattr(scores, fn)(*tensors, *args, **kwargs)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mask_dtype", [torch.bool, torch.float32, torch.int64])
def test_colbert_scores_with_holes(device, mask_dtype):
    q = torch.randn(5, 7, 16, device=device)
    d = torch.randn(6, 11, 16, device=device)
    q_mask = holes(5, 7, device=device).to(mask_dtype)
    d_mask = holes(6, 11, device=device).to(mask_dtype)
    assert_same(both(lambda q, d: scores.colbert_scores(q, d, q_mask, d_mask), q, d))


@pytest.mark.parametrize("device", DEVICES)
def test_masked_zero_wins_when_every_similarity_is_negative(device):
    # Every real similarity is negative: PyLate's masked positions score 0 and win the max, unless
    # the document has none. Doc 0: holes; doc 1: no masked position; doc 2: fully masked.
    q = torch.rand(3, 5, 8, device=device) + 0.1
    d = -(torch.rand(3, 6, 8, device=device) + 0.1)
    d_mask = torch.ones(3, 6, dtype=torch.bool, device=device)
    d_mask[0, [1, 4]] = False
    d_mask[2] = False
    q_mask = torch.ones(3, 5, dtype=torch.bool, device=device)
    q_mask[1, 2:] = False
    results = both(lambda q, d: scores.colbert_scores(q, d, q_mask, d_mask), q, d)
    assert_same(results)
    got = results[1][0]
    assert torch.all(got[:, 0] == 0) and torch.all(got[:, 2] == 0) and torch.all(got[:, 1] < 0)


@pytest.mark.parametrize("device", DEVICES)
def test_no_masks_and_zero_padding_rows(device):
    # rank.rerank pads documents with zero rows and passes no mask: a zero row scores 0 and counts.
    q = torch.randn(2, 5, 8, device=device)
    d = torch.randn(4, 9, 8, device=device)
    d[1, 5:] = 0
    d[3] = -d[3].abs() * torch.sign(q.sum((0, 1)))  # mostly negative similarities
    d[3, 7:] = 0
    assert_same(both(call("colbert_scores"), q, d))


@pytest.mark.parametrize("device", DEVICES)
def test_output_dtype_follows_pylate(device):
    q = torch.randn(3, 5, 16, device=device, dtype=torch.bfloat16)
    d = torch.randn(4, 7, 16, device=device, dtype=torch.bfloat16)
    bf16_tol = dict(rtol=2e-2, atol=5e-2)
    for d_mask in (holes(4, 7, device=device), holes(4, 7, device=device).float()):
        results = both(lambda q, d, m=d_mask: scores.colbert_scores(q, d, None, m), q, d)
        (ref, _), (got, _) = results
        assert got.dtype == ref.dtype  # bf16 with a bool mask, fp32 with a float mask
        torch.testing.assert_close(got, ref, **bf16_tol)


@pytest.mark.parametrize("device", DEVICES)
def test_colbert_kd_scores(device):
    q = torch.randn(4, 6, 16, device=device)
    d = torch.randn(4, 3, 9, 16, device=device)
    d[1, 2] = -(d[1, 2].abs())
    q[1] = q[1].abs()  # query 1 against its third candidate: all similarities negative
    q_mask = holes(4, 6, device=device)
    d_mask = holes(4, 3, 9, device=device)
    d_mask[2, 1] = False
    assert_same(both(lambda q, d: scores.colbert_kd_scores(q, d, q_mask, d_mask), q, d))
    assert_same(both(call("colbert_kd_scores"), q, d))


@pytest.mark.parametrize("device", DEVICES)
def test_colbert_scores_class(device):
    q = torch.randn(4, 6, 16, device=device)
    d = torch.randn(5, 3, 9, 16, device=device)
    q_mask = holes(4, 6, device=device)
    d_mask = holes(5, 3, 9, device=device)
    score = scores.ColBERTScores()
    results = both(lambda q, d: score(q, d, queries_mask=q_mask, documents_mask=d_mask), q, d)
    assert_same(results)
    assert results[0][0].shape == (4, 15)
    assert_same(both(lambda q, d: score(q, d), q, d))


@pytest.mark.parametrize("device", DEVICES)
def test_colbert_scores_pairwise(device):
    q = torch.randn(5, 6, 16, device=device)
    d = torch.randn(5, 8, 16, device=device)
    assert_same(both(call("colbert_scores_pairwise"), q, d))
    # Ragged lists (what the triplet evaluator passes): no padding may take part.
    qs = [torch.randn(n, 16, device=device) for n in (3, 6, 1)]
    ds = [-torch.rand(n, 16, device=device) for n in (9, 2, 5)]
    qs[0] = qs[0].abs()
    results = both(lambda *t: scores.colbert_scores_pairwise(list(t[:3]), list(t[3:])), *qs, *ds)
    assert_same(results)


def test_patch_reaches_every_import_time_copy(maxsim_calls):
    originals = {
        "colbert_scores": scores.colbert_scores,
        "colbert_scores_pairwise": scores.colbert_scores_pairwise,
        "colbert_kd_scores": scores.colbert_kd_scores,
    }
    call_method = scores.ColBERTScores.__call__
    distillation_defaults = losses.Distillation.__init__.__defaults__
    assert integration.patch() is True
    assert integration.patch() is True  # idempotent
    copies = [
        (pylate.scores, "colbert_scores"),
        (pylate.scores.colbert, "colbert_scores"),
        (pylate.scores.similarity_functions, "colbert_scores"),
        (pylate.scores.similarity_functions, "colbert_scores_pairwise"),
        (pylate.rank.rank, "colbert_scores"),
        (pylate.losses.distillation, "colbert_kd_scores"),
        (pylate.evaluation.colbert_triplet, "colbert_scores_pairwise"),
    ]
    for module, name in copies:
        assert getattr(module, name) is not originals[name], f"{module.__name__}.{name}"
    assert losses.Distillation.__init__.__defaults__[0] is pylate.scores.colbert_kd_scores
    assert scores.ColBERTScores.__call__ is not call_method
    scores.ColBERTScores()(torch.randn(2, 3, 8), torch.randn(2, 2, 4, 8))
    assert maxsim_calls == ["maxsim"]
    assert integration.unpatch() is True
    for module, name in copies:
        assert getattr(module, name) is originals[name]
    assert scores.ColBERTScores.__call__ is call_method
    assert losses.Distillation.__init__.__defaults__ is distillation_defaults


def test_patch_wins_over_pylate_backend(monkeypatch, maxsim_calls):
    monkeypatch.setenv("PYLATE_SCORES_BACKEND", "torch")
    integration.patch()
    scores.colbert_scores(torch.randn(2, 3, 8), torch.randn(4, 5, 8), backend="torch")
    assert maxsim_calls == ["maxsim"]


def test_unsupported_inputs_go_to_pylate(maxsim_calls):
    integration.patch()
    q64, d64 = torch.randn(2, 3, 8, dtype=torch.float64), torch.randn(4, 5, 8, dtype=torch.float64)
    integration.unpatch()
    ref = scores.colbert_scores(q64, d64)
    integration.patch()
    torch.testing.assert_close(scores.colbert_scores(q64, d64), ref)
    assert maxsim_calls == []


def test_disable_switch(monkeypatch):
    monkeypatch.setenv("MAXSIM_DISABLE", "1")
    original = scores.colbert_scores
    assert integration.patch() is False
    assert scores.colbert_scores is original


def test_unsupported_version_is_a_clear_error(monkeypatch):
    real = importlib.metadata.version
    monkeypatch.setattr(
        importlib.metadata, "version", lambda name: "1.4.0" if name == "pylate" else real(name)
    )
    with pytest.raises(UnsupportedVersionError, match=r"pylate 1\.4\.0 .*pylate>=1\.5\.0,<1\.7\.0"):
        integration.patch()


# ---- a tiny ColBERT with random weights, trained one step through each loss -------------------


@pytest.fixture(scope="module")
def colbert_dir(tmp_path_factory):
    transformers = pytest.importorskip("transformers")
    path = tmp_path_factory.mktemp("tiny_colbert")
    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", ".", ",", "!", "?"]
    words += [f"w{i}" for i in range(100)]
    tokenizer = transformers.BertTokenizer(vocab={w: i for i, w in enumerate(words)})
    config = transformers.BertConfig(
        vocab_size=len(words),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=64,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    torch.manual_seed(0)
    transformers.BertModel(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


def tiny_colbert(path, device, query_expansion):
    torch.manual_seed(0)
    return models.ColBERT(
        model_name_or_path=path,
        device=device,
        embedding_size=16,
        query_length=12,
        document_length=20,
        do_query_expansion=query_expansion,
    )


def sentences(n, seed, punctuation=True):
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        length = int(torch.randint(1, 14, (1,), generator=g))
        words = [f"w{int(i)}" for i in torch.randint(0, 100, (length,), generator=g)]
        if punctuation:  # skiplist tokens in the middle of the document
            words.insert(length // 2, ".")
            words.insert(1, ",")
        out.append(" ".join(words))
    return out


def features(model, n_queries, n_docs_per_query):
    def on_device(batch):  # tokenize returns CPU tensors; the training loop moves them
        return {k: v.to(model.device) if torch.is_tensor(v) else v for k, v in batch.items()}

    q = on_device(model.tokenize(sentences(n_queries, 1, punctuation=False), is_query=True))
    docs = on_device(model.tokenize(sentences(n_queries * n_docs_per_query, 2), is_query=False))
    groups = [{k: v[i::n_docs_per_query] for k, v in docs.items()} for i in range(n_docs_per_query)]
    return q, docs, groups


def step(model, loss, feats, labels=None):
    """One loss evaluation and backward: (loss, {parameter: grad})."""
    model.zero_grad()
    value = loss(feats, labels) if labels is not None else loss(feats)
    value.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return value.detach(), grads


def loss_both_ways(make_loss, model, feats, labels=None):
    out = []
    for patched in (False, True):
        integration.patch() if patched else integration.unpatch()
        out.append(step(model, make_loss(), feats, labels))
    integration.unpatch()
    (ref, ref_grads), (got, got_grads) = out
    torch.testing.assert_close(got, ref, **TOL)
    assert ref_grads.keys() == got_grads.keys() and ref_grads
    for name in ref_grads:
        torch.testing.assert_close(got_grads[name], ref_grads[name], **TOL, msg=name)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("query_expansion", [True, False])
def test_contrastive_loss(colbert_dir, device, query_expansion, maxsim_calls):
    model = tiny_colbert(colbert_dir, device, query_expansion)
    q, _, groups = features(model, 4, 2)
    feats = [q, *groups]
    loss_both_ways(lambda: losses.Contrastive(model=model, temperature=0.5), model, feats)
    loss_both_ways(lambda: losses.Contrastive(model=model, score_mini_batch_size=3), model, feats)
    assert "maxsim" in maxsim_calls


@pytest.mark.parametrize("device", DEVICES)
def test_cached_contrastive_loss(colbert_dir, device, maxsim_calls):
    model = tiny_colbert(colbert_dir, device, query_expansion=False)
    q, _, groups = features(model, 5, 2)
    loss_both_ways(
        lambda: losses.CachedContrastive(model=model, mini_batch_size=2, score_mini_batch_size=2),
        model,
        [q, *groups],
    )
    assert "maxsim" in maxsim_calls


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("normalize_scores", [True, False])
def test_distillation_loss(colbert_dir, device, normalize_scores, maxsim_calls):
    model = tiny_colbert(colbert_dir, device, query_expansion=False)
    q, docs, _ = features(model, 3, 4)
    labels = torch.randn(3, 4, device=device).log_softmax(-1)
    loss_both_ways(
        lambda: losses.Distillation(model=model, normalize_scores=normalize_scores),
        model,
        [q, docs],
        labels,
    )
    assert "maxsim" in maxsim_calls


def test_rerank(colbert_dir):
    model = tiny_colbert(colbert_dir, "cpu", query_expansion=True)
    queries = model.encode(sentences(2, 3), is_query=True, convert_to_tensor=True)
    documents = [model.encode(sentences(n, 4 + n), is_query=False) for n in (3, 4)]
    ids = [[f"d{i}" for i in range(len(docs))] for docs in documents]
    ref = rank.rerank(documents_ids=ids, queries_embeddings=queries, documents_embeddings=documents)
    integration.patch()
    got = rank.rerank(documents_ids=ids, queries_embeddings=queries, documents_embeddings=documents)
    for ref_q, got_q in zip(ref, got, strict=True):
        assert [r["id"] for r in ref_q] == [g["id"] for g in got_q]
        torch.testing.assert_close(
            torch.tensor([g["score"] for g in got_q]),
            torch.tensor([r["score"] for r in ref_q]),
            **TOL,
        )
