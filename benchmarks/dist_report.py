"""Where the time of ``maxsim.distributed`` goes: per-phase times from CUDA events at
``distributed.phase_marks``, the collectives timed alone, an optional torch.profiler table, and
the printed summary of ``dist_bench.py`` against its targets."""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import torch
import torch.distributed as dist
from maxsim import distributed


class PhaseClock:
    """Timestamps at ``distributed.phase_marks``: CUDA events on the current stream (where the
    phase's work was queued; on CPU, the host clock), read after a sync."""

    def __init__(self, device):
        self.cuda = device.type == "cuda"
        self.marks = []

    def now(self):
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def __call__(self, name):
        self.marks.append((name, self.now()))

    def durations(self):
        """``[(phase, ms since the mark before)]``, the first mark being ``start``."""
        out = []
        for (_, a), (name, b) in zip(self.marks, self.marks[1:]):
            out.append((name, a.elapsed_time(b) if self.cuda else (b - a) * 1e3))
        return out


def phases(fn, device, reps, warmup=3):
    """Per-phase milliseconds of ``fn`` (the median over ``reps`` calls, each alone: synced before
    and after), and the host's time to queue one call: ``({phase: ms}, host_ms)``."""
    for _ in range(warmup):
        fn()
    per_phase, host = {}, []
    clock = PhaseClock(device)
    distributed.phase_marks = clock
    try:
        for _ in range(reps):
            _sync(device)
            dist.barrier()
            clock.marks = []
            clock("start")
            t = time.perf_counter()
            fn()
            host.append((time.perf_counter() - t) * 1e3)
            clock("end")
            _sync(device)
            for name, ms in clock.durations():
                per_phase.setdefault(name, []).append(ms)
    finally:
        distributed.phase_marks = None
    return {name: statistics.median(v) for name, v in per_phase.items()}, statistics.median(host)


def every_rank(values, device):
    """Every rank's ``values`` (floats, as many on every rank): ``[world][n]``."""
    t = torch.tensor(values, dtype=torch.float64, device=device)
    out = t.new_empty(dist.get_world_size() * t.numel())
    distributed._gather_into(out, t)
    return out.view(dist.get_world_size(), -1).tolist()


def phase_table(fn, device, reps):
    """:func:`phases` of every rank: ``{"phases_ms": {phase: [rank 0, rank 1, ...]},
    "host_ms": [...]}``."""
    ms, host = phases(fn, device, reps)
    names = list(ms)
    ranks = every_rank([ms[n] for n in names] + [host], device)
    return {"phases_ms": {n: [r[i] for r in ranks] for i, n in enumerate(names)},
            "host_ms": [r[-1] for r in ranks]}


def collectives_alone(D, device, reps, time_ms):
    """The contrastive step's two transfers timed alone: the all-gather of every rank's ``D`` and
    the reduce-scatter of the gradient of the gathered documents (ms and GB/s of what each rank
    receives / sends)."""
    world = dist.get_world_size()
    flat = D.detach().reshape(-1)
    gathered = flat.new_empty(world * flat.numel())
    out = flat.new_empty(flat.numel())
    ag = time_ms(lambda: distributed._gather_into(gathered, flat), device, reps)
    rs = time_ms(lambda: distributed._reduce_scatter(out, gathered), device, reps)
    moved = flat.numel() * flat.element_size() * (world - 1)  # bytes in (gather) / out (scatter)
    return {"bytes_per_rank": moved,
            "all_gather_ms": ag, "all_gather_GBps": moved / ag / 1e6,
            "reduce_scatter_ms": rs, "reduce_scatter_GBps": moved / rs / 1e6}


def graphed(fn, warmup=3):
    """``fn`` (every rank's, collectives included) captured in one CUDA graph after a warm-up on
    a side stream; returns its replay."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


def profile(fn, device, out, steps=5):
    """torch.profiler over ``steps`` calls of ``fn`` on every rank: a Chrome trace per rank next to
    ``out``; returns rank's table of the ops by device time (by CPU time on CPU)."""
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    fn()
    _sync(device)
    with torch.profiler.profile(activities=activities) as prof:
        for _ in range(steps):
            fn()
        _sync(device)
    trace = Path(out).with_suffix(f".trace.rank{dist.get_rank()}.json")
    trace.parent.mkdir(parents=True, exist_ok=True)
    prof.export_chrome_trace(str(trace))
    events = prof.key_averages()
    for key in ("self_device_time_total", "self_cuda_time_total", "self_cpu_time_total"):
        try:
            return events.table(sort_by=key, row_limit=15), str(trace)
        except (AttributeError, KeyError, ValueError):
            continue
    return events.table(row_limit=15), str(trace)


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _verdict(ok):
    return "MET" if ok else "MISSED"


