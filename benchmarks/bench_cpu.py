"""CPU benchmark: maxsim's compiled CPU kernels and its pure-PyTorch path against the naive
einsum and maxsim-cpu (PyPI), per workload x dtype x thread count x ISA path, into one JSON.

    python benchmarks/bench_cpu.py                  # bench_results/cpu-<model>.json
    python benchmarks/bench_cpu.py --quick          # fewer reps, no file unless --out
    python benchmarks/bench_cpu.py --isas auto,avx2 # the ISA paths to time (default: auto and
                                                    # every vector path this CPU runs)

Each ISA path runs in its own process (MAXSIM_CPU_ISA is read once): ``auto`` (the path maxsim
picks) times every workload, a forced path the ``FORCED`` ones on 1 and 2 threads. Every row
carries ``isa`` (the path that ran), ``cpu`` and ``cpu_flags`` (the CPU's vector features).
``maxsim-after-einsum`` is maxsim called right after an (untimed) einsum, whose OpenMP workers
may still be spinning: the call a training or eval loop makes.

Rows follow bench_results/h100.json (workload, dtype, impl, status, ms_p20/p50/p80, rel_err,
peak_mb, note) plus ``threads``. After a warm-up, the implementations of a workload are timed
interleaved call by call (>= 5 rounds), so that load from other processes falls on all of them
alike. ``peak_mb``: growth of the process's peak resident memory during one call (inputs and
outputs included, so it bounds the working memory from above). maxsim-cpu (``pip install
maxsim-cpu``, imported when found) picks its own thread count (all cores): its rows carry
``threads`` = all cores. The ``SCALING`` workloads are also timed on 1 and 2 threads.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import maxsim  # noqa: E402
from bench import _clean, git_state, percentile  # noqa: E402
from impls import REPO  # noqa: E402
from workloads import padded_scores, ref_allpairs, ref_grouped, rel_err, tokens  # noqa: E402

try:
    import maxsim_cpu  # noqa: E402
except ImportError:
    maxsim_cpu = None

H, LQ = 128, 32
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}

# name: (kind, shape, dtypes, about)
WORKLOADS = {
    "corpus180": ("allpairs", dict(Nq=1, Nd=1000, Ld=180), ["fp32", "bf16"],
                  "1 query x 1000 documents x 180 tokens"),
    "corpus512": ("allpairs", dict(Nq=1, Nd=1000, Ld=512), ["fp32", "bf16"],
                  "1 query x 1000 documents x 512 tokens (maxsim-cpu's README case)"),
    "corpus_var": ("varlen", dict(Nq=1, Nd=1000, lo=50, hi=800), ["fp32"],
                   "1 query x 1000 documents of 50-800 tokens, packed (maxsim-cpu's README case)"),
    "corpus_var_padded": ("allpairs", dict(Nq=1, Nd=1000, Ld=800, lo=50), ["fp32"],
                          "the same documents padded to 800, with lengths"),
    "rerank": ("grouped", dict(Nq=32, K=50, Ld=180), ["fp32", "bf16", "fp16"],
               "rerank B32 K50 Ld180"),
    "rerank_ragged": ("grouped", dict(Nq=32, K=50, Ld=300, lo=30), ["fp32", "bf16"],
                      "rerank B32 K50, documents of 30-300 tokens padded to 300"),
    "allpairs": ("allpairs", dict(Nq=32, Nd=256, Ld=180), ["fp32", "bf16"],
                 "all pairs Nq32 Nd256 Ld180"),
}
SCALING = ("corpus512", "rerank", "allpairs")  # also timed on 1 and 2 threads
FORCED = ("corpus512", "rerank", "allpairs")  # the workloads of a forced ISA path
VECTOR_ISAS = ("avx2", "avx512", "avx512bf16", "neon")


def thread_counts(name: str, cores: int) -> list[int]:
    """All cores, then (scaling workloads) 2 and 1 thread where the machine has more."""
    if name not in SCALING:
        return [cores]
    return [cores] + [t for t in (2, 1) if t < cores]


def cpu_flags() -> str:
    """The CPU's vector features (x86 AVX / FMA / F16C / AMX, Arm ASIMD / SVE), space-separated."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return ""
    line = next((x for x in text.splitlines() if x.startswith(("flags", "Features"))), "")
    wanted = re.compile(r"^(avx.*|fma|f16c|amx.*|asimd.*|sve.*|bf16|i8mm)$")
    return " ".join(f for f in line.split(":", 1)[-1].split() if wanted.match(f))


