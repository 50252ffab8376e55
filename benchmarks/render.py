"""Rewrite the benchmark sections of the README and of docs/BENCHMARKS.md from
bench_results/*.json, and draw their plots.

    python benchmarks/render.py [--readme README.md] [--results bench_results] [--docs docs]
                                [--page docs/BENCHMARKS.md]

The README gets a headline table per GPU file (maxsim's time, × floor, × naive, × best peer) with
the plots and the measurement dates; the page gets every table (all implementations, kernel
times, host cost, the commit of each row). In each file only the text between
``<!-- BENCH:START -->`` and ``<!-- BENCH:END -->`` changes, and the 8-bit fidelity table (from
``quant_fidelity.json``; the README a summary of it) between ``<!-- FIDELITY:START -->`` and
``<!-- FIDELITY:END -->`` where the file has those. A file without the BENCH markers is an error
and nothing is written; a missing page is created with its markers. Output depends on the JSON
files alone, so a second run changes nothing (files are rewritten only when their bytes differ).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from pathlib import Path

from bench_plots import plot_rerank, plot_train_mem
from fidelity_tables import fidelity_section, fidelity_summary
from gates import gate_row
from search_table import MARKERS as SEARCH
from search_table import PATTERN as SEARCH_FILES
from search_table import search_section

REPO = Path(__file__).resolve().parent.parent
START, END = "<!-- BENCH:START -->", "<!-- BENCH:END -->"
FIDELITY = ("<!-- FIDELITY:START -->", "<!-- FIDELITY:END -->")
FIDELITY_FILE = "quant_fidelity.json"
OURS, NAIVE, FLOOR = "maxsim", "naive", "torch-floor"
BASELINES = (NAIVE, FLOOR)  # never a peer: the plain PyTorch baseline and the host-cost stand-in
SWEEP_RE = re.compile(r"^(rerank_ld|train_mem_b)(\d+)$")


class RenderError(Exception):
    pass


# ----------------------------------------------------------------------------------------------
# Loading
# ----------------------------------------------------------------------------------------------


def load_results(results_dir: Path, refused: list | None = None) -> list[tuple[str, dict]]:
    """The bench.py files of ``results_dir`` (others skipped), through :func:`load_results_from`."""
    docs = []
    for path in sorted(results_dir.glob("*.json")):
        if path.match(SEARCH_FILES):
            continue  # search.py's rows: their own table (search_table.py)
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as e:
            print(f"[warn] skipping {path}: {e}", file=sys.stderr)
            continue
        if "schema" not in doc:
            continue  # another tool's output (e.g. pylate_step.py), not a bench.py file
        if doc.get("schema") not in (1, 2) or not isinstance(doc.get("rows"), list):
            print(f"[warn] skipping {path}: schema {doc.get('schema')!r}, expected 2",
                  file=sys.stderr)
            continue
        docs.append((path.stem, doc))
    return load_results_from(docs, refused)


def load_results_from(docs, refused: list | None = None) -> list[tuple[str, dict]]:
    """``(name, doc)`` pairs with their rows gated (gates.py). Rows that do not carry the commit
    and GPU they were measured at are not rendered; a file left without rows goes to ``refused``
    as (file name, why)."""
    out = []
    for name, doc in docs:
        rows = [r for r in doc["rows"] if r.get("commit") and r.get("gpu")]
        if len(rows) < len(doc["rows"]):
            why = (f"{len(doc['rows']) - len(rows)} rows without the commit and GPU they were "
                   "measured at")
            print(f"[warn] {name}.json: {why}, not rendered", file=sys.stderr)
            if not rows and refused is not None:
                refused.append((f"{name}.json", why))
        if rows:
            train = {n for n, m in (doc.get("workloads") or {}).items() if m.get("kind") == "train"}
            gated = [gate_row(r, gradients=r["workload"] in train or r.get("top10_agree") is None)
                     for r in rows]
            out.append((name, {**doc, "rows": gated}))
    return out


def _wl_meta(doc, name) -> dict:
    return (doc.get("workloads") or {}).get(name) or {}


def _is_sweep(doc, name) -> bool:
    meta = _wl_meta(doc, name)
    return bool(meta.get("sweep")) if "sweep" in meta else bool(SWEEP_RE.match(name))


def _index(doc) -> dict:
    return {(r["workload"], r["dtype"], r["impl"]): r for r in doc["rows"]}


def _ok(r) -> bool:
    return bool(r) and r.get("status") == "ok" and bool(r.get("ms_p50"))


_TRAIN_PATHS = {"flash-maxsim-fused": "fused step", OURS: "fused step",
                OURS + "-graph": "graph replay"}


def row_path(doc, r) -> str:
    """How the row computes its result ("one call", "per-query loop", "fused step", "autograd",
    "graph replay"): its own ``path``, or for rows written before paths were recorded, what
    the implementation's entry point for that workload is (bench_results/README.md)."""
    if r.get("path"):
        return r["path"]
    meta = _wl_meta(doc, r["workload"])
    if meta.get("kind") == "train":
        return _TRAIN_PATHS.get(r["impl"], "autograd")
    looped = meta.get("quant") and (r["impl"] == "flash-maxsim" or (
        r["impl"] == "late-interaction-kernels" and meta.get("kind") == "rerank"))
    return "per-query loop" if looped else "one call"


