"""CPU tests of the benchmark harness and the renderer of the README and docs/BENCHMARKS.md (no
GPU, no peers needed)."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import bench  # noqa: E402
import render  # noqa: E402

REQUIRED_ROW_KEYS = {"workload", "dtype", "impl", "path", "status", "ms_p20", "ms_p50", "ms_p80",
                     "kernel_ms", "launches", "floor_ms", "peak_mb", "rel_err", "top10_agree",
                     "note", "commit", "dirty", "gpu", "date"}
REQUIRED_TOP_KEYS = {"schema", "commit", "dirty", "gpu", "torch", "cuda", "triton", "ceilings",
                     "rows"}


def _row(wl, dt, impl, ms, *, status="ok", floor=0.01, peak=1.5, err=1e-4, top=1.0, kernel=None,
         commit="0123456789abcdef"):
    ok = status == "ok"
    return {"workload": wl, "dtype": dt, "impl": impl, "status": status, "commit": commit,
            "dirty": False, "gpu": "NVIDIA H100 80GB HBM3", "date": "2026-11-20",
            "ms_p20": ms * 0.98 if ok else None, "ms_p50": ms if ok else None,
            "ms_p80": ms * 1.03 if ok else None, "floor_ms": floor, "kernel_ms": kernel,
            "launches": 1.0 if kernel else None,
            "peak_mb": peak if ok else None, "rel_err": err if ok else None,
            "top10_agree": top if ok else None, "note": ""}


def fake_results() -> dict:
    rows = []
    for dt in ("fp16", "bf16"):
        k = dt == "fp16"  # bf16 rows as written before kernel times were recorded
        rows += [_row("rerank", dt, "maxsim", 0.05, kernel=0.03 if k else None),
                 _row("rerank", dt, "naive", 0.9),
                 _row("rerank", dt, "flash-maxsim", 0.08, kernel=0.02 if k else None),
                 _row("rerank", dt, "late-interaction-kernels", 0.07, kernel=0.04 if k else None),
                 _row("corpus", dt, "maxsim", 4.0), _row("corpus", dt, "naive", 0, status="oom"),
                 _row("corpus", dt, "flash-maxsim", 0, status="error")]
    rows += [_row("train_small", "bf16", "maxsim", 0.2, top=None),
             _row("train_small", "bf16", "flash-maxsim-fused", 0, status="unsupported")]
    for ld in (128, 256, 512):
        rows += [_row(f"rerank_ld{ld}", "fp16", "maxsim", 0.01 * ld / 128),
                 _row(f"rerank_ld{ld}", "fp16", "naive", 0.2 * ld / 128),
                 _row(f"rerank_ld{ld}", "fp16", "flash-maxsim", 0.02 * ld / 128)]
    for b in (16, 32, 64):
        rows += [_row(f"train_mem_b{b}", "bf16", "maxsim", 0.1, peak=b * 0.5),
                 _row(f"train_mem_b{b}", "bf16", "naive", 0.5, peak=b * 40.0)]
    wls = {"rerank": {"kind": "rerank", "shape": "B32 K50 Lq32 Ld180", "Ld": 180, "sweep": False},
           "corpus": {"kind": "allpairs", "shape": "Nq16 Nd10000", "sweep": False},
           "train_small": {"kind": "train", "shape": "Nq32 Nb32", "sweep": False}}
    return {"schema": 2, "commit": "0123456789abcdef", "dirty": False,
            "gpu": "NVIDIA H100 80GB HBM3", "torch": "2.11.0", "cuda": "13.0", "triton": "3.6.0",
            "ceilings": {"hbm_gbps": 3000.0, "fp16_tflops": 750.0, "bf16_tflops": 760.0},
            "workloads": wls, "rows": rows}


def _tree(tmp_path, readme_text):
    (tmp_path / "bench_results").mkdir()
    (tmp_path / "bench_results" / "h100.json").write_text(json.dumps(fake_results()))
    other = {"benchmark": "pylate_step", "rows": [{"loss": "contrastive"}]}
    (tmp_path / "bench_results" / "pylate_step.json").write_text(json.dumps(other))
    readme = tmp_path / "README.md"
    readme.write_text(readme_text, encoding="utf-8")
    return ["--readme", str(readme), "--results", str(tmp_path / "bench_results"),
            "--docs", str(tmp_path / "docs")]


def _snapshot(tmp_path):
    return {p: p.read_bytes() for p in sorted(tmp_path.rglob("*")) if p.is_file()}


def _page(tmp_path):
    return (tmp_path / "docs" / "BENCHMARKS.md").read_text(encoding="utf-8")


COMMIT = re.compile(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}\b")


def test_render_is_idempotent(tmp_path):
    text = "# Title\n\nintro\n\n<!-- BENCH:START -->\nold\n<!-- BENCH:END -->\n\ntail\n"
    args = _tree(tmp_path, text)
    assert render.main(args) == 0
    first = _snapshot(tmp_path)
    out = (tmp_path / "README.md").read_text(encoding="utf-8")
    assert out.startswith("# Title\n\nintro\n\n<!-- BENCH:START -->\n")
    assert out.endswith("<!-- BENCH:END -->\n\ntail\n")
    assert "old" not in out
    # The README: one headline line per workload (its first dtype), the plots, the dates, no commit
    assert "| rerank | fp16 | 0.0500 | 5.00× | 18.0× | 1.40× late-interaction-kernels |" in out
    assert "| rerank | bf16 |" not in out
    assert "| corpus | fp16 | 4.000 | 400× | naive oom | – |" in out
    assert "| train_small · fused step | bf16 | 0.200 | 20.0× | – | – (no fused step peer) |" in out
    assert "Measured 2026-11-20 (torch 2.11.0, CUDA 13.0)." in out
    assert "(docs/BENCHMARKS.md#nvidia-h100-80gb-hbm3)" in out
    assert "(docs/bench-h100-rerank-ld.png)" in out and "(docs/bench-h100-train-mem.png)" in out
    assert not COMMIT.findall(out) and "kernel ms" not in out
    # The page: every dtype, kernel times, all implementations, the commits
    page = _page(tmp_path)
    line = "| rerank | B32 K50 Lq32 Ld180 | fp16 | 0.0500 | 18.0× | 1.40× late-interaction-kernels"
    assert line in page
    # kernel ms, its floor multiple, the best peer's kernel time over ours (here a slower kernel)
    assert "| 0.0300 | 3.00× | 0.67× flash-maxsim |" in page
    assert "| bf16 | 0.0500 |" in page and "| – | – | – |" in page
    assert "0.0500 / 1.50 MB · k 0.0300" in page
    assert "naive oom" in page and "rows measured at `0123456789` 2026-11-20 (" in page
    assert "(bench-h100-rerank-ld.png)" in page
    assert (tmp_path / "docs" / "bench-h100-rerank-ld.png").exists()
    assert (tmp_path / "docs" / "bench-h100-train-mem.png").exists()
    for text in (out, page):
        assert "pylate_step" not in text and text.count("### ") == 1
    assert render.main(args) == 0
    assert _snapshot(tmp_path) == first


@pytest.mark.parametrize("text", ["# no markers\n", "<!-- BENCH:END -->\n<!-- BENCH:START -->\n",
                                  "<!-- BENCH:START -->\n<!-- BENCH:START -->\n<!-- BENCH:END -->"])
def test_render_refuses_without_markers(tmp_path, text):
    args = _tree(tmp_path, text)
    before = _snapshot(tmp_path)
    assert render.main(args) == 2
    assert _snapshot(tmp_path) == before


def test_render_refuses_a_page_without_markers_and_keeps_its_prose(tmp_path):
    args = _tree(tmp_path, "<!-- BENCH:START -->\n<!-- BENCH:END -->\n")
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "BENCHMARKS.md").write_text("# hand-written\n", encoding="utf-8")
    before = _snapshot(tmp_path)
    assert render.main(args) == 2
    assert _snapshot(tmp_path) == before
    (tmp_path / "docs" / "BENCHMARKS.md").write_text(
        "# Benchmarks\n\nprose\n\n<!-- BENCH:START -->\n<!-- BENCH:END -->\n", encoding="utf-8")
    assert render.main(args) == 0
    page = _page(tmp_path)
    assert page.startswith("# Benchmarks\n\nprose\n\n<!-- BENCH:START -->\n")
    assert "| rerank |" in page


def test_gpu_slug():
    assert bench.gpu_slug("NVIDIA H100 80GB HBM3") == "h100"
    assert bench.gpu_slug("NVIDIA H200") == "h200"
    assert bench.gpu_slug("NVIDIA A100-SXM4-80GB") == "a100"
    assert bench.gpu_slug("NVIDIA GeForce RTX 4090") == "rtx4090"


def test_smoke_run_writes_schema_and_merges(tmp_path):
    out = tmp_path / "r.json"
    common = ["--smoke", "--out", str(out), "--min-reps", "3", "--rounds", "1"]
    # Every implementation that runs on the CPU: maxsim's PyTorch backend (fused step, autograd,
    # compatibility surface), the torch-floor stand-in and the naive baseline.
    assert bench.main(common + ["--only", "call_tiny,varlen,train_small"]) == 0
    doc = json.loads(out.read_text())
    assert REQUIRED_TOP_KEYS <= doc.keys()
    assert {"hbm_gbps", "fp16_tflops", "int8_tops"} <= doc["ceilings"].keys()
    ran = {(r["workload"], r["dtype"], r["impl"]) for r in doc["rows"] if r["status"] == "ok"}
    assert ran == {("call_tiny", "fp16", i)
                   for i in ("maxsim", "maxsim-compat", "torch-floor", "naive")} | {
        (w, d, i) for w in ("varlen", "train_small") for d in ("fp16", "bf16")
        for i in ("maxsim", "naive")} | {
        ("train_small", d, i) for d in ("fp16", "bf16")
        for i in ("maxsim-autograd", "maxsim-compat", "torch-floor")}
    for r in doc["rows"]:
        assert set(r) - {"stand_in"} == REQUIRED_ROW_KEYS
        assert r["gpu"] == "cpu" and r["commit"] == doc["commit"] and r["date"] == doc["date"]
        if r["status"] != "ok":
            assert r["status"] == "unsupported" and r["impl"] == "maxsim-autograd", r
            continue
        assert r["ms_p20"] <= r["ms_p50"] <= r["ms_p80"]
        assert r["floor_ms"] > 0
        if r["impl"] == "torch-floor":  # a stand-in: not checked
            assert r["stand_in"] and r["rel_err"] is None
            continue
        assert r["rel_err"] < 5e-2
        assert (r["top10_agree"] is None) == r["workload"].startswith("train")
    paths = {(r["workload"], r["impl"]): r["path"] for r in doc["rows"]}
    assert paths[("train_small", "maxsim")] == "fused step"
    assert paths[("train_small", "maxsim-autograd")] == "autograd"
    assert paths[("call_tiny", "maxsim-compat")] == "one call"
    assert paths[("train_small", "maxsim-compat")] == "autograd"
    common += ["--impl", "naive"]
    assert bench.main(common + ["--only", "corpus", "--dtype", "bf16"]) == 0
    merged = json.loads(out.read_text())
    assert len(merged["rows"]) == len(doc["rows"]) + 1
    assert [r["workload"] for r in merged["rows"]].index("corpus") > 0
    # The full run's header stays; the selection is listed with its own commit and ceilings.
    assert merged["ceilings"] == doc["ceilings"] and merged["elapsed_s"] == doc["elapsed_s"]
    assert [run["workloads"] for run in merged["merged_runs"]] == [["corpus"]]
    assert bench.main(common + ["--only", "corpus,rerank", "--dtype", "bf16"]) == 0
    again = json.loads(out.read_text())
    assert [run["workloads"] for run in again["merged_runs"]] == [["corpus", "rerank"]]
    assert "re-measured at commit" in render.header_line(again)


def test_kernel_time_counts_kernels_side_by_side_once():
    # intervals in us: two overlapping kernels, one inside another, a gap, one touching the last
    assert bench.busy_us([(0, 5), (1, 3), (4, 8), (10, 11), (11, 12)]) == 10
    assert bench.busy_us([(3, 4), (0, 1)]) == 2
    assert bench.busy_us([]) == 0


def test_sass_histogram_splits_kernels_and_counts(tmp_path):
    import sass_histogram

    header = '"Address","Source","Warp Stall Sampling (All Samples)","Instructions Executed"'
    text = "\n".join([
        '"Kernel Name","void k1(int)",',
        header,
        '"0x0","IMAD R1, R2, R3, R4","3","100"',
        '"0x10","@P0 HMMA.16816.F32 R4, R8, R12, R4","1","400"',
        '"0x20","HMMA.16816.F32 R4, R8, R12, R4","0","400"',
        '"Kernel Name","void k2(int)",',
        header,
        '"0x0","BRA 0x0","2","7"',
    ])
    path = tmp_path / "sass.csv"
    path.write_text(text + "\n")
    (name1, rows1), (name2, rows2) = sass_histogram.kernels(str(path))
    assert name1 == "void k1(int)" and len(rows1) == 3 and len(rows2) == 1
    summary = sass_histogram.summarize(rows1)
    assert "executed warp instructions: 900" in summary
    assert "HMMA" in summary and "88.9%" in summary  # 800 of 900, predicated one included
    assert "       400          800" in summary  # two static instructions run 400 times


def test_kernel_ab_cases_are_well_formed():
    import kernel_ab

    for name, (dtype, (nq, lq), (nd, ld), layout, group, argmax, codes) in kernel_ab.CASES.items():
        assert dtype in kernel_ab.DTYPES and codes in (None, "int8", "fp8", "int8x8"), name
        assert layout in (kernel_ab.ALL, kernel_ab.GROUPED) and isinstance(argmax, bool), name
        if layout == kernel_ab.GROUPED:
            assert nd == nq * group, name  # every query has its own candidates
        assert min(nq, lq, nd, ld) > 0, name
    for name, base in {**kernel_ab.RAGGED, **kernel_ab.MASKED}.items():
        assert base in kernel_ab.CASES and name not in kernel_ab.CASES, name
    for name, base in kernel_ab.TF32.items():
        case = kernel_ab.CASES[kernel_ab.RAGGED.get(base, base)]
        assert case[0] == "fp32" and case[-1] is None and name not in kernel_ab.CASES, name
    for name, (dtype, nq, (q_lo, q_hi), k, (d_lo, d_hi)) in kernel_ab.VARLEN.items():
        assert dtype in kernel_ab.DTYPES and min(nq, k, q_lo, d_lo) > 0, name
        assert q_lo <= q_hi and d_lo <= d_hi and name not in kernel_ab.CASES, name
    for name, (dtype, (nq, lq), (nd, ld)) in kernel_ab.STEPS.items():
        # diagonal targets: a document per query
        assert dtype in kernel_ab.DTYPES and nd >= nq > 0 and min(lq, ld) > 1, name


def test_kernel_ab_lists_and_rejects_unknown_cases(capsys, monkeypatch):
    import kernel_ab

    monkeypatch.setattr(sys, "argv", ["kernel_ab.py", "--list", "--only", "rerank,corpus"])
    kernel_ab.main()
    assert capsys.readouterr().out.splitlines()[0].startswith("rerank ")
    monkeypatch.setattr(sys, "argv", ["kernel_ab.py", "--list", "--only", "train_small_step"])
    kernel_ab.main()
    assert capsys.readouterr().out.startswith("train_small_step ")
    monkeypatch.setattr(sys, "argv", ["kernel_ab.py", "--only", "nope"])
    with pytest.raises(SystemExit):
        kernel_ab.main()


def _fidelity_doc():
    row = dict(format="int8", quantized="documents", top10_overlap=0.9925, top10_overlap_min=0.9,
               ndcg10=0.5, ndcg10_fp32=0.5, ndcg10_diff=-0.00012, score_rel_err=3.8e-3,
               bytes_ratio=0.516)
    shape = dict(queries=500, docs=5000, lq=32, ld=180, dim=128, mean_lq=20.2, mean_ld=59.0)
    return {"python": "3.11.7", "torch": "2.13.0", "wordllama": "0.4.0",
            "datasets": {"text": {"shape": shape, "ndcg10_fp32": 0.256, "rows": [row]}}}


def test_render_fills_the_fidelity_table_only_between_its_markers(tmp_path):
    text = ("<!-- BENCH:START -->\n<!-- BENCH:END -->\n\nintro\n<!-- FIDELITY:START -->\nold\n"
            "<!-- FIDELITY:END -->\ntail\n")
    args = _tree(tmp_path, text)
    (tmp_path / "bench_results" / "quant_fidelity.json").write_text(json.dumps(_fidelity_doc()))
    assert render.main(args) == 0
    out = (tmp_path / "README.md").read_text(encoding="utf-8")
    assert "old" not in out and out.endswith("<!-- FIDELITY:END -->\ntail\n")
    # the README a summary, the page (created with its markers) the full table
    assert "| format | documents |\n| --- | ---: |\n| int8 | 0.993 |\n" in out
    page = _page(tmp_path)
    assert "| text | int8 | documents | 0.993 / 0.9 | -0.0001 | 3.8e-03 |" in page
    assert "- `text`: 500 queries x 5000 documents, Lq <= 32 (mean 20.2)" in page
    assert "wordllama 0.4.0" in page and "| text | int8 |" not in out
    first = _snapshot(tmp_path)
    assert render.main(args) == 0
    assert _snapshot(tmp_path) == first
    # a README without the fidelity markers keeps its text there
    plain = "<!-- BENCH:START -->\n<!-- BENCH:END -->\nhand-written\n"
    (tmp_path / "README.md").write_text(plain, encoding="utf-8")
    assert render.main(args) == 0
    assert (tmp_path / "README.md").read_text(encoding="utf-8").endswith("hand-written\n")


def test_quant_fidelity_runs_on_the_clustered_set(tmp_path):
    import quant_fidelity
    out = tmp_path / "fidelity.json"
    args = ["--data", "clustered", "--queries", "6", "--docs", "40", "--lq", "8", "--ld", "12",
            "--dim", "32", "--out", str(out)]
    assert quant_fidelity.main(args) == 0
    doc = json.loads(out.read_text())
    rows = doc["datasets"]["clustered"]["rows"]
    assert [(r["format"], r["quantized"]) for r in rows] == [
        (f, s) for f in ("int8", "fp8_e4m3") for s in quant_fidelity.SIDES]
    for r in rows:
        assert 0.0 <= r["top10_overlap_min"] <= r["top10_overlap"] <= 1.0
        if "rescored" in r["quantized"]:  # 40 candidates hold all 40 documents
            assert r["top10_overlap"] == 1.0 and r["score_rel_err"] < 1e-5
    with pytest.raises(SystemExit):
        quant_fidelity.main(["--data", "nosuchset"])


def test_text_passages_and_cloze_queries():
    import random

    import fidelity_data as fd
    text = ("First sentence here is long enough. Second one follows it closely now. Third ends "
            "the paragraph with words.\n\n>>> code(that, is) skipped\n\nA fourth sentence "
            "stands in the next paragraph of text.")
    passages = fd._passages(text, max_words=12)
    assert passages == ["First sentence here is long enough. Second one follows it closely now.",
                        "Third ends the paragraph with words.",
                        "A fourth sentence stands in the next paragraph of text."]
    many = [f"Passage {p} opens with a sentence. Another line {p} here with more words. Last one "
            f"{p} closes it for good." for p in range(30)]
    queries, docs, positive = fd.cloze_pairs(many, 5, 20, random.Random(0))
    assert len(queries) == 5 and len(docs) == 20 and len(set(docs)) == 20
    for q, p in zip(queries, positive):
        source = next(m for m in many if q in m)
        rest = [s for s in fd.SENTENCE_END.split(source) if s != q]
        assert docs[p] == " ".join(rest) and len(q.split()) >= 6
    with pytest.raises(ValueError, match="--docs"):
        fd.cloze_pairs(many, 5, 100, random.Random(0))


def test_text_data_gives_unit_tokens_and_one_relevant_document():
    if os.environ.get("MAXSIM_TEST_INTEGRATIONS") == "1":  # CI installs it: missing fails
        import wordllama  # noqa: F401
    else:
        pytest.importorskip("wordllama")
    import argparse

    import fidelity_data as fd
    import torch
    args = argparse.Namespace(queries=4, docs=30, lq=32, ld=64, dim=128, seed=1)
    Q, q_mask, D, d_mask, relevance = fd.text_data(args, torch.Generator().manual_seed(1))
    assert Q.shape[::2] == (4, 128) and D.shape[::2] == (30, 128)
    assert Q.size(1) <= 32 and D.size(1) <= 64 and q_mask.any(1).all() and d_mask.any(1).all()
    norms = torch.cat([Q.norm(dim=-1).flatten(), D.norm(dim=-1).flatten()])
    assert torch.allclose(norms, torch.ones_like(norms), atol=1e-5)  # padding too: unit vectors
    assert torch.equal(relevance.sum(1), torch.ones(4)) and relevance.sum() == 4


class DropsLastToken:
    """A deliberately broken MaxSim: each document's last token is left out."""

    name, peer, stand_in, counts_memory = "broken", True, False, True
    kinds = ("rerank", "train")

    def unavailable(self):
        return None

    def version(self):
        return None

    def note(self, case):
        return ""

    def applies(self, case):
        return True

    def path(self, case):
        return "fused step" if case.kind.train else "one call"

    def bind(self, case, s):
        import maxsim

        short = (case.meta["d_len"] - 1).clamp_min(1)
        if case.kind.train:
            return lambda: maxsim.contrastive_step(s["Q"], s["D"], d_lengths=short,
                                                   targets=case.meta["targets"],
                                                   backend="torch")[1:]
        return lambda: maxsim.maxsim(s["Q"], s["D"], d_lengths=short, backend="torch")


