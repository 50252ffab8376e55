"""Corpus search: exact ``maxsim.retrieve`` over a packed corpus against fast-plaid (PLAID), on the
same synthetic corpora, queries and GPU, into ``bench_results/search-<gpu>.json``.

    python benchmarks/search.py                       # everything (long: see --budget-s)
    python benchmarks/search.py --corpora fiqa --dims 96 --batches 1,1000
    python benchmarks/search.py --corpora 1m --impls maxsim-fp16,maxsim-int8-rescore
    python benchmarks/search.py --smoke                           # CPU, tiny corpora, maxsim only

Data (made on the device, seeded by corpus, dim and ``--seed``): a vocabulary of 16,384 unit
"concept" vectors; ``docs / 50`` topics (at least 64), each a random set of 64 concepts. A document
picks one topic; its length is lognormal (median 141, mean ~155 after clipping to [8, 300]); each
token is the normalized sum of one of its topic's concepts and Gaussian noise of norm ~0.7 (cosine
~0.8 to its concept, as ColBERT tokens sit around their clusters). Tokens are stored fp16, packed
back to back. A query (32 tokens) belongs to one source document: each token is, with probability
1/2, a copy of one of the source's tokens plus noise of norm ~0.6, else a fresh token of the
source's topic. So the source should rank first (``hit_at_1``) and the rest of the top-10 is a
close race among same-topic documents, where an approximate index loses recall.

Rows, one per (corpus, dim, batch, impl): ``qps`` (batch / p50), ``p50_ms`` per batch call (host
to host, results on the host for fast-plaid and on the device for maxsim, synchronized),
``recall_at_10`` and ``hit_at_1`` over the first ``--eval-queries`` queries against the fp32
exhaustive top-10 of the stored fp16 tokens, ``floor_ms`` (the larger of the tensor-core floor over
the real tokens, ``2 * batch * 32 * tokens * dim`` / the measured fp16 or int8 rate, and the HBM
floor, the scanned bytes / the measured bandwidth; none for fast-plaid), ``build_s`` (maxsim:
making the codes; the packed fp16 corpus is the embeddings themselves; fast-plaid: index
creation and load), ``gpu_mb`` (the index's bytes on the GPU plus the peak working memory of the
timed calls), ``index_bytes`` (maxsim: bytes held, host memory included; fast-plaid: its index
folder on disk), ``corpus_bytes`` (the packed fp16 tokens: ``gpu_mb`` is read against it).
``maxsim-int8-rescore-host`` keeps the fp16 tokens in host memory and only the codes on the GPU.

``--memory-mb`` is retrieve's working-memory budget: it sets the documents scored per chunk
(``budget / (batch * 48 bytes)``), so the peak above the stored index stays near it.

A selection merges its rows into the output file (same key replaced); the file is rewritten after
every row, so a run stopped by ``--budget-s`` or a time limit keeps what it measured.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import shutil
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "torch-ext"))

import maxsim  # noqa: E402
from bench import git_state, gpu_slug, measure_ceilings  # noqa: E402

CORPORA = {"scifact": 5_183, "fiqa": 57_638, "trec-covid": 171_332, "1m": 1_000_000}
IMPLS = ("maxsim-fp16", "maxsim-int8", "maxsim-int8x8", "maxsim-int8-rescore",
         "maxsim-int8-rescore-host", "maxsim-fp16-padded", "fast-plaid", "fast-plaid-recall")
PLAID_SETTINGS = {"fast-plaid": {}, "fast-plaid-recall": {"n_ivf_probe": 32,
                                                           "n_full_scores": 8192}}
QUERY_TOKENS = 32
TOP_K = 10
CONCEPTS, TOPIC_CONCEPTS = 16_384, 64
TOKEN_NOISE, QUERY_NOISE = 0.7, 0.6
MAX_LEN, MIN_LEN = 300, 8
GEN_TOKENS = 1 << 22  # tokens generated per step: bounds the fp32 temporaries


# ----------------------------------------------------------------------------------------------
# Data
# ----------------------------------------------------------------------------------------------


class SearchData:
    """A packed fp16 corpus, its topics, and queries drawn from known source documents."""

    def __init__(self, docs: int, dim: int, n_queries: int, seed: int, device: torch.device):
        g = torch.Generator(device).manual_seed(seed)
        rand = lambda *shape: torch.randn(*shape, generator=g, device=device)  # noqa: E731
        self.concepts = torch.nn.functional.normalize(rand(CONCEPTS, dim), dim=-1)
        n_topics = max(64, docs // 50)
        self.topic_concepts = torch.randint(CONCEPTS, (n_topics, TOPIC_CONCEPTS), generator=g,
                                            device=device)
        self.doc_topic = torch.randint(n_topics, (docs,), generator=g, device=device)
        mu = math.log(160.0) - 0.5 * 0.5**2  # lognormal of mean 160 before clipping
        lengths = torch.exp(mu + 0.5 * rand(docs)).round().clamp_(MIN_LEN, MAX_LEN).long()
        self.lengths = lengths.cpu()
        self.offsets = torch.cat([lengths.new_zeros(1), lengths.cumsum(0)])
        total = int(self.offsets[-1])
        self.tokens = torch.empty((total, dim), dtype=torch.float16, device=device)
        doc_of_token = torch.repeat_interleave(torch.arange(docs, device=device), lengths)
        for start in range(0, total, GEN_TOKENS):
            topics = self.doc_topic[doc_of_token[start:start + GEN_TOKENS]]
            self.tokens[start:start + topics.numel()] = self._topic_tokens(topics, g).half()
        del doc_of_token
        self.source = torch.randint(docs, (n_queries,), generator=g, device=device)
        self.queries = self._queries(g).half()

    def _topic_tokens(self, topics, g, noise=TOKEN_NOISE):
        """One token per entry of ``topics``: a concept of that topic plus noise, normalized."""
        pick = torch.randint(TOPIC_CONCEPTS, topics.shape, generator=g, device=topics.device)
        centre = self.concepts[self.topic_concepts[topics, pick]]
        return self._noisy(centre, noise, g)

    @staticmethod
    def _noisy(x, noise, g):
        dim = x.size(-1)
        jitter = torch.randn(x.shape, generator=g, device=x.device) * (noise / math.sqrt(dim))
        return torch.nn.functional.normalize(x.float() + jitter, dim=-1)

    def _queries(self, g):
        n, device = self.source.numel(), self.source.device
        start = self.offsets[self.source]
        length = self.offsets[self.source + 1] - start
        position = (torch.rand((n, QUERY_TOKENS), generator=g, device=device)
                    * length[:, None]).long()
        copied = self._noisy(self.tokens[start[:, None] + position], QUERY_NOISE, g)
        fresh = self._topic_tokens(self.doc_topic[self.source][:, None].expand(-1, QUERY_TOKENS),
                                   g)
        keep = torch.rand((n, QUERY_TOKENS, 1), generator=g, device=device) < 0.5
        return torch.where(keep, copied, fresh)

    def corpus(self) -> maxsim.Corpus:
        return maxsim.Corpus(self.offsets, self.tokens)

    def truth(self, n_eval: int) -> torch.Tensor:
        """fp32 exhaustive top-10 document ids ``[n_eval, 10]`` over the stored fp16 tokens,
        scanned ``GEN_TOKENS`` tokens' worth of documents at a time (no fp32 copy of it all)."""
        q = self.queries[:n_eval].float()
        host = self.offsets.cpu()
        best_s = torch.empty((n_eval, 0), device=q.device)
        best_i = torch.empty((n_eval, 0), dtype=torch.int64, device=q.device)
        start = 0
        while start < len(self.lengths):
            stop = int(torch.searchsorted(host, host[start] + GEN_TOKENS, right=True)) - 1
            stop = min(max(stop, start + 1), len(self.lengths))
            a, b = int(host[start]), int(host[stop])
            part = maxsim.Corpus(host[start:stop + 1] - a, self.tokens[a:b].float())
            s, i = maxsim.retrieve(q, part, min(TOP_K, stop - start))
            best_s, order = torch.cat([best_s, s], 1).topk(min(TOP_K, best_s.size(1) + s.size(1)),
                                                           dim=1)
            best_i = torch.cat([best_i, i + start], 1).gather(1, order)
            start = stop
        return best_i


