"""Rewrite the README's benchmark section from bench_results/*.json, and draw its plots.

    python benchmarks/render.py [--readme README.md] [--results bench_results] [--docs docs]

Only the text between ``<!-- BENCH:START -->`` and ``<!-- BENCH:END -->`` changes, and the
8-bit fidelity table (from ``quant_fidelity.json``) between ``<!-- FIDELITY:START -->`` and
``<!-- FIDELITY:END -->`` where the README has those; a README without the BENCH markers is an
error and nothing is written. Output depends on the JSON files alone, so a
second run changes nothing (files are rewritten only when their bytes differ).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
START, END = "<!-- BENCH:START -->", "<!-- BENCH:END -->"
FIDELITY = ("<!-- FIDELITY:START -->", "<!-- FIDELITY:END -->")
FIDELITY_FILE = "quant_fidelity.json"
OURS, NAIVE = "maxsim", "naive"
SWEEP_RE = re.compile(r"^(rerank_ld|train_mem_b)(\d+)$")


class RenderError(Exception):
    pass


# ----------------------------------------------------------------------------------------------
# Loading
# ----------------------------------------------------------------------------------------------


def load_results(results_dir: Path) -> list[tuple[str, dict]]:
    out = []
    for path in sorted(results_dir.glob("*.json")):
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as e:
            print(f"[warn] skipping {path}: {e}", file=sys.stderr)
            continue
        if "schema" not in doc:
            continue  # another tool's output (e.g. pylate_step.py), not a bench.py file
        if doc.get("schema") != 1 or not isinstance(doc.get("rows"), list):
            print(f"[warn] skipping {path}: schema {doc.get('schema')!r}, expected 1",
                  file=sys.stderr)
            continue
        out.append((path.stem, doc))
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
    line = " · ".join(parts)
    for run in doc.get("merged_runs", []):  # later selections merged into the full run
        rc = run.get("ceilings") or {}
        names = ", ".join(f"`{w}`" for w in run["workloads"])
        commit = str(run.get("commit", "unknown"))[:10] + (" (dirty)" if run.get("dirty") else "")
        line += (f"<br>rows {names} re-measured at commit `{commit}` (copy "
                 f"{rc.get('hbm_gbps', 0):,.0f} GB/s, fp16 matmul {rc.get('fp16_tflops', 0):,.0f} "
                 "TFLOP/s; each row's floor is its own run's)")
    return line


PEER_ORDER = ["flash-maxsim", "flash-maxsim-fused", "late-interaction-kernels"]


def _peers(doc) -> list[str]:
    # Our own variants (maxsim-*) are never a peer.
    names = {r["impl"] for r in doc["rows"] if not r["impl"].startswith(OURS)} - {NAIVE}
    rank = lambda n: (PEER_ORDER.index(n) if n in PEER_ORDER else len(PEER_ORDER), n)  # noqa: E731
    return sorted(names, key=rank)


def main_table(doc) -> list[str]:
    idx, peers = _index(doc), _peers(doc)
    keys = []
    for r in doc["rows"]:
        k = (r["workload"], r["dtype"])
        if k not in keys and not _is_sweep(doc, r["workload"]):
            keys.append(k)
    lines = [
        "| workload | shape | dtype | maxsim ms | × naive | × best peer | × floor (roofline) "
        "| kernel ms | kernel × floor | kernel × best peer | peak MB | rel err |",
        "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for wl, dt in keys:
        ours = idx.get((wl, dt, OURS))
        shape = _wl_meta(doc, wl).get("shape", "")
        if not ours:
            continue
        if not _ok(ours):
            lines.append(f"| {wl} | {shape} | {dt} | {ours['status']} | | | | | | | | |")
            continue
        ms = ours["ms_p50"]
        nv = idx.get((wl, dt, NAIVE))
        if _ok(nv):
            x_naive = f_x(nv["ms_p50"] / ms)
        else:
            x_naive = f"naive {nv['status']}" if nv else "–"
        ok_peers = [(idx[(wl, dt, p)]["ms_p50"], p) for p in peers if _ok(idx.get((wl, dt, p)))]
        if ok_peers:
            best_ms, best = min(ok_peers)
            x_peer = f"{f_x(best_ms / ms)} {best}"
        else:
            x_peer = "–"
        fl = ours.get("floor_ms")
        x_floor = f"{f_x(ms / fl)} ({f_pct(100 * fl / ms)})" if fl else "–"
        lines.append(f"| {wl} | {shape} | {dt} | {f_ms(ms)} | {x_naive} | {x_peer} | {x_floor} "
                     f"| {_kernel_cells(ours, idx, wl, dt, peers)} "
                     f"| {f_mb(ours.get('peak_mb'))} | {f_err(ours.get('rel_err'))} |")
    return lines


def _kernel_cells(ours, idx, wl, dt, peers) -> str:
    """Kernel time (host work left out), its floor multiple and the best peer's kernel time over
    ours; dashes for rows measured before kernel times were recorded."""
    k = ours.get("kernel_ms")
    if not k:
        return "– | – | –"
    fl = ours.get("floor_ms")
    x_floor = f_x(k / fl) if fl else "–"
    timed = [(idx[(wl, dt, p)]["kernel_ms"], p) for p in peers
             if _ok(idx.get((wl, dt, p))) and idx[(wl, dt, p)].get("kernel_ms")]
    if not timed:
        return f"{f_ms(k)} | {x_floor} | –"
    best_ms, best = min(timed)
    return f"{f_ms(k)} | {x_floor} | {f_x(best_ms / k)} {best}"


def _ours(doc) -> list[str]:
    """maxsim first, then its variants (maxsim-*) found in the rows."""
    return [OURS] + sorted({r["impl"] for r in doc["rows"] if r["impl"].startswith(OURS + "-")})


def all_impls_table(doc) -> list[str]:
    idx = _index(doc)
    impls = _ours(doc) + [NAIVE] + _peers(doc)
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


_STYLE = {OURS: dict(color="#d62728", lw=2.4, marker="o"),
          NAIVE: dict(color="#7f7f7f", lw=1.6, marker="s", ls="--")}
_PEER_COLORS = ["#1f77b4", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b"]


def _style(impl, i):
    return _STYLE.get(impl, dict(color=_PEER_COLORS[i % len(_PEER_COLORS)], lw=1.6, marker="^"))


def _log_axes(ax, xs):
    """log2 x axis ticked at the data points, log y axis with plain numbers."""
    from matplotlib.ticker import FuncFormatter, NullLocator

    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(xs, [str(x) for x in xs])
    ax.xaxis.set_minor_locator(NullLocator())
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}"))


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight", metadata={"Software": None})
    return buf.getvalue()


def plot_rerank(doc, gpu):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    label, dt, series = rerank_series(doc)
    fig, ax = plt.subplots(figsize=(6.4, 3.8))
    for i, (impl, pts) in enumerate(series.items()):
        xs, ys = zip(*pts, strict=True)
        ax.plot(xs, ys, label=f"vs {impl}", **_style(impl, i))
    ax.axhline(1.0, color="black", lw=0.8)
    _log_axes(ax, sorted({x for pts in series.values() for x, _ in pts}))
    ax.set_xlabel("document length Ld (tokens)")
    ax.set_ylabel("speed-up of maxsim (×)")
    ax.set_title(f"Reranking, {label}, {dt} — {gpu}", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    data = _png(fig)
    plt.close(fig)
    return data


def plot_train_mem(doc, gpu):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    dt, series, ooms = train_mem_series(doc)
    fig, ax = plt.subplots(figsize=(6.4, 3.8))
    for i, (impl, pts) in enumerate(series.items()):
        xs, ys = zip(*pts, strict=True)
        oom = f" (OOM at {', '.join(map(str, ooms[impl]))})" if impl in ooms else ""
        ax.plot(xs, ys, label=impl + oom, **_style(impl, i))
    _log_axes(ax, sorted({x for pts in series.values() for x, _ in pts}))
    ax.set_xlabel("batch size (Nq = Nb)")
    ax.set_ylabel("peak memory of one step (MB)")
    ax.set_title(f"Training step, Lq32 Ld256, {dt} — {gpu}", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    data = _png(fig)
    plt.close(fig)
    return data


# ----------------------------------------------------------------------------------------------
# Section
# ----------------------------------------------------------------------------------------------


def render(results, docs_dir: Path, readme_dir: Path) -> tuple[str, dict[Path, bytes]]:
    """Markdown for between the markers, and the PNG files it embeds."""
    files: dict[Path, bytes] = {}
    out = [
        "",
        "_Generated by `benchmarks/render.py` from `bench_results/*.json`; edit those, not this "
        "section. Times are medians of at least 30 timed calls. × naive and × best peer are "
        "speed-ups (their time over ours); × floor is our time over the floor set by the "
        "measured copy bandwidth and matmul rate (percent of that roofline in brackets); kernel "
        "ms is the summed device time of the kernels one call launches (torch.profiler), without "
        "the host work that the back-to-back times include and that varies between runs; peak MB "
        "is memory allocated above the inputs during one call; rel err is against a float64 "
        "reference. maxsim's training rows run `contrastive_step` (loss and gradients from one "
        "op); `maxsim-autograd` is the same step as `maxsim()` + `F.cross_entropy` + autograd; "
        "`maxsim-graph` replays the `contrastive_step` captured in a CUDA graph (no host launch "
        "work; its memory sits in the graph's pool, so no peak MB). "
        "Method and columns: `bench_results/README.md`._",
        "",
    ]
    if not results:
        out += ["No results yet: run `just bench` on a GPU, then `just render`.", ""]
    for slug, doc in results:
        if "cpu" in doc:  # benchmarks/bench_cpu.py
            out += cpu_section(doc)
            continue
        gpu = doc.get("gpu", slug)
        out += [f"### {gpu}", "", header_line(doc), ""]
        out += main_table(doc)
        out.append("")
        rel = Path(os.path.relpath(docs_dir, readme_dir)).as_posix()
        if rerank_series(doc):
            name = f"bench-{slug}-rerank-ld.png"
            files[docs_dir / name] = plot_rerank(doc, gpu)
            out += [f"![Reranking speed-up of maxsim against document length on {gpu}]"
                    f"({rel}/{name})", ""]
        if train_mem_series(doc):
            name = f"bench-{slug}-train-mem.png"
            files[docs_dir / name] = plot_train_mem(doc, gpu)
            out += [f"![Peak memory of one training step against batch size on {gpu}]"
                    f"({rel}/{name})", ""]
        out += ["<details><summary>All implementations (p50 ms / peak MB · k kernel ms)</summary>",
                ""]
        out += all_impls_table(doc)
        out += ["", "</details>", ""]
    return "\n".join(out), files


CPU_IMPLS = ("maxsim", "maxsim-torch", "naive", "maxsim-cpu")


def cpu_section(doc) -> list[str]:
    """The table of ``benchmarks/bench_cpu.py``'s JSON: p50 ms per implementation, and the
    compiled kernels' speed-up over the naive einsum and maxsim-cpu (their time over ours)."""
    out = [f"### CPU: {doc['cpu']} ({doc['threads']} threads)", "",
           f"_commit {doc['commit']}, torch {doc['torch']}; implementations timed interleaved "
           "call by call; `maxsim-torch` is the pure-PyTorch path, `maxsim-cpu` the Rust + "
           "libxsmm package from PyPI (fp32 only, its own thread pool)._", "",
           "| workload | dtype | threads | maxsim ms | maxsim-torch ms | naive ms | "
           "maxsim-cpu ms | × naive | × maxsim-cpu |",
           "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    cells: dict[tuple, dict] = {}
    for r in doc["rows"]:
        if _ok(r):
            cells.setdefault((r["workload"], r["dtype"], r["threads"]), {})[r["impl"]] = r["ms_p50"]
    for (wl, dt, th), ms in cells.items():
        ours = ms.get("maxsim")
        peer = ms.get("maxsim-cpu")
        speed = [f_x(ms["naive"] / ours) if ours and ms.get("naive") else "–",
                 f_x(peer / ours) if ours and peer else "–"]
        times = [f_ms(ms.get(i)) if ms.get(i) else "–" for i in CPU_IMPLS]
        out.append(f"| {wl} | {dt} | {th} | " + " | ".join(times + speed) + " |")
    return out + [""]


def fidelity_section(doc) -> str:
    """The 8-bit ranking-fidelity table of ``benchmarks/quant_fidelity.py``'s JSON, one block of
    rows per data set."""
    sets = doc["datasets"]
    out = ["", "_Generated by `benchmarks/render.py` from `bench_results/quant_fidelity.json` "
           f"(`python benchmarks/quant_fidelity.py`, CPU, Python {doc['python']}, torch "
           f"{doc['torch']}" + (f", wordllama {doc['wordllama']}" if "wordllama" in doc else "")
           + ")._", ""]
    for name, ds in sets.items():
        sh = ds["shape"]
        out.append(f"- `{name}`: {sh['queries']} queries x {sh['docs']} documents, "
                   f"Lq <= {sh['lq']} (mean {sh['mean_lq']:.1f}), Ld <= {sh['ld']} "
                   f"(mean {sh['mean_ld']:.1f}), H {sh['dim']}; fp32 nDCG@10 "
                   f"{ds['ndcg10_fp32']:.3f}")
    out += ["", "| data | format | quantized | top-10 overlap with fp32 (mean / min) | "
            "nDCG@10 − fp32 | max score rel. err |", "| --- | --- | --- | ---: | ---: | ---: |"]
    for name, ds in sets.items():
        for r in ds["rows"]:
            out.append(f"| {name} | {r['format']} | {r['quantized']} | "
                       f"{r['top10_overlap']:.3f} / {r['top10_overlap_min']:.1f} | "
                       f"{r['ndcg10_diff']:+.4f} | {r['score_rel_err']:.1e} |")
    return "\n".join(out) + "\n"


def splice(text: str, section: str, start: str = START, end: str = END) -> str:
    if text.count(start) != 1 or text.count(end) != 1 or text.index(start) > text.index(end):
        raise RenderError(f"README must hold exactly one '{start}' followed by one '{end}'; "
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


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--readme", type=Path, default=REPO / "README.md")
    ap.add_argument("--results", type=Path, default=REPO / "bench_results")
    ap.add_argument("--docs", type=Path, default=REPO / "docs")
    args = ap.parse_args(argv)
    if not args.readme.exists():
        print(f"error: {args.readme} does not exist", file=sys.stderr)
        return 2
    text = args.readme.read_text(encoding="utf-8")
    fidelity_path = args.results / FIDELITY_FILE
    fidelity = None  # the fidelity table's markdown, where the README has its markers
    try:
        splice(text, "")  # check the markers before writing anything
        if any(m in text for m in FIDELITY) and fidelity_path.exists():
            splice(text, "", *FIDELITY)
            fidelity = fidelity_section(json.loads(fidelity_path.read_text(encoding="utf-8")))
    except (RenderError, json.JSONDecodeError, KeyError, TypeError) as e:
        print(f"error: {args.readme}: {e}", file=sys.stderr)
        return 2
    section, files = render(load_results(args.results), args.docs, args.readme.parent)
    changed = [p for p, data in sorted(files.items()) if _write_if_changed(p, data)]
    text = splice(text, section)
    if fidelity is not None:
        text = splice(text, fidelity, *FIDELITY)
    if _write_if_changed(args.readme, text.encode("utf-8")):
        changed.append(args.readme)
    for p in changed:
        print(f"wrote {p}")
    if not changed:
        print("up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
