"""Where a call's time goes: host work per call vs GPU kernel time per call, for each workload and
implementation. A row whose back-to-back time is near its host time is host-bound, and no kernel
work will move it.

    python benchmarks/call_profile.py [--only rerank,varlen] [--impl maxsim] [--out FILE]

Columns: ``loop`` back-to-back time per call (CUDA events, as bench.py times it); ``host`` Python +
dispatcher + launch time per call (wall clock of calls queued without a sync); ``gpu`` kernel
time per call (kernels side by side count once) and ``launches`` kernels per call (torch.profiler).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench import kernel_time, percentile, time_calls  # noqa: E402
from impls import Maxsim, MaxsimAutograd, MaxsimCompat, Naive, TorchFloor  # noqa: E402
from peers import PEERS  # noqa: E402
from workloads import BY_NAME, REGISTRY, Unsupported, setup  # noqa: E402


def warm_up(fns):
    """Three calls first: compilation, autotuning and allocations stay out of what is measured."""
    for f in fns[:3]:
        f()


def host_us(fns, reps=60):
    """Host time per call: calls queued back to back (never enough to fill the launch queue)."""
    warm_up(fns)
    torch.cuda.synchronize()
    out = []
    for _ in range(5):
        t0 = time.perf_counter()
        for r in range(reps):
            fns[r % len(fns)]()
        out.append((time.perf_counter() - t0) / reps * 1e6)
        torch.cuda.synchronize()
    return min(out)


def host_floor():
    """Host microseconds of the cheapest things a call does, on this machine: an allocation from
    PyTorch's caching allocator and a one-element kernel launch. A call's host time over these
    says how much of it is our own work."""
    x = torch.zeros(1, device="cuda")
    return {
        "torch.empty": host_us([lambda: torch.empty(256, device="cuda")]),
        "x.add_(1) (one launch)": host_us([lambda: x.add_(1)]),
        "torch.add(x, 1) (alloc + launch)": host_us([lambda: torch.add(x, 1)]),
    }


def gpu_us(fns, reps=20):
    """(kernel microseconds per call, kernels per call, {name: (calls, us)}) after a warm-up."""
    warm_up(fns)
    ms, launches, names = kernel_time(fns, torch.device("cuda"), reps)
    if ms is None:
        return float("nan"), 0.0, {}
    return ms * 1e3, launches, {k: (n, t * 1e3) for k, (n, t) in names.items()}


def profiled_call(fns):
    """One call inside the profiler range, after the warm-up (a peer's autotuning included)."""
    warm_up(fns)
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    fns[0]()
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()


def bound_calls(names, impls, dtype_name, dev):
    """(workload, dtype, impl, fns) for each implementation that takes each workload, its inputs
    set up once per workload; an implementation that fails to bind is reported and skipped."""
    for name in names:
        wl = BY_NAME[name]
        dtype = dtype_name if dtype_name in wl.dtypes else wl.dtypes[0]
        case = setup(wl, dtype, dev, l2_bytes=torch.cuda.get_device_properties(dev).L2_cache_size)
        for impl in impls:
            if wl.kind not in impl.kinds or not impl.applies(case):
                continue
            try:
                fns = [impl.bind(case, s) for s in case.sets]
            except Unsupported:
                continue
            except Exception as e:  # noqa: BLE001 - a failing peer must not stop the profile
                print(f"{name:16} {impl.name:26} error: {type(e).__name__}: {str(e)[:80]}")
                continue
            yield name, dtype, impl, fns
        del case
        torch.cuda.empty_cache()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--only", help="comma-separated workload names (default: all but sweeps)")
    ap.add_argument("--impl", help="comma-separated implementation names")
    ap.add_argument("--dtype", default="fp16")
    ap.add_argument("--out", help="JSON file for the rows")
    ap.add_argument("--ncu", action="store_true",
                    help="run each call once between cudaProfilerStart/Stop after a warm-up and "
                         "time nothing (for `ncu --profile-from-start off`)")
    args = ap.parse_args(argv)
    names = args.only.split(",") if args.only else [w.name for w in REGISTRY if not w.sweep]
    impls = [Maxsim(), MaxsimAutograd(), MaxsimCompat(), TorchFloor(), Naive()]
    impls += [P() for P in PEERS]
    if args.impl:
        impls = [i for i in impls if i.name in args.impl.split(",")]
    impls = [i for i in impls if i.unavailable() is None]
    dev = torch.device("cuda")
    floor = {} if args.ncu else host_floor()
    for what, us in floor.items():
        print(f"host floor: {what:34} {us:6.1f} us")
    if args.ncu:
        for name, _, impl, fns in bound_calls(names, impls, args.dtype, dev):
            profiled_call(fns)
            print(f"{name:16} {impl.name:26} profiled one call", flush=True)
        return 0
    # Kernel times in a second pass: a torch.profiler session slows every later launch of the
    # process (CUPTI stays attached), so no call is timed after one.
    print(f"{'workload':16} {'impl':26} {'loop us':>8} {'host us':>8}")
    rows = {}
    for name, dtype, impl, fns in bound_calls(names, impls, args.dtype, dev):
        try:
            loop = percentile(time_calls(fns, dev, target_s=0.2), 50) * 1e3
            host = host_us(fns)
        except Exception as e:  # noqa: BLE001 - a failing peer must not stop the profile
            print(f"{name:16} {impl.name:26} error: {type(e).__name__}: {str(e)[:80]}")
            continue
        rows[name, impl.name] = dict(workload=name, dtype=dtype, impl=impl.name, loop_us=loop,
                                     host_us=host)
        print(f"{name:16} {impl.name:26} {loop:8.1f} {host:8.1f}", flush=True)
    print(f"{'workload':16} {'impl':26} {'gpu us':>8} {'launches':>8}")
    for name, _, impl, fns in bound_calls(names, impls, args.dtype, dev):
        if (name, impl.name) not in rows:
            continue
        try:
            gpu, launches, kern = gpu_us(fns)
        except Exception as e:  # noqa: BLE001 - the row keeps its host time
            print(f"{name:16} {impl.name:26} no kernel time: {type(e).__name__}: {str(e)[:80]}")
            continue
        rows[name, impl.name].update(gpu_us=gpu, launches=launches, kernels=kern)
        print(f"{name:16} {impl.name:26} {gpu:8.1f} {launches:8.1f}", flush=True)
        if impl.name.startswith("maxsim"):
            for k, (n, us) in sorted(kern.items(), key=lambda kv: -kv[1][1]):
                print(f"      {us:8.1f} us  x{n:g}  {k}")
    rows = list(rows.values())
    if args.out:
        Path(args.out).write_text(json.dumps(
            dict(gpu=torch.cuda.get_device_name(), host_floor_us=floor, rows=rows), indent=1))


if __name__ == "__main__":
    sys.exit(main())
