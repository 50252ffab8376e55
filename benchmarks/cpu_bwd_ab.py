"""The CPU backward op alone, source trees compared in fresh processes (each tree builds and loads
its own CPU extension), the trees' order reversed every round. Prints, per case, each round's
p20 ms of 200 calls per tree, and whether every tree's gradients summed to the same value.

    python benchmarks/cpu_bwd_ab.py --roots build/ab/base,. --threads 2 --rounds 4
"""

import argparse
import json
import subprocess
import sys

# name: (queries, Lq, documents, Ld, dtype), all pairs, H = 128
CASES = {"s32x80_fp32": (32, 32, 32, 80, "float32"), "s32x80_bf16": (32, 32, 32, 80, "bfloat16"),
         "m64x128_fp32": (64, 32, 64, 128, "float32"), "l32x256x180_fp32": (32, 32, 256, 180, "float32")}

CHILD = r"""
import json, sys, time, torch
sys.path.insert(0, sys.argv[1] + "/torch-ext")
from maxsim._ops import load_cpu_ops
ops, why = load_cpu_ops()
assert ops is not None, why
torch.set_num_threads(int(sys.argv[2]))
out = {}
for name, (nq, lq, nd, ld, dt) in json.loads(sys.argv[3]).items():
    torch.manual_seed(0)
    dtype = getattr(torch, dt)
    q = torch.nn.functional.normalize(torch.randn(nq, lq, 128), dim=-1).to(dtype)
    d = torch.nn.functional.normalize(torch.randn(nd, ld, 128), dim=-1).to(dtype)
    s, am = ops.fwd(q, d, None, None, None, None, None, None, None, None, 0, 0, lq, True, False)
    g = torch.randn_like(s)
    ts = []
    for _ in range(205):
        t0 = time.perf_counter()
        dq, dd = ops.bwd(g, q, d, am, None, None, None, None, 0, 0)
        ts.append(time.perf_counter() - t0)
    ts = sorted(ts[5:])
    out[name] = [ts[len(ts) // 5] * 1e3, float(dq.float().abs().sum() + dd.float().abs().sum())]
print(json.dumps(out))
"""


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--roots", required=True, help="comma-separated source trees")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=4)
    args = ap.parse_args(argv)
    roots = args.roots.split(",")
    res = {r: [] for r in roots}
    for k in range(args.rounds):
        for root in roots if k % 2 == 0 else roots[::-1]:
            run = subprocess.run([sys.executable, "-c", CHILD, root, str(args.threads), json.dumps(CASES)],
                                 capture_output=True, text=True, check=True)
            res[root].append(json.loads(run.stdout.strip().splitlines()[-1]))
    for case in CASES:
        rounds = "   ".join(f"{r}: " + " / ".join(f"{x[case][0]:.2f}" for x in res[r]) for r in roots)
        same = len({x[case][1] for r in roots for x in res[r]}) == 1
        print(f"{case:18s} {rounds}   same gradients: {same}")


if __name__ == "__main__":
    main()
