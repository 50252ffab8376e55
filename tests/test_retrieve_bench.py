"""benchmarks/search.py on the CPU (tiny corpora): its rows carry every column, exact rows have
recall 1, and the README table renders from them."""

import json
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"
sys.path.insert(0, str(BENCH))

COLUMNS = {"corpus", "docs", "tokens", "dim", "batch", "impl", "qps", "p50_ms", "recall_at_10",
           "hit_at_1", "floor_ms", "build_s", "gpu_mb", "index_bytes", "gpu", "commit"}


@pytest.mark.slow
def test_smoke_run_writes_complete_rows(tmp_path):
    search = pytest.importorskip("search")
    out = tmp_path / "search-cpu.json"
    search.main(["--smoke", "--corpora", "fiqa", "--dims", "32", "--batches", "1,4",
                 "--impls", "maxsim-fp16,maxsim-int8-rescore-host,maxsim-fp16-padded",
                 "--out", str(out)])
    rows = json.loads(out.read_text())["rows"]
    assert len(rows) == 6
    for row in rows:
        assert COLUMNS <= set(row), COLUMNS - set(row)
        assert row["qps"] > 0 and row["tokens"] > row["docs"] > 0
        assert row["recall_at_10"] == 1.0, row  # exact rows, ties aside
    # a second selection merges: same keys replaced, others kept
    search.main(["--smoke", "--corpora", "fiqa", "--dims", "32", "--batches", "1",
                 "--impls", "maxsim-fp16", "--out", str(out)])
    assert len(json.loads(out.read_text())["rows"]) == 6
    from search_table import search_section

    table = search_section(tmp_path)
    assert "maxsim fp16" in table and "R@10 1.00" in table


def test_data_is_seeded_and_shaped():
    search = pytest.importorskip("search")
    import torch

    a = search.SearchData(40, 16, 8, seed=3, device=torch.device("cpu"))
    b = search.SearchData(40, 16, 8, seed=3, device=torch.device("cpu"))
    assert torch.equal(a.tokens, b.tokens) and torch.equal(a.queries, b.queries)
    lengths = a.lengths
    assert lengths.min() >= search.MIN_LEN and lengths.max() <= search.MAX_LEN
    assert a.queries.shape == (8, search.QUERY_TOKENS, 16)
    norms = a.tokens.float().norm(dim=-1)
    assert torch.allclose(norms, torch.ones_like(norms), atol=1e-2)
    truth = a.truth(8)
    assert truth.shape == (8, search.TOP_K) and (truth < 40).all()
