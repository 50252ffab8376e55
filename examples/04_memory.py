"""Memory: peak memory of one all-pairs training step, naive PyTorch vs maxsim, for a growing batch.

A training step is forward + backward of in-batch cross-entropy over the all-pairs scores [B, B].
Naive PyTorch materialises the [B, B, Lq, Ld] similarity tensor (and its gradient); maxsim does not.
Reported: the peak memory the step adds on top of its inputs.

    python examples/04_memory.py [--device cpu|cuda] [--out DIR] [--quick]

CUDA: torch.cuda.max_memory_allocated. CPU: every measurement runs in a fresh subprocess, which
reports how far its resident set grew during the step (ru_maxrss, or psutil where installed); this
includes allocator slack and is coarser than the CUDA number. So on CPU the ratio column is noisy
at small batches (a few MiB of allocator pages either way move it 2x) and means something only
once the naive step's [B, B, Lq, Ld] tensor dwarfs that slack: it then grows with the batch,
because naive memory grows as B^2 while maxsim's stays near its budget.

Off CUDA (the compiled CPU kernels, the Metal kernels, the PyTorch fallback), maxsim works in
pieces sized by MAXSIM_TORCH_MEMORY_MB (library default 128): its extra memory grows until it
reaches that budget and then stays there. `--fallback-mb` sets the budget for this run (default
16, so that the plateau shows at the small CPU sizes). The second line printed names the backend
that runs.
"""

import argparse
import gc
import json
import os
import subprocess
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

try:
    import maxsim
except ImportError:  # a source checkout without `pip install .`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "torch-ext"))
    import maxsim

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
MiB = 2.0**20


def naive_maxsim(Q, D, q_mask, d_mask):
    """All-pairs MaxSim in plain PyTorch: materialises the [Nq, Nd, Lq, Ld] similarity tensor."""
    sim = torch.einsum("qih,djh->qdij", Q, D)
    sim = sim.masked_fill(~d_mask[None, :, None, :], float("-inf"))
    return sim.max(-1).values.float().masked_fill(~q_mask[:, None, :], 0).sum(-1)


IMPLS = {"naive": naive_maxsim, "maxsim": maxsim.maxsim}


def make_inputs(batch, lq, ld, h, dtype, device, seed=0):
    g = torch.Generator().manual_seed(seed)
    Q, D = (F.normalize(torch.randn(batch, n, h, generator=g), dim=-1).to(device, dtype)
            .requires_grad_() for n in (lq, ld))
    q_mask = (torch.arange(lq) < torch.randint(1, lq + 1, (batch, 1), generator=g)).to(device)
    d_mask = (torch.arange(ld) < torch.randint(1, ld + 1, (batch, 1), generator=g)).to(device)
    return Q, D, q_mask, d_mask


def train_step(impl, Q, D, q_mask, d_mask):
    scores = IMPLS[impl](Q, D, q_mask, d_mask)  # [B, B]
    labels = torch.arange(scores.shape[0], device=scores.device)
    F.cross_entropy(scores / 0.05, labels).backward()


def rss_now():
    """Current resident set in bytes, or None where it cannot be read cheaply."""
    try:
        import psutil

        return psutil.Process().memory_info().rss
    except ImportError:
        pass
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return None


def rss_peak():
    """Peak resident set of this process in bytes."""
    try:
        import resource
    except ImportError:  # Windows
        import psutil

        return psutil.Process().memory_info().peak_wset
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024  # Linux reports KiB


def measure_here(impl, batch, shape, dtype, device):
    """Peak extra bytes of one training step, measured in this process."""
    train_step(impl, *make_inputs(2, *shape, dtype, device))  # warm-up: lazy init, thread pools
    inputs = make_inputs(batch, *shape, dtype, device)
    gc.collect()
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        train_step(impl, *inputs)
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - base
    base = rss_now()
    base = rss_peak() if base is None else base
    train_step(impl, *inputs)
    return max(0, rss_peak() - base)