# ----------------------------------------------------------------------------------------------
# Implementations: build() -> (search(Q) -> ids [Nq, 10] (any device), index bytes, GPU bytes)
# ----------------------------------------------------------------------------------------------


def build_maxsim(impl: str, data: SearchData, dim: int):
    corpus = data.corpus()
    if impl == "maxsim-fp16":
        return (lambda Q: maxsim.retrieve(Q, corpus, TOP_K)[1]), corpus.nbytes, corpus.nbytes
    if impl == "maxsim-fp16-padded":
        width, device = int(data.lengths.max()), data.tokens.device
        padded = torch.zeros((len(data.lengths), width, dim), dtype=torch.float16, device=device)
        d_lengths = data.lengths.to(device)
        padded[torch.arange(width, device=device) < d_lengths[:, None]] = data.tokens
        held = padded.numel() * 2

        def padded_search(Q):
            return maxsim.retrieve(Q, padded, TOP_K, d_lengths=d_lengths)[1]

        return padded_search, held, held
    if impl == "maxsim-int8-rescore-host":  # codes on the GPU, fp16 tokens in host memory
        host = maxsim.Corpus(data.offsets.cpu(), data.tokens.cpu())
        split = host.with_codes("int8", device=data.tokens.device)
        on_gpu = split.codes.nbytes + split.offsets.numel() * 8
        return (lambda Q: maxsim.retrieve(Q, split, TOP_K, rescore=True)[1]), split.nbytes, on_gpu
    with_codes = corpus.with_codes("int8")
    if impl == "maxsim-int8-rescore":
        return ((lambda Q: maxsim.retrieve(Q, with_codes, TOP_K, rescore=True)[1]),
                with_codes.nbytes, with_codes.nbytes)
    codes = with_codes.codes_only()
    if impl == "maxsim-int8":  # fp16 queries against the codes
        return (lambda Q: maxsim.retrieve(Q, codes, TOP_K)[1]), codes.nbytes, codes.nbytes

    def int8x8_search(Q):  # int8 queries (quantized per call) x int8 codes: integer tensor cores
        return maxsim.retrieve(maxsim.quantize(Q, check_finite=False), codes, TOP_K)[1]

    return int8x8_search, codes.nbytes, codes.nbytes


