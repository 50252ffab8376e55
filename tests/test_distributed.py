"""maxsim.distributed on two gloo processes (CPU) against one process holding everything.

One spawn serves the whole module (starting processes is the slow part): the workers run every
case on their part of the data, which the parent wrote to disk, and save what they got; each test
compares one case with the single-process result.
"""

import datetime
import os
import warnings

import maxsim
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from maxsim import distributed

pytestmark = pytest.mark.distributed

WORLD = 2
TIMEOUT_S = 120
# The ragged case: queries, documents and document length differ per rank.
RAGGED = [(3, 5, 7), (4, 6, 12)]
CORPUS_SHARDS = (13, 8)  # fewer than top_k on rank 1


def _grid(*shape):
    """Multiples of 1/8 in [-1, 1]: exact in every dtype, so scores tie exactly."""
    return torch.randint(-8, 9, shape).float() / 8


def _data():
    lq, h = 5, 16
    uniform = [(_grid(4, lq, h).requires_grad_(), torch.randn(4, 9, h)) for _ in range(WORLD)]
    ragged = []
    for nq, nd, ld in RAGGED:
        lengths = torch.randint(1, ld + 1, (nd,), dtype=torch.int32)
        mask = torch.rand(nd, ld) < 0.8
        mask[:, 0] = True
        ragged.append((torch.randn(nq, lq, h), torch.randn(nd, ld, h), lengths, mask,
                       torch.randint(0, sum(r[1] for r in RAGGED), (nq,))))
    return {
        "uniform": [(q.detach(), d) for q, d in uniform],
        "uniform_lengths": [torch.randint(1, 10, (4,), dtype=torch.int32) for _ in range(WORLD)],
        "ragged": ragged,
        "queries": _grid(6, lq, h),
        "corpus": _grid(sum(CORPUS_SHARDS), 6, h),
        "corpus_mask": torch.rand(sum(CORPUS_SHARDS), 6) < 0.9,
    }


def _shard(x, rank):
    start = sum(CORPUS_SHARDS[:rank])
    return x[start:start + CORPUS_SHARDS[rank]]


def _loss_and_grads(*args, upstream=None, **kwargs):
    """The rank's loss and its gradients with respect to its queries and documents (of
    ``loss * upstream`` where given)."""
    Q, D = args[0].clone().requires_grad_(), args[1].clone().requires_grad_()
    loss = distributed.contrastive_loss(Q, D, *args[2:], **kwargs)
    (loss if upstream is None else loss * upstream).backward()
    return loss.detach(), Q.grad, D.grad


