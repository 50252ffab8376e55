"""Host time of ``maxsim.distributed.contrastive_loss``'s Python layer: one training step
(forward and backward) with the ops replaced by stubs that return preallocated outputs, on the
``fake`` process group of two ranks (collectives that move nothing) in one process, or on gloo
with ``--gloo`` (one process, world 1: the real collective calls, no partner to wait for). What is
left is validation, layout, collectives' dispatch and autograd. Runs on any machine (CPU).

    python benchmarks/dist_overhead.py
"""
from __future__ import annotations

import argparse
import os
import sys
import time
import types
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "torch-ext"))
from maxsim import distributed  # noqa: E402
from wrapper_overhead import per_call_us  # noqa: E402


def per_step_us(fn, steps=300):
    """Best of 30 averages over ``steps`` steps (the machine's noise: the best is the Python
    layer)."""
    return per_call_us(fn, n=steps, rounds=30)


def stub_ops(B, N, world, Lq, Ld, H):
    """Ops that return preallocated outputs of the shapes the real ones would."""
    q = torch.randn(B, Lq, H)
    loss = torch.tensor(1.0)
    dq, dd = torch.randn(B, Lq, H), torch.randn(world * N, Ld, H)
    scores, argmax = torch.randn(B, world * N), torch.zeros(B, world * N, Lq, dtype=torch.int32)
    part = lambda d: (scores[:, :d.size(0)], argmax[:, :d.size(0)])  # noqa: E731
    return types.SimpleNamespace(
        contrastive_step=lambda *a: (loss, dq, dd),
        fwd=lambda qx, d, *a: part(d),
        ce=lambda s, *a: (loss, torch.ones_like(s)),
        bwd=lambda g, qx, d, *a: (dq, dd[:d.size(0)]),
    ), q


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--gloo", action="store_true", help="gloo, world 1, instead of fake, world 2")
    ap.add_argument("--steps", type=int, default=300, help="steps per timed round")
    args = ap.parse_args(argv)
    if args.gloo:
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29533")
        dist.init_process_group("gloo", rank=0, world_size=1)
    else:
        from torch.testing._internal.distributed.fake_pg import FakeStore
        dist.init_process_group("fake", rank=0, world_size=2, store=FakeStore())
    world = dist.get_world_size()
    B, N, Lq, Ld, H = 8, 8, 8, 16, 32
    ops, _ = stub_ops(B, N, world, Lq, Ld, H)
    distributed.select_ops = lambda device, backend="auto": ops
    Q = torch.randn(B, Lq, H, requires_grad=True)
    D = torch.randn(N, Ld, H, requires_grad=True)

    def step(**kw):
        return lambda: distributed.contrastive_loss(Q, D, temperature=0.05, **kw).backward()

    with torch.no_grad():
        def no_grad():
            distributed.contrastive_loss(Q, D, temperature=0.05, same_shapes=True)
        rows = [("no grad, same_shapes", per_step_us(no_grad, args.steps))]
    rows += [(name, per_step_us(step(**kw), args.steps)) for name, kw in (
        ("fused, same_shapes", {"same_shapes": True}),
        ("fused, shapes exchanged", {}),
        ("overlap, same_shapes", {"same_shapes": True, "overlap": True}),
    )]
    print(f"{dist.get_backend()} world {world}, B {B} N {N} Lq {Lq} Ld {Ld} H {H}, stubbed ops, "
          f"us per step (forward + backward)")
    for name, us in rows:
        print(f"  {name:28s} {us:7.1f}")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