def best_peer(doc, idx, wl, dt, peers, path=None, field="ms_p50"):
    """(time, name, path) of the fastest ``ok`` peer row, of ``path`` only when given; None."""
    timed = [(idx[(wl, dt, p)][field], p, row_path(doc, idx[(wl, dt, p)])) for p in peers
             if _ok(idx.get((wl, dt, p))) and idx[(wl, dt, p)].get(field)]
    timed = [t for t in timed if path is None or t[2] == path]
    return min(timed) if timed else None


def peer_cell(best, ours_value, ours_path) -> str:
    """"1.40× flash-maxsim", with the peer's path where it differs from ours."""
    if best is None:
        return "–"
    value, name, path = best
    return f"{f_x(value / ours_value)} {name}" + (f" ({path})" if path != ours_path else "")


# ----------------------------------------------------------------------------------------------
# Formatting
# ----------------------------------------------------------------------------------------------


def f_ms(x) -> str:
    if x >= 100:
        return f"{x:.0f}"
    if x >= 10:
        return f"{x:.1f}"
    if x >= 0.1:
        return f"{x:.3f}"
    return f"{x:.4f}"


def f_mb(x) -> str:
    if x is None:
        return "–"
    if abs(x) >= 100:
        return f"{x:,.0f}"
    if abs(x) >= 10:
        return f"{x:.1f}"
    return f"{x:.2f}"


def f_x(x) -> str:
    if x >= 100:
        return f"{x:.0f}×"
    if x >= 10:
        return f"{x:.1f}×"
    return f"{x:.2f}×" if x >= 0.1 else f"{x:.2g}×"


def f_pct(x) -> str:
    return f"{x:.0f}%" if x >= 10 else f"{x:.2g}%"


def f_err(x) -> str:
    return "–" if x is None else f"{x:.1e}"


def header_line(doc) -> str:
    c = doc.get("ceilings") or {}
    commit = str(doc.get("commit", "unknown"))[:10] + (" (dirty)" if doc.get("dirty") else "")
    parts = [f"torch {doc.get('torch', '?')}", f"CUDA {doc.get('cuda') or '?'}",
             f"Triton {doc.get('triton') or '–'}"]
    if doc.get("driver"):
        parts.append(f"driver {doc['driver']}")
    parts.append(f"commit `{commit}`")
    if c.get("hbm_gbps"):
        parts.append(f"copy {c['hbm_gbps']:,.0f} GB/s")
    for k in ("fp16", "bf16", "fp32"):
        if c.get(f"{k}_tflops"):
            parts.append(f"{k} matmul {c[f'{k}_tflops']:,.0f} TFLOP/s")
    line = " · ".join(parts) + "<br>" + provenance_line(doc)
    for run in doc.get("merged_runs", []):  # later selections merged into the full run
        rc = run.get("ceilings") or {}
        names = ", ".join(f"`{w}`" for w in run["workloads"])
        commit = str(run.get("commit", "unknown"))[:10] + (" (dirty)" if run.get("dirty") else "")
        line += (f"<br>rows {names} re-measured at commit `{commit}` (copy "
                 f"{rc.get('hbm_gbps', 0):,.0f} GB/s, fp16 matmul {rc.get('fp16_tflops', 0):,.0f} "
                 "TFLOP/s; each row's floor is its own run's)")
    return line