def build_plaid(impl: str, data: SearchData, index_dir: Path):
    """fast-plaid's index of ``data`` (built once per corpus and dim, shared by its settings)
    and a search at ``impl``'s settings: ``(search, bytes on disk, build seconds)``."""
    if getattr(data, "plaid", None) is None:
        from fast_plaid import search as plaid_search

        t0 = time.perf_counter()
        shutil.rmtree(index_dir, ignore_errors=True)
        docs = list(data.tokens.split(data.lengths.tolist()))
        plaid = plaid_search.FastPlaid(index=str(index_dir), device=str(data.tokens.device))
        plaid.create(documents_embeddings=docs, nbits=4, kmeans_niters=4)
        del docs
        plaid.search(queries_embeddings=data.queries[:1], top_k=TOP_K, show_progress=False)
        on_disk = sum(p.stat().st_size for p in index_dir.rglob("*") if p.is_file())
        data.plaid = (plaid, on_disk, time.perf_counter() - t0)
    plaid, on_disk, build_s = data.plaid
    settings = PLAID_SETTINGS[impl]

    def plaid_search_ids(Q):
        found = plaid.search(queries_embeddings=Q, top_k=TOP_K, show_progress=False, **settings)
        return torch.tensor([[d for d, _ in hits] + [-1] * (TOP_K - len(hits)) for hits in found])

    return plaid_search_ids, on_disk, build_s


