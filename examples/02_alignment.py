"""Alignment: which document token did each query token match?

`maxsim_with_argmax` returns, next to the scores, the index of the winning document token for every
query token. With toy word embeddings the alignment reads like a dictionary lookup.

    python examples/02_alignment.py [--device cpu|cuda] [--out DIR]
"""

import argparse
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

try:
    import maxsim
except ImportError:  # a source checkout without `pip install .`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "torch-ext"))
    import maxsim

QUERY = "what causes rain in spring".split()
DOCUMENTS = [
    "spring rainfall happens because moist air cools".split(),
    "the market fell in march".split(),
]
# Words that share a concept get nearby vectors; every other word is its own concept.
CONCEPTS = {"rainfall": "rain", "because": "causes", "cools": "cold"}


def embed(words, table, H, g):
    """One unit vector per word: its concept's vector plus a little word-specific noise."""
    out = []
    for w in words:
        c = CONCEPTS.get(w, w)
        if c not in table:
            table[c] = torch.randn(H, generator=g)
        out.append(table[c] + 0.4 * torch.randn(H, generator=g))
    return F.normalize(torch.stack(out), dim=-1)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--out", default=str(Path(__file__).resolve().parent / "out"))
    p.add_argument("--quick", action="store_true", help="accepted for symmetry; already tiny")
    args = p.parse_args()
    device = torch.device(args.device)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    H = 32
    g = torch.Generator().manual_seed(0)
    table = {}
    Q = embed(QUERY, table, H, g)[None]  # [1, Lq, H]
    Ld = max(len(d) for d in DOCUMENTS)
    D = torch.randn(len(DOCUMENTS), Ld, H, generator=g)  # padding stays random: it is masked
    d_mask = torch.zeros(len(DOCUMENTS), Ld, dtype=torch.bool)
    for i, words in enumerate(DOCUMENTS):
        D[i, :len(words)] = embed(words, table, H, g)
        d_mask[i, :len(words)] = True
    Q, D, d_mask = Q.to(device), D.to(device), d_mask.to(device)

    # 3-D documents: all pairs -> scores [1, Nd], argmax [1, Nd, Lq].
    scores, argmax = maxsim.maxsim_with_argmax(Q, D, d_mask=d_mask)
    sim = torch.einsum("qh,dlh->dql", Q[0], D).cpu()  # dense, only to show it: [Nd, Lq, Ld]
    scores, argmax = scores.cpu(), argmax.cpu()

    for i, words in enumerate(DOCUMENTS):
        print(f"\ndocument {i}: \"{' '.join(words)}\"   score {scores[0, i].item():.3f}")
        print(f"  {'query token':<12} {'matched document token':<24} similarity")
        for t, qw in enumerate(QUERY):
            j = argmax[0, i, t].item()
            print(f"  {qw:<12} {f'{words[j]} (#{j})':<24} {sim[i, t, j].item():.3f}")
        dense = sim[i, :, :len(words)]
        assert torch.equal(argmax[0, i], dense.argmax(-1).to(argmax.dtype))
        assert abs(scores[0, i].item() - dense.max(-1).values.sum().item()) < 1e-4

    fig, axes = plt.subplots(1, len(DOCUMENTS), figsize=(5 * len(DOCUMENTS), 3.8),
                             constrained_layout=True)
    for i, (ax, words) in enumerate(zip(axes, DOCUMENTS)):
        im = ax.imshow(sim[i, :, :len(words)], cmap="viridis", vmin=-1, vmax=1)
        ax.scatter(argmax[0, i].tolist(), range(len(QUERY)), marker="s", s=260,
                   facecolors="none", edgecolors="red", linewidths=2)
        ax.set_xticks(range(len(words)), words, rotation=45, ha="right")
        ax.set_yticks(range(len(QUERY)), QUERY)
        ax.set_title(f"document {i}: score {scores[0, i].item():.2f}")
    fig.suptitle("query tokens x document tokens; red square: the argmax of each row")
    fig.colorbar(im, ax=axes, shrink=0.8, label="<q, d>")
    path = out / "02_alignment.png"
    fig.savefig(path, dpi=120)
    print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