def peer_version(dist: str):
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "cpu"


def cpu_slug(model: str) -> str:
    """'AMD EPYC 7R13 Processor' -> 'amd-epyc-7r13'."""
    words = [w for w in re.split(r"[^a-z0-9]+", model.lower()) if w]
    words = [w for w in words if w not in ("processor", "cpu", "r", "tm", "core", "with")]
    return "-".join(words[:4]) or "cpu"


def peak_rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM"):
            return int(line.split()[1]) / 1024
    return float("nan")


def memory_call(fn):
    """(output, MB the peak resident memory grew by during one call), via clear_refs."""
    try:
        Path("/proc/self/clear_refs").write_text("5")  # resets the peak to the current RSS
    except OSError:
        return fn(), None
    before = peak_rss_mb()
    out = fn()
    return out, max(0.0, peak_rss_mb() - before)


def time_interleaved(fns, reps, target_s=20.0, before=None):
    """Milliseconds per call of each of ``fns`` (a dict), one call of each in turn per round, so
    that every implementation sees the same load from whatever else runs on the machine.
    ``before``: {name: an untimed call made right before each timed call of that name}."""
    before = before or {}
    est = {}
    for name, fn in fns.items():
        fn()
        t = time.perf_counter()
        fn()
        est[name] = time.perf_counter() - t
    rounds = int(max(reps, min(30, target_s / max(sum(est.values()), 1e-6))))
    ms = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            if name in before:
                before[name]()
            t = time.perf_counter()
            fn()
            ms[name].append((time.perf_counter() - t) * 1e3)
    return ms


def make_case(kind, p, dtype, seed=0):
    """Inputs, the float64 reference scores and one callable per implementation."""
    gen, cpu_gen = torch.Generator().manual_seed(seed), torch.Generator().manual_seed(seed + 1)
    Q = tokens((p["Nq"], LQ, H), dtype, gen, "cpu")
    impls = {}
    if kind == "varlen":
        lengths = torch.randint(p["lo"], p["hi"] + 1, (p["Nd"],), generator=cpu_gen)
        docs = tokens((int(lengths.sum()), H), dtype, gen, "cpu")
        offsets = torch.cat([lengths.new_zeros(1), lengths.cumsum(0)]).to(torch.int32)
        parts = list(docs.split(lengths.tolist()))
        impls["maxsim"] = lambda: maxsim.score_contrastive(Q, docs, offsets, backend="cpu")
        impls["maxsim-torch"] = lambda: maxsim.score_contrastive(Q, docs, offsets, backend="torch")
        impls["naive"] = lambda: torch.stack(
            [(Q[0] @ d.T).amax(-1).float().sum() for d in parts])[None]
        if maxsim_cpu is not None and dtype == torch.float32:
            qn, dn = Q[0].numpy(), [d.numpy() for d in parts]
            impls["maxsim-cpu"] = lambda: torch.from_numpy(
                maxsim_cpu.maxsim_scores_variable(qn, dn))[None]
        ref = torch.stack([padded_scores(Q.double(), d[None].double())[0, 0] for d in parts])[None]
        return impls, ref
    if kind == "grouped":
        D = tokens((p["Nq"], p["K"], p["Ld"], H), dtype, gen, "cpu")
        d_mask = None
        if "lo" in p:
            lengths = torch.randint(p["lo"], p["Ld"] + 1, (p["Nq"], p["K"]), generator=cpu_gen)
            d_mask = torch.arange(p["Ld"]) < lengths[..., None]
        impls["maxsim"] = lambda: maxsim.maxsim(Q, D, d_mask=d_mask, backend="cpu")
        impls["maxsim-after-einsum"] = impls["maxsim"]
        impls["maxsim-torch"] = lambda: maxsim.maxsim(Q, D, d_mask=d_mask, backend="torch")
        impls["naive"] = lambda: padded_scores(Q, D, None, d_mask, grouped=True)
        return impls, ref_grouped(Q, D, None, d_mask)
    D = tokens((p["Nd"], p["Ld"], H), dtype, gen, "cpu")
    d_mask = None
    if "lo" in p:
        lengths = torch.randint(p["lo"], p["Ld"] + 1, (p["Nd"],), generator=cpu_gen)
        d_mask = torch.arange(p["Ld"]) < lengths[:, None]
    impls["maxsim"] = lambda: maxsim.maxsim(Q, D, d_mask=d_mask, backend="cpu")
    impls["maxsim-after-einsum"] = impls["maxsim"]
    impls["maxsim-torch"] = lambda: maxsim.maxsim(Q, D, d_mask=d_mask, backend="torch")
    impls["naive"] = lambda: padded_scores(Q, D, None, d_mask)
    if maxsim_cpu is not None and dtype == torch.float32 and p["Nq"] == 1 and d_mask is None:
        qn, dn = Q[0].numpy(), D.numpy()
        impls["maxsim-cpu"] = lambda: torch.from_numpy(maxsim_cpu.maxsim_scores(qn, dn))[None]
    return impls, ref_allpairs(Q, D, None, d_mask)


