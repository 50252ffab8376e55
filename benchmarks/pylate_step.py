"""Time one PyLate training step with and without maxsim.integrations.pylate.

A ColBERT with random weights (BERT encoder, default 4 layers, hidden 256, 128-d output) takes one
AdamW step through PyLate's Contrastive loss (query, positive, negative: in-batch negatives over
2*B documents) and through its Distillation loss (B queries, K candidates each). Each step is timed
with CUDA events, median of --iters, in three variants timed in --rounds interleaved rounds (the
order rotating each round, so that drift during the run favours none of them):

    pylate-torch   PYLATE_SCORES_BACKEND=torch: PyLate's own PyTorch scoring (no peer kernels)
    pylate-auto    PyLate's default backend, a peer kernel where one is installed (skipped, and
                   reported equal to pylate-torch, when it resolves to torch on this machine)
    maxsim         patched with maxsim.integrations.pylate

The loss values of the variants are compared as a sanity check. In the JSON rows `pylate_ms` is
the pylate-torch time, `pylate_auto_ms` the pylate-auto one and `auto_backend` what `auto`
resolves to; `speedup` is pylate-torch / maxsim and `speedup_vs_auto` pylate-auto / maxsim.

    python benchmarks/pylate_step.py --out bench_results/pylate_step.json
    python benchmarks/pylate_step.py --device cpu --quick      # smoke run
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
BACKEND_ENV = "PYLATE_SCORES_BACKEND"
# variant -> (row key prefix, PYLATE_SCORES_BACKEND); maxsim keeps the caller's environment.
VARIANTS = {"pylate-torch": ("pylate", "torch"), "pylate-auto": ("pylate_auto", "auto")}
# PyLate's peer backends: (module in pylate.scores, scoring functions, name).
PEERS = (
    (
        "_flash_backend",
        ("colbert_scores_flash", "colbert_scores_pairwise_flash", "colbert_kd_scores_flash"),
        "flash-maxsim",
    ),
    (
        "_lik_backend",
        ("colbert_scores_lik", "colbert_scores_pairwise_lik", "colbert_kd_scores_lik"),
        "late-interaction-kernels",
    ),
)


def build_colbert(path: Path, args, device: str):
    import transformers
    from pylate import models

    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", ".", ",", "!", "?", ";"]
    words += [f"w{i}" for i in range(2000)]
    tokenizer = transformers.BertTokenizer(vocab={w: i for i, w in enumerate(words)})
    config = transformers.BertConfig(
        vocab_size=len(words),
        hidden_size=args.hidden,
        num_hidden_layers=args.layers,
        num_attention_heads=max(1, args.hidden // 64),
        intermediate_size=4 * args.hidden,
        max_position_embeddings=512,
    )
    torch.manual_seed(0)
    transformers.BertModel(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return models.ColBERT(
        model_name_or_path=str(path),
        device=device,
        embedding_size=args.dim,
        query_length=args.lq,
        document_length=args.ld,
    )


def sentences(n: int, max_words: int, seed: int) -> list[str]:
    """Random word sequences with punctuation (the skiplist makes holes in the document masks).
    The first one is full length, so every batch is padded to the model's maximum length."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        length = (
            max_words
            if i == 0
            else int(torch.randint(max_words // 4, max_words + 1, (1,), generator=g))
        )
        words = [f"w{int(w)}" for w in torch.randint(0, 2000, (length,), generator=g)]
        for pos in torch.randint(0, length, (length // 12,), generator=g).tolist():
            words[pos] = ".,!?;"[pos % 5]
        out.append(" ".join(words))
    return out


def to_device(features: dict, device: str) -> dict:
    return {k: v.to(device) for k, v in features.items()}


def time_steps(step, iters: int, warmup: int, device: str) -> list[float]:
    for _ in range(warmup):
        step()
    times = []
    for _ in range(iters):
        if device == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            step()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            step()
            times.append((time.perf_counter() - t0) * 1e3)
    return times


def make_step(model, loss_fn, features, labels, bf16: bool, device: str):
    """One training step: loss, backward, AdamW update (lr 0: every step sees the same weights)."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.0)

    def step():
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device, dtype=torch.bfloat16, enabled=bf16):
            value = loss_fn(features, labels) if labels is not None else loss_fn(features)
        value.backward()
        optimizer.step()
        return value

    return step


def auto_backend(device: str) -> str:
    """What PyLate's `auto` backend picks for tensors on `device`, in the order of
    pylate/scores/colbert.py: flash-maxsim (installed, CUDA), then late-interaction-kernels
    (installed, CUDA or MPS), else torch. A peer kernel can still decline some shapes and fall back
    to torch; `peers_used` tells what really ran."""
    kind = torch.device(device).type
    try:
        from pylate.scores import _flash_backend, _lik_backend
    except ImportError:  # a PyLate without peer backends
        return "torch"
    if kind == "cuda" and _flash_backend.is_available():
        return "flash-maxsim"
    if kind in ("cuda", "mps") and _lik_backend.is_available():
        return "late-interaction-kernels"
    return "torch"


@contextlib.contextmanager
def peers_used():
    """The set of PyLate peer backends that returned scores inside the block."""
    import importlib

    used, saved = set(), []
    for module_name, functions, peer in PEERS:
        try:
            module = importlib.import_module(f"pylate.scores.{module_name}")
        except ImportError:
            continue
        for fn_name in functions:
            function = getattr(module, fn_name, None)
            if function is None:
                continue

            def spy(*args, _function=function, _peer=peer, **kwargs):
                out = _function(*args, **kwargs)
                used.add(_peer)
                return out

            saved.append((module, fn_name, function))
            setattr(module, fn_name, spy)
    try:
        yield used
    finally:
        for module, fn_name, function in saved:
            setattr(module, fn_name, function)


def set_backend_env(value: str | None) -> None:
    if value is None:
        os.environ.pop(BACKEND_ENV, None)
    else:
        os.environ[BACKEND_ENV] = value


def run_loss(name: str, model, make_loss, features, labels, args, device: str) -> dict:
    """Times the variants in interleaved rounds (each round times every variant in turn, the order
    rotating), so that drift over a long run (clocks, allocator growth) does not favour one."""
    from maxsim.integrations import pylate as integration

    auto = auto_backend(device)
    row = {"loss": name, "auto_backend": auto}
    values = {}
    caller_env = os.environ.get(BACKEND_ENV)
    variants = [v for v in ("pylate-torch", "pylate-auto", "maxsim")
                if not (v == "pylate-auto" and auto == "torch")]  # auto = torch: reported equal
    steps, times, peaks = {}, {v: [] for v in variants}, {v: 0.0 for v in variants}
    keys = {v: VARIANTS.get(v, ("maxsim", None))[0] for v in variants}

    def activate(variant):
        set_backend_env(VARIANTS.get(variant, (None, caller_env))[1])
        integration.patch() if variant == "maxsim" else integration.unpatch()

    try:
        for variant in variants:
            activate(variant)
            key = keys[variant]
            bf16 = args.dtype == "bf16"
            steps[variant] = make_step(model, make_loss(), features, labels, bf16, device)
            torch.manual_seed(0)  # the same dropout masks for every variant's checked step
            with peers_used() as used:
                values[key] = float(steps[variant]().detach())
            if variant == "pylate-auto":
                row["auto_peers_used"] = sorted(used)
        rounds = max(1, min(args.rounds, args.iters))
        for r in range(rounds):
            order = variants[r % len(variants):] + variants[: r % len(variants)]
            for variant in order:
                activate(variant)
                if device == "cuda":
                    torch.cuda.synchronize()
                    torch.cuda.reset_peak_memory_stats()
                n = args.iters // rounds + (1 if r < args.iters % rounds else 0)
                warmup = args.warmup if r == 0 else 1  # one step re-settles after a switch
                times[variant] += time_steps(steps[variant], n, warmup, device)
                if device == "cuda":
                    peaks[variant] = max(peaks[variant], torch.cuda.max_memory_allocated() / 2**20)
        for variant in variants:
            key = keys[variant]
            row[f"{key}_ms"] = statistics.median(times[variant])
            row[f"{key}_p20_ms"] = statistics.quantiles(times[variant], n=5)[0]
            row[f"{key}_p80_ms"] = statistics.quantiles(times[variant], n=5)[-1]
            if device == "cuda":
                row[f"{key}_peak_mib"] = peaks[variant]
    finally:
        integration.unpatch()
        set_backend_env(caller_env)
    if auto == "torch":
        for suffix in ("ms", "p20_ms", "p80_ms", "peak_mib"):
            if f"pylate_{suffix}" in row:
                row[f"pylate_auto_{suffix}"] = row[f"pylate_{suffix}"]
        row["auto_peers_used"] = []
        values["pylate_auto"] = values["pylate"]
    row["speedup"] = row["pylate_ms"] / row["maxsim_ms"]
    row["speedup_vs_auto"] = row["pylate_auto_ms"] / row["maxsim_ms"]
    row["loss_pylate"], row["loss_pylate_auto"] = values["pylate"], values["pylate_auto"]
    row["loss_maxsim"] = values["maxsim"]
    return row


def environment(device: str) -> dict:
    import pylate

    def git(*cmd):
        try:
            return subprocess.run(
                ["git", *cmd], cwd=ROOT, capture_output=True, text=True
            ).stdout.strip()
        except OSError:
            return ""

    # MAXSIM_COMMIT / MAXSIM_DIRTY win, as in bench.py: a copied tree's .git may not be its own.
    dirty = os.environ.get("MAXSIM_DIRTY")
    env = {
        "commit": os.environ.get("MAXSIM_COMMIT") or git("rev-parse", "HEAD"),
        "dirty": bool(git("status", "--porcelain")) if dirty is None else dirty not in ("0", ""),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "pylate": pylate.__version__,
        "python": platform.python_version(),
        "device": torch.cuda.get_device_name() if device == "cuda" else platform.processor(),
    }
    return env


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--out", type=Path, help="write the results as JSON here")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--lq", type=int, default=32)
    parser.add_argument("--ld", type=int, default=180)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument(
        "--kd-ways", type=int, default=8, help="candidates per query (Distillation)"
    )
    parser.add_argument(
        "--dtype",
        choices=["fp32", "bf16"],
        default="fp32",
        help="bf16 runs the step under torch.autocast",
    )
    parser.add_argument("--iters", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=5, help="untimed steps before each round")
    parser.add_argument(
        "--rounds", type=int, default=5, help="interleaved rounds the timed steps are split into"
    )
    parser.add_argument("--quick", action="store_true", help="tiny shapes, 3 iterations")
    args = parser.parse_args()
    if args.quick:
        args.batch, args.lq, args.ld, args.layers, args.hidden, args.dim = 4, 16, 40, 1, 64, 32
        args.kd_ways, args.iters, args.warmup = 2, 3, 1

    from pylate import losses

    device = args.device
    with tempfile.TemporaryDirectory() as tmp:
        model = build_colbert(Path(tmp), args, device)
    model.train()
    queries = to_device(model.tokenize(sentences(args.batch, args.lq, 1), is_query=True), device)
    positives = to_device(model.tokenize(sentences(args.batch, args.ld, 2), is_query=False), device)
    negatives = to_device(model.tokenize(sentences(args.batch, args.ld, 3), is_query=False), device)
    candidates = to_device(
        model.tokenize(sentences(args.batch * args.kd_ways, args.ld, 4), is_query=False), device
    )
    teacher = torch.randn(args.batch, args.kd_ways, device=device).log_softmax(-1)

    rows = [
        run_loss(
            "contrastive",
            model,
            lambda: losses.Contrastive(model=model),
            [queries, positives, negatives],
            None,
            args,
            device,
        ),
        run_loss(
            "distillation",
            model,
            lambda: losses.Distillation(model=model),
            [queries, candidates],
            teacher,
            args,
            device,
        ),
    ]

    shape = (
        f"B={args.batch} Lq={args.lq} Ld={args.ld} dim={args.dim} "
        f"BERT {args.layers}x{args.hidden} {args.dtype} on {device}"
    )
    print(f"PyLate training step, median of {args.iters} ({shape})")
    print(
        f"{'loss':<14}{'torch ms':>10}{'auto ms':>10}  {'auto backend':<26}{'maxsim ms':>10}"
        f"{'vs torch':>10}{'vs auto':>9}{'|dloss|':>10}"
    )
    for row in rows:
        seen = (row["loss_pylate"], row["loss_pylate_auto"], row["loss_maxsim"])
        diff = max(seen) - min(seen)
        auto = row["auto_backend"]
        if auto == "torch":
            auto = "torch (= torch ms)"
        elif row["auto_peers_used"] != [row["auto_backend"]]:
            auto += " (ran: " + ("+".join(row["auto_peers_used"]) or "torch") + ")"
        print(
            f"{row['loss']:<14}{row['pylate_ms']:>10.2f}{row['pylate_auto_ms']:>10.2f}  "
            f"{auto:<26}{row['maxsim_ms']:>10.2f}"
            f"{row['speedup']:>9.2f}x{row['speedup_vs_auto']:>8.2f}x{diff:>10.1e}"
        )
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        config = {k: v for k, v in vars(args).items() if k != "out"}
        report = {
            "benchmark": "pylate_step",
            "config": config,
            "env": environment(device),
            "rows": rows,
        }
        args.out.write_text(json.dumps(report, indent=2) + "\n")
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
