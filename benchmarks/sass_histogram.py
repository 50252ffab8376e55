"""Where a kernel's executed instructions go, from ncu's per-instruction SASS counts.

    ncu -k regex:fwd_tc -c 2 --section SourceCounters --page source --print-source=sass --csv \\
        python3 <script> > sass.csv
    python benchmarks/sass_histogram.py sass.csv

For each kernel: the instructions executed by opcode (with their share of the warp-stall samples),
and by execution count, which separates once-per-block set-up from per-tile loop bodies (a static
instruction executed N times belongs to code that runs N times per warp over the launch)."""

from __future__ import annotations

import argparse
import collections
import csv


def kernels(path: str) -> list[tuple[str, list[dict]]]:
    """(kernel name, its SASS rows) for every kernel in an ncu source-page CSV."""
    out, header = [], None
    with open(path, newline="") as f:
        for row in csv.reader(f):
            if row and row[0] == "Kernel Name":
                out.append((row[1], []))
            elif row and row[0] == "Address":
                header = row
            elif out and header and len(row) == len(header):
                out[-1][1].append(dict(zip(header, row)))
    return out


def opcode(source: str) -> str:
    words = source.split()
    if not words:
        return "?"
    word = words[1] if words[0].startswith("@") and len(words) > 1 else words[0]
    return word.split(".")[0]


def summarize(rows: list[dict], top: int = 15) -> str:
    executed = [int(r.get("Instructions Executed") or 0) for r in rows]
    samples = [int(r.get("Warp Stall Sampling (All Samples)") or 0) for r in rows]
    total, total_samples = sum(executed), max(1, sum(samples))
    by_op, stalls, by_count = collections.Counter(), collections.Counter(), collections.Counter()
    statics = collections.Counter()
    for r, n, s in zip(rows, executed, samples):
        op = opcode(r.get("Source", ""))
        by_op[op] += n
        stalls[op] += s
        by_count[n] += n
        statics[n] += 1
    lines = [f"executed warp instructions: {total:,}"]
    lines.append(f"{'opcode':<10} {'executed':>12} {'share':>7} {'stall samples':>14}")
    for op, n in by_op.most_common(top):
        share, stall = n / max(total, 1), stalls[op] / total_samples
        lines.append(f"{op:<10} {n:>12,} {share:>7.1%} {stall:>14.1%}")
    lines.append(f"{'times run':>10} {'executed':>12} {'share':>7} {'static instrs':>14}")
    for n, c in sorted(by_count.items(), key=lambda kv: -kv[1])[:top]:
        if n:
            lines.append(f"{n:>10,} {c:>12,} {c / max(total, 1):>7.1%} {statics[n]:>14}")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv", help="ncu --page source --print-source=sass --csv output")
    ap.add_argument("--top", type=int, default=15)
    args = ap.parse_args()
    for name, rows in kernels(args.csv):
        print(f"== {name}\n{summarize(rows, args.top)}\n")


if __name__ == "__main__":
    main()