def test_a_broken_implementation_is_wrong_and_never_a_best_peer(tmp_path):
    import impls

    out = tmp_path / "r.json"
    args = ["--smoke", "--out", str(out), "--min-reps", "3", "--rounds", "1", "--only",
            "rerank,train_small", "--dtype", "fp16"]
    assert bench.main(args, extra_impls=[impls.Maxsim(backend="torch"), DropsLastToken()]) == 0
    doc = json.loads(out.read_text())
    status = {(r["workload"], r["impl"]): r for r in doc["rows"]}
    for wl in ("rerank", "train_small"):
        assert status[(wl, "maxsim")]["status"] == "ok"
        broken = status[(wl, "broken")]
        assert broken["status"] == "wrong" and broken["note"].startswith("wrong: "), broken
        assert broken["ms_p50"] is not None  # timed all the same
    # Rendered as wrong, and the best-peer cells skip it even where it is faster.
    for r in doc["rows"]:
        if r["impl"] == "broken" and r["ms_p50"]:
            r["ms_p50"] = r["kernel_ms"] = 1e-6
    text = "<!-- BENCH:START -->\n<!-- BENCH:END -->\n"
    (tmp_path / "README.md").write_text(text, encoding="utf-8")
    (tmp_path / "bench_results").mkdir()
    (tmp_path / "bench_results" / "cpu.json").write_text(json.dumps(doc))
    assert render.main(["--readme", str(tmp_path / "README.md"), "--results",
                        str(tmp_path / "bench_results"), "--docs", str(tmp_path / "docs")]) == 0
    readme, page = (tmp_path / "README.md").read_text(encoding="utf-8"), _page(tmp_path)
    assert "| rerank | fp16 |" in readme and "| rerank | B2 K12 Lq4 Ld10 | fp16 |" in page
    assert "× broken" not in readme + page and "| wrong |" in page


