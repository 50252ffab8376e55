"""Malformed input raises ValueError / TypeError naming the argument; index values are checked
on the CPU always, elsewhere under MAXSIM_DEBUG=1 (tests/test_fuzz.py covers every entry point)."""

import maxsim
import pytest
import torch
from maxsim import validation

H = 8


def t(*shape, dtype=torch.float32, device="cpu"):
    return (
        torch.randn(shape, device=device).to(dtype)
        if dtype.is_floating_point
        else torch.zeros(shape, dtype=dtype, device=device)
    )


def raises(exc, name, fn, *args, **kwargs):
    with pytest.raises(exc) as info:
        fn(*args, **kwargs)
    assert str(info.value).startswith(name + ":") or f"{name}:" in str(info.value), str(info.value)
    return str(info.value)


Q, D = t(2, 3, H), t(4, 5, H)
OFF = torch.tensor([0, 2, 5], dtype=torch.int32)
PACKED = t(5, H)
PAIR = torch.tensor([1, 0], dtype=torch.int32)  # valid ids for two segments


@pytest.mark.parametrize(
    "case",
    [
        ("Q", ValueError, lambda: maxsim.maxsim(t(3, H), D)),
        ("Q", ValueError, lambda: maxsim.maxsim(torch.tensor(1.0), D)),
        ("Q", ValueError, lambda: maxsim.contrastive_step(torch.tensor(1.0), D)),
        ("Q", TypeError, lambda: maxsim.maxsim([[1.0]], D)),
        ("Q", TypeError, lambda: maxsim.maxsim(t(2, 3, H, dtype=torch.int32), D)),
        ("Q", TypeError, lambda: maxsim.maxsim(t(2, 3, H, dtype=torch.float64), D)),
        ("Q", ValueError, lambda: maxsim.maxsim(t(2, 3, 0), t(4, 5, 0))),
        ("D", ValueError, lambda: maxsim.maxsim(Q, t(5, H))),
        ("D", ValueError, lambda: maxsim.maxsim(Q, t(1, 2, 3, 4, H))),
        ("D", TypeError, lambda: maxsim.maxsim(Q, t(4, 5, H, dtype=torch.float16))),
        ("D", ValueError, lambda: maxsim.maxsim(Q, t(4, 5, H + 1))),
        ("D", ValueError, lambda: maxsim.maxsim(Q, t(4, 5, H, device="meta"))),
        ("D", ValueError, lambda: maxsim.maxsim(Q, t(3, 2, 5, H))),
        (
            "q_mask",
            ValueError,
            lambda: maxsim.maxsim(Q, D, q_mask=torch.ones(2, 4, dtype=torch.bool)),
        ),
        (
            "q_mask",
            ValueError,
            lambda: maxsim.maxsim(Q, D, q_mask=torch.ones(2, 3, dtype=torch.bool, device="meta")),
        ),
        (
            "q_mask",
            TypeError,
            lambda: maxsim.maxsim(Q, D, q_mask=torch.ones(2, 3, dtype=torch.complex64)),
        ),
        ("q_mask", TypeError, lambda: maxsim.maxsim(Q, D, q_mask=[[True] * 3] * 2)),
        ("d_mask", ValueError, lambda: maxsim.maxsim(Q, D, d_mask=torch.ones(4, dtype=torch.bool))),
        (
            "d_mask",
            ValueError,
            lambda: maxsim.maxsim(Q, t(2, 3, 5, H), d_mask=torch.ones(6, 5, dtype=torch.bool)),
        ),
        ("backend", ValueError, lambda: maxsim.maxsim(Q, D, backend="triton")),
        ("D", ValueError, lambda: maxsim.maxsim_pairs(Q, D)),
        ("D", ValueError, lambda: maxsim.maxsim_pairs(Q, t(2, 5))),
    ],
)
def test_native_surface_names_the_argument(case):
    name, exc, call = case
    raises(exc, name, call)


