"""The two data sets of `quant_fidelity.py`: real token embeddings over real text, and clustered
synthetic tokens. Each maker returns queries, documents, their masks and a graded relevance
``[Nq, Nd]``; tokens are L2-normalised and padding holds random unit vectors, never zeros.

* ``text_data``: WordLlama's token embeddings (the ``wordllama`` package on PyPI ships its weights:
  a table of 32,000 Llama-2 tokens x 256 dimensions, trained Matryoshka-style so that the first 128
  stand alone) over English prose from the running Python's standard library (every docstring,
  found with ``ast`` so nothing is imported, and pydoc's help topics), cut into passages of whole
  sentences of at most 100 words, as DPR cuts Wikipedia. Queries follow the inverse cloze task:
  one sentence is taken out of a passage and becomes the query; the passage without it is the one
  relevant document. The table is static (one vector per token id, no context), so a word scores
  alike wherever it stands; a contextual encoder gives every occurrence its own vector.
* ``clustered_data``: documents are bags of topic tokens (a topic centre plus noise); a query takes
  most of its topics from one document; relevance counts shared topics. Many documents share a
  query's topics, so near-ties are common: a harder case for 8-bit codes than the text set.
"""
from __future__ import annotations

import ast
import math
import random
import re
import sysconfig
from pathlib import Path

import torch
import torch.nn.functional as F

SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z\"'(])")
SKIP_DIRS = {"test", "tests", "site-packages", "idlelib", "lib2to3", "turtledemo", "__phello__"}


def _is_prose(text: str) -> bool:
    words = text.split()
    return sum(w.strip(".,;:()\"'").isalpha() for w in words) >= 0.6 * len(words)


def _passages(text: str, max_words: int) -> list[str]:
    """Whole sentences packed into passages of at most ``max_words`` words (a longer sentence is
    a passage of its own); paragraphs of code or tables are left out."""
    out, cur, n = [], [], 0
    for paragraph in re.split(r"\n\s*\n", text):
        paragraph = " ".join(paragraph.split())
        if not paragraph or paragraph.startswith(">>>") or not _is_prose(paragraph):
            continue
        for sentence in SENTENCE_END.split(paragraph):
            w = len(sentence.split())
            if cur and n + w > max_words:
                out.append(" ".join(cur))
                cur, n = [], 0
            cur.append(sentence)
            n += w
    if cur:
        out.append(" ".join(cur))
    return out


def stdlib_passages(max_words: int = 100) -> list[str]:
    """Passages of English prose (at most ``max_words`` words of whole sentences, at least 8) from
    the standard library's docstrings and help topics: deduplicated, in a fixed order (the same on
    every machine with the same Python)."""
    texts = []
    root = Path(sysconfig.get_paths()["stdlib"])
    for path in sorted(root.rglob("*.py")):
        if SKIP_DIRS.intersection(path.relative_to(root).parts):
            continue
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                texts.append(ast.get_docstring(node) or "")
    try:
        from pydoc_data.topics import topics
        texts += [topics[k] for k in sorted(topics)]
    except ImportError:  # some distributions leave pydoc_data out
        pass
    passages = (p for t in texts for p in _passages(t, max_words))
    return list(dict.fromkeys(p for p in passages if len(p.split()) >= 8))


def cloze_pairs(passages, n_queries, n_docs, rng):
    """(query texts, document texts, index of each query's document): each query is one sentence
    (6+ words) taken out of a passage of 3+ sentences, whose remainder is its document; the other
    documents are further passages, all in a shuffled order."""
    sources = []
    for i, p in enumerate(passages):
        sentences = SENTENCE_END.split(p)
        picks = [j for j, s in enumerate(sentences) if len(s.split()) >= 6]
        if len(sentences) >= 3 and picks:
            sources.append((i, sentences, picks))
    if len(sources) < n_queries:
        raise ValueError(f"--queries {n_queries}: only {len(sources)} passages have 3+ sentences")
    chosen = rng.sample(sources, n_queries)
    queries, relevant_text = [], []
    for _, sentences, picks in chosen:
        j = rng.choice(picks)
        queries.append(sentences[j])
        relevant_text.append(" ".join(sentences[:j] + sentences[j + 1:]))
    used = {i for i, _, _ in chosen}
    rest = [p for i, p in enumerate(passages) if i not in used]
    if n_docs < n_queries or n_docs - n_queries > len(rest):
        raise ValueError(f"--docs {n_docs}: needs between {n_queries} and "
                         f"{n_queries + len(rest)} for {n_queries} queries")
    docs = relevant_text + rng.sample(rest, n_docs - n_queries)
    order = list(range(n_docs))
    rng.shuffle(order)
    position = {old: new for new, old in enumerate(order)}
    return queries, [docs[k] for k in order], [position[q] for q in range(n_queries)]