def _cases(rank, data):
    out = {}
    q, d = data["uniform"][rank]
    out["uniform"] = _loss_and_grads(q, d, temperature=0.05, same_shapes=True)
    out["uniform_again"] = _loss_and_grads(q, d, temperature=0.05, same_shapes=True)
    # other documents of the same shapes in between (the gathered buffer is reused)
    _loss_and_grads(q, d.flip(0) * 2, temperature=0.05, same_shapes=True)
    out["uniform_after_other"] = _loss_and_grads(q, d, temperature=0.05, same_shapes=True)
    # a different upstream gradient on each rank: each scales its own share of every gradient
    out["uniform_scaled"] = _loss_and_grads(q, d, temperature=0.05, same_shapes=True,
                                            upstream=torch.tensor(0.5 * (rank + 1)))
    out["uniform_overlap"] = _loss_and_grads(q, d, temperature=0.05, same_shapes=True,
                                             overlap=True)
    out["uniform_exchange"] = _loss_and_grads(q, d, temperature=0.05)
    out["uniform_normalized"] = _loss_and_grads(q, d, normalize=True)
    lengths = data["uniform_lengths"][rank]
    out["uniform_lengths"] = _loss_and_grads(q, d, d_lengths=lengths, temperature=0.05,
                                             same_shapes=True)
    out["uniform_lengths_overlap"] = _loss_and_grads(q, d, d_lengths=lengths, temperature=0.05,
                                                     same_shapes=True, overlap=True)
    with torch.no_grad():
        out["uniform_no_grad"] = distributed.contrastive_loss(q, d, temperature=0.05)
    marks = []
    distributed.phase_marks = marks.append
    try:
        for overlap in (False, True):
            _loss_and_grads(q, d, same_shapes=True, overlap=overlap)
            marks.append("|")
    finally:
        distributed.phase_marks = None
    out["phases"] = marks
    q, d, lengths, mask, targets = data["ragged"][rank]
    out["ragged_lengths"] = _loss_and_grads(q, d, d_lengths=lengths, targets=targets)
    out["ragged_lengths_overlap"] = _loss_and_grads(q, d, d_lengths=lengths, targets=targets,
                                                    overlap=True)
    out["ragged_mask"] = _loss_and_grads(q, d, None, mask, targets=targets, temperature=0.1)
    out["ragged_mask_overlap"] = _loss_and_grads(q, d, None, mask, targets=targets,
                                                 temperature=0.1, overlap=True)
    out["ragged_plain"] = _loss_and_grads(q, d, targets=targets, overlap=True)
    out["ragged_bf16"] = _loss_and_grads(q.bfloat16(), d.bfloat16(), None, mask,
                                         targets=targets)
    out["ragged_bf16_overlap"] = _loss_and_grads(q.bfloat16(), d.bfloat16(), None, mask,
                                                 targets=targets, overlap=True)
    try:  # a token dim that differs between ranks: every rank raises, none hangs
        distributed.contrastive_loss(q[..., : 8 + 8 * rank], d[..., : 8 + 8 * rank],
                                     targets=targets)
    except ValueError as e:
        out["mismatched_dim"] = str(e)
    queries, corpus = data["queries"], data["corpus"]
    shard, shard_mask = _shard(corpus, rank), _shard(data["corpus_mask"], rank)
    out["retrieve"] = distributed.retrieve(queries, shard, 10)
    out["retrieve_mask"] = distributed.retrieve(queries, shard, 17, None, shard_mask,
                                                chunk_size=3)
    out["retrieve_offset"] = distributed.retrieve(queries, shard, 4,
                                                  offset=sum(CORPUS_SHARDS[:rank]))
    out["retrieve_int8"] = distributed.retrieve(queries, _shard(maxsim.quantize(corpus), rank), 7)
    try:
        distributed.retrieve(queries, shard, sum(CORPUS_SHARDS) + 1)
    except ValueError as e:
        out["retrieve_too_many"] = str(e)
    return out


def _worker(rank, folder):
    dist.init_process_group(  # a file store: no port to race for
        "gloo", init_method=f"file://{os.path.join(folder, 'store')}", rank=rank, world_size=WORLD,
        timeout=datetime.timedelta(seconds=TIMEOUT_S),
    )
    try:
        torch.save(_cases(rank, torch.load(os.path.join(folder, "data.pt"))),
                   os.path.join(folder, f"rank{rank}.pt"))
        dist.barrier()  # no rank tears gloo down while the other still uses it (an abort)
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """``(data, [rank 0's results, rank 1's results])``."""
    torch.manual_seed(35)
    folder = tmp_path_factory.mktemp("distributed")
    data = _data()
    torch.save(data, folder / "data.pt")
    context = mp.spawn(_worker, args=(str(folder),), nprocs=WORLD, join=False)
    results = [folder / f"rank{r}.pt" for r in range(WORLD)]
    try:
        while not context.join(timeout=TIMEOUT_S):
            pass
    except mp.ProcessExitedException as exc:
        # gloo's teardown after the last barrier aborts now and then ("terminate called without
        # an active exception"); every rank's results were written by then and are what is tested
        if exc.signal_name != "SIGABRT" or not all(r.exists() for r in results):
            raise
        warnings.warn(f"a rank aborted in gloo's teardown, after writing its results: {exc}",
                      stacklevel=2)
    return data, [torch.load(r) for r in results]


def _whole(q_parts, d_parts, lengths=None, masks=None):
    """One process's batch: queries and documents of every rank, documents padded to the longest,
    their valid tokens ``[Nd, Ld]`` and the keyword (``d_lengths`` or ``d_mask``) that says so."""
    ld = max(d.size(1) for d in d_parts)
    pad = lambda x: torch.nn.functional.pad(x, [0, 0, 0, ld - x.size(1)], value=7.0)  # noqa: E731
    Q = torch.cat(q_parts).clone().requires_grad_()
    D = torch.cat([pad(d) for d in d_parts]).requires_grad_()
    valid = torch.cat([torch.arange(ld) < d.size(1) for d in d_parts for _ in range(len(d))])
    valid = valid.view(-1, ld)
    kw = {"d_mask": valid}
    if lengths is not None:
        kw = {"d_lengths": torch.cat(lengths)}
        valid = torch.arange(ld) < kw["d_lengths"][:, None]
    if masks is not None:
        kw["d_mask"] = valid = valid & torch.cat(
            [torch.nn.functional.pad(m, [0, ld - m.size(1)]) for m in masks])
    return Q, D, valid, kw