def provenance_line(doc) -> str:
    """The commits (and dates) the rendered rows were measured at, newest first, with counts."""
    runs = {}
    for r in doc["rows"]:
        key = (r.get("date") or "?", str(r["commit"])[:10] + (" (dirty)" if r.get("dirty") else ""))
        runs[key] = runs.get(key, 0) + 1
    return "rows measured at " + ", ".join(
        f"`{commit}` {date} ({n} rows)" for (date, commit), n in sorted(runs.items(), reverse=True))


PEER_ORDER = ["flash-maxsim", "flash-maxsim-fused", "late-interaction-kernels"]


def _peers(doc) -> list[str]:
    # Our own variants (maxsim-*) and the baselines are never a peer.
    names = {r["impl"] for r in doc["rows"] if not r["impl"].startswith(OURS)} - set(BASELINES)
    rank = lambda n: (PEER_ORDER.index(n) if n in PEER_ORDER else len(PEER_ORDER), n)  # noqa: E731
    return sorted(names, key=rank)


def main_table(doc, headline=False) -> list[str]:
    """One line per (workload, dtype); a training workload has two, the fused step (``maxsim``)
    and the autograd step (``maxsim-autograd``), each against the best peer of the same path.
    ``headline``: the README's table, a workload's first dtype only, four numbers, no shape."""
    idx, peers = _index(doc), _peers(doc)
    keys = []
    for r in doc["rows"]:
        k = (r["workload"], r["dtype"])
        shown = any(w == k[0] for w, _ in keys) if headline else k in keys
        if not shown and not _is_sweep(doc, r["workload"]):
            keys.append(k)
    if headline:
        lines = ["| workload | dtype | maxsim ms | × floor | × naive | × best peer |",
                 "| --- | --- | ---: | ---: | ---: | ---: |"]
    else:
        lines = [
            "| workload | shape | dtype | maxsim ms | × naive | × best peer | × floor (roofline) "
            "| kernel ms | kernel × floor | kernel × best peer | peak MB | rel err |",
            "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
        ]
    for wl, dt in keys:
        for impl in (OURS, OURS + "-autograd"):
            ours = idx.get((wl, dt, impl))
            if ours and (impl == OURS or ours.get("status") != "unsupported"):
                lines.append(_main_line(doc, idx, peers, ours, headline))
    return lines


def _main_line(doc, idx, peers, ours, headline=False) -> str:
    wl, dt = ours["workload"], ours["dtype"]
    shape = _wl_meta(doc, wl).get("shape", "")
    path = row_path(doc, ours)
    label = f"{wl} · {path}" if _wl_meta(doc, wl).get("kind") == "train" else wl
    cells = f"| {label} | {dt}" if headline else f"| {label} | {shape} | {dt}"
    if not _ok(ours):
        return f"{cells} | {ours['status']} |" + " |" * (3 if headline else 8)
    ms = ours["ms_p50"]
    nv = idx.get((wl, dt, NAIVE))
    if _ok(nv):
        x_naive = f_x(nv["ms_p50"] / ms)
    else:
        x_naive = f"naive {nv['status']}" if nv else "–"
    # Training steps against the same path only; inference rows against any, its path named.
    same = path if path in ("fused step", "autograd") else None
    x_peer = peer_cell(best_peer(doc, idx, wl, dt, peers, same), ms, path)
    if same and x_peer == "–":
        x_peer = f"– (no {path} peer)"
    fl = ours.get("floor_ms")
    if headline:
        return f"{cells} | {f_ms(ms)} | {f_x(ms / fl) if fl else '–'} | {x_naive} | {x_peer} |"
    x_floor = f"{f_x(ms / fl)} ({f_pct(100 * fl / ms)})" if fl else "–"
    return (f"{cells} | {f_ms(ms)} | {x_naive} | {x_peer} | {x_floor} "
            f"| {_kernel_cells(doc, ours, idx, peers, same, path)} "
            f"| {f_mb(ours.get('peak_mb'))} | {f_err(ours.get('rel_err'))} |")