def test_render_gates_old_rows_and_compares_like_with_like(tmp_path):
    doc = fake_results()
    doc["rows"] += [_row("rerank", "fp16", "naive-ish-peer", 0.001, top=0.375),
                    _row("train_small", "bf16", "maxsim-autograd", 0.3, top=None),
                    _row("train_small", "bf16", "flash-maxsim", 0.45, top=None),
                    _row("train_small", "bf16", "late-interaction-kernels", 0.05, top=None,
                         err=0.2),
                    _row("train_small", "bf16", "torch-floor", 0.25, top=None, err=None)]
    doc["rows"][-1]["stand_in"] = True
    idx = render._index(render.load_results_from([("h100", doc)])[0][1])
    assert idx[("rerank", "fp16", "naive-ish-peer")]["status"] == "wrong"  # top-10 0.375
    assert idx[("train_small", "bf16", "late-interaction-kernels")]["status"] == "wrong"
    assert idx[("train_small", "bf16", "torch-floor")]["status"] == "ok"
    table = "\n".join(render.main_table(render.load_results_from([("h100", doc)])[0][1]))
    assert "naive-ish-peer" not in table
    # fused step against fused steps only (flash-maxsim-fused is unsupported), autograd against
    # autograd: flash-maxsim, the faster late-interaction-kernels row being wrong
    assert "| train_small · fused step | Nq32 Nb32 | bf16 | 0.200 | – | – (no fused step peer)" \
        in table
    assert "| train_small · autograd | Nq32 Nb32 | bf16 | 0.300 | – | 1.50× flash-maxsim |" in table
    host = "\n".join(render.host_cost_table(render.load_results_from([("h100", doc)])[0][1]))
    assert "| train_small | bf16 | 0.250 | 0.200 (-50.0) | 0.300 (+50.0) | 0.450 flash-maxsim |" \
        in host