def run_rows(name, dtype_name, impls, ref, threads, reps):
    """One row per implementation: memory and error of one call each, then interleaved timing
    (``maxsim-after-einsum``: each timed call right after a call of ``naive``)."""
    rows, ok = {}, {}
    for impl, fn in impls.items():
        row = dict(workload=name, dtype=dtype_name, impl=impl, threads=threads, status="ok",
                   ms_p20=None, ms_p50=None, ms_p80=None, floor_ms=None, peak_mb=None,
                   rel_err=None, note="")
        try:
            out, row["peak_mb"] = memory_call(fn)
            row["rel_err"] = rel_err(out.reshape(ref.shape), ref)
            ok[impl] = fn
        except Exception as e:  # a failure is the row's status, never a crash
            row.update(status="error", note=f"{type(e).__name__}: {str(e)[:200]}")
        rows[impl] = row
    before = {"maxsim-after-einsum": impls["naive"]} if "naive" in ok else {}
    for impl, ms in time_interleaved(ok, reps, before=before).items():
        rows[impl].update(ms_p20=percentile(ms, 20), ms_p50=percentile(ms, 50),
                          ms_p80=percentile(ms, 80), note=f"{len(ms)} interleaved reps")
    return list(rows.values())


def bench_this_process(mode, names, reps, cores):
    """The rows of one ISA path, the one this process runs (``mode``: auto or the forced name)."""
    ops, reason = maxsim.cpu_ops()
    if ops is None:
        sys.exit(f"the compiled CPU kernels are unavailable: {reason}")
    isa = ops.cpu_isa()
    model, flags = cpu_model(), cpu_flags()
    rows = []
    for name in names:
        if mode != "auto" and name not in FORCED:
            continue
        kind, p, dtypes, _ = WORKLOADS[name]
        for dtype_name in dtypes:
            if mode != "auto" and dtype_name == "fp16":
                continue
            impls, ref = make_case(kind, p, DTYPES[dtype_name])
            if mode != "auto":  # the pure-PyTorch path does not depend on the ISA
                impls.pop("maxsim-torch", None)
            counts = thread_counts(name, cores) if mode == "auto" else [
                t for t in (2, 1) if t <= cores]
            for threads in counts:
                torch.set_num_threads(threads)
                fns = {k: v for k, v in impls.items() if k != "maxsim-cpu" or threads == cores}
                for row in run_rows(name, dtype_name, fns, ref, threads, reps):
                    # The bf16 tile takes bf16 inputs only; others run the AVX-512 one (tile.h).
                    tile = "avx512" if isa == "avx512bf16" and dtype_name != "bf16" else isa
                    row.update(isa=tile, isa_mode=mode, cpu=model, cpu_flags=flags)
                    rows.append(row)
                    print(f"{mode:>10} {isa:<10} {name:<18} {dtype_name:<5} {row['impl']:<19} "
                          f"{threads:>2}t {row['ms_p50'] or float('nan'):9.2f} ms  rel_err "
                          f"{row['rel_err'] or 0:.1e}  peak {row['peak_mb'] or 0:.0f} MB "
                          f"{row['status'] if row['status'] != 'ok' else ''}", flush=True)
            torch.set_num_threads(cores)
    return rows, reason


