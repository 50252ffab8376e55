"""Benchmark harness: ceilings, then every workload x dtype x implementation, into one JSON.

    python benchmarks/bench.py                      # full matrix (+ sweeps if time allows)
    python benchmarks/bench.py --only rerank,corpus --dtype bf16 --impl maxsim,naive
    python benchmarks/bench.py --sweeps             # only the sweep rows (README plots)
    python benchmarks/bench.py --smoke              # CPU, tiny shapes, every CPU implementation

Per row: warm-up; one untimed call for peak memory (above what was allocated before it) and
correctness against a float64 reference on the same cast inputs; then >= 30 timed calls with CUDA
events, rotating input sets that together exceed the L2; p20/p50/p80. OOM and errors become the
row's status, never a crash; output outside the correctness gate (gates.py) makes the row `wrong`
(still timed, never a best peer), and the run's exit status 1 when the row is one of maxsim's. Results go to bench_results/<gpu>.json (see bench_results/README.md):
the unfiltered full run replaces that file, any selection (--only, --sweeps, --dtype, --impl)
merges its rows into it.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import re
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("LIK_SUPPRESS_NORM_WARN", "1")

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))

from gates import wrong_reason  # noqa: E402
from impls import REPO, Maxsim, MaxsimAutograd, MaxsimCompat, MaxsimGraph, Naive, TorchFloor  # noqa: E402
from maxsim.emulation import device_capability  # noqa: E402
from peers import PEERS  # noqa: E402
from workloads import BY_NAME, REGISTRY, Unsupported, describe, setup  # noqa: E402

SCHEMA = 2  # 2: every row carries the commit, GPU and date it was measured at
ROW_PROVENANCE = ("commit", "dirty", "gpu", "date")
IMPL_ORDER = ["maxsim", "maxsim-autograd", "maxsim-graph", "maxsim-compat", "torch-floor", "naive",
              "flash-maxsim", "flash-maxsim-fused", "late-interaction-kernels"]
DTYPE_ORDER = ["fp16", "bf16", "fp32"]


# ----------------------------------------------------------------------------------------------
# Environment
# ----------------------------------------------------------------------------------------------


def gpu_slug(name: str) -> str:
    """'NVIDIA H100 80GB HBM3' -> 'h100'; 'NVIDIA GeForce RTX 4090' -> 'rtx4090';
    'Apple M2 Max' -> 'apple-m2-max'."""
    words = [w for w in re.split(r"[^a-z0-9]+", name.lower()) if w]
    if words[:1] == ["apple"]:
        return "-".join(words)
    words = [w for w in words if w not in ("nvidia", "geforce", "tesla", "quadro")]
    for i, w in enumerate(words):
        if re.search(r"\d", w) and not re.fullmatch(r"\d+gb", w):
            if w.isdigit() and i > 0:
                return words[i - 1] + w
            return w
    return "-".join(words) or "gpu"


def git_state() -> tuple[str, bool]:
    """(commit, dirty) from MAXSIM_COMMIT / MAXSIM_DIRTY when set (a copy of the tree whose .git
    is not its own), else from git. Result files are not counted as changes."""
    if "MAXSIM_COMMIT" not in os.environ and (REPO / ".git").exists():
        try:
            run = lambda *a: subprocess.run(a, cwd=REPO, capture_output=True, text=True,  # noqa: E731
                                            check=True).stdout
            commit = run("git", "rev-parse", "HEAD").strip()
            dirty = bool(run("git", "status", "--porcelain", "--", ".",
                             ":(exclude)bench_results").strip())
            return commit, dirty
        except (OSError, subprocess.CalledProcessError):
            pass
    commit = os.environ.get("MAXSIM_COMMIT", "unknown")
    dirty = os.environ.get("MAXSIM_DIRTY", "1").strip().lower() not in ("0", "false", "no", "")
    return commit, dirty


def apple_chip() -> str:
    """'Apple M2 Max' (the chip's name as macOS reports it)."""
    try:
        return subprocess.check_output(["sysctl", "-n", "machdep.cpu.brand_string"],
                                       text=True).strip() or "Apple"
    except (OSError, subprocess.CalledProcessError):
        return "Apple"


def driver_version() -> str | None:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20, check=True).stdout
        return out.strip().splitlines()[0] or None
    except (OSError, subprocess.SubprocessError, IndexError):
        return None