@pytest.mark.parametrize(
    "case",
    [
        ("q", ValueError, lambda: maxsim.maxsim_varlen(Q, OFF, PACKED, OFF)),
        ("cu_seqlens_q", TypeError, lambda: maxsim.maxsim_varlen(PACKED, OFF.float(), PACKED, OFF)),
        ("cu_seqlens_q", ValueError, lambda: maxsim.maxsim_varlen(PACKED, OFF[None], PACKED, OFF)),
        ("cu_seqlens_q", ValueError, lambda: maxsim.maxsim_varlen(PACKED, OFF[:0], PACKED, OFF)),
        (
            "cu_seqlens_d",
            ValueError,
            lambda: maxsim.maxsim_varlen(PACKED, OFF, PACKED, OFF.to("meta")),
        ),
        (
            "cu_seqlens_d",
            ValueError,
            lambda: maxsim.maxsim_varlen(PACKED, OFF, PACKED, OFF, num_candidates=2),
        ),
        (
            "num_candidates",
            ValueError,
            lambda: maxsim.maxsim_varlen(PACKED, OFF, PACKED, OFF, num_candidates=-1),
        ),
        (
            "num_candidates",
            ValueError,
            lambda: maxsim.maxsim_varlen(
                PACKED, OFF, PACKED, OFF, num_candidates=1, pair_q=PAIR, pair_d=PAIR
            ),
        ),
        (
            "pair_d",
            ValueError,
            lambda: maxsim.maxsim_varlen(PACKED, OFF, PACKED, OFF, pair_q=PAIR),
        ),
        (
            "pair_q",
            ValueError,
            lambda: maxsim.maxsim_varlen(PACKED, OFF, PACKED, OFF, pair_d=PAIR),
        ),
        (
            "pair_d",
            ValueError,
            lambda: maxsim.maxsim_varlen(PACKED, OFF, PACKED, OFF, pair_q=PAIR, pair_d=OFF),
        ),
        (
            "pair_q",
            TypeError,
            lambda: maxsim.maxsim_varlen(
                PACKED, OFF, PACKED, OFF, pair_q=PAIR.float(), pair_d=PAIR
            ),
        ),
        (
            "max_seqlen_q",
            ValueError,
            lambda: maxsim.maxsim_varlen(PACKED, OFF, PACKED, OFF, max_seqlen_q=-1),
        ),
        (
            "d_mask",
            ValueError,
            lambda: maxsim.maxsim_varlen(PACKED, OFF, PACKED, OFF, d_mask=torch.ones(4) > 0),
        ),
    ],
)
def test_varlen_names_the_argument(case):
    name, exc, call = case
    raises(exc, name, call)


LQ, LD = torch.tensor([3, 1]), torch.tensor([[5, 2, 0]] * 2)
CAND = t(2, 3, 5, H)