def _kernel_cells(doc, ours, idx, peers, same, path) -> str:
    """Kernel time (host work left out), its floor multiple and the best peer's kernel time over
    ours; dashes for rows measured before kernel times were recorded."""
    k = ours.get("kernel_ms")
    if not k:
        return "– | – | –"
    fl = ours.get("floor_ms")
    x_floor = f_x(k / fl) if fl else "–"
    best = best_peer(doc, idx, ours["workload"], ours["dtype"], peers, same, "kernel_ms")
    return f"{f_ms(k)} | {x_floor} | {peer_cell(best, k, path)}"


def host_cost_table(doc) -> list[str]:
    """The workloads timed next to the torch-floor stand-in: what a call costs above one PyTorch
    call of one kernel on the same inputs (back-to-back times)."""
    idx = _index(doc)
    keys = [(r["workload"], r["dtype"]) for r in doc["rows"] if r["impl"] == FLOOR and _ok(r)]
    if not keys:
        return []
    ours = [i for i in (OURS, OURS + "-compat", OURS + "-autograd")
            if any((wl, dt, i) in idx for wl, dt in keys)]
    lines = ["| workload | dtype | torch-floor ms | " + " | ".join(
        f"{i} ms (− floor, µs)" for i in ours) + " | best peer ms |",
             "| --- | --- | ---: | " + " | ".join("---:" for _ in ours) + " | ---: |"]
    for wl, dt in keys:
        floor = idx[(wl, dt, FLOOR)]["ms_p50"]
        cells = []
        for i in ours:
            r = idx.get((wl, dt, i))
            cells.append(f"{f_ms(r['ms_p50'])} ({1e3 * (r['ms_p50'] - floor):+.1f})" if _ok(r)
                         else (r["status"] if r else ""))
        best = best_peer(doc, idx, wl, dt, _peers(doc))
        peer = f"{f_ms(best[0])} {best[1]}" if best else "–"
        lines.append(f"| {wl} | {dt} | {f_ms(floor)} | " + " | ".join(cells) + f" | {peer} |")
    return lines


def _ours(doc) -> list[str]:
    """maxsim first, then its variants (maxsim-*) found in the rows."""
    return [OURS] + sorted({r["impl"] for r in doc["rows"] if r["impl"].startswith(OURS + "-")})


def all_impls_table(doc) -> list[str]:
    idx = _index(doc)
    present = {r["impl"] for r in doc["rows"]}
    impls = _ours(doc) + [b for b in BASELINES if b in present] + _peers(doc)
    keys = []
    for r in doc["rows"]:
        if (r["workload"], r["dtype"]) not in keys:
            keys.append((r["workload"], r["dtype"]))
    lines = ["| workload | dtype | floor ms | " + " | ".join(impls) + " |",
             "| --- | --- | ---: | " + " | ".join("---:" for _ in impls) + " |"]
    for wl, dt in keys:
        floor = next((idx[(wl, dt, i)].get("floor_ms") for i in impls if (wl, dt, i) in idx), None)
        cells = []
        for i in impls:
            r = idx.get((wl, dt, i))
            if r is None:
                cells.append("")
            elif _ok(r):
                peak = "" if r.get("peak_mb") is None else f" / {f_mb(r['peak_mb'])} MB"
                kernel = f" · k {f_ms(r['kernel_ms'])}" if r.get("kernel_ms") else ""
                cells.append(f"{f_ms(r['ms_p50'])}{peak}{kernel}")
            else:
                cells.append(r["status"])
        lines.append(f"| {wl} | {dt} | {f_ms(floor) if floor else '–'} | " + " | ".join(cells)
                     + " |")
    return lines