def bench_child(mode, argv):
    """Runs ``mode``'s path in a child process (MAXSIM_CPU_ISA is read once per process); its
    rows, or None with the reason where this CPU lacks the path."""
    env = dict(os.environ)
    env.pop("MAXSIM_CPU_ISA", None)
    if mode != "auto":
        env["MAXSIM_CPU_ISA"] = mode
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "rows.json"
        done = subprocess.run([sys.executable, __file__, *argv, "--child", mode,
                               "--child-out", str(out)], env=env, stderr=subprocess.PIPE,
                              text=True)
        if done.returncode != 0:
            tail = done.stderr.strip().splitlines()[-1:] or [""]
            print(f"{mode}: skipped ({tail[0]})", flush=True)
            return None
        return json.loads(out.read_text())


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="3 reps per row, no file unless --out")
    ap.add_argument("--only", default="", help="comma-separated workloads")
    ap.add_argument("--reps", type=int, default=5, help="interleaved rounds at least")
    ap.add_argument("--isas", default=",".join(("auto",) + VECTOR_ISAS),
                    help="comma-separated ISA paths: auto, scalar, avx2, avx512, avx512bf16, neon")
    ap.add_argument("--out", default=None,
                    help="output JSON (default bench_results/cpu-<model>.json)")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--child-out", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    cores = torch.get_num_threads()
    reps = 3 if args.quick else args.reps
    names = [n for n in WORKLOADS if not args.only or n in args.only.split(",")]
    if args.child:
        rows, reason = bench_this_process(args.child, names, reps, cores)
        Path(args.child_out).write_text(json.dumps(dict(rows=rows, extension=reason)))
        return
    child_argv = ["--reps", str(args.reps), "--only", args.only] + ["--quick"] * args.quick
    rows, reason, t0 = [], None, time.time()
    for mode in args.isas.split(","):
        result = bench_child(mode, child_argv)
        if result is not None:
            rows += result["rows"]
            reason = reason or result["extension"]
    commit, dirty = git_state()
    model = cpu_model()
    today = time.strftime("%Y-%m-%d")
    for row in rows:  # each row names where and when it was measured (bench_results/README.md)
        row.update(commit=commit[:12], dirty=dirty, gpu=f"CPU: {model}", date=today)
    doc = dict(
        schema=2, commit=commit[:12], dirty=dirty, cpu=model, cpu_flags=cpu_flags(),
        threads=cores, torch=torch.__version__, extension=reason,
        versions={"maxsim": getattr(maxsim, "__version__", "?"),
                  "maxsim-cpu": peer_version("maxsim-cpu") if maxsim_cpu else None},
        elapsed_s=round(time.time() - t0, 1),
        workloads={n: dict(kind=WORKLOADS[n][0], **WORKLOADS[n][1], Lq=LQ, H=H,
                           about=WORKLOADS[n][3]) for n in names},
        rows=rows,
    )
    if args.quick and args.out is None:
        return
    out = Path(args.out) if args.out else REPO / "bench_results" / f"cpu-{cpu_slug(model)}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(_clean(doc), indent=1) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
