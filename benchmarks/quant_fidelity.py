"""Ranking fidelity of 8-bit token embeddings (maxsim.quantize): real token embeddings over real
text, and clustered synthetic tokens (`fidelity_data.py` describes both).

Every document is scored against every query in fp32 (exact) and with INT8 / FP8 documents (and
queries), and the rankings are compared:

* top-10 overlap: |top-10 of the 8-bit scores ∩ top-10 of the fp32 scores| / 10, averaged;
* nDCG@10 of each ranking against the data set's relevance, and their difference.

Rankings break ties to the lower document index, as `maxsim.retrieve` does. The "rescored" rows
are the two-stage search (`maxsim.retrieve(..., rescore=D)`): the 8-bit scan keeps 40 candidates
per query and their fp32 scores pick the top 10. The scores are computed on the CPU (the PyTorch
backend on dequantized values); the CUDA kernels give the same scores within 1e-5 (the tests), so
the rankings are the ones they give.

    python benchmarks/quant_fidelity.py [--data text,clustered] [--queries N] [--docs N]
                                        [--out FILE]

The text set needs wordllama (its token table ships in the package): `pip install -e ".[bench]"`
pins the version that made bench_results/quant_fidelity.json.
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from importlib import metadata
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "torch-ext"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import maxsim  # noqa: E402
from fidelity_data import clustered_data, text_data  # noqa: E402

DATASETS = {
    "text": (text_data, dict(queries=500, docs=5000, lq=32, ld=180, dim=128)),
    "clustered": (clustered_data, dict(queries=64, docs=2000, lq=32, ld=64, dim=128, topics=64,
                                       doc_topics=6, query_topics=4, noise=1.0)),
}
SIDES = ("documents", "documents + queries", "documents, rescored")


def ranked(scores, k=10):
    """The k best document ids per query, ties to the lower index."""
    return scores.sort(dim=1, descending=True, stable=True).indices[:, :k]


def ndcg_at_10(top, relevance):
    """nDCG@10 of the ranked document ids ``top [Nq, 10]``."""
    discount = 1.0 / torch.log2(torch.arange(2, 12, dtype=torch.float64))
    dcg = ((2.0 ** relevance.gather(1, top).double() - 1) * discount).sum(1)
    ideal = ((2.0 ** relevance.topk(10, dim=1).values.double() - 1) * discount).sum(1)
    return dcg / ideal.clamp_min(1e-12)


def mean_length(x, mask):
    """Mean number of valid tokens per sequence."""
    return float(mask.sum(1).float().mean()) if mask is not None else float(x.size(1))


def evaluate(Q, q_mask, D, d_mask, relevance):
    exact = maxsim.maxsim(Q, D, q_mask, d_mask, backend="torch")
    top_exact = ranked(exact)
    base_ndcg = ndcg_at_10(top_exact, relevance)
    rows = []
    for fmt in ("int8", "fp8_e4m3"):
        qd = maxsim.quantize(D, fmt)
        for side in SIDES:
            q_in = maxsim.quantize(Q, fmt) if "queries" in side else Q
            if "rescored" in side:
                scores, top = maxsim.retrieve(q_in, qd, 10, q_mask, d_mask, rescore=D,
                                              candidates=40, backend="torch")
                reference = exact.gather(1, top)
            else:
                scores = maxsim.maxsim(q_in, qd, q_mask, d_mask, backend="torch")
                top, reference = ranked(scores), exact
            overlap = (top[:, :, None] == top_exact[:, None, :]).any(-1).float().mean(1)
            ndcg = ndcg_at_10(top, relevance)
            rel_err = (scores - reference).abs() / reference.abs().clamp_min(1e-6)
            rows.append(dict(
                format=fmt, quantized=side, top10_overlap=float(overlap.mean()),
                top10_overlap_min=float(overlap.min()), ndcg10=float(ndcg.mean()),
                ndcg10_fp32=float(base_ndcg.mean()),
                ndcg10_diff=float((ndcg - base_ndcg).mean()),
                score_rel_err=float(rel_err.max()),
                bytes_ratio=qd.nbytes / (D.numel() * 2),
            ))
    return rows, float(base_ndcg.mean())


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--data", default="text,clustered",
                    help="comma-separated data sets: " + ", ".join(DATASETS))
    for key in ("queries", "docs", "lq", "ld", "dim", "topics", "doc_topics", "query_topics"):
        ap.add_argument("--" + key.replace("_", "-"), type=int,
                        help="overrides the data set's default (" + ", ".join(
                            f"{n} {d[key]}" for n, (_, d) in DATASETS.items() if key in d) + ")")
    ap.add_argument("--noise", type=float)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", help="JSON file for the results")
    args = ap.parse_args(argv)
    names = [n.strip() for n in args.data.split(",") if n.strip()]
    unknown = [n for n in names if n not in DATASETS]
    if unknown or not names:
        ap.error(f"--data {args.data!r}: expected a comma-separated subset of {list(DATASETS)}")
    given = {k: v for k, v in vars(args).items() if v is not None}
    results = {}
    for name in names:
        make, defaults = DATASETS[name]
        config = argparse.Namespace(**{**defaults, **{k: given[k] for k in defaults if k in given},
                                       "seed": args.seed})
        start = time.time()
        Q, q_mask, D, d_mask, relevance = make(config, torch.Generator().manual_seed(args.seed))
        rows, base = evaluate(Q, q_mask, D, d_mask, relevance)
        shape = dict(queries=Q.size(0), docs=D.size(0), lq=Q.size(1), ld=D.size(1), dim=D.size(2),
                     mean_lq=mean_length(Q, q_mask), mean_ld=mean_length(D, d_mask))
        results[name] = dict(config=vars(config), shape=shape, ndcg10_fp32=base, rows=rows)
        print(f"\n{name}: {shape['queries']} queries x {shape['docs']} documents, Lq <= "
              f"{shape['lq']} (mean {shape['mean_lq']:.1f}), Ld <= {shape['ld']} (mean "
              f"{shape['mean_ld']:.1f}), H {shape['dim']}; fp32 nDCG@10 {base:.4f} "
              f"({time.time() - start:.0f} s)")
        print("| format | quantized | top-10 overlap (mean / min) | nDCG@10 | nDCG@10 − fp32 | "
              "max score rel. err | bytes vs fp16 |")
        print("| --- | --- | ---: | ---: | ---: | ---: | ---: |")
        for r in rows:
            print(f"| {r['format']} | {r['quantized']} | {r['top10_overlap']:.4f} / "
                  f"{r['top10_overlap_min']:.1f} | {r['ndcg10']:.4f} | {r['ndcg10_diff']:+.4f} | "
                  f"{r['score_rel_err']:.1e} | {r['bytes_ratio']:.3f} |")
    if args.out:
        meta = dict(python=platform.python_version(), torch=torch.__version__)
        try:
            meta["wordllama"] = metadata.version("wordllama")
        except metadata.PackageNotFoundError:  # not installed: only the clustered set ran
            pass
        Path(args.out).write_text(json.dumps(dict(meta, datasets=results), indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
