"""What a build of PTX alone costs at first use against machine code, on the GPU at hand:

    python3 scripts/jit_cost.py [--out $OUT]

builds two kernels-hub variants of the package (scripts/build_variant.py): `9.0a` (sm_90a machine
code, what a Hopper runs) and `9.0+PTX-only` (compute_90 PTX alone, what a GPU newer than the
build's machine code runs: the driver JIT-compiles it). Then, per variant, two fresh processes
share one empty CUDA_CACHE_PATH: the first pays the driver's JIT (cold), the second finds its
result in the cache (warm). Each process times the import, the first call, and the first call of
each further kind of call (each reaches kernels of other translation units, which the driver
loads, and JIT-compiles, lazily). Writes $OUT/jit_cost.json and prints a table.
"""

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VARIANTS = {"sm_90a": "9.0a", "compute_90 PTX": "9.0+PTX-only"}


def build(archs, out):
    """The variant folder build_variant.py writes for `archs` under `out`."""
    env = dict(os.environ, MAX_JOBS=os.environ.get("MAX_JOBS", "16"))
    subprocess.run([sys.executable, str(ROOT / "scripts" / "build_variant.py"), "--archs", archs,
                    "--out", str(out)], check=True, env=env, stdout=subprocess.DEVNULL)
    return next(p for p in out.iterdir() if (p / "metadata.json").exists())


def calls(M, torch):
    """(name, call) of the kinds of call whose first use is timed, first call first."""
    dev = "cuda"
    Q = torch.randn(8, 32, 128, device=dev, dtype=torch.float16)
    D = torch.randn(64, 180, 128, device=dev, dtype=torch.float16)
    Qg = Q.clone().requires_grad_()

    def backward():
        M.maxsim(Qg, D).sum().backward()

    return [
        ("fp16 all pairs", lambda: M.maxsim(Q, D)),
        ("bf16 all pairs", lambda: M.maxsim(Q.bfloat16(), D.bfloat16())),
        ("fp32 all pairs", lambda: M.maxsim(Q.float(), D.float())),
        ("argmax", lambda: M.maxsim_with_argmax(Q, D)),
        ("backward", backward),
        ("int8 documents", lambda: M.maxsim(Q, M.quantize(D, "int8"))),
    ]


def child(variant_dir):
    """One fresh process: seconds to import the variant and to each kind's first call."""
    t0 = time.perf_counter()
    import torch

    torch.zeros(1, device="cuda")
    torch.cuda.synchronize()
    times = {"context": time.perf_counter() - t0}
    t = time.perf_counter()
    spec = importlib.util.spec_from_file_location(
        "maxsim_jit_variant", variant_dir / "__init__.py",
        submodule_search_locations=[str(variant_dir)])
    M = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = M
    spec.loader.exec_module(M)
    ops, reason = M.cuda_ops()
    assert ops is not None and "bundled" in reason, reason
    times["import"] = time.perf_counter() - t
    for name, call in calls(M, torch):
        t = time.perf_counter()
        call()
        torch.cuda.synchronize()
        times[name] = time.perf_counter() - t
    t = time.perf_counter()
    calls(M, torch)[0][1]()  # the first kind again: the call itself, no loading
    torch.cuda.synchronize()
    times["fp16 all pairs, again"] = time.perf_counter() - t
    print(json.dumps({k: round(v, 4) for k, v in times.items()}))


def measure(variant_dir):
    """{cold, warm}: the child's times with an empty JIT cache, then with the one it filled."""
    cache = tempfile.mkdtemp(prefix="maxsim_jit_cache_")
    env = dict(os.environ, CUDA_CACHE_PATH=cache, CUDA_CACHE_MAXSIZE=str(4 << 30))
    env.pop("MAXSIM_EMULATE_GPU", None)
    out = {}
    for run in ("cold", "warm"):
        res = subprocess.run([sys.executable, __file__, "--child", str(variant_dir)], env=env,
                             capture_output=True, text=True, check=True)
        out[run] = json.loads(res.stdout.strip().splitlines()[-1])
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "/tmp/maxsim_out")))
    ap.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(args.child)
    import torch

    builds = Path(tempfile.mkdtemp(prefix="maxsim_jit_builds_"))
    result = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
              "cuda": torch.version.cuda, "variants": {}}
    for name, archs in VARIANTS.items():
        t = time.perf_counter()
        variant = build(archs, builds / name.replace(" ", "_"))
        print(f"built {name} ({archs}) in {time.perf_counter() - t:.0f} s", flush=True)
        result["variants"][name] = {"archs": archs, **measure(variant)}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "jit_cost.json").write_text(json.dumps(result, indent=1) + "\n")
    kinds = list(result["variants"]["sm_90a"]["cold"])
    print(f"\nseconds on {result['gpu']} (fresh process each column)")
    print(f"{'':<24}" + "".join(f"{v + ' ' + r:>22}" for v in VARIANTS for r in ("cold", "warm")))
    for kind in kinds:
        cells = [result["variants"][v][r][kind] for v in VARIANTS for r in ("cold", "warm")]
        print(f"{kind:<24}" + "".join(f"{c:>22.3f}" for c in cells))
    totals = {v: sum(t for k, t in result["variants"][v]["cold"].items() if k != "context")
              for v in VARIANTS}
    print("first use, import + every kind (cold cache): "
          + ", ".join(f"{v} {s:.2f} s" for v, s in totals.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