def triton_version() -> str:
    try:
        import triton

        return triton.__version__
    except ImportError:
        return ""


# ----------------------------------------------------------------------------------------------
# Timing and memory
# ----------------------------------------------------------------------------------------------


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


MAX_REPS = 300  # timed calls per row at most


def time_calls(fns, device, *, min_reps=30, max_reps=MAX_REPS, target_s=0.4, warmup=3,
               spin_s=0.2):
    """Milliseconds per call (list), rotating over ``fns`` (one per input set). Warm-up first
    (compilation and autotuning stay out), then a rep count sized to ~target_s of work."""
    n = len(fns)
    for i in range(warmup):
        fns[i % n]()
    sync(device)
    t0, k = time.perf_counter(), 0
    while k < 2 or (k < 20 and time.perf_counter() - t0 < 0.05):
        fns[k % n]()
        sync(device)
        k += 1
    est = (time.perf_counter() - t0) / k
    reps = int(min(max_reps, max(min_reps, target_s / max(est, 1e-7))))
    # Keep the GPU busy for ~spin_s before timing: after an idle spell (a peer's compile, input
    # set-up) its clocks ramp up again, and the first implementation timed would pay for it.
    for r in range(int(min(2000, spin_s / max(est, 1e-7)))):
        fns[r % n]()
    sync(device)
    if device.type == "cuda":
        ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
              for _ in range(reps)]
        out = None
        for r in range(reps):
            ev[r][0].record()
            out = fns[r % n]()
            ev[r][1].record()
        del out
        torch.cuda.synchronize(device)
        return [a.elapsed_time(b) for a, b in ev]
    ms = []
    for r in range(reps):
        t = time.perf_counter()
        fns[r % n]()
        sync(device)  # MPS queues its work: the wall time of one call ends when it has run
        ms.append((time.perf_counter() - t) * 1e3)
    return ms


def kernel_time(fns, device, reps=10):
    """``(ms, launches, kernels)``: the device time the kernels one call launches occupy
    (torch.profiler, ``reps`` calls rotating over ``fns``; the union of their intervals, so that
    kernels running side by side count once), the kernels per call, and ``{name: (launches,
    ms)}`` per call (each kernel's own duration). Host work is not in it, so it does not move with
    the host's speed the way a back-to-back timing does. ``(None, None, {})`` off CUDA."""
    if device.type != "cuda":
        return None, None, {}
    from torch.profiler import ProfilerActivity, profile

    sync(device)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for r in range(reps):
            fns[r % len(fns)]()
        sync(device)
    names = {}
    spans = []
    for e in prof.events():
        if e.device_type != torch.autograd.DeviceType.CUDA:
            continue
        us = e.device_time_total if hasattr(e, "device_time_total") else e.cuda_time_total
        n, t = names.get(e.name[:70], (0, 0.0))
        names[e.name[:70]] = (n + 1 / reps, t + us / 1e3 / reps)
        spans.append((e.time_range.start, e.time_range.start + us))
    if not spans:  # nothing recorded (e.g. a CUDA graph replay the profiler does not see)
        return None, None, {}
    return busy_us(spans) / 1e3 / reps, len(spans) / reps, names


def busy_us(spans):
    """Total length of the union of ``(start, end)`` intervals."""
    total, end = 0.0, -math.inf
    for a, b in sorted(spans):
        if b > end:
            total += b - max(a, end)
            end = b
    return total


def percentile(xs, q):
    xs = sorted(xs)
    i = (len(xs) - 1) * q / 100.0
    lo, hi = math.floor(i), math.ceil(i)
    return xs[lo] + (xs[hi] - xs[lo]) * (i - lo)


def memory_call(fn, device):
    """(output, peak MB above what was allocated before the call) of one untimed call."""
    if device.type != "cuda":
        return fn(), None
    gc.collect()
    torch.cuda.synchronize(device)
    base = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    out = fn()
    torch.cuda.synchronize(device)
    return out, (torch.cuda.max_memory_allocated(device) - base) / 2**20


