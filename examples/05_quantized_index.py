"""A quantized index: store document token embeddings as INT8 or FP8 codes with one scale per token,
retrieve from it, and see how much the ranking moves compared with the fp32 index.

Synthetic corpus: documents are bags of "topic" tokens (each token a topic centre plus noise,
L2-normalised); each query shares most topics with one document.

    python examples/05_quantized_index.py [--device cpu|cuda] [--out DIR] [--quick]

Prints the index size of each format and, per format, the top-10 overlap with the fp32 ranking and
whether each query's source document is still in its top 10; then the same for the two-stage
search (`retrieve(..., rescore=D)`: the 8-bit scan keeps 40 candidates per query, their
full-precision scores pick the top 10; it keeps the full-precision documents too, hence its size).
Writes a bar chart of both.
Scores from a quantized index are exact for its dequantized values. With fp16 / bf16 queries on a
CUDA GPU (sm_80+) the codes stream through the 8-bit tensor-core kernels; this example keeps fp32
queries, so that only the index's quantization moves the ranking, and those dequantize each chunk
to fp32.
"""

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

try:
    import maxsim
except ImportError:  # a source checkout without `pip install .`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "torch-ext"))
    import maxsim


def make_corpus(n_docs, n_queries, ld, lq, h, topics, gen):
    centers = F.normalize(torch.randn(topics, h, generator=gen), dim=-1)

    def bags(topic_ids, length):
        pick = torch.randint(0, topic_ids.size(1), (topic_ids.size(0), length), generator=gen)
        x = centers[topic_ids.gather(1, pick)]
        return F.normalize(x + torch.randn(x.shape, generator=gen) / h**0.5, dim=-1)

    doc_topics = torch.randint(0, topics, (n_docs, 6), generator=gen)
    source = torch.randint(0, n_docs, (n_queries,), generator=gen)
    query_topics = torch.cat(
        [doc_topics[source][:, :3], torch.randint(0, topics, (n_queries, 1), generator=gen)], 1
    )
    return bags(query_topics, lq), bags(doc_topics, ld), source


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--out", default=str(Path(__file__).resolve().parent / "out"))
    p.add_argument("--quick", action="store_true", help="a small corpus")
    args = p.parse_args()
    n_docs, n_queries = (300, 8) if args.quick else (5000, 64)
    gen = torch.Generator().manual_seed(0)
    Q, D, source = make_corpus(n_docs, n_queries, ld=64, lq=32, h=128, topics=96, gen=gen)
    Q, D, source = Q.to(args.device), D.to(args.device), source.to(args.device)

    exact_scores, exact_top = maxsim.retrieve(Q, D, 10)
    print(f"{n_queries} queries, {n_docs} documents of 64 tokens, H 128, on {args.device}")
    print(f"{'index':16s} {'MiB':>8s} {'top-10 overlap':>15s} {'source in top 10':>17s}")
    fp16_mib = D.numel() * 2 / 2**20
    print(f"{'fp16':16s} {fp16_mib:8.2f} {'(reference: fp32 scores)':>34s}")
    rows = []

    def report(name, mib, top):
        overlap = (top[:, :, None] == exact_top[:, None, :]).any(-1).float().mean().item()
        found = (top == source[:, None]).any(1).float().mean().item()
        rows.append((name, mib, overlap, found))
        print(f"{name:16s} {mib:8.2f} {overlap:15.3f} {found:17.3f}")

    indexes = {fmt: maxsim.quantize(D, fmt) for fmt in ("int8", "fp8_e4m3")}
    for fmt, index in indexes.items():
        report(fmt, index.nbytes / 2**20, maxsim.retrieve(Q, index, 10)[1])
    for fmt, index in indexes.items():
        _, top = maxsim.retrieve(Q, index, 10, rescore=D, candidates=40)
        report(f"{fmt}+rescore", index.nbytes / 2**20 + D.numel() * 4 / 2**20, top)
    exact_found = (exact_top == source[:, None]).any(1).float().mean().item()
    print(f"{'fp32':16s} {'':8s} {1.0:15.3f} {exact_found:17.3f}")

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(1, 2, figsize=(11, 3.6))
    colors = ["C0", "C1", "C2", "C3"]
    names = ["fp16"] + [r[0] for r in rows]
    ax[0].bar(names, [fp16_mib] + [r[1] for r in rows], color=["gray", *colors])
    ax[0].set_ylabel("index size (MiB)")
    ax[0].tick_params(axis="x", labelrotation=20)
    ax[1].bar([r[0] for r in rows], [r[2] for r in rows], color=colors)
    ax[1].tick_params(axis="x", labelrotation=20)
    ax[1].set_ylim(0.9, 1.0)
    ax[1].set_ylabel("top-10 overlap with fp32")
    fig.tight_layout()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    fig.savefig(out / "05_quantized_index.png", dpi=120)
    print(f"wrote {out / '05_quantized_index.png'}")


if __name__ == "__main__":
    main()