def test_render_refuses_rows_without_their_commit(tmp_path):
    args = _tree(tmp_path, "<!-- BENCH:START -->\n<!-- BENCH:END -->\n")
    old = fake_results()
    for r in old["rows"]:
        del r["commit"]
    (tmp_path / "bench_results" / "h200.json").write_text(json.dumps({**old, "schema": 1}))
    assert render.main(args) == 0
    for out in ((tmp_path / "README.md").read_text(encoding="utf-8"), _page(tmp_path)):
        assert out.count("### ") == 1 and "_Not rendered: `bench_results/h200.json` (" in out
    assert "rows measured at `0123456789` 2026-11-20 (" in _page(tmp_path)


def test_eight_bit_by_eight_bit_floors_use_the_int8_rate():
    import workloads

    case = workloads.setup(workloads.BY_NAME["corpus_int8x8"], "fp16", "cpu", smoke=True)
    work = case.kind.work(case.params, case.meta, case.dtype)
    assert work.rate == "int8"
    ceil = {"hbm_gbps": 1e9, "fp16_tflops": 1.0, "int8_tops": 2.0}
    assert bench.floor_ms(work, "fp16", ceil) == pytest.approx(work.flops / 2e12 * 1e3)
    fp16_docs = workloads.setup(workloads.BY_NAME["corpus_int8"], "fp16", "cpu", smoke=True)
    assert fp16_docs.kind.work(fp16_docs.params, fp16_docs.meta, fp16_docs.dtype).rate is None


