"""maxsim.distributed on several GPUs: correctness against one process, then timings, and
where the time goes.

    torchrun --nproc-per-node 2 benchmarks/dist_bench.py --out bench_results/dist_h100x2.json
    torchrun --nproc-per-node 2 benchmarks/dist_bench.py --profile   # + torch.profiler tables
    torchrun --nproc-per-node 2 benchmarks/dist_bench.py --graph     # + CUDA graph replays
    python -m torch.distributed.run --nproc-per-node 2 benchmarks/dist_bench.py --small  # CPU

Each measurement is checked on rank 0 against one process holding everything first:
- the gathered contrastive step (forward and backward of ``distributed.contrastive_loss``, every
  rank's documents as negatives; the fused default and ``overlap=True``) against the single-GPU
  step at the same per-GPU batch (the target) and at twice its documents (what each rank
  computes: the floor, so that the cost of distribution shows apart from the extra compute);
  per-phase times from CUDA events at ``distributed.phase_marks``, the host time per step, and
  the two collectives timed alone;
- ``distributed.retrieve`` over a corpus split across the ranks against ``maxsim.retrieve`` of the
  whole corpus on one GPU (throughput ratio; the top-k must be identical), fp16 and int8 shards,
  with every rank's scan and merge times and the scan of one shard alone.
NCCL on GPUs (beside gloo, for the host-side shape exchange), gloo with ``--small`` (tiny
shapes, CPU). Writes one JSON (rank 0) and prints a summary against the targets.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "torch-ext"))  # this tree's maxsim

import dist_report  # noqa: E402
import maxsim  # noqa: E402
from bench import git_state  # noqa: E402
from maxsim import distributed  # noqa: E402
from maxsim.reference import maxsim_reference_padded  # noqa: E402

FULL = {"queries": 128, "docs": 128, "lq": 32, "ld": 256, "dim": 128, "dtype": "bf16",
        "corpus": 20000, "corpus_ld": 1024, "retrieve_queries": 16, "top_k": 10}
SMALL = {"queries": 8, "docs": 8, "lq": 8, "ld": 16, "dim": 32, "dtype": "fp32",
         "corpus": 300, "corpus_ld": 32, "retrieve_queries": 4, "top_k": 10}
DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
# Settings that change the host's or the link's cost of a collective, recorded where set.
HOST_KNOBS = ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE", "NCCL_PROTO", "NCCL_ALGO")
STEP_TARGET, RETRIEVE_TARGET = 1.15, 1.8  # at most x the single-GPU step; at least x throughput


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_ms(fn, device, reps, rounds=5, warmup=3, together=True):
    """Milliseconds per call: the median over ``rounds`` of ``reps`` back-to-back calls; with
    ``together``, every rank starts each round at once (every rank must then call it)."""
    for _ in range(warmup):
        fn()
    per_round = []
    for _ in range(rounds):
        sync(device)
        if together:
            dist.barrier()
        t = time.perf_counter()
        for _ in range(reps):
            fn()
        sync(device)
        per_round.append((time.perf_counter() - t) * 1e3 / reps)
    return statistics.median(per_round)


def slowest(ms, device):
    """The largest of every rank's ``ms`` (a step takes as long as its slowest rank)."""
    t = torch.tensor([ms], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()


def gather_all(x):
    """Every rank's ``x`` (same shape everywhere), concatenated along dim 0."""
    parts = [torch.empty_like(x) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, x.contiguous())
    return torch.cat(parts)


def relative_error(got, expect):
    return ((got.double() - expect.double()).norm() / expect.double().norm()).item()


def random_batch(shape, dtype, device, seed):
    g = torch.Generator(device="cpu").manual_seed(seed)
    q = torch.randn(shape["queries"], shape["lq"], shape["dim"], generator=g)
    d = torch.randn(shape["docs"], shape["ld"], shape["dim"], generator=g)
    # unit tokens, as trained models give (scores in a realistic range for the softmax)
    q, d = (torch.nn.functional.normalize(x, dim=-1).to(device, dtype) for x in (q, d))
    return q, d


UPSTREAM = 0.5  # the checks' upstream gradient: not 1, so that its scaling is checked too


def step(fn, Q, D, **kw):
    """One training step's loss and the gradients of ``UPSTREAM * loss`` w.r.t. the embeddings."""
    Q, D = Q.detach().requires_grad_(), D.detach().requires_grad_()
    loss = fn(Q, D, **kw)
    (loss * UPSTREAM).backward()
    return loss.detach(), Q.grad, D.grad


def loss_f64(Q, D, temperature):
    """The whole batch's loss and :func:`step`'s gradients in float64 (the truth that fp32 is
    checked against)."""
    Q, D = Q.detach().double().requires_grad_(), D.detach().double().requires_grad_()
    valid = lambda x: torch.ones(x.shape[:2], dtype=torch.bool, device=x.device)  # noqa: E731
    scores = maxsim_reference_padded(Q[:, None], valid(Q)[:, None], D[None], valid(D)[None])[0]
    loss = torch.nn.functional.cross_entropy(scores / temperature, torch.arange(len(Q),
                                                                                device=Q.device))
    (loss * UPSTREAM).backward()
    return loss.detach(), Q.grad, D.grad


def check_contrastive(shape, dtype, device, temperature, overlap=False):
    """The gathered step against one process holding the whole batch (on rank 0)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    Q, D = random_batch(shape, dtype, device, seed=100 + rank)
    got = step(distributed.contrastive_loss, Q, D, temperature=temperature, overlap=overlap)
    loss = got[0].reshape(1).double()
    dist.all_reduce(loss)
    Q_all, D_all = gather_all(Q), gather_all(D)
    dQ_all, dD_all = gather_all(got[1]) / world, gather_all(got[2]) / world
    if rank != 0:
        return None
    whole = step(maxsim.contrastive_loss, Q_all, D_all, temperature=temperature)
    ranks = (loss[0] / world, dQ_all, dD_all)
    out = {"dtype": next(k for k, v in DTYPES.items() if v == dtype), "overlap": overlap,
           "rel_err_vs_one_process": [relative_error(g, w) for g, w in zip(ranks, whole)]}
    if dtype == torch.float32:
        truth = loss_f64(Q_all, D_all, temperature)
        out["rel_err_vs_f64"] = [relative_error(g, t) for g, t in zip(ranks, truth)]
        out["one_process_rel_err_vs_f64"] = [relative_error(w, t) for w, t in zip(whole, truth)]
        out["ok"] = all(e <= max(1e-6, 1.5 * w) for e, w in
                        zip(out["rel_err_vs_f64"], out["one_process_rel_err_vs_f64"]))
    else:
        out["ok"] = max(out["rel_err_vs_one_process"]) <= 1e-2
    return out


def bench_contrastive(shape, device, reps, profile_out=None, graph=False):
    """The gathered step's paths against the single-GPU step at the same batch and at twice its
    documents (each rank scores every rank's documents: the compute a rank cannot shed), the
    phases of both paths, the collectives alone, (``profile_out``) a profiler table, and
    (``graph``) the fused gathered step and the one-GPU step replayed as CUDA graphs: the steps
    without their host work."""
    dtype = DTYPES[shape["dtype"]]
    Q, D = random_batch(shape, dtype, device, seed=200 + dist.get_rank())
    _, more = random_batch(shape, dtype, device, seed=900 + dist.get_rank())
    D2 = torch.cat([D, more])  # what one rank scores in the gathered step
    Q.requires_grad_()
    for x in (D, D2):
        x.requires_grad_()

    def gathered(same_shapes=True, overlap=False):
        distributed.contrastive_loss(Q, D, temperature=0.05, same_shapes=same_shapes,
                                     overlap=overlap).backward()

    def single(docs):
        return lambda: maxsim.contrastive_loss(Q, docs, temperature=0.05).backward()

    def fused(docs):
        return lambda: maxsim.contrastive_step(Q.detach(), docs.detach(), temperature=0.05)

    ms = {name: slowest(time_ms(fn, device, reps), device) for name, fn in (
        ("gathered_ms", gathered), ("gathered_overlap_ms", lambda: gathered(overlap=True)),
        ("gathered_shape_exchange_ms", lambda: gathered(False)),
        ("single_gpu_ms", single(D)), ("single_gpu_fused_step_ms", fused(D)),
        ("single_gpu_2x_docs_ms", single(D2)), ("single_gpu_2x_docs_fused_step_ms", fused(D2)),
    )}
    best = min(("gathered_ms", "gathered_overlap_ms"), key=ms.get)
    ms["best"] = {"gathered_ms": "fused", "gathered_overlap_ms": "overlap=True"}[best]
    ms["ratio"] = ms[best] / ms["single_gpu_ms"]
    ms["target_ratio_at_most"] = STEP_TARGET
    ms["overhead_vs_2x_docs"] = ms[best] / ms["single_gpu_2x_docs_ms"]
    ms["overhead_vs_2x_docs_fused"] = ms[best] / ms["single_gpu_2x_docs_fused_step_ms"]
    ms["phases_fused"] = dist_report.phase_table(gathered, device, reps)
    ms["phases_overlap"] = dist_report.phase_table(lambda: gathered(overlap=True), device, reps)
    ms["collectives_alone"] = dist_report.collectives_alone(D, device, reps, time_ms)
    if graph:
        for name, fn in (("single_gpu_graph_ms", single(D)), ("gathered_graph_ms", gathered)):
            try:  # every rank fails alike (same code, same shapes): recorded, not fatal
                ms[name] = slowest(time_ms(dist_report.graphed(fn), device, reps), device)
            except RuntimeError as e:
                ms[name.replace("_ms", "_error")] = repr(e)[:300]
    if profile_out:
        table, trace = dist_report.profile(gathered, device, profile_out)
        ms["profile_trace"] = trace
        if dist.get_rank() == 0:
            print(f"torch.profiler, rank 0, 5 gathered steps (fused):\n{table}", flush=True)
    return ms


def grid(shape, generator):
    """fp32 multiples of 1/8 in [-1, 1]: every fp16 score is exact whatever the summation order
    (so one process's and the ranks' scores can be compared bit for bit), with many ties."""
    return torch.randint(-8, 9, shape, generator=generator, device=generator.device).float() / 8


def corpus_shard(shape, rank, world, device, fmt):
    """Rank ``rank``'s contiguous part of the corpus, each part from its own seed: fp16 grid values,
    or int8 codes with power-of-two scales (exact scores too)."""
    n = shape["corpus"] // world + (rank < shape["corpus"] % world)
    g = torch.Generator(device=device).manual_seed(300 + rank)  # made where it is used: GBs
    size = (n, shape["corpus_ld"], shape["dim"])
    if fmt == "fp16":
        return grid(size, g).to(torch.float16)
    codes = torch.randint(-127, 128, size, generator=g, dtype=torch.int8, device=device)
    return maxsim.QuantizedTokens(codes, torch.full(size[:2], 1 / 128, device=device))


def whole_corpus(shards):
    if isinstance(shards[0], torch.Tensor):
        return torch.cat(shards)
    return maxsim.QuantizedTokens(torch.cat([s.codes for s in shards]),
                                  torch.cat([s.scale for s in shards]))


def bench_retrieve(shape, device, reps):
    rank, world = dist.get_rank(), dist.get_world_size()
    g = torch.Generator(device=device).manual_seed(400)
    queries = grid((shape["retrieve_queries"], shape["lq"], shape["dim"]), g).half()
    sizes = [shape["corpus"] // world + (r < shape["corpus"] % world) for r in range(world)]
    offset = sum(sizes[:rank])
    return {fmt: retrieve_row(queries, shape, fmt, offset, device, reps)
            for fmt in ("fp16", "int8")}


def retrieve_row(queries, shape, fmt, offset, device, reps):
    """The sharded retrieve of one corpus format: its time, every rank's scan (alone, and inside
    the call) and merge, and on rank 0 its check against one GPU holding the whole corpus and
    that GPU's time."""
    rank, world, k = dist.get_rank(), dist.get_world_size(), shape["top_k"]
    shard = corpus_shard(shape, rank, world, device, fmt)
    got = distributed.retrieve(queries, shard, k, offset=offset)
    call = lambda: distributed.retrieve(queries, shard, k, offset=offset)  # noqa: E731
    row = {"sharded_ms": slowest(time_ms(call, device, reps), device)}
    row.update(dist_report.phase_table(call, device, reps))
    scan = time_ms(lambda: maxsim.retrieve(queries, shard, k), device, reps)
    row["scan_alone_ms"] = [r[0] for r in dist_report.every_rank([scan], device)]
    row["imbalance"] = max(row["scan_alone_ms"]) / min(row["scan_alone_ms"])
    if rank == 0:  # one GPU holding the whole corpus, the others waiting
        whole = whole_corpus([shard] + [corpus_shard(shape, r, world, device, fmt)
                                        for r in range(1, world)])
        expect = maxsim.retrieve(queries, whole, k)
        row["identical_top_k"] = bool(torch.equal(got[1], expect[1])
                                      and torch.equal(got[0], expect[0]))
        row["max_score_diff"] = (got[0] - expect[0]).abs().max().item()
        row["single_gpu_ms"] = time_ms(lambda: maxsim.retrieve(queries, whole, k), device, reps,
                                       together=False)
        row["throughput_ratio"] = row["single_gpu_ms"] / row["sharded_ms"]
        row["target_ratio_at_least"] = RETRIEVE_TARGET
        row["scan_scaling"] = row["single_gpu_ms"] / max(row["scan_alone_ms"])
        del whole
    dist.barrier()  # the others wait while rank 0 holds the whole corpus
    return row


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="bench_results/dist.json", help="the JSON file (rank 0)")
    ap.add_argument("--small", action="store_true", help="tiny shapes, gloo on the CPU")
    ap.add_argument("--reps", type=int, default=None, help="calls per timed round")
    ap.add_argument("--backend", default="cpu:gloo,cuda:nccl",
                    help="the process group's backend on GPUs (gloo beside NCCL keeps the shape "
                         "exchange on the host; 'nccl' alone if gloo cannot start)")
    ap.add_argument("--graph", action="store_true",
                    help="also time the fused gathered step and the one-GPU step as CUDA graph "
                         "replays (NCCL collectives captured): the GPU's time without the host's")
    ap.add_argument("--profile", action="store_true",
                    help="also run torch.profiler over 5 gathered steps: rank 0 prints its table, "
                         "every rank writes a Chrome trace next to --out")
    return ap.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    use_cuda = torch.cuda.is_available() and not args.small
    local = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", local) if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(device)
    if os.environ.get("WORLD_SIZE") == os.environ.get("LOCAL_WORLD_SIZE"):
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # one host: gloo needs no hostname
    dist.init_process_group(args.backend if use_cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    shape = SMALL if args.small else FULL
    reps = args.reps or (3 if args.small else 20)
    checks = [check_contrastive(shape, dtype, device, 0.05, overlap)
              for dtype in (torch.float32, DTYPES[shape["dtype"]]) for overlap in (False, True)]
    result = {"contrastive": bench_contrastive(shape, device, reps,
                                               args.out if args.profile else None,
                                               args.graph and use_cuda),
              "retrieve": bench_retrieve(shape, device, reps)}
    if rank == 0:
        commit, dirty = git_state()
        doc = {"world": world, "backend": dist.get_backend(), "commit": commit, "dirty": dirty,
               "device": torch.cuda.get_device_name(device) if use_cuda else "cpu",
               "torch": torch.__version__, "shape": shape, "checks": checks,
               "premultiplied_reduce_scatter": use_cuda and distributed._PREMUL[0],
               "env": {k: os.environ[k] for k in HOST_KNOBS if k in os.environ}, **result}
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")
        ok = all(c["ok"] for c in checks) and all(
            r["identical_top_k"] for r in result["retrieve"].values())
        print("\n" + dist_report.summary(doc))
        errors = ", ".join(f"{c['dtype']}{' overlap' if c['overlap'] else ''} "
                           f"{max(c['rel_err_vs_one_process']):.1e}" for c in checks)
        print(f"correctness: {'ok' if ok else 'FAILED'} (largest relative error against one "
              f"process: {errors}); wrote {args.out}")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