@pytest.mark.parametrize(
    "case",
    [
        ("queries", ValueError, lambda: maxsim.score_candidates_padded(t(3, H), CAND, LQ, LD)),
        ("documents", ValueError, lambda: maxsim.score_candidates_padded(Q, t(3, 3, 5, H), LQ, LD)),
        ("documents", TypeError, lambda: maxsim.score_candidates_padded(Q, CAND.half(), LQ, LD)),
        ("query_lengths", ValueError, lambda: maxsim.score_candidates_padded(Q, CAND, LQ[:1], LD)),
        (
            "query_lengths",
            TypeError,
            lambda: maxsim.score_candidates_padded(Q, CAND, LQ.float(), LD),
        ),
        ("doc_lengths", ValueError, lambda: maxsim.score_candidates_padded(Q, CAND, LQ, LD[:, :2])),
        (
            "doc_lengths",
            ValueError,
            lambda: maxsim.score_candidates_padded(Q, CAND, LQ, LD.to("meta")),
        ),
        ("documents", ValueError, lambda: maxsim.score_contrastive(Q, D, OFF)),
        ("document_offsets", TypeError, lambda: maxsim.score_contrastive(Q, PACKED, OFF.double())),
        (
            "queries",
            ValueError,
            lambda: maxsim.score_pairs_packed(Q, OFF, PACKED, OFF, PAIR, PAIR),
        ),
        (
            "pair_document_ids",
            ValueError,
            lambda: maxsim.score_pairs_packed(PACKED, OFF, PACKED, OFF, PAIR, OFF),
        ),
        (
            "max_q_len",
            ValueError,
            lambda: maxsim.score_pairs_packed(PACKED, OFF, PACKED, OFF, PAIR, PAIR, max_q_len=2.5),
        ),
        ("corpus", TypeError, lambda: maxsim.retrieve(Q, D.half(), 2)),
        ("top_k", ValueError, lambda: maxsim.retrieve(Q, D, 5)),
        ("top_k", ValueError, lambda: maxsim.retrieve(Q, D, -1)),
        ("chunk_size", ValueError, lambda: maxsim.retrieve(Q, D, 2, chunk_size=0)),
        ("d_mask", ValueError, lambda: maxsim.retrieve(Q, D, 2, d_mask=torch.ones(4, 4) > 0)),
    ],
)
def test_compat_and_retrieve_name_the_argument(case):
    name, exc, call = case
    raises(exc, name, call)


def test_errors_show_the_shape_and_the_expectation():
    message = raises(ValueError, "D", maxsim.maxsim, Q, t(4, 5, H + 1))
    assert f"last dim {H}" in message and f"(4, 5, {H + 1})" in message
    message = raises(ValueError, "Q", maxsim.maxsim, t(3, H), D)
    assert "3-D [Nq, Lq, H]" in message and f"(3, {H})" in message


def test_backend_cuda_without_extension_says_why():
    if maxsim.cuda_ops()[0] is not None:
        pytest.skip("the CUDA extension is available here")
    with pytest.raises(
        RuntimeError, match="backend='cuda'.*unavailable: " + maxsim.cuda_ops()[1][:20]
    ):
        maxsim.maxsim(Q, D, backend="cuda")


def test_only_a_strided_last_dim_is_copied():
    x = t(4, 3, H).transpose(0, 1)  # batch dims permuted, last dim contiguous
    assert validation.embeddings("Q", x, ("Nq", "Lq", "H")) is x
    y = t(2, H, 3).transpose(1, 2)  # stride(-1) == 3
    copy = validation.embeddings("Q", y, ("Nq", "Lq", "H"))
    assert copy.stride(-1) == 1 and torch.equal(copy, y)
    torch.testing.assert_close(
        maxsim.maxsim(y, D), maxsim.maxsim(y.contiguous(), D), rtol=0, atol=0
    )


# ---- value checks: on the CPU always (MAXSIM_DEBUG=1 adds them elsewhere) ----


@pytest.fixture
def debug(monkeypatch):
    monkeypatch.setenv("MAXSIM_DEBUG", "1")


def pairs_call(q_off=OFF, d_off=OFF, pq=None, pd=None, **kw):
    pq = torch.tensor([0, 1]) if pq is None else pq
    pd = torch.tensor([1, 0]) if pd is None else pd
    return maxsim.score_pairs_packed(PACKED, q_off, PACKED, d_off, pq, pd, **kw)


@pytest.mark.parametrize(
    "case",
    [
        ("query_offsets", "[0] == 0", dict(q_off=torch.tensor([1, 2, 5]))),
        ("query_offsets", "non-decreasing", dict(q_off=torch.tensor([0, 3, 2, 5]))),
        ("document_offsets", "== 5 (the number of tokens)", dict(d_off=torch.tensor([0, 2, 4]))),
        ("pair_query_ids", "query id in [0, 2)", dict(pq=torch.tensor([0, 2]))),
        ("pair_document_ids", "document id in [0, 2)", dict(pd=torch.tensor([-1, 0]))),
        ("max_q_len", "longest query", dict(max_q_len=2)),
    ],
)
def test_debug_mode_checks_values(debug, case):
    name, expectation, kwargs = case
    message = raises(ValueError, name, pairs_call, **kwargs)
    assert expectation in message