def matrix_table(results) -> list[str]:
    """One table across GPUs: rows = workloads (non-sweep, with dtype), columns = GPUs; each cell
    is maxsim's p50 ms and its speed-up over the best peer measured on that GPU."""
    gpus = [(doc.get("gpu", slug), _index(doc), _peers(doc), doc) for slug, doc in results]
    keys = []
    for _, _, _, doc in gpus:
        for r in doc["rows"]:
            k = (r["workload"], r["dtype"])
            if k not in keys and not _is_sweep(doc, r["workload"]):
                keys.append(k)
    lines = ["| workload | dtype | " + " | ".join(g[0] for g in gpus) + " |",
             "| --- | --- | " + " | ".join("---:" for _ in gpus) + " |"]
    for wl, dt in keys:
        cells = []
        for _, idx, peers, _ in gpus:
            ours = idx.get((wl, dt, OURS))
            if not ours:
                cells.append("")
                continue
            if not _ok(ours):
                cells.append(ours["status"])
                continue
            ms = ours["ms_p50"]
            ok_peers = [(idx[(wl, dt, p)]["ms_p50"], p) for p in peers
                        if _ok(idx.get((wl, dt, p)))]
            best = f" · {f_x(min(ok_peers)[0] / ms)} {min(ok_peers)[1]}" if ok_peers else ""
            cells.append(f"{f_ms(ms)}{best}")
        lines.append(f"| {wl} | {dt} | " + " | ".join(cells) + " |")
    return lines


# ----------------------------------------------------------------------------------------------
# Plots
# ----------------------------------------------------------------------------------------------


def _sweep_points(doc, prefix):
    """{value: workload} for rows named <prefix><N>."""
    pts = {}
    for r in doc["rows"]:
        m = SWEEP_RE.match(r["workload"])
        if m and m.group(1) == prefix:
            pts[int(m.group(2))] = r["workload"]
    return pts


def rerank_series(doc):
    """(title suffix, dtype, {impl: [(Ld, speed-up of maxsim over impl)]}) or None."""
    pts = _sweep_points(doc, "rerank_ld")
    label = "B8 K100 Lq32"
    if not pts:
        for name, meta in sorted((doc.get("workloads") or {}).items()):
            if meta.get("kind") == "rerank" and "Ld" in meta:
                pts.setdefault(int(meta["Ld"]), name)
        label = "rerank rows"
    if not pts:
        return None
    idx = _index(doc)
    dtypes = [d for d in ("fp16", "bf16", "fp32")
              if any(_ok(idx.get((w, d, OURS))) for w in pts.values())]
    if not dtypes:
        return None
    dt = dtypes[0]
    series = {}
    for ld in sorted(pts):
        ours = idx.get((pts[ld], dt, OURS))
        if not _ok(ours):
            continue
        for impl in [NAIVE] + _peers(doc):
            other = idx.get((pts[ld], dt, impl))
            if _ok(other):
                series.setdefault(impl, []).append((ld, other["ms_p50"] / ours["ms_p50"]))
    return (label, dt, series) if series else None


def train_mem_series(doc):
    pts = _sweep_points(doc, "train_mem_b")
    if not pts:
        return None
    idx = _index(doc)
    dts = sorted({d for (w, d, _i) in idx if w in pts.values()})
    if not dts:
        return None
    dt = "bf16" if "bf16" in dts else dts[0]
    series, ooms = {}, {}
    for b in sorted(pts):
        for impl in [OURS, NAIVE] + _peers(doc):
            r = idx.get((pts[b], dt, impl))
            if r and r.get("status") == "ok" and r.get("peak_mb") is not None:
                series.setdefault(impl, []).append((b, max(r["peak_mb"], 1e-3)))
            elif r and r.get("status") == "oom":
                ooms.setdefault(impl, []).append(b)
    return (dt, series, ooms) if series else None


# ----------------------------------------------------------------------------------------------
# Section
# ----------------------------------------------------------------------------------------------