def _loss_f64(Q, D, valid, targets, temperature, normalize):
    """The whole batch's loss in float64 and its gradients."""
    Q, D = Q.detach().double().requires_grad_(), D.detach().double().requires_grad_()
    q, d = (torch.nn.functional.normalize(x, dim=-1) for x in (Q, D)) if normalize else (Q, D)
    q_valid = torch.ones(q.shape[:2], dtype=torch.bool)
    scores = maxsim.reference.maxsim_reference_padded(q[:, None], q_valid[:, None], d[None],
                                                      valid[None])[0]
    loss = torch.nn.functional.cross_entropy(scores / temperature, targets)
    loss.backward()
    return loss.detach(), Q.grad, D.grad


def _relative_error(got, expect):
    return ((got.double() - expect.double()).norm() / expect.double().norm()).item()


def _rank_results(results):
    """The ranks' mean loss and their gradients over WORLD (what DDP applies), as one batch."""
    ld = max(r[2].size(1) for r in results)
    pad = lambda x: torch.nn.functional.pad(x.float(), [0, 0, 0, ld - x.size(1)])  # noqa: E731
    return (sum(r[0].double() for r in results) / WORLD,
            torch.cat([r[1].float() for r in results]) / WORLD,
            torch.cat([pad(r[2]) for r in results]) / WORLD)


def _check(results, whole, truth, valid, tol):
    """The ranks' loss and gradients (padding excluded) are within ``tol`` of the whole batch's;
    in fp32, or as close to the float64 truth as one fp32 process is, whichever is looser (the
    summation order differs, and one process is no closer to the truth)."""
    got = _rank_results(results)
    for i, (g, w) in enumerate(zip(got, whole)):
        t = None if truth is None else truth[i]
        if i == 2:  # the documents' gradient: padding tokens left out
            g, w, t = g[valid], w[valid], None if t is None else t[valid]
        if t is None:
            assert _relative_error(g, w) <= tol
        else:
            assert _relative_error(g, t) <= max(tol, 1.5 * _relative_error(w, t))


@pytest.mark.parametrize("case,temperature,normalize", [
    ("uniform", 0.05, False), ("uniform_overlap", 0.05, False), ("uniform_exchange", 0.05, False),
    ("uniform_normalized", 1.0, True),
])
def test_uniform_loss_equals_one_process(run, case, temperature, normalize):
    data, results = run
    Q, D, valid, _ = _whole([q for q, _ in data["uniform"]], [d for _, d in data["uniform"]])
    loss = maxsim.contrastive_loss(Q, D, temperature=temperature, normalize=normalize)
    loss.backward()
    truth = _loss_f64(Q, D, valid, torch.arange(len(Q)), temperature, normalize)
    _check([r[case] for r in results], (loss.detach(), Q.grad, D.grad), truth, valid, 1e-6)


@pytest.mark.parametrize("case", ["uniform_lengths", "uniform_lengths_overlap"])
def test_uniform_lengths_equal_one_process(run, case):
    data, results = run
    Q, D, valid, kw = _whole([q for q, _ in data["uniform"]], [d for _, d in data["uniform"]],
                             lengths=data["uniform_lengths"])
    loss = maxsim.contrastive_loss(Q, D, temperature=0.05, **kw)
    loss.backward()
    truth = _loss_f64(Q, D, valid, torch.arange(len(Q)), 0.05, False)
    _check([r[case] for r in results], (loss.detach(), Q.grad, D.grad), truth, valid, 1e-6)