def wordllama_table():
    """WordLlama's tokenizer and token table ``[32000, 256]`` fp16, read from the installed package
    (no download)."""
    try:
        from importlib.resources import files

        from safetensors.torch import load_file
        from tokenizers import Tokenizer
        root = files("wordllama")
    except ImportError as e:
        raise SystemExit(f"the text data set needs the wordllama package ({e}): "
                         "pip install wordllama==0.4.0.post1") from e
    table = load_file(str(root / "weights" / "l2_supercat_256.safetensors"))["embedding.weight"]
    tokenizer = Tokenizer.from_file(str(root / "tokenizers" / "l2_supercat_tokenizer_config.json"))
    return tokenizer, table


def _padded(token_ids, table, cap, gen):
    """[N, L, H] unit token vectors and their [N, L] mask, sequences cut at ``cap`` tokens and L the
    longest; random unit padding."""
    n, h = len(token_ids), table.size(1)
    length = min(cap, max(len(ids) for ids in token_ids))
    x = F.normalize(torch.randn(n, length, h, generator=gen), dim=-1)
    mask = torch.zeros(n, length, dtype=torch.bool)
    for i, ids in enumerate(token_ids):
        ids = ids[:length]
        x[i, : len(ids)] = table[torch.tensor(ids, dtype=torch.long)]
        mask[i, : len(ids)] = True
    return x, mask


def text_data(args, gen):
    rng = random.Random(args.seed)
    queries, docs, positive = cloze_pairs(stdlib_passages(), args.queries, args.docs, rng)
    tokenizer, table = wordllama_table()
    table = F.normalize(table[:, : args.dim].float(), dim=-1)

    def encode(texts):
        return [e.ids for e in tokenizer.encode_batch(texts, add_special_tokens=False)]

    Q, q_mask = _padded(encode(queries), table, args.lq, gen)
    D, d_mask = _padded(encode(docs), table, args.ld, gen)
    relevance = torch.zeros(args.queries, args.docs)
    relevance[torch.arange(args.queries), torch.tensor(positive)] = 1.0
    return Q, q_mask, D, d_mask, relevance


def clustered_data(args, gen):
    h, topics = args.dim, args.topics
    centers = F.normalize(torch.randn(topics, h, generator=gen), dim=-1)
    sigma = args.noise / math.sqrt(h)  # noise of norm ~args.noise per token

    def tokens(topic_ids, length):  # [N, k] topics -> [N, length, h] tokens
        pick = torch.randint(0, topic_ids.size(1), (topic_ids.size(0), length), generator=gen)
        ids = topic_ids.gather(1, pick)
        return F.normalize(centers[ids] + sigma * torch.randn(*ids.shape, h, generator=gen), dim=-1)

    doc_topics = torch.randint(0, topics, (args.docs, args.doc_topics), generator=gen)
    D = tokens(doc_topics, args.ld)
    positive = torch.randint(0, args.docs, (args.queries,), generator=gen)
    keep = doc_topics[positive][:, : args.query_topics - 1]
    extra = torch.randint(0, topics, (args.queries, 1), generator=gen)
    query_topics = torch.cat([keep, extra], dim=1)
    Q = tokens(query_topics, args.lq)
    shared = (query_topics[:, None, :, None] == doc_topics[None, :, None, :]).any(-1).sum(-1)
    return Q, None, D, None, shared.float()
