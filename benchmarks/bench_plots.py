"""The benchmark plots of ``render.py``: PNG bytes from the series it extracts, no file I/O, so
the same series give the same bytes (no timestamps in the PNG metadata)."""

from __future__ import annotations

import io

OURS, NAIVE = "maxsim", "naive"
_STYLE = {OURS: dict(color="#d62728", lw=2.4, marker="o"),
          NAIVE: dict(color="#7f7f7f", lw=1.6, marker="s", ls="--")}
_PEER_COLORS = ["#1f77b4", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b"]


def _style(impl, i):
    return _STYLE.get(impl, dict(color=_PEER_COLORS[i % len(_PEER_COLORS)], lw=1.6, marker="^"))


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _log_axes(ax, xs):
    """log2 x axis ticked at the data points, log y axis with plain numbers."""
    from matplotlib.ticker import FuncFormatter, NullLocator

    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(xs, [str(x) for x in xs])
    ax.xaxis.set_minor_locator(NullLocator())
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}"))


def _draw(series, label, xlabel, ylabel, title, unit_line=False) -> bytes:
    """One log-log line per implementation, labelled ``label(impl)``; the PNG's bytes."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 3.8))
    for i, (impl, pts) in enumerate(series.items()):
        xs, ys = zip(*pts, strict=True)
        ax.plot(xs, ys, label=label(impl), **_style(impl, i))
    if unit_line:  # where a speed-up crosses 1
        ax.axhline(1.0, color="black", lw=0.8)
    _log_axes(ax, sorted({x for pts in series.values() for x, _ in pts}))
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight", metadata={"Software": None})
    plt.close(fig)
    return buf.getvalue()


def plot_rerank(rerank, gpu) -> bytes:
    """``rerank``: (title suffix, dtype, {impl: [(Ld, speed-up of maxsim over impl)]})."""
    label, dt, series = rerank
    return _draw(series, lambda impl: f"vs {impl}", "document length Ld (tokens)",
                 "speed-up of maxsim (×)", f"Reranking, {label}, {dt} — {gpu}", unit_line=True)


def plot_train_mem(train_mem, gpu) -> bytes:
    """``train_mem``: (dtype, {impl: [(batch, peak MB)]}, {impl: [batches that ran out]})."""
    dt, series, ooms = train_mem
    return _draw(series,
                 lambda impl: impl + (f" (OOM at {', '.join(map(str, ooms[impl]))})"
                                      if impl in ooms else ""),
                 "batch size (Nq = Nb)", "peak memory of one step (MB)",
                 f"Training step, Lq32 Ld256, {dt} — {gpu}")