def measure(impl, batch, shape, args):
    """Peak extra bytes, or None when the step ran out of memory."""
    device = torch.device(args.device)
    if device.type == "cuda":
        try:
            return measure_here(impl, batch, shape, DTYPES[args.dtype], device)
        except torch.OutOfMemoryError:
            return None
        finally:
            gc.collect()
            torch.cuda.empty_cache()
    cmd = [sys.executable, __file__, "--device", args.device, "--dtype", args.dtype,
           "--worker", impl, str(batch), *map(str, shape)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        if "MemoryError" in proc.stderr or proc.returncode < 0:
            return None
        raise RuntimeError(f"measurement {impl} batch {batch} failed:\n{proc.stderr}")
    return json.loads(proc.stdout.strip().splitlines()[-1])["peak_bytes"]


def backend_label(device):
    """What maxsim's dispatch picks for tensors on `device`, and for CPU tensors which loop runs."""
    ops = maxsim.select_ops(device)
    if ops is maxsim.dispatch.torch_ops:
        reason = maxsim.cpu_ops()[1] if device.type == "cpu" else ""
        return "the PyTorch fallback" + (f" ({reason.splitlines()[0]})" if reason else "")
    if device.type == "cpu":
        from maxsim.info import cpu_path

        return f"the compiled CPU kernels ({cpu_path()[1].split(';')[0]})"
    return {"cuda": "the CUDA kernels", "mps": "the Metal kernels"}.get(device.type, str(ops))


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--out", default=str(Path(__file__).resolve().parent / "out"))
    p.add_argument("--dtype", choices=DTYPES, default="fp32", help="fp16/bf16 on CUDA only")
    p.add_argument("--quick", action="store_true", help="two small batches")
    p.add_argument("--fallback-mb", type=float, default=16,
                   help="MAXSIM_TORCH_MEMORY_MB, maxsim's working memory off CUDA (default 16)")
    p.add_argument("--worker", nargs=5, metavar=("IMPL", "B", "LQ", "LD", "H"),
                   help=argparse.SUPPRESS)
    args = p.parse_args()
    device = torch.device(args.device)
    if args.dtype != "fp32" and device.type != "cuda":
        p.error(f"--dtype {args.dtype} needs --device cuda")

    if args.worker:
        impl, *sizes = args.worker
        batch, *shape = map(int, sizes)
        peak = measure_here(impl, batch, shape, DTYPES[args.dtype], device)
        print(json.dumps({"peak_bytes": peak}))
        return

    os.environ["MAXSIM_TORCH_MEMORY_MB"] = f"{args.fallback_mb:g}"  # read at call time; inherited
    backend = (f"maxsim backend: {backend_label(device)}, "
               f"MAXSIM_TORCH_MEMORY_MB={args.fallback_mb:g}")

    if device.type == "cuda":
        shape, batches = (32, 300, 128), [16, 32, 64, 128, 256, 512, 1024]
    else:
        shape, batches = (32, 128, 64), [8, 16, 32, 64, 128]
    if args.quick:
        shape, batches = (16, 64, 32), [8, 32]
    lq, ld, h = shape
    elt = torch.tensor([], dtype=DTYPES[args.dtype]).element_size()
    print(f"device {device}; Lq {lq}, Ld {ld}, H {h}, {args.dtype}; "
          "peak memory one training step adds on top of its inputs")
    print(backend)
    print(f"{'batch':>6} {'[B,B,Lq,Ld] MiB':>16} {'naive MiB':>10} {'maxsim MiB':>11} "
          f"{'naive/maxsim':>13}")
    rows = []
    naive_oom = False
    for batch in batches:
        naive = None if naive_oom else measure("naive", batch, shape, args)
        naive_oom = naive is None
        ours = measure("maxsim", batch, shape, args)
        sim = batch * batch * lq * ld * elt
        rows.append((batch, sim, naive, ours))
        fmt = lambda b: "OOM" if b is None else f"{b / MiB:.1f}"  # noqa: E731
        ratio = f"{naive / ours:.0f}x" if naive and ours else "-"
        print(f"{batch:>6} {sim / MiB:>16.1f} {fmt(naive):>10} {fmt(ours):>11} {ratio:>13}")

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(6, 4), constrained_layout=True)
    xs = [r[0] for r in rows]
    ax.plot(xs, [r[1] / MiB for r in rows], ":", color="gray", label="size of [B, B, Lq, Ld]")
    for i, name in ((2, "naive PyTorch"), (3, "maxsim")):
        pts = [(r[0], r[i] / MiB) for r in rows if r[i] is not None]
        ax.plot(*zip(*pts), "o-", label=name)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("batch (queries = documents)")
    ax.set_ylabel("peak extra memory, MiB")
    ax.set_title(f"training step, Lq={lq}, Ld={ld}, H={h}, {args.dtype}, {device.type}")
    ax.legend()
    path = out / "04_memory.png"
    fig.savefig(path, dpi=120)
    print(f"wrote {path}")
    if device.type != "cuda":
        print("CPU: resident-set growth, allocator slack included: ratios at small batches are "
              "noise; maxsim levels off near its budget (--fallback-mb) while naive grows as B^2.")


if __name__ == "__main__":
    main()