def test_call_tiny_and_the_floor_stand_in_on_the_cpu():
    import torch
    import workloads

    case = workloads.setup(workloads.BY_NAME["call_tiny"], "fp16", "cpu", smoke=True, max_sets=1)
    s = case.sets[0]
    ref = case.kind.reference(s, case.meta)
    err, top, _ = case.kind.check(case.kind.naive(s, case.meta)(), ref)
    assert err < 1e-3 and top == 1.0
    stand_in = workloads.floor_scores(s["Q"], s["D"])
    assert stand_in.shape == ref["scores"].shape and stand_in.dtype == torch.float16
    train = workloads.setup(workloads.BY_NAME["train_small"], "fp16", "cpu", smoke=True,
                            max_sets=1)
    q, d = train.sets[0]["Q"], train.sets[0]["D"]
    assert workloads.floor_scores(q, d).shape == (q.size(0), d.size(0))


def test_wrapper_overhead_times_every_entry_point():
    """The host-cost harness runs (in its own process: it stubs the ops for good) and times each
    entry point on meta and CPU tensors."""
    done = subprocess.run([sys.executable, str(HERE / "wrapper_overhead.py"), "--n", "20"],
                          capture_output=True, text=True, timeout=300, check=True)
    lines = done.stdout.splitlines()
    assert lines[0].split()[-4:] == ["meta", "us", "cpu", "us"]
    timed = {line.rsplit(None, 2)[0]: line.split()[-2:] for line in lines[1:]}
    assert {"score_candidates_padded call_tiny", "score_contrastive_train train_small",
            "score_pairs_packed (max_q_len)", "maxsim call_tiny (d_lengths)"} <= timed.keys()
    assert all(float(us) > 0 for row in timed.values() for us in row)


def test_dist_overhead_times_every_path_of_the_python_layer():
    """The gathered loss's Python layer with stubbed ops on the two-rank ``fake`` group."""
    script = Path(__file__).resolve().parent / "dist_overhead.py"
    out = subprocess.run([sys.executable, str(script), "--steps", "3"], capture_output=True,
                         text=True, timeout=300, check=True).stdout
    for row in ("no grad", "fused, same_shapes", "fused, shapes exchanged", "overlap"):
        assert row in out