def test_upstream_gradient_scales_each_ranks_share(run):
    """Rank r's loss times g_r: the query gradients scale by g_r, each rank's document gradient
    is the sum over ranks of g_s times rank s's part of it."""
    data, results = run
    Q, D, _, _ = _whole([q for q, _ in data["uniform"]], [d for _, d in data["uniform"]])
    Q, D = Q.detach().double().requires_grad_(), D.detach().double().requires_grad_()
    scores = torch.einsum("ith,juh->ijtu", Q, D).amax(3).sum(2)
    losses = torch.nn.functional.cross_entropy(scores / 0.05, torch.arange(len(Q)),
                                               reduction="none")
    weights = torch.cat([torch.full((len(q),), 0.5 * (r + 1))
                         for r, (q, _) in enumerate(data["uniform"])])
    (losses * weights).mean().backward()
    n = len(data["uniform"][0][0])
    for r, got in enumerate(results):
        torch.testing.assert_close(got["uniform_scaled"][0], got["uniform"][0])
        for got_grad, whole in ((got["uniform_scaled"][1], Q.grad), (got["uniform_scaled"][2],
                                                                     D.grad)):
            assert _relative_error(got_grad / WORLD, whole[r * n:(r + 1) * n]) <= 1e-5


def test_repeated_steps_are_bit_identical(run):
    """Deterministic, and nothing of a call (its reused buffers) leaks into the next."""
    for r in run[1]:
        for case in ("uniform_again", "uniform_after_other"):
            for got, first in zip(r[case], r["uniform"]):
                assert torch.equal(got, first)


def test_loss_without_gradients_is_the_same(run):
    for r in run[1]:
        torch.testing.assert_close(r["uniform_no_grad"], r["uniform"][0], rtol=1e-6, atol=0)


def test_phase_marks_name_every_phase_in_order(run):
    fused = ["gather", "step", "reduce_scatter", "scale"]
    overlapped = ["local_score", "gather_wait", "remote_score", "loss", "remote_backward",
                  "local_backward", "reduce_scatter_wait"]
    for r in run[1]:
        assert r["phases"] == fused + ["|"] + overlapped + ["|"]


def test_mismatched_token_dims_raise_on_every_rank(run):
    for r in run[1]:
        assert "token dim" in r["mismatched_dim"]


@pytest.mark.parametrize("case,dtype,temperature", [
    ("ragged_lengths", torch.float32, 1.0), ("ragged_lengths_overlap", torch.float32, 1.0),
    ("ragged_mask", torch.float32, 0.1), ("ragged_mask_overlap", torch.float32, 0.1),
    ("ragged_plain", torch.float32, 1.0),
    ("ragged_bf16", torch.bfloat16, 1.0), ("ragged_bf16_overlap", torch.bfloat16, 1.0),
])
def test_ragged_loss_equals_one_process(run, case, dtype, temperature):
    data, results = run
    parts = data["ragged"]
    Q, D, valid, kw = _whole(
        [p[0].to(dtype) for p in parts], [p[1].to(dtype) for p in parts],
        lengths=[p[2] for p in parts] if case.startswith("ragged_lengths") else None,
        masks=[p[3] for p in parts] if "mask" in case or "bf16" in case else None,
    )
    targets = torch.cat([p[4] for p in parts])
    loss = maxsim.contrastive_loss(Q, D, targets=targets, temperature=temperature, **kw)
    loss.backward()
    fp32 = dtype == torch.float32
    truth = _loss_f64(Q, D, valid, targets, temperature, False) if fp32 else None
    _check([r[case] for r in results], (loss.detach(), Q.grad, D.grad), truth, valid,
           1e-6 if fp32 else 1e-2)


@pytest.mark.parametrize("case,top_k,kwargs", [
    ("retrieve", 10, {}), ("retrieve_mask", 17, {"chunk_size": 3}), ("retrieve_offset", 4, {}),
    ("retrieve_int8", 7, {}),
])
def test_sharded_retrieve_equals_one_process(run, case, top_k, kwargs):
    data, results = run
    corpus = maxsim.quantize(data["corpus"]) if case == "retrieve_int8" else data["corpus"]
    mask = data["corpus_mask"] if case == "retrieve_mask" else None
    scores, ids = maxsim.retrieve(data["queries"], corpus, top_k, None, mask, **kwargs)
    for got_scores, got_ids in (r[case] for r in results):
        assert torch.equal(got_ids, ids)
        assert torch.equal(got_scores, scores)


def test_sharded_retrieve_has_ties_broken_by_index(run):
    _, results = run
    scores, ids = results[0]["retrieve"]
    tied = scores[:, 1:] == scores[:, :-1]
    assert tied.any()  # grid values: the case is exercised
    assert (ids[:, 1:] > ids[:, :-1])[tied].all()


def test_sharded_retrieve_rejects_top_k_above_the_corpus(run):
    for r in run[1]:
        assert "top_k" in r["retrieve_too_many"]
