"""Loads maxsim the way a user of the Hugging Face `kernels` package does, from a variant built by
scripts/build_variant.py, and checks its padded, all-pairs and packed paths against a float64
reference. Runs on a GPU machine with `kernels` installed:

    python scripts/hub_check.py [--build] [--archs "9.0a"]

--build first runs the build (timed; the variant's size is printed). The checks run in a fresh
interpreter that never sees this repository's torch-ext/, so only the variant can answer.
"""
import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "build" / "hub"

CHECK = r'''
import sys
import torch
from kernels import get_kernel, get_local_kernel

assert not any("torch-ext" in p for p in sys.path)
by_env = get_kernel("maxsim/maxsim", version=2, trust_remote_code=True)
by_path = get_local_kernel(__import__("pathlib").Path(sys.argv[1]), trust_remote_code=True)
print("get_kernel (LOCAL_KERNELS):", by_env.__name__, "| get_local_kernel:", by_path.__name__)


def ref(Q, D, qv, dv):
    """float64 MaxSim of every (query, document) pair: Q [Nq, Lq, H], D [Nd, Ld, H]."""
    sim = torch.einsum("qih,djh->qdij", Q.double(), D.double())
    sim = sim.masked_fill(~dv[None, :, None, :], float("-inf"))
    best = sim.max(-1).values
    best = torch.where(torch.isinf(best) | ~qv[:, None, :], 0.0, best)
    return best.sum(-1)


def close(name, got, want):
    err = float((got.double() - want).abs().max() / want.abs().max().clamp_min(1e-30))
    print(f"  {name:34s} rel err {err:.1e}")
    assert err < 1e-6, name


torch.manual_seed(0)
dev = "cuda"
for k in (by_env, by_path):
    print(k.__name__, "backend:", k.cuda_ops()[1] or "CUDA extension")
    assert k.cuda_ops()[0] is not None
    for dtype in (torch.float16, torch.bfloat16):
        nq, K, lq, ld, h = 6, 9, 32, 200, 128
        Q = torch.nn.functional.normalize(torch.randn(nq, lq, h, device=dev), dim=-1).to(dtype)
        D = torch.nn.functional.normalize(torch.randn(nq * K, ld, h, device=dev), dim=-1).to(dtype)
        d_len = torch.randint(1, ld + 1, (nq * K,), device=dev)
        dv = torch.arange(ld, device=dev) < d_len[:, None]
        qv = torch.ones(nq, lq, dtype=torch.bool, device=dev)
        full = ref(Q, D, qv, dv)
        # padded candidates [Nq, K, Ld, H]
        got = k.maxsim(Q, D.view(nq, K, ld, h), d_lengths=d_len.view(nq, K))
        want = torch.stack([full[i, i * K:(i + 1) * K] for i in range(nq)])
        close(f"padded candidates {dtype}", got, want)
        # all pairs [Nd, Ld, H]
        close(f"all pairs {dtype}", k.maxsim(Q, D, d_mask=dv), full)
        # packed pairs
        q_pack = Q.reshape(-1, h)
        cu_q = torch.arange(0, nq * lq + 1, lq, device=dev, dtype=torch.int32)
        d_pack = torch.cat([D[j, : d_len[j]] for j in range(nq * K)])
        cu_d = torch.zeros(nq * K + 1, dtype=torch.int32, device=dev)
        cu_d[1:] = torch.cumsum(d_len, 0)
        pq = torch.randint(0, nq, (40,), device=dev)
        pd = torch.randint(0, nq * K, (40,), device=dev)
        got = k.maxsim_varlen(q_pack, cu_q, d_pack, cu_d, max_seqlen_q=lq, pair_q=pq, pair_d=pd)
        close(f"packed pairs {dtype}", got, full[pq, pd])
print("hub check: all passed")
'''


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--build", action="store_true", help="build the variant first (timed)")
    ap.add_argument("--archs", help="passed to build_variant.py (default: all of its archs)")
    args = ap.parse_args()
    if args.build:
        cmd = [sys.executable, str(ROOT / "scripts" / "build_variant.py"), "--out", str(OUT)]
        if args.archs:
            cmd += ["--archs", args.archs]
        t = time.time()
        subprocess.run(cmd, check=True)
        size = sum(p.stat().st_size for p in OUT.rglob("*") if p.is_file())
        print(f"build: {time.time() - t:.0f} s, variant {size / 2**20:.1f} MiB", flush=True)
    env = dict(os.environ, LOCAL_KERNELS=f"maxsim/maxsim={OUT}", HF_HUB_OFFLINE="1")
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and "torch-ext" not in p
    )
    return subprocess.run([sys.executable, "-c", CHECK, str(OUT)], env=env, cwd="/").returncode


if __name__ == "__main__":
    sys.exit(main())
