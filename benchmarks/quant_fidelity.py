"""Ranking fidelity of 8-bit token embeddings (maxsim.quantize) on clustered synthetic data.

Documents are bags of topic tokens: each document draws a few topics from a shared set of topic
centres, and each of its tokens is one of its topics' centres plus noise, L2-normalised. Each query
takes most of its topics from one document and one at random; a document's graded relevance to a
query is the number of topics they share. Every document is scored against every query in fp32
(exact) and with INT8 / FP8 documents (and queries), and the rankings are compared:

* top-10 overlap: |top-10 of the 8-bit scores ∩ top-10 of the fp32 scores| / 10, averaged;
* nDCG@10 of each ranking against the planted relevance, and their difference.

The "rescored" rows are the two-stage search (`maxsim.retrieve(..., rescore=D)`): the 8-bit scan
keeps 40 candidates per query and their fp32 scores pick the top 10.

    python benchmarks/quant_fidelity.py [--docs 2000] [--queries 64] [--out FILE]
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "torch-ext"))
import maxsim  # noqa: E402


def make_data(args, gen):
    h, topics = args.dim, args.topics
    centers = torch.nn.functional.normalize(torch.randn(topics, h, generator=gen), dim=-1)
    sigma = args.noise / math.sqrt(h)  # noise of norm ~args.noise per token

    def tokens(topic_ids, length):  # [N, k] topics -> [N, length, h] tokens
        pick = torch.randint(0, topic_ids.size(1), (topic_ids.size(0), length), generator=gen)
        ids = topic_ids.gather(1, pick)
        x = centers[ids] + sigma * torch.randn(*ids.shape, h, generator=gen)
        return torch.nn.functional.normalize(x, dim=-1)

    doc_topics = torch.randint(0, topics, (args.docs, args.doc_topics), generator=gen)
    D = tokens(doc_topics, args.ld)
    positive = torch.randint(0, args.docs, (args.queries,), generator=gen)
    keep = doc_topics[positive][:, : args.query_topics - 1]
    extra = torch.randint(0, topics, (args.queries, 1), generator=gen)
    query_topics = torch.cat([keep, extra], dim=1)
    Q = tokens(query_topics, args.lq)
    shared = (query_topics[:, None, :, None] == doc_topics[None, :, None, :]).any(-1).sum(-1)
    return Q, D, shared.float()  # relevance [Nq, Nd]


def ndcg_at_10(top, relevance):
    """nDCG@10 of the ranked document ids ``top [Nq, 10]``."""
    discount = 1.0 / torch.log2(torch.arange(2, 12, dtype=torch.float64))
    dcg = ((2.0 ** relevance.gather(1, top).double() - 1) * discount).sum(1)
    ideal = ((2.0 ** relevance.topk(10, dim=1).values.double() - 1) * discount).sum(1)
    return dcg / ideal.clamp_min(1e-12)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--docs", type=int, default=2000)
    ap.add_argument("--queries", type=int, default=64)
    ap.add_argument("--ld", type=int, default=64)
    ap.add_argument("--lq", type=int, default=32)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--topics", type=int, default=64)
    ap.add_argument("--doc-topics", type=int, default=6)
    ap.add_argument("--query-topics", type=int, default=4)
    ap.add_argument("--noise", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", help="JSON file for the results")
    args = ap.parse_args(argv)
    gen = torch.Generator().manual_seed(args.seed)
    Q, D, relevance = make_data(args, gen)
    exact = maxsim.maxsim(Q, D, backend="torch")
    top_exact = exact.topk(10, dim=1).indices
    base_ndcg = ndcg_at_10(top_exact, relevance)
    rows = []
    for fmt in ("int8", "fp8_e4m3"):
        qd = maxsim.quantize(D, fmt)
        for side in ("documents", "documents + queries", "documents, rescored"):
            q_in = maxsim.quantize(Q, fmt) if "queries" in side else Q
            if "rescored" in side:
                scores, top = maxsim.retrieve(q_in, qd, 10, rescore=D, candidates=40,
                                              backend="torch")
                reference = exact.gather(1, top)
            else:
                scores = maxsim.maxsim(q_in, qd, backend="torch")
                top, reference = scores.topk(10, dim=1).indices, exact
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
    print(f"{args.queries} queries x {args.docs} documents, Lq {args.lq}, Ld {args.ld}, "
          f"H {args.dim}, {args.topics} topics; fp32 nDCG@10 {float(base_ndcg.mean()):.4f}")
    print("| format | quantized | top-10 overlap (mean / min) | nDCG@10 | nDCG@10 − fp32 | "
          "max score rel. err | bytes vs fp16 |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        print(f"| {r['format']} | {r['quantized']} | {r['top10_overlap']:.4f} / "
              f"{r['top10_overlap_min']:.1f} | {r['ndcg10']:.4f} | {r['ndcg10_diff']:+.4f} | "
              f"{r['score_rel_err']:.1e} | {r['bytes_ratio']:.3f} |")
    if args.out:
        Path(args.out).write_text(json.dumps(dict(config=vars(args), rows=rows), indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
