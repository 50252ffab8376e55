"""Everything we check on Hopper, per emulated GPU (MAXSIM_EMULATE_GPU, docs/ARCHITECTURE.md):
the build of that GPU's PTX, gpu_check.py (every kernel check against float64), the CUDA tests,
compute-sanitizer memcheck (sanitize_cases.py's kernel calls and fuzz corpus, and each bench
workload once at a capped size) and the bench workloads' kernel time against the naive einsum on
the same card. Run on the GPU machine by `scripts/gpu_check.sh archs`:

    [ARCHS="t4 a100 a10g"] [ARCH_BUDGET_S=510] [ARCH_SKIP="gpu_check bench"] \
        python3 scripts/arch_check.py --out $OUT

Writes $OUT/archs.json (bench_results/archs.json's entries of GPUs not run here are kept, so two
calls of three GPUs each add up) and logs under $OUT/archs/. Builds run side by side, then the
checks of ARCH_PARALLEL (3) GPUs at a time; the benchmarks run one GPU at a time, alone on the
card. ARCH_TESTS replaces the test selection. The card's timings are the card's, not the emulated
GPU's: the bench ratios are a floor (cuBLAS takes its own kernels for this card).
Exit status 1 when any check, test or memcheck failed or did not run.
"""

import argparse
import importlib.util
import json
import os
import re
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def load_emulation():
    """maxsim/emulation.py by path: importing the package here would build its extension for
    this card in this process, which emulates nothing."""
    path = ROOT / "torch-ext" / "maxsim" / "emulation.py"
    spec = importlib.util.spec_from_file_location("maxsim_emulation", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


emulation = load_emulation()

# The CUDA-marked tests that run kernels; left out: integrations, several GPUs, examples, docs,
# Metal, and test_gpu_check (it builds its own sm_90a extension).
TEST_ARGS = (
    "-m cuda tests --ignore=tests/test_integrations_pylate.py "
    "--ignore=tests/test_integrations_colpali.py "
    "--ignore=tests/test_integrations_pylate_distributed.py "
    "--ignore=tests/test_integrations_sentence_transformers.py --ignore=tests/test_distributed.py "
    "--ignore=tests/test_examples.py --ignore=tests/test_docs.py --ignore=tests/test_gpu_check.py "
    "--ignore=tests/test_metal.py --ignore=tests/test_metal_harness.py --ignore=tests/test_mps.py "
    "--ignore=tests/test_hf_job.py"
)
# Each bench workload once under memcheck: the same lengths and dim (they pick the tile), fewer
# queries / candidates / documents (memcheck runs every access in software).
MEMCHECK_CAPS = {"B": 4, "K": 8, "Nq": 8, "Nd": 64, "Nb": 8}
STEP_LIMIT_S = {"build": 420, "gpu_check": 300, "tests": 300, "memcheck": 240, "bench": 120}


class Run:
    """The call's deadline and its output folder."""

    def __init__(self, out, budget_s):
        self.out, self.logs = out, out / "archs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.deadline = time.monotonic() + budget_s

    def left(self):
        return self.deadline - time.monotonic()


def child_env(gpu, jobs=16):
    env = dict(os.environ, MAXSIM_EMULATE_GPU=gpu.name, MAX_JOBS=str(jobs))
    # the driver's JIT of the PTX is paid once per build, then read from this cache
    env.setdefault("CUDA_CACHE_PATH", "/tmp/maxsim_jit_cache")
    env.setdefault("CUDA_CACHE_MAXSIZE", str(4 << 30))
    paths = [str(ROOT / "torch-ext"), env.get("PYTHONPATH")]
    env["PYTHONPATH"] = os.pathsep.join(filter(None, paths))
    return env


def step(run, gpu, name, cmd, jobs=16):
    """Runs one step of one GPU (log in $OUT/archs/<gpu>_<name>.log); (exit code or None when
    it was not run or timed out, log text, seconds)."""
    limit = min(STEP_LIMIT_S[name], run.left())
    log = run.logs / f"{gpu.name}_{name}.log"
    if name in os.environ.get("ARCH_SKIP", "").split():
        log.write_text("not run: ARCH_SKIP\n")
        return None, "", 0.0
    if limit < 20:
        log.write_text("not run: out of time\n")
        return None, "", 0.0
    t = time.monotonic()
    with open(log, "w") as f:
        try:
            rc = subprocess.run(cmd, cwd=ROOT, env=child_env(gpu, jobs), stdout=f,
                                stderr=subprocess.STDOUT, timeout=limit).returncode
        except subprocess.TimeoutExpired:
            rc = None
            f.write(f"\ntimed out after {limit:.0f} s\n")
    seconds = time.monotonic() - t
    print(f"  {gpu.name:<8} {name:<10} exit {rc} in {seconds:.0f} s", flush=True)
    return rc, log.read_text(errors="replace"), seconds


def count(pattern, text):
    return sum(int(m) for m in re.findall(pattern, text))


def build(run, gpus):
    """One build per PTX arch, side by side; {ptx: (ok, seconds)}."""
    first = {}
    for gpu in gpus:
        first.setdefault(gpu.ptx, gpu)
    code = "import maxsim; ops, why = maxsim.cuda_ops(); print(why); assert ops is not None, why"
    jobs = max(4, 32 // len(first))
    with ThreadPoolExecutor(len(first)) as pool:
        done = pool.map(lambda g: step(run, g, "build", [sys.executable, "-c", code], jobs),
                        first.values())
        return {g.ptx: (rc == 0, s) for g, (rc, _, s) in zip(first.values(), done)}


def checks(run, gpu, entry):
    """gpu_check.py, the CUDA tests and memcheck of one GPU, into its entry."""
    py = sys.executable
    rc, log, s = step(run, gpu, "gpu_check", [py, "scripts/gpu_check.py"])
    m = re.search(r"checks: (\d+)/(\d+) passed", log)
    entry["gpu_check"] = {"passed": int(m[1]), "failed": int(m[2]) - int(m[1])} if m else \
        {"passed": 0, "failed": None, "error": f"exit {rc}: no summary line"}
    if m and rc != 0:
        entry["gpu_check"]["error"] = f"exit {rc}"
    entry["seconds"]["gpu_check"] = round(s)

    tests = os.environ.get("ARCH_TESTS", TEST_ARGS).split()
    cmd = [py, "-m", "pytest", "-q", "-p", "no:cacheprovider", *tests]
    rc, log, s = step(run, gpu, "tests", cmd)
    final = re.compile(r"\d+ (passed|failed|errors?)\b.* in ")  # pytest's closing line
    finals = [ln for ln in log.splitlines() if final.search(ln)]
    summary = finals[-1] if finals else ""
    entry["tests"] = {"passed": count(r"(\d+) passed", summary),
                      "failed": count(r"(\d+) (?:failed|errors?)\b", summary),
                      "skipped": count(r"(\d+) skipped", summary)}
    if rc not in (0, 1):
        entry["tests"]["error"] = f"exit {rc}: {summary[-200:]}"
    entry["seconds"]["tests"] = round(s)

    cmd = ["compute-sanitizer", "--tool", "memcheck", "--error-exitcode", "1", py, __file__,
           "--memcheck-cases"]
    rc, log, s = step(run, gpu, "memcheck", cmd)
    m = re.search(r"ERROR SUMMARY: (\d+) error", log)
    entry["memcheck_errors"] = int(m[1]) if m else None
    if rc != 0 or "memcheck cases: done" not in log:
        entry["memcheck_error"] = f"exit {rc}" + ("" if "memcheck cases: done" in log else
                                                 ", the cases did not finish")
    entry["seconds"]["memcheck"] = round(s)


def bench(run, gpu, entry):
    """Kernel time of every bench workload, maxsim against the naive einsum (bench_child)."""
    out = run.logs / f"{gpu.name}_bench.json"
    rc, _, s = step(run, gpu, "bench", [sys.executable, __file__, "--bench-child", str(out)])
    entry["seconds"]["bench"] = round(s)
    entry["bench"] = json.loads(out.read_text()) if out.exists() else {}
    if rc != 0:
        entry["bench_error"] = f"exit {rc}"


def bench_child(out):
    """In the emulating process, alone on the card: per non-sweep bench workload and dtype, the
    kernel time (bench.py's kernel_time: device time of one call) of maxsim and of the naive
    einsum on the same inputs; written to `out` after each row."""
    import torch

    sys.path.insert(0, str(ROOT / "benchmarks"))
    from bench import kernel_time
    from impls import Maxsim, Naive
    from workloads import REGISTRY, setup

    device, table = torch.device("cuda"), {}
    l2 = torch.cuda.get_device_properties(device).L2_cache_size
    for wl in (w for w in REGISTRY if not w.sweep):
        for dt in wl.dtypes:
            cell = table.setdefault(f"{wl.name}/{dt}", {})
            try:
                case = setup(wl, dt, device, l2_bytes=l2, max_sets=8)
                for impl in (Maxsim(), Naive()):
                    need = case.kind.naive_bytes(case.params, case.meta, case.dtype)
                    if impl.name == "naive" and need > torch.cuda.mem_get_info(device)[0]:
                        cell["naive_ms"], cell["naive_note"] = None, "out of memory"
                        continue
                    fns = [impl.bind(case, s) for s in case.sets]
                    for i in range(2):
                        fns[i % len(fns)]()
                    ms = kernel_time(fns, device)[0]
                    cell[f"{impl.name}_ms"] = None if ms is None else round(ms, 5)
                    fns = None
            except Exception as e:  # noqa: BLE001 - record the row's failure, go on
                cell["error"] = f"{type(e).__name__}: {str(e)[:200]}"
            case = None
            torch.cuda.empty_cache()
            print(f"{wl.name}/{dt}: {cell}", flush=True)
            Path(out).write_text(json.dumps(table, indent=1) + "\n")
    return 1 if any("error" in c for c in table.values()) else 0


def memcheck_cases():
    """The child under compute-sanitizer: sanitize_cases.py's kernel calls and fuzz corpus, then
    each bench workload once with MEMCHECK_CAPS."""
    import dataclasses

    import torch

    sys.path[:0] = [str(ROOT / "scripts"), str(ROOT / "benchmarks")]
    import sanitize_cases
    from impls import Maxsim
    from workloads import REGISTRY, setup

    torch.manual_seed(0)
    sanitize_cases.kernel_cases()
    mismatches = sanitize_cases.fuzz(0, 1, "cuda")
    impl, device, failed = Maxsim(), torch.device("cuda"), 0
    for wl in (w for w in REGISTRY if not w.sweep):
        capped = {k: min(v, MEMCHECK_CAPS[k]) if k in MEMCHECK_CAPS else v
                  for k, v in wl.params.items()}
        wl = dataclasses.replace(wl, params=capped)
        for dt in wl.dtypes:
            try:
                case = setup(wl, dt, device, l2_bytes=0, max_sets=1)
                impl.bind(case, case.sets[0])()
                torch.cuda.synchronize()
            except Exception as e:  # noqa: BLE001 - a failed call fails the step, the rest run
                failed += 1
                print(f"memcheck case {wl.name}/{dt} failed: {type(e).__name__}: {e}", flush=True)
    print(f"memcheck cases: done ({mismatches} fuzz mismatches, {failed} failed calls)", flush=True)
    return 1 if mismatches or failed else 0


def guarded(stage, run, gpu, entry):
    """Runs a stage of one GPU; a failure of this script is recorded in the entry, and the other
    GPUs and stages go on."""
    try:
        stage(run, gpu, entry)
    except Exception as e:  # noqa: BLE001 - the entry says what broke
        entry.setdefault("errors", []).append(f"{stage.__name__}: {type(e).__name__}: {e}")
        print(f"  {gpu.name:<8} {stage.__name__} broke: {type(e).__name__}: {e}", flush=True)


def new_entry(gpu, ran_on, commit):
    return {"arch": gpu.name, "sm": gpu.capability[0] * 10 + gpu.capability[1],
            "smem_per_block": gpu.smem_per_block, "sms": gpu.sms,
            "ptx": "compute_" + gpu.ptx.replace(".", ""), "gpu_check": None, "tests": None,
            "memcheck_errors": None, "bench": {}, "commit": commit, "ran_on": ran_on,
            "date": time.strftime("%Y-%m-%d", time.gmtime()), "seconds": {}}


def passed(entry):
    """Whether an entry ran everything with no failure and no memcheck error."""
    return bool(entry.get("gpu_check") and entry.get("tests")) and "errors" not in entry and \
        entry["gpu_check"]["failed"] == 0 and entry["gpu_check"]["passed"] > 0 and \
        entry["tests"]["failed"] == 0 and entry["tests"]["passed"] > 0 and \
        "error" not in entry["gpu_check"] and "error" not in entry["tests"] and \
        entry.get("memcheck_errors") == 0 and "memcheck_error" not in entry


def slowest(entry):
    """(maxsim over naive speed-up, row) of the row where maxsim gains least, or (None, "")."""
    ratios = [(c["naive_ms"] / c["maxsim_ms"], k) for k, c in entry.get("bench", {}).items()
              if c.get("maxsim_ms") and c.get("naive_ms")]
    return min(ratios) if ratios else (None, "")


def table(entries):
    lines = [f"{'gpu':<8} {'sm':>4} {'SMs':>4} {'smem':>7} {'checks':>10} {'tests':>10} "
             f"{'memcheck':>8} {'min x naive':>22}  result"]
    for e in entries:
        chk, tst = e.get("gpu_check") or {}, e.get("tests") or {}
        ratio, row = slowest(e)
        speed = f"{ratio:.2f}x {row}" if ratio else "-"
        result = "ok" if passed(e) else "FAIL"
        if ratio is not None and ratio <= 1.0:
            result += " (slower than naive)"
        kb = e["smem_per_block"] // 1024
        lines.append(f"{e['arch']:<8} {e['sm']:>4} {e['sms']:>4} {kb:>5}KB "
                     f"{chk.get('passed', '-')}/{str(chk.get('failed', '-')):<5} "
                     f"{tst.get('passed', '-'):>5}/{str(tst.get('failed', '-')):<4} "
                     f"{str(e.get('memcheck_errors', '-')):>8} {speed:>22}  {result}")
    return "\n".join(lines)


def commit_and_card():
    import torch

    commit = os.environ.get("MAXSIM_COMMIT") or subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    if os.environ.get("MAXSIM_DIRTY") == "1":
        commit += "-dirty"
    driver = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                            capture_output=True, text=True).stdout.strip().splitlines()
    card = f"{torch.cuda.get_device_name()}, driver {driver[0] if driver else '?'}, " \
           f"torch {torch.__version__}, CUDA {torch.version.cuda}"
    return commit or "unknown", card


def write(run, entries):
    """$OUT/archs.json: this call's entries over those already in bench_results/archs.json."""
    kept = ROOT / "bench_results" / "archs.json"
    earlier = json.loads(kept.read_text())["entries"] if kept.exists() else []
    by_arch = {e["arch"]: e for e in earlier}
    by_arch.update({e["arch"]: e for e in entries})
    order = list(emulation.GPUS)
    doc = {"about": "each GPU's code (its PTX, JIT-compiled for the card) and limits, emulated on "
                    "the card of ran_on (MAXSIM_EMULATE_GPU); bench: kernel ms on that card",
           "entries": sorted(by_arch.values(), key=lambda e: order.index(e["arch"]))}
    (run.out / "archs.json").write_text(json.dumps(doc, indent=1) + "\n")
    return doc["entries"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "/tmp/maxsim_out")))
    ap.add_argument("--memcheck-cases", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--bench-child", metavar="JSON", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.memcheck_cases:
        return memcheck_cases()
    if args.bench_child:
        return bench_child(args.bench_child)
    names = os.environ.get("ARCHS", " ".join(emulation.GPUS)).lower().split()
    bad = [n for n in names if n not in emulation.GPUS]
    if bad:
        sys.exit(f"ARCHS: expected names from {' '.join(emulation.GPUS)}, got {' '.join(bad)}")
    gpus = [emulation.GPUS[n] for n in names]
    run = Run(args.out, float(os.environ.get("ARCH_BUDGET_S", "510")))
    commit, card = commit_and_card()
    print(f"emulating {' '.join(names)} on {card}", flush=True)
    entries = [new_entry(g, card, commit) for g in gpus]
    built = build(run, gpus)
    for gpu, entry in zip(gpus, entries):
        entry["seconds"]["build"] = round(built[gpu.ptx][1])
    ready = [(g, e) for g, e in zip(gpus, entries) if built[g.ptx][0]]
    with ThreadPoolExecutor(int(os.environ.get("ARCH_PARALLEL", "3"))) as pool:
        list(pool.map(lambda ge: guarded(checks, run, *ge), ready))
    write(run, entries)
    for gpu, entry in ready:
        guarded(bench, run, gpu, entry)
        write(run, entries)
    print(table(write(run, entries)), flush=True)
    return 0 if all(passed(e) for e in entries) else 1


if __name__ == "__main__":
    sys.exit(main())
