"""The fuzz corpus (tests/fuzz_corpus.py) on the CPU: every malformed call raises a clear error
naming the argument, or returns the documented answer; with the value checks off (as on CUDA
outside debug mode) the pure-PyTorch path gives NaN exactly where the rule says."""

import collections

import fuzz_corpus
import maxsim
import pytest
import torch
from maxsim import fallback, validation
from maxsim.layouts import ALLPAIRS

CASES = fuzz_corpus.corpus(seed=0, variants=2)
BY_ENTRY = collections.defaultdict(list)
for _case in CASES:
    BY_ENTRY[_case.entry].append(_case)


def mismatches(cases, values_checked):
    found = []
    for case in cases:
        kind, detail = fuzz_corpus.outcome(case, "cpu", values_checked)
        if kind == "mismatch":
            found.append(f"{case.entry} ({case.what}): {detail}")
    return found


def test_the_corpus_covers_every_public_entry_point():
    covered = {entry.split("[")[0] for entry in BY_ENTRY}
    public = {
        name for name in maxsim.__all__
        if callable(getattr(maxsim, name)) and "reference" not in name
        and name not in ("cuda_ops", "cpu_ops", "metal_ops", "select_ops")
    }
    assert public <= covered, public - covered
    assert len(CASES) > 2000


@pytest.mark.parametrize("entry", sorted(BY_ENTRY))
def test_cpu_calls_raise_a_clear_error_or_answer(entry):
    found = mismatches(BY_ENTRY[entry], values_checked=True)
    assert not found, "\n".join(found[:20])


@pytest.mark.parametrize("entry", sorted(e for e, c in BY_ENTRY.items() if c[-1].nan is not None))
def test_unchecked_values_give_nan_where_documented(entry, monkeypatch):
    """What the CUDA path gives without MAXSIM_DEBUG, from the pure-PyTorch ops."""
    monkeypatch.setattr(validation, "values_checked", lambda t: False)
    cases = [c for c in BY_ENTRY[entry] if c.error is None]
    found = mismatches(cases, values_checked=False)
    assert not found, "\n".join(found[:20])
    assert sum(bool(c.nan.any()) for c in cases) > len(cases) // 2  # most values are bad


def test_errors_name_the_position_and_the_range():
    Q, D = torch.randn(2, 3, 8), torch.randn(4, 5, 8)
    with pytest.raises(ValueError) as info:
        maxsim.maxsim(Q, D, d_lengths=torch.tensor([5, 1, 9, 0], dtype=torch.int32))
    assert str(info.value) == (
        "d_lengths: expected a length in [0, 5] (the padded size), got d_lengths[2] = 9"
    )
    with pytest.raises(ValueError) as info:
        maxsim.maxsim(Q, D.view(2, 2, 5, 8), d_lengths=torch.tensor([[1, 2], [-3, 0]]))
    assert "got d_lengths[1, 0] = -3" in str(info.value)
    with pytest.raises(ValueError, match=r"targets: expected a document index in \[0, 4\), "
                                         r"got targets\[1\] = 4"):
        maxsim.contrastive_loss(Q, D, targets=torch.tensor([0, 4]))


def test_int64_values_past_int32_are_rejected_not_wrapped(monkeypatch):
    Q, D = torch.randn(2, 3, 8), torch.randn(4, 5, 8)
    wrapped = torch.tensor([1, 2**32 + 1, 0, 5])  # 2**32 + 1 would wrap to 1
    with pytest.raises(ValueError, match=r"d_lengths\[1\] = 4294967297"):
        maxsim.maxsim(Q, D, d_lengths=wrapped)
    monkeypatch.setattr(validation, "values_checked", lambda t: False)
    scores = maxsim.maxsim(Q, D, d_lengths=wrapped)
    assert scores[:, 1].isnan().all() and scores[:, [0, 2, 3]].isfinite().all()


META_CALLS = {
    "maxsim": lambda m: maxsim.maxsim(m(2, 3, 8), m(4, 5, 8)),
    "maxsim_with_argmax": lambda m: maxsim.maxsim_with_argmax(m(2, 3, 8), m(2, 4, 5, 8)),
    "maxsim_pairs": lambda m: maxsim.maxsim_pairs(m(2, 3, 8), m(2, 5, 8)),
    "maxsim_varlen": lambda m: maxsim.maxsim_varlen(
        m(5, 8), m(3, dtype=torch.int32), m(7, 8), m(4, dtype=torch.int32), max_seqlen_q=4),
    "score_pairs_packed": lambda m: maxsim.score_pairs_packed(
        m(5, 8), m(3, dtype=torch.int32), m(7, 8), m(4, dtype=torch.int32),
        m(6, dtype=torch.int32), m(6, dtype=torch.int32), max_q_len=4),
    "score_candidates_padded": lambda m: maxsim.score_candidates_padded(
        m(2, 3, 8), m(2, 4, 5, 8), m(2, dtype=torch.int32), m(2, 4, dtype=torch.int32)),
    "score_contrastive": lambda m: maxsim.score_contrastive(
        m(2, 3, 8), m(7, 8), m(4, dtype=torch.int32)),
    "contrastive_loss": lambda m: maxsim.contrastive_loss(m(2, 3, 8), m(4, 5, 8)),
    "contrastive_step": lambda m: maxsim.contrastive_step(m(2, 3, 8), m(4, 5, 8))[0],
    "retrieve": lambda m: maxsim.retrieve(m(2, 3, 8), m(4, 5, 8), 3)[1],
}
META_SHAPES = {
    "maxsim": (2, 4), "maxsim_with_argmax": (2, 4), "maxsim_pairs": (2,), "maxsim_varlen": (2, 3),
    "score_pairs_packed": (6,), "score_candidates_padded": (2, 4), "score_contrastive": (2, 3),
    "contrastive_loss": (), "contrastive_step": (), "retrieve": (2, 3),
}