PAGE_NOTE = (
    "_Generated by `benchmarks/render.py` from `bench_results/*.json`; edit those, not this "
    "section. Times are medians of at least 30 timed calls. × naive and × best peer are "
    "speed-ups (their time over ours); × floor is our time over the floor set by the "
    "measured copy bandwidth and matmul rate (percent of that roofline in brackets); kernel "
    "ms is the device time the kernels one call launches occupy (torch.profiler; kernels side "
    "by side count once), without "
    "the host work that the back-to-back times include and that varies between runs; peak MB "
    "is memory allocated above the inputs during one call; rel err is against a float64 "
    "reference. maxsim's training rows run `contrastive_step` (loss and gradients from one "
    "op); `maxsim-autograd` is the same step as `maxsim()` + `F.cross_entropy` + autograd; "
    "`maxsim-graph` replays the `contrastive_step` captured in a CUDA graph (no host launch "
    "work; its memory sits in the graph's pool, so no peak MB). A training workload has a "
    "line per path (`fused step`: `maxsim`; `autograd`: `maxsim-autograd`), each against the "
    "best peer of the same path; an inference row names a peer's path where it is not one "
    "call. A row whose output fails the correctness gate (`bench_results/README.md`) is "
    "`wrong` and never a best peer. Method and columns: `bench_results/README.md`._")
README_NOTE = (
    "_Rendered by `benchmarks/render.py` from `bench_results/*.json`: median of at least 30 "
    "calls, a workload's first dtype; × floor: our time over the roofline of the measured copy "
    "bandwidth and matmul rate; × naive, × best peer: their time over ours (a training step "
    "against peers of its own path; a row failing the correctness gate is never a peer). "
    "Shapes, every dtype and implementation, each row's commit: [{page}]({page})._")
PAGE_TEMPLATE = (f"# Benchmarks\n\n{START}\n{END}\n\n## 8-bit ranking fidelity\n\n"
                 f"{FIDELITY[0]}\n{FIDELITY[1]}\n\n## Corpus search\n\n{SEARCH[0]}\n{SEARCH[1]}\n")


def measured_line(doc) -> str:
    """When the rows were measured (the dates alone) and with what."""
    dates = sorted({str(r.get("date") or "?") for r in doc["rows"]})
    when = dates[0] if len(dates) == 1 else f"{dates[0]} to {dates[-1]}"
    return f"Measured {when} (torch {doc.get('torch', '?')}, CUDA {doc.get('cuda') or '?'})."


def anchor(heading: str) -> str:
    """The fragment GitHub gives a markdown heading."""
    return re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")


def _rel(path: Path, start: Path) -> str:
    return Path(os.path.relpath(path, start)).as_posix()


def _plots(slug, doc, gpu, docs_dir, files) -> list[tuple[str, Path]]:
    """(alt text, file) of each plot the doc has data for; their PNG bytes go into ``files``."""
    out = []
    for what, series, plot, alt in (
            ("rerank-ld", rerank_series(doc), plot_rerank,
             "Reranking speed-up of maxsim against document length"),
            ("train-mem", train_mem_series(doc), plot_train_mem,
             "Peak memory of one training step against batch size")):
        if series:
            path = docs_dir / f"bench-{slug}-{what}.png"
            files[path] = plot(series, gpu)
            out.append((f"{alt} on {gpu}", path))
    return out