def free(device):
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def eight_bit_products(n, device):
    """``{name: product}`` of the 8-bit tensor-core rates: int8 x int8 -> int32 (``_int_mm``) and,
    where the GPU has it, e4m3 x e4m3 -> fp16 (``_scaled_mm``); n x n random codes."""
    a = torch.randint(-127, 128, (n, n), dtype=torch.int8, device=device)
    b = torch.randint(-127, 128, (n, n), dtype=torch.int8, device=device).t()  # column-major
    products = {"int8": lambda: torch._int_mm(a, b)}
    if device.type == "cuda" and device_capability(device) >= (8, 9):
        fa = torch.randn(n, n, device=device).div_(4).to(torch.float8_e4m3fn)
        fb = torch.randn(n, n, device=device).div_(4).to(torch.float8_e4m3fn).t()  # column-major
        one = torch.ones((), device=device)
        products["fp8"] = lambda: torch._scaled_mm(fa, fb, one, one, out_dtype=torch.float16)
    return products


def measure_ceilings(device, smoke):
    """HBM: a large device-to-device copy, bytes read + written. Matmul: n^3 fp16, bf16 and fp32
    products on random data (fp32 in full precision, no TF32: the rate exact fp32 inputs are held
    to), int8 x int8 (``int8_tops``, the floor of 8-bit x 8-bit rows) and e4m3 x e4m3 where the
    GPU has it. Medians of 30 timed calls; a product this torch cannot run leaves its rate out."""
    n_bytes = (16 << 20) if smoke else (2 << 30)
    src = torch.randint(0, 255, (n_bytes,), dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    ms = percentile(time_calls([lambda: dst.copy_(src)], device, target_s=0.2), 50)
    hbm = 2 * n_bytes / (ms * 1e-3) / 1e9
    src = dst = None
    n = 256 if smoke else 8192
    rates = {}
    precision = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    try:
        for name, dt in (("fp16", torch.float16), ("bf16", torch.bfloat16),
                         ("fp32", torch.float32)):
            a = torch.randn(n, n, device=device, dtype=dt)
            b = torch.randn(n, n, device=device, dtype=dt)
            ms = percentile(time_calls([lambda a=a, b=b: a @ b], device, target_s=0.3), 50)
            rates[name] = 2 * n**3 / (ms * 1e-3) / 1e12
            a = b = None
    finally:
        torch.set_float32_matmul_precision(precision)
    free(device)
    out = {f"{name}_tflops": rate for name, rate in rates.items()}
    for name, product in eight_bit_products(n, device).items():
        try:
            ms = percentile(time_calls([product], device, target_s=0.3), 50)
            out[RATE_KEY.get(name, f"{name}_tflops")] = 2 * n**3 / (ms * 1e-3) / 1e12
        except (RuntimeError, NotImplementedError) as e:
            print(f"[warn] no {name} rate: {_short(e)}")
    free(device)
    return out | {"hbm_gbps": hbm}


RATE_KEY = {"int8": "int8_tops"}  # integer products: tera-operations, not floating point


def floor_rate(work, dtype_name, ceil):
    """The tensor-core rate (per second) that bounds the row: the 8-bit rate for 8-bit x 8-bit
    rows (``work.rate``), else the row dtype's matmul rate; None when not measured."""
    name = work.rate or dtype_name
    rate = ceil.get(RATE_KEY.get(name, f"{name}_tflops"))
    return rate * 1e12 if rate else None


def floor_ms(work, dtype_name, ceil):
    t_mem = work.bytes / (ceil["hbm_gbps"] * 1e9)
    rate = floor_rate(work, dtype_name, ceil)
    t_flop = work.flops / rate if rate else 0.0
    return max(t_mem, t_flop) * 1e3


# ----------------------------------------------------------------------------------------------
# One row
# ----------------------------------------------------------------------------------------------


def _short(e: BaseException) -> str:
    msg = str(e).strip().splitlines()
    return f"{type(e).__name__}: {msg[0] if msg else ''}"[:300]


def is_oom(e: BaseException) -> bool:
    return isinstance(e, torch.cuda.OutOfMemoryError) or "out of memory" in str(e).lower()


def row_skeleton_for(workload, dtype, impl, floor=None, path=""):
    return {"workload": workload, "dtype": dtype, "impl": impl, "path": path, "status": "ok",
            "ms_p20": None, "ms_p50": None, "ms_p80": None, "floor_ms": floor, "kernel_ms": None,
            "launches": None, "peak_mb": None, "rel_err": None, "top10_agree": None, "note": ""}


def row_skeleton(case, impl, floor):
    row = row_skeleton_for(case.workload.name, case.dtype_name, impl.name, floor, impl.path(case))
    if impl.stand_in:
        row["stand_in"] = True
    return row


class Prepared:
    """One implementation's row of a (workload, dtype) while it is measured: ``fns`` (one call
    per input set) stays None when the row cannot be timed."""

    def __init__(self, row, notes):
        self.row, self.notes, self.fns, self.ms = row, notes, None, []

    def fail(self, e, case, impl_name, device, state):
        self.fns = None
        self.row["status"] = "oom" if is_oom(e) else "error"
        self.notes.append(_short(e))
        if device.type == "cuda" and not is_oom(e):
            try:
                torch.cuda.synchronize(device)
            except Exception as e2:  # noqa: BLE001 - a sticky CUDA error poisons the context
                state["broken"] = f"CUDA context lost at {case.workload.name}/{impl_name}: " \
                                  f"{_short(e2)}"

    def finish(self):
        self.fns = None
        self.row["note"] = "; ".join(n for n in self.notes if n)
        return self.row


def prepare_row(case, impl, ref, floor, device, state) -> Prepared:
    """Binds ``impl`` to every input set, warms it up, measures one call's memory and checks its
    output against the float64 reference."""
    prep = Prepared(row_skeleton(case, impl, floor), [impl.note(case)])
    row = prep.row
    if state.get("broken"):
        prep.notes = [f"not run: {state['broken']}"]
        row["status"] = "error"
        return prep
    out = None
    try:
        try:
            fns = [impl.bind(case, s) for s in case.sets]
        except Unsupported as e:
            row["status"], prep.notes = "unsupported", [str(e)]
            return prep
        if impl.name == "naive" and device.type == "cuda":
            need = case.kind.naive_bytes(case.params, case.meta, case.dtype)
            have = torch.cuda.mem_get_info(device)[0]
            if need > have:
                row["status"] = "oom"
                prep.notes = [f"not run: needs > {need / 2**30:.1f} GiB, "
                              f"{have / 2**30:.1f} GiB free"]
                return prep
        for i in range(2):
            fns[i % len(fns)]()
        sync(device)
        out, peak = memory_call(fns[0], device)
        row["peak_mb"] = peak if impl.counts_memory else None
        prep.fns = fns
        if not impl.stand_in:  # a stand-in is not MaxSim: nothing to check
            output = getattr(impl, "output", None)  # impls.Impl's hook; duck-typed ones lack it
            judge(prep, case, output(out, case) if output else out, ref)
        out = None
    except Exception as e:  # noqa: BLE001 - every failure is recorded in the row
        out = None
        prep.fail(e, case, impl.name, device, state)
    finally:
        free(device)
    return prep


def judge(prep, case, out, ref):
    """Checks one call's output against float64: non-finite output makes the row an ``error``
    (not timed); output outside the gate (gates.py) makes it ``wrong`` (timed, never a peer)."""
    row = prep.row
    err, top, cnote = case.kind.check(out, ref)
    row["rel_err"], row["top10_agree"] = err, top
    prep.notes.append(cnote)
    if err is None:
        row["status"], prep.fns = "error", None
        return
    why = wrong_reason(case.dtype_name, err, top, gradients=case.kind.train)
    if why:
        row["status"] = "wrong"
        prep.notes.insert(0, why)


def time_rows(preps, case, device, args, state):
    """Times the prepared rows of one (workload, dtype) in ``args.rounds`` rounds, the
    implementations interleaved in alternating order, so that a slow spell of the host or the
    GPU falls on all of them alike. Kernel times come after the whole run (kernel_times)."""
    rounds = max(1, args.rounds)
    for r in range(rounds):
        order = preps if r % 2 == 0 else preps[::-1]
        for prep in order:
            if prep.fns is None:
                continue
            try:
                prep.ms += time_calls(
                    prep.fns, device, min_reps=-(-args.min_reps // rounds),
                    max_reps=-(-MAX_REPS // rounds), target_s=args.target_s / rounds,
                    spin_s=0.2 if r == 0 else 0.05)
            except Exception as e:  # noqa: BLE001 - recorded in the row, the others go on
                prep.ms = []
                prep.fail(e, case, prep.row["impl"], device, state)
            finally:
                free(device)
    for prep in preps:
        if prep.fns is None or not prep.ms:
            continue
        ms = prep.ms
        prep.row.update(ms_p20=percentile(ms, 20), ms_p50=percentile(ms, 50),
                        ms_p80=percentile(ms, 80))
        prep.notes.append(f"{len(ms)} reps in {rounds} rounds, {len(prep.fns)} input sets")


def kernel_times(timed, rows, device, l2):
    """Each timed row's kernel time (kernel_time), in a pass of its own after every back-to-back
    timing of the run: a torch.profiler session leaves CUPTI attached to the process, and every
    launch after it costs more (TEARDOWN_CUPTI=1 detaches it, but then the next session hangs).
    ``timed``: (workload, dtype, impls) whose rows were timed; each is set up again."""
    by_key = {(r["workload"], r["dtype"], r["impl"]): r for r in rows}
    for wl, dt, impls in timed:
        case = None
        try:
            case = setup(wl, dt, device, l2_bytes=l2)
            for impl in impls:
                row = by_key[(wl.name, dt, impl.name)]
                try:
                    fns = [impl.bind(case, s) for s in case.sets]
                    for i in range(2):
                        fns[i % len(fns)]()
                    row["kernel_ms"], row["launches"], _ = kernel_time(fns, device)
                except Exception as e:  # noqa: BLE001 - a profiler failure must not fail the row
                    row["note"] = "; ".join(n for n in (row["note"], f"no kernel time: {_short(e)}") if n)
                finally:
                    fns = None
                    free(device)
        except Exception as e:  # noqa: BLE001 - the rows keep their timings
            print(f"  {wl.name:<16} {dt:<5} no kernel times: {_short(e)}", flush=True)
        finally:
            case = None
            free(device)


# ----------------------------------------------------------------------------------------------
# Output
# ----------------------------------------------------------------------------------------------


def _order_key(row):
    names = [w.name for w in REGISTRY]
    w = names.index(row["workload"]) if row["workload"] in names else len(names)
    d = DTYPE_ORDER.index(row["dtype"]) if row["dtype"] in DTYPE_ORDER else 9
    i = IMPL_ORDER.index(row["impl"]) if row["impl"] in IMPL_ORDER else 99
    return (w, row["workload"], d, i, row["impl"])


def _clean(x):
    """JSON-safe: NaN/inf become null."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _clean(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_clean(v) for v in x]
    return x


def write_results(path: Path, header: dict, rows: list, base_rows: list, base: dict | None = None):
    """Rows of this run replace rows with the same (workload, dtype, impl) in ``base_rows``.

    ``base``: the document merged into. Its header (the full run's commit, ceilings, versions) is
    kept, and ``merged_runs`` lists, per later selection, the commit, ceilings and workloads whose
    rows it re-measured, so that every row's provenance stays known."""
    key = lambda r: (r["workload"], r["dtype"], r["impl"])  # noqa: E731
    rows = [stamped(r, header) for r in rows]
    new = {key(r) for r in rows}
    merged = sorted([r for r in base_rows if key(r) not in new] + rows, key=_order_key)
    doc = dict(header)
    if base is not None:
        doc.update({k: v for k, v in base.items() if k not in ("rows", "workloads", "merged_runs")})
        names = sorted({r["workload"] for r in rows})
        runs = []
        for run in base.get("merged_runs", []):  # drop workloads this run measured again
            left = [w for w in run["workloads"] if w not in names]
            if left:
                runs.append({**run, "workloads": left})
        if names:
            runs.append({k: header.get(k) for k in ("commit", "dirty", "date", "ceilings")}
                        | {"workloads": names})
        doc["merged_runs"] = runs
    workloads = dict(header.get("workloads", {}))
    doc["workloads"] = {k: workloads[k] for k in sorted(workloads)}
    doc["rows"] = merged
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(_clean(doc), indent=1) + "\n")
    tmp.replace(path)


def stamped(row, header):
    """``row`` with the commit, dirty flag, GPU and date of the run that measured it: rows of
    several runs share a file, and each keeps its own provenance."""
    return {**row, **{k: header.get(k) for k in ROW_PROVENANCE}}


def fmt(x, spec):
    width = re.match(r"\d*", spec).group()
    return format("-", f">{width}") if x is None else format(x, spec)


def print_table(rows):
    naive = {(r["workload"], r["dtype"]): r["ms_p50"] for r in rows
             if r["impl"] == "naive" and r["status"] == "ok"}
    print(f"\n{'workload':<16} {'dtype':<5} {'impl':<25} {'p50 ms':>9} {'x floor':>8} "
          f"{'x naive':>8} {'rel_err':>8}  status")
    for r in rows:
        p50 = r["ms_p50"]
        xf = p50 / r["floor_ms"] if p50 and r["floor_ms"] else None
        nv = naive.get((r["workload"], r["dtype"]))
        xn = nv / p50 if p50 and nv else None
        st = "" if r["status"] == "ok" else r["status"]
        print(f"{r['workload']:<16} {r['dtype']:<5} {r['impl']:<25} {fmt(p50, '9.4f')} "
              f"{fmt(xf, '8.2f')} {fmt(xn, '8.2f')} {fmt(r['rel_err'], '8.1e')}  {st}")


# ----------------------------------------------------------------------------------------------
# Main
# ----------------------------------------------------------------------------------------------


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--only", help="comma-separated workload names")
    ap.add_argument("--sweeps", action="store_true",
                    help="run the sweep workloads (rerank_ld*, train_mem_b*)")
    ap.add_argument("--no-sweeps", action="store_true", help="leave the sweeps out of a full run")
    ap.add_argument("--dtype", help="comma-separated: fp16,bf16")
    ap.add_argument("--impl", help="comma-separated implementation names")
    ap.add_argument("--out", help="output JSON (default bench_results/<gpu>.json)")
    ap.add_argument("--smoke", action="store_true",
                    help="CPU, tiny shapes, every implementation that runs on the CPU")
    ap.add_argument("--budget-s", type=float, default=390.0,
                    help="a full run starts no sweep workload after this many seconds")
    ap.add_argument("--min-reps", type=int, default=None, help="timed calls per row (>= 30)")
    ap.add_argument("--target-s", type=float, default=None,
                    help="seconds of timed work per row before the rep cap")
    ap.add_argument("--rounds", type=int, default=3,
                    help="timed rounds per (workload, dtype), implementations interleaved")
    ap.add_argument("--no-kernel-time", dest="kernel_time", action="store_false",
                    help="leave out the profiler pass that records each row's kernel time")
    ap.add_argument("--list", action="store_true", help="list the workloads and exit")
    return ap.parse_args(argv)


def select(args):
    split = lambda s: [x.strip() for x in s.split(",") if x.strip()]  # noqa: E731
    if args.only:
        names = split(args.only)
        bad = [n for n in names if n not in BY_NAME]
        if bad:
            sys.exit(f"unknown workload(s) {bad}; known: {[w.name for w in REGISTRY]}")
        chosen = [BY_NAME[n] for n in names]
        if args.sweeps:
            chosen += [w for w in REGISTRY if w.sweep and w not in chosen]
    elif args.sweeps:
        chosen = [w for w in REGISTRY if w.sweep]
    else:
        chosen = [w for w in REGISTRY if not (w.sweep and args.no_sweeps)]
    dtypes = set(split(args.dtype)) if args.dtype else None
    impls = set(split(args.impl)) if args.impl else None
    return chosen, dtypes, impls


def main(argv=None, extra_impls=None):
    """``extra_impls``: with ``--smoke``, the implementations to run instead of the CPU set (the
    tests pass a deliberately broken one)."""
    args = parse_args(argv)
    if args.list:
        for w in REGISTRY:
            print(f"{w.name:<16} {w.kind:<9} {'/'.join(w.dtypes):<10} {describe(w.kind, w.params)}"
                  f"{'  (sweep)' if w.sweep else ''}")
        return 0
    t_start = time.perf_counter()
    chosen, dtypes, impl_filter = select(args)
    # Only the unfiltered full run replaces the file; any selection merges into it.
    merge = bool(args.only or args.sweeps or args.dtype or args.impl)
    requested = {w.name for w in chosen} if (args.only or args.sweeps) else set()
    if args.min_reps is None:
        args.min_reps = 5 if args.smoke else 30
    if args.target_s is None:
        args.target_s = 0.02 if args.smoke else 0.4

    if args.smoke:
        device = torch.device("cpu")
        gpu, l2 = "cpu", 1 << 20
        impls = extra_impls or [Maxsim(backend="torch"), MaxsimAutograd(backend="torch"),
                                MaxsimCompat(backend="torch"), TorchFloor(), Naive()]
    elif not torch.cuda.is_available() and torch.backends.mps.is_available():
        # Apple Silicon: the Metal kernels against naive PyTorch, both on mps.
        device = torch.device("mps")
        gpu, l2 = apple_chip(), 8 << 20
        impls = [Maxsim(), MaxsimAutograd(), Naive()]
    else:
        if not torch.cuda.is_available():
            sys.exit("bench.py needs a CUDA GPU or Apple's MPS (use --smoke to exercise it on the "
                     "CPU)")
        device = torch.device("cuda")
        props = torch.cuda.get_device_properties(device)
        gpu, l2 = props.name, getattr(props, "L2_cache_size", 50 << 20) or (50 << 20)
        impls = [Maxsim(), MaxsimAutograd(), MaxsimGraph(), MaxsimCompat(), TorchFloor(),
                 Naive()] + [P() for P in PEERS]
    if impl_filter:
        impls = [i for i in impls if i.name in impl_filter]
    usable = []
    for impl in impls:
        t0 = time.perf_counter()
        why = impl.unavailable()  # imports it (maxsim may build its extension here, once)
        dt = time.perf_counter() - t0
        if why:
            print(f"[skip] {impl.name}: {why}")
        else:
            usable.append(impl)
            print(f"[impl] {impl.name} {impl.version() or ''} (import {dt:.1f}s)")

    out_path = Path(args.out) if args.out else (
        Path("/tmp/maxsim-bench-smoke.json") if args.smoke
        else REPO / "bench_results" / f"{gpu_slug(gpu)}.json")
    base_rows, old_workloads, base = [], {}, None
    if merge and out_path.exists():
        try:
            old = json.loads(out_path.read_text())
            if old.get("schema") == SCHEMA:
                base_rows, old_workloads, base = old.get("rows", []), old.get("workloads", {}), old
        except (OSError, json.JSONDecodeError) as e:
            print(f"[warn] cannot merge into {out_path}: {e}; starting afresh")

    torch.manual_seed(0)
    ceilings = measure_ceilings(device, args.smoke)
    commit, dirty = git_state()
    header = {
        "schema": SCHEMA, "commit": commit, "dirty": dirty, "gpu": gpu,
        "date": time.strftime("%Y-%m-%d", time.gmtime()),
        "torch": torch.__version__, "cuda": torch.version.cuda or "", "triton": triton_version(),
        "ceilings": ceilings,
        "driver": driver_version() if device.type == "cuda" else None,
        "l2_mb": l2 / 2**20,
        "versions": {i.name: i.version() for i in usable if i.version()},
    }
    print(f"{gpu} | torch {header['torch']} | CUDA {header['cuda']} | triton {header['triton']} "
          f"| commit {commit[:12]}{' (dirty)' if dirty else ''}")
    print("ceilings: " + ", ".join(f"{k} {v:,.0f}" for k, v in ceilings.items()))

    rows, workloads_meta, state = [], dict(old_workloads), {}
    skipped, timed = [], []
    for wl in chosen:
        late = time.perf_counter() - t_start > args.budget_s
        if wl.sweep and wl.name not in requested and late:
            skipped.append(wl.name)
            continue
        shape = wl.shape(args.smoke)
        workloads_meta[wl.name] = {"kind": wl.kind, "shape": describe(wl.kind, shape), **shape,
                                   "sweep": wl.sweep, "about": wl.about}
        for dt in wl.dtypes:
            if dtypes and dt not in dtypes:
                continue
            t_case = time.perf_counter()
            case = ref = None
            try:
                case = setup(wl, dt, device, smoke=args.smoke, l2_bytes=l2)
                ref = case.kind.reference(case.sets[0], case.meta)
                free(device)
                floor = floor_ms(case.kind.work(case.params, case.meta, case.dtype), dt, ceilings)
                preps, bound = [], []
                for impl in usable:
                    if not impl.applies(case):
                        continue
                    if case.kind.name not in impl.kinds:  # recorded, so every impl has a row
                        rows.append({**row_skeleton(case, impl, floor), "status": "unsupported",
                                     "note": f"{impl.name} covers {', '.join(impl.kinds)} "
                                             f"workloads only"})
                        continue
                    preps.append(prepare_row(case, impl, ref, floor, device, state))
                    bound.append(impl)
                t_rows = time.perf_counter()
                try:
                    time_rows(preps, case, device, args, state)
                    timed.append((wl, dt, [i for i, p in zip(bound, preps) if p.fns and p.ms]))
                finally:
                    for prep in preps:
                        row = prep.finish()
                        rows.append(row)
                        print(f"  {wl.name:<16} {dt:<5} {row['impl']:<25} {row['status']:<11} "
                              f"p50 {fmt(row['ms_p50'], '.4f')} ms  floor {floor:.4f} ms  "
                              f"rel_err {fmt(row['rel_err'], '.1e')}  {row['note']}", flush=True)
                    print(f"  timed in {time.perf_counter() - t_rows:.1f}s", flush=True)
            except Exception as e:  # noqa: BLE001 - setup or reference failed: record, go on
                for impl in usable:
                    if wl.kind in impl.kinds and not impl.stand_in:
                        r = row_skeleton_for(wl.name, dt, impl.name)
                        r.update(status="oom" if is_oom(e) else "error",
                                 note=f"setup failed: {_short(e)}")
                        rows.append(r)
                print(f"  {wl.name:<16} {dt:<5} setup failed: {_short(e)}", flush=True)
            finally:
                case = ref = None
                free(device)
            print(f"  -- {wl.name} {dt} done in {time.perf_counter() - t_case:.1f}s "
                  f"(total {time.perf_counter() - t_start:.0f}s)", flush=True)
            header["workloads"] = workloads_meta
            header["elapsed_s"] = round(time.perf_counter() - t_start, 1)
            write_results(out_path, header, rows, base_rows, base)

    if args.kernel_time and device.type == "cuda":
        t_kernels = time.perf_counter()
        kernel_times(timed, rows, device, l2)
        print(f"kernel times in {time.perf_counter() - t_kernels:.1f}s", flush=True)
    header["workloads"] = workloads_meta
    header["elapsed_s"] = round(time.perf_counter() - t_start, 1)
    write_results(out_path, header, rows, base_rows, base)
    print_table(sorted(rows, key=_order_key))
    if skipped:
        print(f"\nsweeps left out for time ({args.budget_s:.0f}s budget): {', '.join(skipped)}; "
              f"add them with: python benchmarks/bench.py --sweeps")
    print(f"\nwrote {out_path} ({len(rows)} rows, {time.perf_counter() - t_start:.0f}s)")
    ours_wrong = [f"{r['workload']}/{r['dtype']}/{r['impl']}" for r in rows
                  if r["impl"].startswith("maxsim") and r["status"] == "wrong"]
    if ours_wrong:  # the measurements are written all the same; the run fails
        print(f"maxsim rows outside the correctness gate: {', '.join(ours_wrong)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