def test_debug_mode_checks_lengths(debug):
    raises(
        ValueError,
        "query_lengths",
        maxsim.score_candidates_padded,
        Q,
        CAND,
        torch.tensor([4, 1]),
        LD,
    )
    raises(
        ValueError,
        "doc_lengths",
        maxsim.score_candidates_padded,
        Q,
        CAND,
        LQ,
        torch.tensor([[5, 6, 0]] * 2),
    )
    raises(
        ValueError,
        "query_lengths",
        maxsim.score_candidates_padded,
        Q,
        CAND,
        torch.tensor([-1, 1]),
        LD,
    )


def test_debug_mode_checks_varlen(debug):
    raises(
        ValueError,
        "cu_seqlens_d",
        maxsim.maxsim_varlen,
        PACKED,
        OFF,
        PACKED,
        torch.tensor([0, 6, 5]),
    )
    raises(
        ValueError,
        "pair_d",
        maxsim.maxsim_varlen,
        PACKED,
        OFF,
        PACKED,
        OFF,
        pair_q=torch.tensor([0]),
        pair_d=torch.tensor([2]),
    )
    raises(
        ValueError, "max_seqlen_q", maxsim.maxsim_varlen, PACKED, OFF, PACKED, OFF, max_seqlen_q=1
    )


def test_cpu_values_are_checked_without_debug(monkeypatch):
    monkeypatch.delenv("MAXSIM_DEBUG", raising=False)
    message = raises(ValueError, "query_lengths", maxsim.score_candidates_padded, Q, CAND,
                     torch.tensor([4, 1]), LD)
    assert "got query_lengths[0] = 4" in message
    message = raises(ValueError, "max_q_len", pairs_call, max_q_len=2)
    assert "query 1's 3 tokens" in message
    raises(ValueError, "document_offsets", pairs_call, d_off=torch.tensor([0, 7, 5]))
    raises(ValueError, "pair_query_ids", pairs_call, pq=torch.tensor([0, -1]))


def test_debug_mode_accepts_good_input(debug):
    pairs_call(max_q_len=3)
    maxsim.score_candidates_padded(Q, CAND, LQ, LD)
    maxsim.maxsim_varlen(PACKED, OFF, PACKED, OFF, num_candidates=1, max_seqlen_q=3)


def test_masks_come_out_contiguous_bool():
    base = torch.rand(2, 6) > 0.5
    strided = base[:, ::2]
    out = validation.mask("q_mask", strided, (2, 3), torch.device("cpu"))
    assert out.dtype == torch.bool and out.is_contiguous() and torch.equal(out, strided)
    torch.testing.assert_close(maxsim.maxsim(Q, D, q_mask=strided), maxsim.maxsim(Q, D, q_mask=out))


