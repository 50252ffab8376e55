"""Kernel time of the raw CUDA ops of one source tree, for A/B comparisons of kernel changes.

Builds the extension from ``--root`` (its own ``scripts/gpu_check.py``, so any tree or git ref
checked out elsewhere works), then times each case as a CUDA graph of ``--reps`` calls replayed
``--replays`` times (median, CUDA events): kernel time without the host work that dominates the
small rows of ``bench.py``. Each case is checked against float64 on a slice of its pairs first.
One JSON line per case on stdout; ``scripts/kernel_ab.sh`` runs several trees in one GPU call.

    python benchmarks/kernel_ab.py [--root DIR] [--label NAME] [--only a,b] [--list]
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ALL, GROUPED = 0, 1

# name: (query dtype, (queries, Lq), (documents, Ld), layout, group, argmax, document codes)
CASES = {
    "rerank": ("fp16", (32, 32), (1600, 180), GROUPED, 50, False, None),
    "rerank_heavy": ("fp16", (32, 32), (3200, 256), GROUPED, 100, False, None),
    # candidates filling about 2.1 and 2.9 waves of the H100's streaming slots (rerank: 2.4)
    "rerank_k43": ("fp16", (32, 32), (1376, 180), GROUPED, 43, False, None),
    "rerank_k60": ("fp16", (32, 32), (1920, 180), GROUPED, 60, False, None),
    "rerank_bf16": ("bf16", (32, 32), (1600, 180), GROUPED, 50, False, None),
    "rerank_colpali": ("fp16", (8, 32), (800, 1024), GROUPED, 100, False, None),
    "rerank_colpali_bf16": ("bf16", (8, 32), (800, 1024), GROUPED, 100, False, None),
    # the bench's Ld sweep at its short end: fewer than two waves of short documents
    "rerank_ld128": ("fp16", (8, 32), (800, 128), GROUPED, 100, False, None),
    "rerank_ld256": ("fp16", (8, 32), (800, 256), GROUPED, 100, False, None),
    "rerank_ld384": ("fp16", (8, 32), (800, 384), GROUPED, 100, False, None),
    # fewer candidates than one or two waves of streaming slots
    "rerank_k12": ("fp16", (32, 32), (384, 180), GROUPED, 12, False, None),
    "rerank_k25": ("fp16", (32, 32), (800, 180), GROUPED, 25, False, None),
    "rerank_heavy_k12": ("fp16", (32, 32), (384, 256), GROUPED, 12, False, None),
    # a few long candidates: far fewer pairs than streaming slots
    "rerank_few_448": ("fp16", (1, 32), (32, 448), GROUPED, 32, False, None),
    "rerank_few_256": ("fp16", (4, 32), (128, 256), GROUPED, 32, False, None),
    "rerank_colpali_k40": ("fp16", (8, 32), (320, 1024), GROUPED, 40, False, None),
    "corpus": ("fp16", (16, 32), (10000, 1024), ALL, 0, False, None),
    "allpairs_large": ("fp16", (128, 128), (128, 1024), ALL, 0, False, None),
    "allpairs_large_bf16": ("bf16", (128, 128), (128, 1024), ALL, 0, False, None),
    "train_colpali_fwd": ("bf16", (128, 128), (128, 1024), ALL, 0, True, None),
    "train_medium_fwd": ("fp16", (64, 32), (64, 128), ALL, 0, True, None),
    "fp32_allpairs": ("fp32", (128, 32), (256, 180), ALL, 0, True, None),
    "fp32_rerank": ("fp32", (32, 32), (1600, 180), GROUPED, 50, False, None),
    # the bench's fp32 rows (scores only); their _len forms draw the lengths as the bench does
    "allpairs_fp32": ("fp32", (128, 32), (256, 180), ALL, 0, False, None),
    "rerank_fp32": ("fp32", (32, 32), (1600, 180), GROUPED, 50, False, None),
    # fp32 calls at the planner's CUDA-core / tensor-core threshold (2^24 multiply-adds) and a
    # small training forward above it
    "fp32_threshold": ("fp32", (4, 32), (16, 64), ALL, 0, False, None),
    "fp32_train_small": ("fp32", (32, 32), (32, 80), ALL, 0, True, None),
    "rerank_heavy_int8": ("fp16", (32, 32), (3200, 256), GROUPED, 100, False, "int8"),
    "rerank_colpali_int8": ("fp16", (8, 32), (800, 1024), GROUPED, 100, False, "int8"),
    "rerank_heavy_fp8": ("fp16", (32, 32), (3200, 256), GROUPED, 100, False, "fp8"),
    "rerank_colpali_fp8": ("fp16", (8, 32), (800, 1024), GROUPED, 100, False, "fp8"),
    # int8 queries against int8 documents (integer tensor cores)
    "rerank_heavy_int8x8": ("fp16", (32, 32), (3200, 256), GROUPED, 100, False, "int8x8"),
    "rerank_colpali_int8x8": ("fp16", (8, 32), (800, 1024), GROUPED, 100, False, "int8x8"),
    "corpus_int8x8": ("fp16", (16, 32), (10000, 1024), ALL, 0, False, "int8x8"),
    "corpus_int8": ("fp16", (16, 32), (10000, 1024), ALL, 0, False, "int8"),
    "corpus_int8_bf16": ("bf16", (16, 32), (10000, 1024), ALL, 0, False, "int8"),
    "corpus_fp8": ("fp16", (16, 32), (10000, 1024), ALL, 0, False, "fp8"),
}
# The same cases with document lengths drawn from [Ld / 2, Ld] (as bench.py draws them): padding
# rows are never read, so these time the real-token traffic of the benchmark rows.
RAGGED = {"rerank_len": "rerank", "rerank_heavy_len": "rerank_heavy",
          "rerank_k43_len": "rerank_k43", "rerank_k60_len": "rerank_k60",
          "rerank_bf16_len": "rerank_bf16",
          "rerank_ld128_len": "rerank_ld128", "rerank_ld256_len": "rerank_ld256",
          "rerank_ld384_len": "rerank_ld384", "rerank_k12_len": "rerank_k12",
          "rerank_k25_len": "rerank_k25", "rerank_heavy_k12_len": "rerank_heavy_k12",
          "rerank_few_448_len": "rerank_few_448", "rerank_few_256_len": "rerank_few_256",
          "rerank_colpali_k40_len": "rerank_colpali_k40",
          "rerank_colpali_len": "rerank_colpali", "rerank_colpali_bf16_len": "rerank_colpali_bf16",
          "rerank_heavy_int8_len": "rerank_heavy_int8",
          "rerank_heavy_fp8_len": "rerank_heavy_fp8",
          "rerank_colpali_int8_len": "rerank_colpali_int8",
          "rerank_colpali_fp8_len": "rerank_colpali_fp8",
          "rerank_heavy_int8x8_len": "rerank_heavy_int8x8",
          "rerank_colpali_int8x8_len": "rerank_colpali_int8x8",
          "corpus_int8x8_len": "corpus_int8x8", "corpus_int8_len": "corpus_int8",
          "corpus_fp8_len": "corpus_fp8",
          "corpus_len": "corpus", "allpairs_large_len": "allpairs_large",
          "train_colpali_fwd_len": "train_colpali_fwd"}
RAGGED.update({"allpairs_fp32_len": "allpairs_fp32", "rerank_fp32_len": "rerank_fp32"})
# fp32 cases with single-TF32 products (the op's tf32 argument; a tree that ignores it times its
# exact path): name: the case it repeats.
TF32 = {f"{name}_tf32": name for name in ("fp32_allpairs", "allpairs_fp32", "allpairs_fp32_len",
                                           "rerank_fp32", "rerank_fp32_len", "fp32_threshold")}
# Ragged documents described by a mask instead, with holes as PyLate's punctuation skiplist makes
# (about one token in ten): the kernel reads the mask bytes of every tile.
MASKED = {"rerank_heavy_mask": "rerank_heavy", "rerank_heavy_int8_mask": "rerank_heavy_int8"}
# Contrastive training steps (forward with argmax, loss, backward; one op): name: (dtype, (queries,
# Lq), (documents, Ld)), all pairs, diagonal targets, document lengths drawn from [Ld / 2, Ld].
STEPS = {
    "train_small_step": ("fp16", (32, 32), (32, 80)),
    "train_medium_step": ("fp16", (64, 32), (64, 128)),
    "train_colpali_step": ("bf16", (128, 128), (128, 1024)),
}
# The same steps with the documents' valid rows packed by offsets (as score_contrastive_train
# takes them): the same data, so the same loss as the padded step.
PACKED_STEPS = {f"{name}_packed": name for name in STEPS}
# Packed pairs (the bench's varlen kind): name: (dtype, queries, (Lq min, max), candidates per
# query, (Ld min, max)); query i is scored with documents i*K .. i*K+K-1.
VARLEN = {
    "varlen": ("fp16", 32, (8, 32), 100, (32, 300)),
    "varlen_q8": ("fp16", 8, (8, 32), 100, (32, 300)),  # fewer pairs than two waves
}
PAIRS = 2
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}


def graph_ms(fn, reps: int, replays: int) -> float:
    """Median time of one call: ``reps`` calls captured in a CUDA graph, replayed ``replays``
    times (warm-up and allocations on a side stream first)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(reps):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / reps)
    return sorted(times)[len(times) // 2]


def tokens(n: int, length: int, dtype: str) -> torch.Tensor:
    """Random L2-normalised token vectors [n, length, 128] on the GPU."""
    x = torch.nn.functional.normalize(torch.randn(n, length, 128, device="cuda"), dim=-1)
    return x.to(DTYPES[dtype])


def cold_copies(x: torch.Tensor, reps: int):
    """(a function that returns ``x`` or one of its copies in turn, the calls per graph). Inputs
    that fit the L2 twice over are cycled through enough copies to span three L2s, every copy once
    per graph replay, so that each call reads DRAM as the benchmark's rotating sets do."""
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    nbytes = x.numel() * x.element_size()
    n = min(64, -(-3 * l2 // nbytes)) if nbytes < 2 * l2 else 1
    copies = [x] + [x.clone() for _ in range(n - 1)]
    turn = iter(range(1 << 30))
    return (lambda: copies[next(turn) % n]), max(reps, n)


def spot_error(scores, Q, D, layout, group, valid=None) -> float:
    """Relative error of the first queries' scores against float64 (D already dequantized;
    ``valid`` [Nd, Ld] marks the documents' real tokens)."""
    pad = None if valid is None else ~valid
    if layout == ALL:
        nq, nd = min(16, Q.size(0)), min(8, D.size(0))  # 16: every row of a 256-row tile
        sim = torch.einsum("qik,djk->qdij", Q[:nq].double(), D[:nd].double())
        if pad is not None:
            sim = sim.masked_fill(pad[None, :nd, None], -torch.inf)
        ref = sim.amax(-1).sum(-1)
        got = scores.view(Q.size(0), -1)[:nq, :nd]  # D: maybe only the first documents
    else:
        nq = min(2, Q.size(0))
        docs = D[: nq * group].double().view(nq, group, *D.shape[1:])
        sim = torch.einsum("qik,qdjk->qdij", Q[:nq].double(), docs)
        if pad is not None:
            sim = sim.masked_fill(pad[: nq * group].view(nq, group, 1, -1), -torch.inf)
        ref = sim.amax(-1).sum(-1)
        got = scores.view(Q.size(0), group)[:nq]
    return float((got.double() - ref).norm() / ref.norm())


def run_case(ops, case: str, reps: int, replays: int) -> dict:
    name, tf32 = TF32.get(case, case), case in TF32
    base = RAGGED.get(name) or MASKED.get(name) or name
    dtype, (nq, lq), (nd, ld), layout, group, argmax, codes = CASES[base]
    torch.manual_seed(0)
    Q = tokens(nq, lq, dtype)
    lengths = mask = valid = None
    if name in RAGGED or name in MASKED:
        lengths = torch.randint(max(1, ld // 2), ld + 1, (nd,), device="cuda", dtype=torch.int32)
        valid = torch.arange(ld, device="cuda")[None, :] < lengths[:, None].long()
    if name in MASKED:
        valid = valid & (torch.rand(nd, ld, device="cuda") > 0.1)
        lengths, mask = None, valid
    rest = (None, None, None, None, lengths, mask, None, None, layout, group, lq, argmax)
    if codes is None:
        D = tokens(nd, ld, dtype)
        next_d, reps = cold_copies(D, reps)
        def call():
            return ops.fwd(Q, next_d(), *rest, tf32)
        dense = D
    else:
        q_scale = None
        if codes in ("int8", "int8x8"):
            D = torch.randint(-127, 128, (nd, ld, 128), device="cuda", dtype=torch.int8)
        else:  # e4m3 codes of every magnitude the format has, none NaN
            D = torch.randn(nd, ld, 128, device="cuda") * 64
            D = D.clamp(-448, 448).to(torch.float8_e4m3fn)
        scale = torch.rand(nd, ld, device="cuda") / 127
        q_in = Q
        if codes == "int8x8":
            q_in = torch.randint(-127, 128, (nq, lq, 128), device="cuda", dtype=torch.int8)
            q_scale = torch.rand(nq, lq, device="cuda") / 127
            Q = q_in.float() * q_scale[..., None]
        def call():
            return ops.fwd_scaled(q_in, q_scale, D, scale, *rest)
        n = max(8, 2 * group)
        dense = D[:n].float() * scale[:n, :, None]
    err = spot_error(call()[0], Q, dense, layout, group, valid)
    return {"case": case, "ms": round(graph_ms(call, reps, replays), 4), "rel_err": err}


def run_varlen(ops, name: str, reps: int, replays: int) -> dict:
    dtype, nq, (q_lo, q_hi), k, (d_lo, d_hi) = VARLEN[name]
    torch.manual_seed(0)
    q_len = torch.randint(q_lo, q_hi + 1, (nq,))
    d_len = torch.randint(d_lo, d_hi + 1, (nq * k,))
    cu = lambda n: torch.cat([torch.zeros(1, dtype=torch.int64), n.cumsum(0)]).to("cuda", torch.int32)  # noqa: E731
    q = tokens(1, int(q_len.sum()), dtype)[0]
    d = tokens(1, int(d_len.sum()), dtype)[0]
    cu_q, cu_d = cu(q_len), cu(d_len)
    pair_q = torch.arange(nq, device="cuda", dtype=torch.int32).repeat_interleave(k)
    pair_d = torch.arange(nq * k, device="cuda", dtype=torch.int32)
    next_d, reps = cold_copies(d, reps)

    def call():
        return ops.fwd(q, next_d(), cu_q, None, None, cu_d, None, None,
                       pair_q, pair_d, PAIRS, 0, int(q_len.max()), False, False)
    scores = call()[0]
    ref = []
    for p in range(0, nq * k, max(1, nq * k // 16)):  # a spread of pairs in float64
        qi = int(pair_q[p])
        qs = q[int(cu_q[qi]):int(cu_q[qi + 1])].double()
        ds = d[int(cu_d[p]):int(cu_d[p + 1])].double()
        ref.append((p, float((qs @ ds.T).amax(1).sum())))
    got = torch.tensor([float(scores[p]) for p, _ in ref], dtype=torch.float64)
    want = torch.tensor([v for _, v in ref], dtype=torch.float64)
    err = float((got - want).norm() / want.norm())
    return {"case": name, "ms": round(graph_ms(call, reps, replays), 4), "rel_err": err}


def step_loss_error(loss, Q, D, lengths) -> float:
    """Relative error of the step's loss against float64 (scores computed 8 queries at a time)."""
    valid = torch.arange(D.size(1), device=D.device)[None, :] < lengths[:, None]
    rows = []
    for q in Q.double().split(8):
        sim = torch.einsum("qik,djk->qdij", q, D.double())
        rows.append(sim.masked_fill(~valid[None, :, None], -torch.inf).amax(-1).sum(-1))
    scores = torch.cat(rows)
    ref = torch.nn.functional.cross_entropy(scores, torch.arange(Q.size(0), device=Q.device))
    return float(abs(loss.double() - ref) / abs(ref))


def run_step(ops, name: str, reps: int, replays: int) -> dict:
    dtype, (nq, lq), (nd, ld) = STEPS[PACKED_STEPS.get(name, name)]
    torch.manual_seed(0)
    Q, D = (tokens(n, length, dtype) for n, length in ((nq, lq), (nd, ld)))
    lengths = torch.randint(ld // 2, ld + 1, (nd,), device="cuda", dtype=torch.int32)
    targets = torch.arange(nq, device="cuda")
    docs, offsets, d_lengths = D, None, lengths
    if name in PACKED_STEPS:
        docs = torch.cat([D[j, :n] for j, n in enumerate(lengths.tolist())])
        offsets = torch.cat([lengths.new_zeros(1), lengths.cumsum(0, dtype=torch.int32)])
        d_lengths = None

    def call():
        return ops.contrastive_step(
            Q, docs, None, None, None, offsets, d_lengths, None, ALL, 0, lq, targets, 1.0)
    err = step_loss_error(call()[0], Q, D, lengths)
    return {"case": name, "ms": round(graph_ms(call, reps, replays), 4), "rel_err": err}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", default=ROOT, help="source tree to build (default: this one)")
    ap.add_argument("--label", default=None, help="tree name in the output (default: --root)")
    ap.add_argument("--only", help="comma-separated case names")
    ap.add_argument("--reps", type=int, default=10, help="calls per CUDA graph")
    ap.add_argument("--replays", type=int, default=5, help="graph replays (median)")
    ap.add_argument("--list", action="store_true", help="print the cases and exit")
    args = ap.parse_args()
    names = args.only.split(",") if args.only else [*CASES, *RAGGED, *MASKED, *TF32, *VARLEN,
                                                     *STEPS, *PACKED_STEPS]
    known = {**CASES, **{n: CASES[c] for n, c in {**RAGGED, **MASKED}.items()}, **VARLEN, **STEPS}
    known.update({n: STEPS[c] for n, c in PACKED_STEPS.items()})
    known.update({n: (*known[c][:-1], "tf32") for n, c in TF32.items()})
    unknown = [n for n in names if n not in known]
    if unknown:
        ap.error(f"unknown case(s) {unknown}; known: {', '.join(known)}")
    if args.list:
        for n in names:
            print(n, known[n])
        return
    sys.path.insert(0, os.path.join(os.path.abspath(args.root), "scripts"))
    import gpu_check  # the tree's own build: its csrc, its binding

    ops = gpu_check.build()
    label = args.label or os.path.abspath(args.root)
    for name in names:
        steps = name in STEPS or name in PACKED_STEPS
        run = run_step if steps else run_varlen if name in VARLEN else run_case
        row = run(ops, name, args.reps, args.replays)
        print(json.dumps({"tree": label, "gpu": torch.cuda.get_device_name(), **row}), flush=True)


if __name__ == "__main__":
    main()