# ----------------------------------------------------------------------------------------------
# Measuring one row
# ----------------------------------------------------------------------------------------------


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_batches(search, queries, batch, device, target_s):
    """Milliseconds per call of ``search`` on batches of ``batch`` queries, rotating through the
    query set: one warm-up call, then at least 3 and up to 50 calls or ``target_s`` seconds."""
    n = queries.size(0)
    batches = [queries[i:i + batch] for i in range(0, n - batch + 1, batch)] or [queries[:batch]]
    search(batches[0])
    sync(device)
    times, spent = [], 0.0
    while len(times) < 3 or (len(times) < 50 and spent < target_s):
        q = batches[len(times) % len(batches)]
        t0 = time.perf_counter()
        search(q)
        sync(device)
        times.append((time.perf_counter() - t0) * 1e3)
        spent += times[-1] / 1e3
    return sorted(times)[len(times) // 2]


def kernel_profile(search, queries, device, top=8):
    """Where one call's device time goes: ``{"kernels_ms": total, "top": {kernel: ms}}`` of one
    profiled call (torch.profiler), the ``top`` longest kernels by name; empty on the CPU."""
    if device.type != "cuda":
        return {}
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        search(queries)
        sync(device)
    totals = {}
    for event in prof.events():
        if event.device_type == DeviceType.CUDA:
            name = event.name[:80]
            totals[name] = totals.get(name, 0.0) + event.time_range.elapsed_us() / 1e3
    ranked = sorted(totals.items(), key=lambda kv: -kv[1])
    return {"kernels_ms": sum(totals.values()), "top": dict(ranked[:top])}


def floor_ms(impl, batch, tokens, dim, ceilings):
    """The row's floor: max(tensor-core time over the real tokens, HBM time of the scanned
    bytes); None for an approximate index, or without measured ceilings."""
    if not impl.startswith("maxsim") or not ceilings:
        return None
    int8x8 = impl in ("maxsim-int8x8", "maxsim-int8-rescore", "maxsim-int8-rescore-host")
    rate = ceilings.get("int8_tops" if int8x8 else "fp16_tflops")
    per_value = 2 if impl in ("maxsim-fp16", "maxsim-fp16-padded") else 1
    scanned = tokens * dim * per_value + (0 if per_value == 2 else 4 * tokens)
    t_flop = 2 * batch * QUERY_TOKENS * tokens * dim / (rate * 1e12) if rate else 0.0
    return max(t_flop, scanned / (ceilings["hbm_gbps"] * 1e9)) * 1e3


def quality(ids, truth, source):
    """(recall@10 against ``truth``, hit@1: the source document ranked first)."""
    ids, truth = ids.cpu()[: truth.size(0)], truth.cpu()
    found = (ids[:, :, None] == truth[:, None, :]).any(1).sum(1).float() / truth.size(1)
    hit = (ids[:, 0] == source.cpu()[: truth.size(0)]).float().mean()
    return float(found.mean()), float(hit)


def device_used(device) -> int:
    if device.type != "cuda":
        return 0
    free, total = torch.cuda.mem_get_info(device)
    return total - free


def measure_impl(impl, data, spec, args, ceilings, device, emit):
    """Build ``impl`` on ``data``, then one row per batch size through ``emit``."""
    name, dim = spec
    tokens = int(data.offsets[-1])
    base_alloc = torch.cuda.memory_allocated(device) if device.type == "cuda" else 0
    base_used = device_used(device)
    t0 = time.perf_counter()
    if impl.startswith("fast-plaid"):
        search, index_bytes, build_s = build_plaid(impl, data,
                                                   Path(args.index_dir) / f"{name}-{dim}")
        gpu_bytes = getattr(data, "plaid_gpu_bytes", None)
    else:
        search, index_bytes, gpu_bytes = build_maxsim(impl, data, dim)
        sync(device)
        build_s = time.perf_counter() - t0
    ids = torch.cat([search(data.queries[i:i + 250]).cpu()
                     for i in range(0, args.eval_queries, 250)])
    if gpu_bytes is None:  # fast-plaid's own placement: what its loaded index added
        gpu_bytes = data.plaid_gpu_bytes = max(
            device_used(device) - base_used,
            (torch.cuda.memory_allocated(device) - base_alloc) if device.type == "cuda" else 0)
    recall, hit = quality(ids, data.truth_ids, data.source)
    for batch in args.batches:
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
            start_alloc = torch.cuda.memory_allocated(device)
        p50 = time_batches(search, data.queries, batch, device, args.target_s)
        work = (torch.cuda.max_memory_allocated(device) - start_alloc
                if device.type == "cuda" else 0)
        extra = {}
        if args.profile:
            extra["profile"] = kernel_profile(search, data.queries[:batch], device)
        emit(extra | {"corpus": name, "docs": len(data.lengths), "tokens": tokens, "dim": dim,
              "batch": batch, "impl": impl, "qps": batch * 1e3 / p50, "p50_ms": p50,
              "recall_at_10": recall, "hit_at_1": hit,
              "floor_ms": floor_ms(impl, batch, tokens, dim, ceilings), "build_s": build_s,
              "gpu_mb": (gpu_bytes + work) / 2**20, "index_bytes": index_bytes,
              "corpus_bytes": tokens * dim * 2})


# ----------------------------------------------------------------------------------------------
# Driver
# ----------------------------------------------------------------------------------------------


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--corpora", default=",".join(CORPORA), help=f"of {', '.join(CORPORA)}")
    p.add_argument("--dims", default="96,128")
    p.add_argument("--batches", default="1,32,1000")
    p.add_argument("--impls", default="maxsim-fp16,maxsim-int8,maxsim-int8x8,maxsim-int8-rescore,"
                   "maxsim-int8-rescore-host,"
                   "fast-plaid,fast-plaid-recall", help=f"of {', '.join(IMPLS)}")
    p.add_argument("--queries", type=int, default=1000, help="query set size (>= every batch)")
    p.add_argument("--eval-queries", type=int, default=200, help="queries scored for recall")
    p.add_argument("--plaid-max-docs", type=int, default=200_000,
                   help="skip fast-plaid (index build) on larger corpora")
    p.add_argument("--padded-max-gb", type=float, default=12.0,
                   help="skip maxsim-fp16-padded where the padded copy is larger")
    p.add_argument("--budget-s", type=float, default=1e9,
                   help="start no new corpus or implementation after this many seconds")
    p.add_argument("--target-s", type=float, default=1.0, help="timed seconds per row, about")
    p.add_argument("--memory-mb", type=float, default=1024,
                   help="retrieve's working-memory budget (MAXSIM_TORCH_MEMORY_MB): chunk size")
    p.add_argument("--profile", action="store_true",
                   help="add each row's kernel-time breakdown of one call (torch.profiler)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--index-dir", default="/tmp/search_plaid")
    p.add_argument("--out", default=None, help="default bench_results/search-<gpu>.json")
    p.add_argument("--smoke", action="store_true", help="CPU, corpora / 1000, maxsim only")
    args = p.parse_args(argv)
    args.corpora = [c for c in args.corpora.split(",") if c]
    args.dims = [int(x) for x in args.dims.split(",") if x]
    args.batches = [int(x) for x in args.batches.split(",") if x]
    args.impls = [i for i in args.impls.split(",") if i]
    for what, values, known in (("corpora", args.corpora, CORPORA), ("impls", args.impls, IMPLS)):
        unknown = [v for v in values if v not in known]
        if unknown:
            p.error(f"--{what}: unknown {unknown}, expected some of {list(known)}")
    if args.smoke:
        args.impls = [i for i in args.impls if i.startswith("maxsim")]
        args.queries, args.eval_queries, args.target_s = 64, 16, 0.05
        args.batches = [b for b in args.batches if b <= 64] or [1]
    args.eval_queries = min(args.eval_queries, args.queries)
    if max(args.batches) > args.queries:
        p.error(f"--batches: expected at most --queries = {args.queries}, got {args.batches}")
    return args


def load_rows(path: Path) -> list:
    try:
        return json.loads(path.read_text())["rows"]
    except (OSError, ValueError, KeyError):
        return []


def row_key(row):
    return tuple(row.get(k) for k in ("corpus", "dim", "batch", "impl"))


def main(argv=None):
    args = parse_args(argv)
    os.environ["MAXSIM_TORCH_MEMORY_MB"] = str(args.memory_mb)
    device = torch.device("cpu" if args.smoke or not torch.cuda.is_available() else "cuda")
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    out = Path(args.out or Path(__file__).resolve().parents[1] / "bench_results"
               / f"search-{gpu_slug(gpu)}.json")
    commit, dirty = git_state()
    ceilings = measure_ceilings(device, smoke=False) if device.type == "cuda" else {}
    header = {"schema": 1, "gpu": gpu, "commit": commit[:7], "dirty": dirty,
              "date": time.strftime("%Y-%m-%d"), "torch": torch.__version__,
              "cuda": torch.version.cuda, "ceilings": ceilings, "memory_mb": args.memory_mb}
    rows = load_rows(out)
    began = time.perf_counter()

    def emit(row):
        row |= {"gpu": gpu, "commit": commit[:7]}
        rows[:] = [r for r in rows if row_key(r) != row_key(row)] + [row]
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(header | {"rows": rows}, indent=1) + "\n")
        print(f"{row['corpus']:>10} d{row['dim']:<3} b{row['batch']:<4} {row['impl']:<20} "
              f"{row.get('qps') or 0:>10,.0f} qps  p50 {row.get('p50_ms') or 0:8.2f} ms  "
              f"recall {row.get('recall_at_10') or 0:.3f}  hit@1 {row.get('hit_at_1') or 0:.3f}  "
              f"floor {row.get('floor_ms') or 0:.2f} ms  {row.get('gpu_mb') or 0:,.0f} MB  "
              f"{row.get('status', '')}", flush=True)
        for kernel, ms in list(row.get("profile", {}).get("top", {}).items())[:4]:
            print(f"{'':>12}{ms:9.3f} ms  {kernel}")

    for name in args.corpora:
        docs = max(50, CORPORA[name] // 1000) if args.smoke else CORPORA[name]
        for dim in args.dims:
            if time.perf_counter() - began > args.budget_s:
                print(f"budget spent: {name} dim {dim} not run")
                continue
            run_corpus(name, docs, dim, args, ceilings, device, emit, began)
    print(f"wrote {out} ({len(rows)} rows) in {time.perf_counter() - began:.0f} s")


def run_corpus(name, docs, dim, args, ceilings, device, emit, began):
    seed = args.seed * 1_000_003 + docs * 1009 + dim
    t0 = time.perf_counter()
    data = SearchData(docs, dim, args.queries, seed, device)
    data.truth_ids = data.truth(args.eval_queries)
    sync(device)
    print(f"{name} dim {dim}: {docs:,} docs, {int(data.offsets[-1]):,} tokens, made and "
          f"ground truth in {time.perf_counter() - t0:.1f} s", flush=True)
    for impl in args.impls:
        skip = None
        if time.perf_counter() - began > args.budget_s:
            skip = "budget spent"
        elif impl.startswith("fast-plaid") and docs > args.plaid_max_docs:
            skip = f"skipped: more than --plaid-max-docs {args.plaid_max_docs}"
        elif impl == "maxsim-fp16-padded" and docs * MAX_LEN * dim * 2 > args.padded_max_gb * 2**30:
            skip = f"skipped: padded copy over --padded-max-gb {args.padded_max_gb}"
        if skip:
            print(f"{name} dim {dim} {impl}: {skip}")
            continue
        try:
            measure_impl(impl, data, (name, dim), args, ceilings, device, emit)
        except Exception as e:  # one failing row (OOM, missing package) must not end the run
            msg = str(e).strip().splitlines()
            status = f"{type(e).__name__}: {msg[0] if msg else ''}"[:200]
            for batch in args.batches:
                emit({"corpus": name, "docs": docs, "dim": dim, "batch": batch, "impl": impl,
                      "status": status})
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()


if __name__ == "__main__":
    os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    main()
