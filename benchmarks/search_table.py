"""The corpus-search tables (from ``bench_results/search-<gpu>.json``, written by search.py) that
render.py puts between ``<!-- SEARCH:START -->`` and ``<!-- SEARCH:END -->``."""

from __future__ import annotations

import json
import sys
from pathlib import Path

MARKERS = ("<!-- SEARCH:START -->", "<!-- SEARCH:END -->")
PATTERN = "search-*.json"
CORPUS_ORDER = ["scifact", "fiqa", "trec-covid", "1m"]
COLUMNS = [  # (impl, heading)
    ("maxsim-fp16", "maxsim fp16"),
    ("maxsim-int8-rescore", "maxsim 8-bit + rescore"),
    ("maxsim-int8-rescore-host", "maxsim 8-bit + rescore, fp16 in host memory"),
    ("maxsim-int8x8", "maxsim 8-bit"),
    ("maxsim-int8", "maxsim 8-bit codes, fp16 queries"),
    ("maxsim-fp16-padded", "maxsim fp16, padded corpus"),
    ("fast-plaid", "fast-plaid default"),
    ("fast-plaid-recall", "fast-plaid probe 32, 8192 full scores"),
]


def load_search(results_dir: Path) -> list[tuple[str, dict]]:
    docs = []
    for path in sorted(results_dir.glob(PATTERN)):
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as e:
            print(f"[warn] skipping {path}: {e}", file=sys.stderr)
            continue
        if isinstance(doc.get("rows"), list):
            docs.append((path.stem, doc))
    return docs


def _cell(row) -> str:
    if row is None:
        return ""
    if row.get("qps") is None:
        return "failed" if "status" not in row else row["status"].split(":")[0]
    text = f"{row['qps']:,.0f} QPS, R@10 {row['recall_at_10']:.2f}"
    if row.get("floor_ms"):
        text += f", {row['p50_ms'] / row['floor_ms']:.1f}× floor"
    return text


def _corpus_key(row):
    name = row.get("corpus")
    rank = CORPUS_ORDER.index(name) if name in CORPUS_ORDER else len(CORPUS_ORDER)
    return rank, row.get("dim", 0), row.get("batch", 0)


def speed_table(rows) -> list[str]:
    present = [(impl, head) for impl, head in COLUMNS if any(r.get("impl") == impl for r in rows)]
    by_key = {(r.get("corpus"), r.get("dim"), r.get("batch"), r.get("impl")): r for r in rows}
    keys = sorted({(r.get("corpus"), r.get("dim"), r.get("batch")) for r in rows},
                  key=lambda k: _corpus_key({"corpus": k[0], "dim": k[1], "batch": k[2]}))
    lines = ["| corpus (docs, tokens) | dim | batch | " + " | ".join(h for _, h in present) + " |",
             "|---|---:|---:|" + "---|" * len(present)]
    for corpus, dim, batch in keys:
        any_row = next(r for r in rows if (r.get("corpus"), r.get("dim"), r.get("batch"))
                       == (corpus, dim, batch))
        size = f"{corpus} ({any_row.get('docs', 0):,}, {(any_row.get('tokens') or 0) / 1e6:.1f}M)"
        cells = [_cell(by_key.get((corpus, dim, batch, impl))) for impl, _ in present]
        lines.append(f"| {size} | {dim} | {batch:,} | " + " | ".join(cells) + " |")
    return lines


def memory_table(rows) -> list[str]:
    """Build time, index size and peak GPU memory, at each (corpus, dim, impl)'s largest batch."""
    largest = {}
    for r in rows:
        if r.get("qps") is None:
            continue
        key = (r["corpus"], r["dim"], r["impl"])
        if key not in largest or r["batch"] > largest[key]["batch"]:
            largest[key] = r
    order = {impl: i for i, (impl, _) in enumerate(COLUMNS)}
    picked = sorted(largest.values(), key=lambda r: (*_corpus_key(r)[:2], order.get(r["impl"], 99)))
    lines = ["| corpus | dim | impl | build s | index MB | peak GPU MB (batch) | × fp16 corpus "
             "| hit@1 |", "|---|---:|---|---:|---:|---:|---:|---:|"]
    for r in picked:
        times = f"{r['gpu_mb'] * 2**20 / r['corpus_bytes']:.2f}" if r.get("corpus_bytes") else ""
        lines.append(f"| {r['corpus']} | {r['dim']} | {r['impl']} | {r['build_s']:.1f} | "
                     f"{r['index_bytes'] / 2**20:,.0f} | {r['gpu_mb']:,.0f} ({r['batch']:,}) | "
                     f"{times} | {r['hit_at_1']:.2f} |")
    return lines


def search_section(results_dir: Path) -> str:
    """Markdown for every search-<gpu>.json of ``results_dir``; a line saying none exist else."""
    docs = load_search(results_dir)
    if not docs:
        return "No search results yet: run `python benchmarks/search.py` on a GPU."
    out = []
    for _stem, doc in docs:
        rows = doc["rows"]
        out += [f"**{doc.get('gpu', '?')}**, torch {doc.get('torch', '?')}, measured "
                f"{doc.get('date', '?')}: queries per second "
                "(batch / p50 latency), recall@10 against the fp32 exhaustive top-10, and the "
                "p50 as a multiple of the row's floor.", ""]
        out += speed_table(rows) + [""] + memory_table(rows) + [""]
    return "\n".join(out).rstrip() + "\n"