@pytest.mark.parametrize("entry", sorted(META_CALLS))
def test_meta_tensors_give_the_output_shape(entry):
    def meta(*shape, dtype=torch.float32):
        return torch.empty(shape, dtype=dtype, device="meta")

    out = META_CALLS[entry](meta)
    out = out[0] if isinstance(out, tuple) else out
    assert out.device.type == "meta" and tuple(out.shape) == META_SHAPES[entry]


def test_meta_offsets_without_a_hint_say_so():
    meta = torch.empty(3, dtype=torch.int32, device="meta")
    with pytest.raises(ValueError, match="max_q_len: expected an int for tensors on meta"):
        maxsim.score_pairs_packed(torch.empty(5, 8, device="meta"), meta,
                                  torch.empty(5, 8, device="meta"), meta, meta[:2], meta[:2])


def test_unchecked_bad_values_send_no_gradient(monkeypatch):
    monkeypatch.setattr(validation, "values_checked", lambda t: False)
    Q = torch.randn(2, 3, 8, requires_grad=True)
    D = torch.randn(4, 5, 8, requires_grad=True)
    scores = maxsim.maxsim(Q, D, d_lengths=torch.tensor([5, -2, 3, 99], dtype=torch.int32))
    assert scores[:, [1, 3]].isnan().all() and scores[:, [0, 2]].isfinite().all()
    scores.nan_to_num(0.0).sum().backward()
    assert (D.grad[[1, 3]] == 0).all() and D.grad[[0, 2]].abs().sum() > 0
    q, offsets = torch.randn(6, 8, requires_grad=True), torch.tensor([0, 2, 6])
    pairs = maxsim.score_pairs_packed(q, offsets, q.detach(), offsets, torch.tensor([0, 1, 7]),
                                      torch.tensor([1, 0, 0]), max_q_len=3)
    assert pairs.isnan().tolist() == [False, True, True]  # query 1 (4 tokens) > max_q_len 3
    pairs.nan_to_num(0.0).sum().backward()
    assert (q.grad[2:] == 0).all() and q.grad[:2].abs().sum() > 0


def test_unchecked_targets_give_a_nan_loss(monkeypatch):
    monkeypatch.setattr(validation, "values_checked", lambda t: False)
    Q, D = torch.randn(2, 3, 8), torch.randn(4, 5, 8)
    for targets in (torch.tensor([0, 4]), torch.tensor([-1, 0]), torch.tensor([2**40, 0])):
        assert maxsim.contrastive_loss(Q, D, targets=targets).isnan()
        assert maxsim.contrastive_step(Q, D, targets=targets)[0].isnan()
    assert maxsim.contrastive_loss(Q, D, targets=torch.tensor([3, 0])).isfinite()


def test_unchecked_targets_send_no_gradient_from_their_row(backend_device):
    backend, device = backend_device
    ops = maxsim.select_ops(torch.device(device), backend)
    scores = torch.randn(3, 5, device=device)
    targets = torch.tensor([1, 5, -2], device=device)
    loss, grad = ops.ce(scores, targets, 2.0)
    assert loss.isnan() and (grad[1:] == 0).all()
    expected = torch.softmax(2.0 * scores[0].double(), 0) - torch.eye(5, device=device)[1]
    torch.testing.assert_close(grad[0].double(), expected * 2.0 / 3)


def test_backward_adds_the_gradients_of_segments_sharing_rows(backend_device):
    """Decreasing offsets leave in-range segments overlapping ([0, 4) and [2, 5) here, the middle
    one out of range): the rows they share get both segments' gradients, as in the fallback. On
    CUDA each document token takes its dD from the one document a binary search of the offsets
    finds for it (docs/API.md): the shared rows 2 and 3 take document 0's gradient only."""
    backend, device = backend_device
    ops = maxsim.select_ops(torch.device(device), backend)
    q, q_offsets = torch.randn(5, 8, device=device), torch.tensor([0, 2, 5], dtype=torch.int32)
    d, d_offsets = torch.randn(5, 8, device=device), torch.tensor([0, 4, 2, 5], dtype=torch.int32)
    argmax = torch.stack([torch.randint(0, 4, (2, 3)), torch.full((2, 3), -1),
                          torch.randint(0, 3, (2, 3))], dim=1).int()
    argmax[0, :, 2] = -1  # query 0 has 2 tokens
    grad = torch.randn(2, 3, device=device)
    args = [grad, q, d, argmax.to(device), q_offsets.to(device), d_offsets.to(device), None, None,
            ALLPAIRS, 0]
    (dq, dd), (want_dq, want_dd) = ops.bwd(*args), fallback.bwd(*args)
    torch.testing.assert_close(dq, want_dq)
    if backend == "cuda":
        owned = argmax.clone()
        owned[:, 2][owned[:, 2] < 2] = -1  # document 2's entries on rows 2 and 3
        args[3] = owned.to(device)
        want_dd = fallback.bwd(*args)[1]
    torch.testing.assert_close(dd, want_dd)
