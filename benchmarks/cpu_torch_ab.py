"""The PyTorch path's block GEMMs against the path they replaced (``fallback.py``'s general
blocks, taken when ``fallback_scores`` declines a call) and the naive einsum, interleaved call
by call in one process, on ``bench_cpu.py``'s workloads. Prints one markdown row per workload
and dtype: p50 ms of naive, before, after, and before / after over naive.

    PYTHONPATH=torch-ext python benchmarks/cpu_torch_ab.py --threads 2
"""

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_cpu  # noqa: E402
from maxsim import fallback_scores  # noqa: E402


def general_path(fn):
    """``fn`` run with the block-GEMM path declining every call."""
    def run():
        supported = fallback_scores.supported
        fallback_scores.supported = lambda *args: False
        try:
            return fn()
        finally:
            fallback_scores.supported = supported
    return run


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default=",".join(bench_cpu.WORKLOADS))
    ap.add_argument("--dtypes", default="fp32,bf16")
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    print("| workload | dtype | threads | naive | torch before | torch after | before / naive "
          "| after / naive |\n| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for name in args.only.split(","):
        kind, shape, dtypes, _ = bench_cpu.WORKLOADS[name]
        for dtype in [d for d in args.dtypes.split(",") if d in dtypes]:
            impls, _ = bench_cpu.make_case(kind, shape, bench_cpu.DTYPES[dtype])
            fns = {"naive": impls["naive"], "before": general_path(impls["maxsim-torch"]),
                   "after": impls["maxsim-torch"]}
            ms = bench_cpu.time_interleaved(fns, 5, target_s=6)
            p50 = {k: bench_cpu.percentile(v, 50) for k, v in ms.items()}
            print(f"| {name} | {dtype} | {args.threads} | {p50['naive']:.1f} | "
                  f"{p50['before']:.1f} | {p50['after']:.1f} | "
                  f"{p50['before'] / p50['naive']:.2f} | {p50['after'] / p50['naive']:.2f} |",
                  flush=True)


if __name__ == "__main__":
    main()