def render(results, docs_dir: Path, readme_dir: Path, page: Path,
           refused=()) -> tuple[str, str, dict[Path, bytes]]:
    """Markdown for between the README's markers (a headline table per GPU) and the page's
    (every table, with the commits), and the PNG files both embed."""
    files: dict[Path, bytes] = {}
    link = _rel(page, readme_dir)
    notes = [] if results else ["No results yet: run `just bench` on a GPU, then `just render`.",
                                ""]
    for name, why in refused:
        notes += [f"_Not rendered: `bench_results/{name}` ({why}); re-measure it with "
                  "`python benchmarks/bench.py`._", ""]
    readme = ["", README_NOTE.format(page=link), ""] + notes
    if sum("cpu" not in doc for _, doc in results) > 1:
        readme += ["### Across GPUs", "", "_maxsim's p50 ms on each GPU · its speed-up over the "
                   "fastest peer measured on that GPU (`just bench-matrix FLAVOR` runs the "
                   "benchmark on HF Jobs, `just bench-pull` fetches the files)._", ""]
        readme += matrix_table([(n, d) for n, d in results if "cpu" not in d]) + [""]
    full = ["", PAGE_NOTE, ""] + notes
    for slug, doc in results:
        if "cpu" in doc:  # benchmarks/bench_cpu.py: its own table, not a GPU's
            readme += cpu_section(doc, headline=True)
            full += cpu_section(doc)
            continue
        gpu = doc.get("gpu", slug)
        plots = _plots(slug, doc, gpu, docs_dir, files)
        readme += [f"### {gpu}", "", f"{measured_line(doc)} All tables: "
                   f"[{link}]({link}#{anchor(gpu)}).", ""] + main_table(doc, headline=True)
        readme += [""] + [f"![{alt}]({_rel(p, readme_dir)})\n" for alt, p in plots]
        full += [f"### {gpu}", "", header_line(doc), ""] + main_table(doc) + [""]
        host = host_cost_table(doc)
        if host:
            full += ["Host cost of a call: back-to-back time per call next to `torch-floor`, one "
                     "PyTorch call of one kernel on the same inputs (a stand-in, not MaxSim; "
                     "training: the same step with scores from one matmul).", ""] + host + [""]
        full += [f"![{alt}]({_rel(p, page.parent)})\n" for alt, p in plots]
        full += ["All implementations (p50 ms / peak MB · k kernel ms):", ""]
        full += all_impls_table(doc) + [""]
    return "\n".join(readme), "\n".join(full), files


CPU_IMPLS = ("maxsim", "maxsim-after-einsum", "maxsim-torch", "naive", "maxsim-cpu")


def cpu_isa_label(row) -> str:
    """The ISA path of a ``bench_cpu.py`` row: "auto (avx512bf16)", a forced "avx2", or "" for
    files from before the rows named it."""
    if not row.get("isa"):
        return ""
    return f"auto ({row['isa']})" if row.get("isa_mode", "auto") == "auto" else row["isa"]


def cpu_section(doc, headline: bool = False) -> list[str]:
    """The table of ``benchmarks/bench_cpu.py``'s JSON: p50 ms per implementation and ISA path,
    and the compiled kernels' speed-up over the naive einsum (also when called right after one)
    and maxsim-cpu (their time over ours). ``headline``: the automatic ISA path on all threads
    only (named in the heading), no commit and no pure-PyTorch or after-einsum columns (the
    README's form)."""
    impls = [i for i in CPU_IMPLS
             if not (headline and i in ("maxsim-torch", "maxsim-after-einsum"))]
    where = (f"{doc['torch']}" if headline else f"{doc['torch']}, commit {doc['commit']}")
    flags = f" ({doc['cpu_flags']})" if doc.get("cpu_flags") and not headline else ""
    lead = ["workload", "dtype"] if headline else ["workload", "dtype", "threads", "ISA"]
    speeds = ["× naive", "× maxsim-cpu"] if headline else [
        "× naive", "× naive after einsum", "× maxsim-cpu", "maxsim-torch × naive"]
    auto_isas = sorted({r["isa"] for r in doc["rows"] if r.get("isa_mode") == "auto"})
    paths = f", {' / '.join(auto_isas)}" if headline and auto_isas else ""
    out = [f"### CPU: {doc['cpu']} ({doc['threads']} threads{paths})", "",
           f"_torch {where}{flags}; implementations timed interleaved call by call; "
           + ("" if headline else "after einsum: each call made right after an einsum; "
              "`maxsim-torch` is the pure-PyTorch path, ")
           + "`maxsim-cpu` the Rust + libxsmm package from PyPI (fp32 only)._", "",
           "| " + " | ".join(lead + [f"{i} ms" for i in impls] + speeds) + " |",
           "| --- | --- | " + ("" if headline else "---: | --- | ")
           + " | ".join("---:" for _ in impls + speeds) + " |"]
    cells: dict[tuple, dict] = {}
    for r in doc["rows"]:
        auto = r.get("isa_mode", "auto") == "auto"
        if _ok(r) and not (headline and (r["threads"] != doc["threads"] or not auto)):
            key = (r["workload"], r["dtype"], r["threads"], cpu_isa_label(r))
            cells.setdefault(key, {})[r["impl"]] = r["ms_p50"]
    for (wl, dt, th, isa), ms in cells.items():
        ours, after = ms.get("maxsim"), ms.get("maxsim-after-einsum")
        peer = ms.get("maxsim-cpu")
        naive, torch_path = ms.get("naive"), ms.get("maxsim-torch")
        speed = [f_x(naive / ours) if ours and naive else "–",
                 f_x(naive / after) if after and naive else "–",
                 f_x(peer / ours) if ours and peer else "–",
                 # the pure-PyTorch path against the einsum it replaces
                 f_x(naive / torch_path) if torch_path and naive else "–"]
        if headline:
            speed = [speed[0], speed[2]]
        times = [f_ms(ms.get(i)) if ms.get(i) else "–" for i in impls]
        lead_cells = [wl, dt] if headline else [wl, dt, str(th), isa or "–"]
        out.append("| " + " | ".join(lead_cells + times + speed) + " |")
    return out + [""]


