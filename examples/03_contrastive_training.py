"""Contrastive training with in-batch negatives: a tiny token encoder learns to score each query
highest against its own document.

Synthetic data: every (query, document) pair draws a few "topic" tokens that appear in both, and
both sides are padded out with random noise tokens. Query i's positive is document i; the other
documents of the batch are its negatives.

    python examples/03_contrastive_training.py [--steps 200] [--compare] [--dtype fp32|bf16|fp16]

    python examples/03_contrastive_training.py --compare --optimizer adam

`--compare` runs the same loop from the same initial weights and data with a float32 naive PyTorch
MaxSim (einsum -> max -> sum over the full [B, B, Lq, Ld] tensor) and plots both loss curves.

With plain SGD (the default) the two curves stay equal to fp32 rounding over the whole run. With
Adam they start equal and drift apart: a training step takes millions of maxima, a few of which
are ties to within rounding, and there two implementations may pick different winners; Adam
divides each update by the gradient's running magnitude, so the few-ulp difference becomes a
full-size update of another token, and the trajectories separate. The naive code drifts from
itself in the same way under Adam when only its summation order changes (einsum vs matmul).
"""

import argparse
import copy
import json
import sys
import time
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

try:
    import maxsim
except ImportError:  # a source checkout without `pip install .`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "torch-ext"))
    import maxsim

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


class TokenEncoder(nn.Module):
    """Embedding + linear projection + L2 normalisation: one vector per token, ColBERT-style."""

    def __init__(self, vocab, width, dim):
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        nn.init.normal_(self.embed.weight, std=0.02)  # BERT's init: tokens start nearly alike
        self.proj = nn.Linear(width, dim)

    def forward(self, ids):
        return F.normalize(self.proj(self.embed(ids)), dim=-1)