@pytest.mark.parametrize(
    "args",
    [
        lambda: (t(2, 3, H, dtype=torch.float16), t(4, 5, H, dtype=torch.float16), {}),
        lambda: (t(2, 3, H), t(2, 6, 5, H),
                 {"d_lengths": torch.randint(0, 6, (2, 6), dtype=torch.int32)}),
        lambda: (t(2, 3, H, dtype=torch.bfloat16), t(4, 5, H, dtype=torch.bfloat16),
                 {"d_lengths": torch.tensor([0, 5, 2, 1], dtype=torch.int32)}),
        lambda: (t(1, 1, H), t(1, 1, 1, H), {}),
        lambda: (t(2, 3, H), t(2, 6, 5, H),
                 {"q_lengths": torch.tensor([3, 0], dtype=torch.int32),
                  "d_lengths": torch.randint(0, 6, (2, 6), dtype=torch.int32)}),
        lambda: (t(2, 3, H), t(4, 5, H),  # int64 lengths: converted on the short path too
                 {"q_lengths": torch.tensor([3, 1]), "d_lengths": torch.tensor([0, 5, 2, 1])}),
    ],
)
def test_plain_calls_skip_the_layered_checks_with_the_same_token_sets(args):
    """The short path of plain padded calls hands the op what the fully checked path does."""
    from maxsim import native

    Q, D, kw = args()
    q_lengths, d_lengths = kw.get("q_lengths"), kw.get("d_lengths")
    fast = native._plain_sets(Q, D, None, None, False, q_lengths, d_lengths)
    assert fast is not None
    full_mask = torch.ones(D.shape[:-1])  # a float mask forces the checked path
    layered = native.padded_sets(Q, D, None, full_mask, False, q_lengths, d_lengths)
    for a, b in zip(fast[0], layered[0], strict=True):  # queries: identical
        assert a is b or torch.equal(a, b)
    assert torch.equal(fast[1].x, layered[1].x) and fast[2:] == layered[2:]
    assert (fast[1].lengths is None) == (layered[1].lengths is None)
    if fast[1].lengths is not None:
        assert torch.equal(fast[1].lengths, layered[1].lengths)


@pytest.mark.parametrize("rank", [3, 4])
def test_bool_masks_take_the_plain_path_with_the_same_token_sets(rank):
    """Contiguous bool masks (PyLate's) stay on the short path and reach the op as the checked
    path hands them over (float masks of the same values go through the checks)."""
    from maxsim import native

    Q = t(2, 3, H, dtype=torch.float16)
    D = t(2, 4, 5, H, dtype=torch.float16) if rank == 4 else t(4, 5, H, dtype=torch.float16)
    q_mask = torch.rand(2, 3) > 0.3
    d_mask = torch.rand(D.shape[:-1]) > 0.3
    fast = native._plain_sets(Q, D, q_mask, d_mask, False, None, None)
    assert fast is not None
    layered = native.padded_sets(Q, D, q_mask.float(), d_mask.float(), False)
    for a, b in zip(fast[:2], layered[:2], strict=True):
        assert torch.equal(a.x, b.x) and torch.equal(a.mask, b.mask) and a.mask.dtype == torch.bool
    assert fast[2:] == layered[2:]
    torch.testing.assert_close(
        maxsim.maxsim(Q, D, q_mask, d_mask), maxsim.maxsim(Q, D, q_mask.float(), d_mask.float()),
        rtol=0, atol=0,
    )


@pytest.mark.parametrize(
    "kw",
    [
        {"d_lengths": torch.tensor([1, 0, 2, 0, 3, 0, 4, 0], dtype=torch.int32)[::2]},  # strided
        {"d_lengths": torch.tensor([1, 2, 3, 4], dtype=torch.int16)},  # not an index dtype
        {"d_mask": torch.ones(4, 5)},  # float: converted by the full path
        {"d_mask": torch.ones(4, 10, dtype=torch.bool)[:, ::2]},  # not contiguous
        {"q_mask": torch.ones(2, 3, dtype=torch.int64)},
        {"normalize": True},
        {"q_lengths": torch.tensor([1, 2, 3], dtype=torch.int32)},  # the wrong shape
    ],
)
def test_calls_with_more_than_the_plain_arguments_take_the_checked_path(kw):
    from maxsim import native

    q_mask, d_mask = kw.get("q_mask"), kw.get("d_mask")
    assert native._plain_sets(Q, D, q_mask, d_mask, kw.get("normalize", False),
                              kw.get("q_lengths"), kw.get("d_lengths")) is None
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert native._plain_sets(Q, D, None, None, False, None, None) is None