def splice(text: str, section: str, start: str = START, end: str = END) -> str:
    if text.count(start) != 1 or text.count(end) != 1 or text.index(start) > text.index(end):
        raise RenderError(f"it must hold exactly one '{start}' followed by one '{end}'; "
                          "add them where the section belongs")
    head, rest = text.split(start, 1)
    _old, tail = rest.split(end, 1)
    return f"{head}{start}\n{section}\n{end}{tail}"


def _write_if_changed(path: Path, data: bytes) -> bool:
    if path.exists() and path.read_bytes() == data:
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return True


def _read_targets(readme: Path, page: Path, fidelity_path: Path):
    """The README's and the page's text (the page from a template when it does not exist yet),
    their markers checked, and the fidelity JSON where one of them has its markers."""
    texts = {readme: readme.read_text(encoding="utf-8"),
             page: page.read_text(encoding="utf-8") if page.exists() else PAGE_TEMPLATE}
    fidelity = None
    for path, text in texts.items():
        try:
            splice(text, "")
            if any(m in text for m in FIDELITY) and fidelity_path.exists():
                splice(text, "", *FIDELITY)
                fidelity = json.loads(fidelity_path.read_text(encoding="utf-8"))
        except (RenderError, json.JSONDecodeError) as e:
            raise RenderError(f"{path}: {e}") from e
    return texts, fidelity


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--readme", type=Path, default=REPO / "README.md")
    ap.add_argument("--results", type=Path, default=REPO / "bench_results")
    ap.add_argument("--docs", type=Path, default=REPO / "docs")
    ap.add_argument("--page", type=Path, help="the full tables (default: DOCS/BENCHMARKS.md)")
    args = ap.parse_args(argv)
    page = args.page or args.docs / "BENCHMARKS.md"
    if not args.readme.exists():
        print(f"error: {args.readme} does not exist", file=sys.stderr)
        return 2
    try:  # everything checked before anything is written
        texts, fidelity = _read_targets(args.readme, page, args.results / FIDELITY_FILE)
        link = _rel(page, args.readme.parent)
        tables = {args.readme: fidelity and fidelity_summary(fidelity, f"[{link}]({link})"),
                  page: fidelity and fidelity_section(fidelity)}
    except (RenderError, KeyError, TypeError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    refused = []
    results = load_results(args.results, refused)
    readme, full, files = render(results, args.docs, args.readme.parent, page, refused)
    changed = [p for p, data in sorted(files.items()) if _write_if_changed(p, data)]
    for path, section in ((page, full), (args.readme, readme)):
        text = splice(texts[path], section)
        if tables[path] and FIDELITY[0] in text:
            text = splice(text, tables[path], *FIDELITY)
        if SEARCH[0] in text:
            text = splice(text, search_section(args.results), *SEARCH)
        if _write_if_changed(path, text.encode("utf-8")):
            changed.append(path)
    for p in changed:
        print(f"wrote {p}")
    if not changed:
        print("up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
