"""The compatibility entry points raise what `erikkaum/maxsim` raises (TypeError for mixed dtypes,
RuntimeError for pair ids out of range) as well as the package's ValueError, with its messages."""

import maxsim
import pytest
import torch
from maxsim.validation import DtypeMismatch, IndexOutOfRange


def packed(dtype_d=torch.float32, pair_q=(0,), pair_d=(0,)):
    q, d = torch.randn(5, 8), torch.randn(7, 8, dtype=dtype_d)
    offsets = dict(query_offsets=torch.tensor([0, 2, 5]), document_offsets=torch.tensor([0, 7]))
    return (q, offsets["query_offsets"], d, offsets["document_offsets"],
            torch.tensor(pair_q), torch.tensor(pair_d))


@pytest.mark.parametrize("caught", [TypeError, ValueError])
def test_mixed_dtypes(caught):
    with pytest.raises(caught, match="same dtype") as info:
        maxsim.score_pairs_packed(*packed(dtype_d=torch.float16))
    assert type(info.value) is DtypeMismatch
    assert str(info.value) == (
        "documents: expected torch.float32, the same dtype as queries (they share dtype), "
        "got torch.float16"
    )
    q, d = torch.randn(2, 3, 4, 8), torch.randn(2, 3, 5, 8).half()
    lengths = torch.tensor([3, 3]), torch.full((2, 3), 5)
    with pytest.raises(caught, match="share dtype"):
        maxsim.score_candidates_padded(q[:, 0], d, *lengths)


@pytest.mark.parametrize("caught", [RuntimeError, ValueError])
@pytest.mark.parametrize(
    "pair_q, pair_d, message",
    [
        ((0, 2), (0, 0), "pair_query_ids: expected a query id in [0, 2) (others are out of "
                         "range), got pair_query_ids[1] = 2"),
        ((0,), (-1,), "pair_document_ids: expected a document id in [0, 1) (others are "
                      "out of range), got pair_document_ids[0] = -1"),
    ],
)
def test_pair_ids_out_of_range(caught, pair_q, pair_d, message):
    with pytest.raises(caught, match="out of range") as info:
        maxsim.score_pairs_packed(*packed(pair_q=pair_q, pair_d=pair_d))
    assert type(info.value) is IndexOutOfRange and str(info.value) == message


def test_lengths_out_of_range_keep_their_message():
    with pytest.raises(ValueError) as info:
        lengths = torch.tensor([5, 1, 9, 0])
        maxsim.maxsim(torch.randn(2, 3, 8), torch.randn(4, 5, 8), d_lengths=lengths)
    assert isinstance(info.value, RuntimeError)
    assert str(info.value) == (
        "d_lengths: expected a length in [0, 5] (the padded size), got d_lengths[2] = 9"
    )
