"""PyLate's Contrastive(gather_across_devices=True) under torch.distributed, patched: the loss and
gradients of PyLate's own gather, computed by maxsim.distributed (one gloo rank here; two ranks
against one process are in test_distributed.py)."""

import datetime
import socket

import pytest
import torch

pytest.importorskip("pylate")
pytest.importorskip("transformers")

import test_integrations_pylate  # noqa: E402
import torch.distributed as dist  # noqa: E402
from maxsim import distributed  # noqa: E402
from pylate import losses  # noqa: E402
from test_integrations_pylate import features, loss_both_ways, tiny_colbert  # noqa: E402

colbert_dir = test_integrations_pylate.colbert_dir  # the tiny model's fixture, shared

pytestmark = pytest.mark.distributed


@pytest.fixture
def process_group():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1,
                            timeout=datetime.timedelta(seconds=60))
    yield
    dist.destroy_process_group()


@pytest.fixture
def gathered_calls(monkeypatch):
    calls = []
    original = distributed.contrastive_loss

    def spy(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(distributed, "contrastive_loss", spy)
    return calls


@pytest.mark.parametrize("query_expansion", [True, False])
@pytest.mark.parametrize("size_average", [True, False])
def test_gathered_contrastive_is_pylates(colbert_dir, process_group, gathered_calls,
                                         query_expansion, size_average):
    model = tiny_colbert(colbert_dir, "cpu", query_expansion)
    q, _, groups = features(model, 4, 3)
    loss_both_ways(
        lambda: losses.Contrastive(model=model, gather_across_devices=True, temperature=0.5,
                                   size_average=size_average),
        model, [q, *groups],
    )
    assert gathered_calls


def test_without_a_process_group_pylate_runs_its_own(colbert_dir, gathered_calls):
    model = tiny_colbert(colbert_dir, "cpu", False)
    q, _, groups = features(model, 4, 2)
    loss_both_ways(lambda: losses.Contrastive(model=model, gather_across_devices=True), model,
                   [q, *groups])
    assert not gathered_calls
    assert torch.distributed.is_available()