def make_batch(g, batch, vocab, lq, ld, topic):
    """Token ids [B, L] and boolean masks for queries and documents; pair i shares `topic` tokens.
    Lengths vary per row; padding positions hold random ids and are masked out."""
    def side(L, lo, topics):
        ids = torch.randint(vocab, (batch, L), generator=g)
        lengths = torch.randint(lo, L + 1, (batch,), generator=g)
        for b in range(batch):
            pos = torch.randperm(int(lengths[b]), generator=g)[:topic]
            ids[b, pos] = topics[b]
        return ids, torch.arange(L) < lengths[:, None]

    topics = torch.randint(vocab, (batch, topic), generator=g)
    q_ids, q_mask = side(lq, topic, topics)
    d_ids, d_mask = side(ld, max(topic, ld // 2), topics)
    return q_ids, q_mask, d_ids, d_mask


def naive_maxsim(Q, D, q_mask, d_mask):
    """All-pairs MaxSim in plain PyTorch: materialises the [Nq, Nd, Lq, Ld] similarity tensor."""
    sim = torch.einsum("qih,djh->qdij", Q, D)
    sim = sim.masked_fill(~d_mask[None, :, None, :], float("-inf"))
    return sim.max(-1).values.masked_fill(~q_mask[:, None, :], 0).sum(-1)


def maxsim_scores(dtype):
    def score(Q, D, q_mask, d_mask):
        return maxsim.maxsim(Q.to(dtype), D.to(dtype), q_mask, d_mask)  # fp32 scores
    return score


def train(model, score_fn, args, device):
    """Returns the loss at every step. The data stream depends only on the seed."""
    g = torch.Generator().manual_seed(args.seed)
    optimizer = torch.optim.SGD if args.optimizer == "sgd" else torch.optim.Adam
    opt = optimizer(model.parameters(), lr=args.lr)
    labels = torch.arange(args.batch, device=device)
    losses = []
    for _ in range(args.steps):
        q_ids, q_mask, d_ids, d_mask = (t.to(device) for t in make_batch(
            g, args.batch, args.vocab, args.lq, args.ld, args.topic))
        scores = score_fn(model(q_ids), model(d_ids), q_mask, d_mask)  # [B, B]
        loss = F.cross_entropy(scores / args.temperature, labels)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--out", default=str(Path(__file__).resolve().parent / "out"))
    p.add_argument("--steps", type=int, default=None,
                   help="training steps (default 200, 40 with --quick)")
    p.add_argument("--compare", action="store_true",
                   help="also train with naive fp32 PyTorch MaxSim")
    p.add_argument("--dtype", choices=DTYPES, default="fp32",
                   help="dtype of the embeddings fed to maxsim (fp16/bf16 on CUDA only)")
    p.add_argument("--quick", action="store_true", help="fewer steps and a smaller batch")
    p.add_argument("--batch", type=int, default=None, help="default 64, 16 with --quick")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--optimizer", choices=("sgd", "adam"), default="sgd",
                   help="sgd keeps the --compare curves equal to rounding; adam lets them drift")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--temperature", type=float, default=0.05)
    p.add_argument("--replot", metavar="FILE",
                   help="print and plot the curves saved in FILE (a run's JSON); train nothing")
    args = p.parse_args()
    if args.replot:
        record = json.loads(Path(args.replot).read_text())
        record["out"] = str(Path(args.replot).parent)
        return report(record)
    args.steps = args.steps or (40 if args.quick else 200)
    args.batch = args.batch or (16 if args.quick else 64)
    args.vocab, args.lq, args.ld, args.topic = 4096, 16, 64, 4
    device = torch.device(args.device)
    if args.dtype != "fp32" and device.type != "cuda":
        p.error(f"--dtype {args.dtype} needs --device cuda (half precision here is CUDA only)")

    torch.manual_seed(args.seed)
    model = TokenEncoder(args.vocab, 64, 32).to(device)
    init = copy.deepcopy(model.state_dict())
    print(f"device {device}; batch {args.batch}, {args.steps} steps, {args.optimizer}, "
          f"maxsim in {args.dtype}")

    t0 = time.perf_counter()
    score_fn = maxsim_scores(DTYPES[args.dtype])
    curves = {f"maxsim ({args.dtype})": train(model, score_fn, args, device)}
    times = [time.perf_counter() - t0]
    if args.compare:
        model.load_state_dict(init)
        t0 = time.perf_counter()
        curves["naive PyTorch (fp32)"] = train(model, naive_maxsim, args, device)
        times.append(time.perf_counter() - t0)

    for (name, losses), sec in zip(curves.items(), times):
        first, last = losses[0], sum(losses[-10:]) / len(losses[-10:])
        print(f"{name:<22} loss {first:.4f} -> {last:.4f} (mean of the last 10 steps), {sec:.1f} s")

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    record = dict(device=gpu,
                  batch=args.batch, steps=args.steps, optimizer=args.optimizer, curves=curves,
                  out=str(out))
    (out / "03_contrastive_training.json").write_text(json.dumps(record))
    report(record)


def report(record):
    """Print the comparison and plot the curves (and their difference, with two curves)."""
    curves, steps = record["curves"], record["steps"]
    diffs = None
    if len(curves) == 2:
        a, b = curves.values()
        diffs = [abs(x - y) for x, y in zip(a, b)]
        every = max(1, steps // 10)
        for s in range(0, steps, every):
            print(f"  step {s:>4}: maxsim {a[s]:.6f}  naive {b[s]:.6f}  |diff| {diffs[s]:.2e}")
        worst = max(range(steps), key=diffs.__getitem__)
        print(f"max |loss difference| over all {steps} steps: {diffs[worst]:.2e} "
              f"(step {worst}); the first 10 steps: {max(diffs[:10]):.2e}")
        if record["optimizer"] == "adam":
            print("(equal to fp32 rounding at first; the module docstring says why Adam drifts)")
    try:
        import matplotlib
    except ImportError:
        print("matplotlib is not installed: no plot (the curves are in the JSON file; "
              "`--replot FILE` draws them where it is)")
        return
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = 2 if diffs else 1
    fig, axes = plt.subplots(1, panels, figsize=(6 * panels, 4), constrained_layout=True,
                             squeeze=False)
    ax = axes[0, 0]
    for (name, losses), style in zip(curves.items(), ("-", "--")):
        ax.plot(losses, style, label=name)
    ax.set_xlabel("step")
    ax.set_ylabel("in-batch cross-entropy")
    ax.set_yscale("log")
    ax.set_title(f"contrastive training, batch {record['batch']}, {record['optimizer']}, "
                 f"{record['device']}")
    ax.legend()
    if diffs:
        ax = axes[0, 1]
        ax.plot([max(d, 1e-9) for d in diffs], ".", markersize=3)
        ax.set_xlabel("step")
        ax.set_ylabel("|loss(maxsim) - loss(naive)|")
        ax.set_yscale("log")
        ax.set_title("difference between the curves (floored at 1e-9)")
    path = Path(record["out"]) / "03_contrastive_training.png"
    fig.savefig(path, dpi=120)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
