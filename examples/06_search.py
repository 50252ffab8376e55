"""Search a corpus exactly: ragged document embeddings in, a packed corpus saved and loaded, the
top 10 of every query out, with queries per second and recall against the fp32 exhaustive top 10.

Synthetic data: tokens around topic centres (L2-normalised), lognormal document lengths in
[8, 300], and queries of 32 tokens that are noisy copies of part of one document.

    python examples/06_search.py [--device cpu|cuda] [--out DIR] [--docs N] [--quick]

Two searches over the same `maxsim.Corpus`: one exact scan of the float tokens, and the two-stage
search (`rescore=True`: int8 codes scanned, 40 candidates per query rescored exactly from the
float tokens). On CUDA the tokens are fp16 and the scan takes int8 queries against the int8 codes
(integer tensor cores); on the CPU the tokens stay fp32. The corpus is saved to
DIR/corpus.safetensors and loaded back when the safetensors package is installed.
"""

import argparse
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

try:
    import maxsim
except ImportError:  # a source checkout without `pip install .`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "torch-ext"))
    import maxsim

QUERY_TOKENS, TOP_K = 32, 10


def make_documents(n_docs, dim, gen):
    """Ragged ``[Ld_i, dim]`` documents: each picks a topic, each token is one of the topic's
    centres plus noise."""
    centres = F.normalize(torch.randn(max(8, n_docs // 20), 16, dim, generator=gen), dim=-1)
    lengths = torch.exp(4.95 + 0.5 * torch.randn(n_docs, generator=gen)).round().clamp(8, 300)
    docs = []
    for length in lengths.long().tolist():
        topic = centres[torch.randint(0, centres.size(0), (1,), generator=gen)][0]
        x = topic[torch.randint(0, 16, (length,), generator=gen)]
        docs.append(F.normalize(x + 0.7 * torch.randn(x.shape, generator=gen) / dim**0.5, dim=-1))
    return docs


def make_queries(docs, n_queries, gen):
    """Noisy copies of 32 tokens of one document each; returns (queries, source ids)."""
    source = torch.randint(0, len(docs), (n_queries,), generator=gen)
    rows = []
    for i in source.tolist():
        picked = docs[i][torch.randint(0, docs[i].size(0), (QUERY_TOKENS,), generator=gen)]
        noise = torch.randn(picked.shape, generator=gen) / picked.size(-1) ** 0.5
        rows.append(F.normalize(picked + noise, dim=-1))
    return torch.stack(rows), source


def timed(fn, device, reps):
    fn()  # warm-up (and the first-use build of the kernels)
    if device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(reps):
        out = fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return out, (time.perf_counter() - start) / reps


def recall_at_k(ids, truth):
    return (ids[:, :, None] == truth[:, None, :]).any(1).float().mean().item()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--out", type=Path, default=Path("examples_out"))
    ap.add_argument("--docs", type=int, default=20_000)
    ap.add_argument("--queries", type=int, default=256)
    ap.add_argument("--dim", type=int, default=96)
    ap.add_argument("--quick", action="store_true", help="a small corpus (CI)")
    args = ap.parse_args()
    if args.quick:
        args.docs, args.queries = 400, 16
    device = torch.device(args.device)
    gen = torch.Generator().manual_seed(0)
    docs = make_documents(args.docs, args.dim, gen)
    Q, source = make_queries(docs, args.queries, gen)
    dtype = torch.float16 if device.type == "cuda" else torch.float32
    Q = Q.to(device, dtype)

    start = time.perf_counter()
    corpus = maxsim.Corpus.from_embeddings(docs, dtype=dtype, device=device, codes="int8")
    print(f"{corpus!r}, built in {time.perf_counter() - start:.2f} s")
    args.out.mkdir(parents=True, exist_ok=True)
    try:
        corpus.save(args.out / "corpus.safetensors")
        corpus = maxsim.Corpus.load(args.out / "corpus.safetensors", device=device)
        print(f"saved and loaded {args.out / 'corpus.safetensors'}")
    except ImportError as e:
        print(f"not saved: {e}")

    fp32 = maxsim.Corpus(corpus.host_offsets, corpus.tokens.float())
    truth = maxsim.retrieve(Q.float(), fp32, TOP_K)[1].cpu()
    reps = 3 if args.quick else 10
    searches = {
        "exact scan": lambda: maxsim.retrieve(Q, corpus.tokens_only(), TOP_K),
        "8-bit scan + exact rescore": lambda: maxsim.retrieve(Q, corpus, TOP_K, rescore=True),
    }
    print(f"{len(docs):,} documents, {corpus.num_tokens:,} tokens, dim {args.dim}, "
          f"{args.queries} queries of {QUERY_TOKENS} tokens on {device} ({dtype})")
    for name, search in searches.items():
        (scores, ids), seconds = timed(search, device, reps)
        ids = ids.cpu()
        hit = (ids[:, 0] == source).float().mean().item()
        print(f"{name:<28} {args.queries / seconds:>10,.0f} QPS   recall@10 "
              f"{recall_at_k(ids, truth):.3f}   hit@1 {hit:.3f}")


if __name__ == "__main__":
    main()