def _phases_line(table):
    """``phase max-over-ranks`` in order, and the host time per step."""
    cells = [f"{n} {max(v):.3f}" for n, v in table["phases_ms"].items()]
    return " | ".join(cells) + f"  (host {max(table['host_ms']):.3f} ms per step)"


def summary(doc):
    """The lines printed at the end: each measurement against its target, and where time goes."""
    c, shape = doc["contrastive"], doc["shape"]
    lines = [
        f"gathered contrastive step: {doc['world']} ranks x ({shape['queries']} queries, "
        f"{shape['docs']} docs, Lq {shape['lq']}, Ld {shape['ld']}, {shape['dtype']}) on "
        f"{doc['device']}, slowest rank, ms",
    ]
    for key, label in (("gathered_ms", "gathered, fused (default)"),
                       ("gathered_overlap_ms", "gathered, overlap=True"),
                       ("gathered_shape_exchange_ms", "gathered, shapes exchanged"),
                       ("single_gpu_ms", "one GPU, same per-GPU batch"),
                       ("single_gpu_fused_step_ms", "one GPU, same batch, fused step"),
                       ("single_gpu_2x_docs_ms", "one GPU, 2x docs (the floor)"),
                       ("single_gpu_2x_docs_fused_step_ms", "one GPU, 2x docs, fused step")):
        lines.append(f"  {label:34s} {c[key]:8.3f}")
    for key, label in (("gathered_graph_ms", "gathered, fused, CUDA graph replay"),
                       ("single_gpu_graph_ms", "one GPU, same batch, CUDA graph replay")):
        if key in c:  # --graph: the GPU's time alone
            lines.append(f"  {label:34s} {c[key]:8.3f}")
        elif key.replace("_ms", "_error") in c:
            lines.append(f"  {label:34s} failed: {c[key.replace('_ms', '_error')]}")
    lines += [
        f"  ratio to one GPU: {c['ratio']:.2f}x (target <= {c['target_ratio_at_most']}x: "
        f"{_verdict(c['ratio'] <= c['target_ratio_at_most'])}); best path: {c['best']}",
        f"  cost of distribution over the same compute: {c['overhead_vs_2x_docs']:.2f}x the "
        f"one-GPU step with 2x docs, {c['overhead_vs_2x_docs_fused']:.2f}x its fused step",
        f"  phases, fused: {_phases_line(c['phases_fused'])}",
        f"  phases, overlap: {_phases_line(c['phases_overlap'])}",
    ]
    lines.append(f"  documents' gradient scaled inside the reduce-scatter (NCCL pre-multiplied "
                 f"sum): {doc.get('premultiplied_reduce_scatter')}; "
                 f"settings: {doc.get('env') or {}}")
    t = c["collectives_alone"]
    lines.append(
        f"  collectives alone, {t['bytes_per_rank'] / 1e6:.1f} MB a rank: all-gather "
        f"{t['all_gather_ms']:.3f} ms ({t['all_gather_GBps']:.0f} GB/s), reduce-scatter "
        f"{t['reduce_scatter_ms']:.3f} ms ({t['reduce_scatter_GBps']:.0f} GB/s)")
    lines.append(f"sharded retrieve: {shape['corpus']} x {shape['corpus_ld']} tokens, "
                 f"{shape['retrieve_queries']} queries, top {shape['top_k']}, ms")
    for fmt, r in doc["retrieve"].items():
        lines += [
            f"  {fmt}: sharded {r['sharded_ms']:.3f}, one GPU {r['single_gpu_ms']:.3f} -> "
            f"{r['throughput_ratio']:.2f}x (target >= {r['target_ratio_at_least']}x: "
            f"{_verdict(r['throughput_ratio'] >= r['target_ratio_at_least'])}); identical top-k: "
            f"{r['identical_top_k']}",
            f"    per rank: scan alone {_ranks(r['scan_alone_ms'])}, in the call: scan "
            f"{_ranks(r['phases_ms']['local_scan'])}, merge (with the wait for the slowest) "
            f"{_ranks(r['phases_ms']['merge'])}; "
            f"host {_ranks(r['host_ms'])}",
            f"    one GPU scanning the whole corpus / the slowest shard alone: "
            f"{r['scan_scaling']:.2f}x (the ratio a free merge would give); imbalance "
            f"{r['imbalance']:.3f}",
        ]
    return "\n".join(lines)


def _ranks(values):
    return "[" + ", ".join(f"{v:.3f}" for v in values) + "]"
