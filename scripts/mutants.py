"""Mutation check: deliberate bugs in the PyTorch fallback and the argument checks, each of which
the test suite must catch (`just mutants`).

    python scripts/mutants.py [--only NAME,...] [--list]

Every mutant is applied to a scratch copy of torch-ext/ (the tree is never touched), and the
tests named beside it run against that copy (CPU, ``-x``): the mutant is killed when they fail.
The exit status is non-zero when any mutant survives, or when a mutant no longer applies (its
text changed: update the list).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parent.parent


class Mutant(NamedTuple):
    name: str
    file: str  # under torch-ext/maxsim/
    before: str  # must occur exactly once
    after: str
    tests: tuple  # the tests expected to kill it (pytest node ids or files)


MUTANTS = (
    Mutant("all -inf: argmax not moved to the first valid token", "fallback.py",
           'index = torch.where(values == float("-inf"), d_valid.view(torch.uint8).argmax(-1), '
           "index)", "index = index", ("tests/test_rules.py",)),
    Mutant("float masks: positive = valid", "validation.py",
           "(m if m.dtype == torch.bool else m != 0)", "(m if m.dtype == torch.bool else m > 0)",
           ("tests/test_rules.py",)),
    Mutant("padding takes part in the max", "fallback.py",
           'sim.masked_fill_(~d_valid, float("-inf"))', "sim", ("tests/test_semantics.py",)),
    Mutant("grouped candidates scored against the wrong query", "fallback.py",
           "return p // group, p", "return p % group, p", ("tests/test_ops_layouts.py",)),
    Mutant("a masked query token adds its max", "fallback.py",
           "values = torch.where(counts, values, 0.0)", "values = values",
           ("tests/test_semantics.py",)),
    Mutant("document token 0 never receives gradient", "fallback.py",
           "won = winner >= 0", "won = winner > 0", ("tests/test_autograd.py",)),
    Mutant("cross-entropy gradient not divided by the rows", "fallback.py",
           "return loss, grad * (scale / rows)", "return loss, grad * scale",
           ("tests/test_losses.py",)),
    Mutant("packed segments read one token too many", "fallback.py",
           "valid = cols < self.lengths[ids, None]\n            if self.mask is not None:\n"
           "                valid &= self.mask[rows]",
           "valid = cols <= self.lengths[ids, None]\n            if self.mask is not None:\n"
           "                valid &= self.mask[rows]",
           ("tests/test_semantics.py",)),
    Mutant("offsets may start past 0", "validation.py", "if first != 0:", "if first < 0:",
           ("tests/test_validation.py",)),
    Mutant("ranges admit one past the end", "validation.py", "bad = (t < low) | (t > high)",
           "bad = (t < low) | (t > high + 1)", ("tests/test_validation.py",)),
    Mutant("documents of another dtype accepted", "validation.py",
           "if same_dtype and d.dtype != q.dtype:", "if False:", ("tests/test_validation.py",)),
)


def apply(mutant: Mutant, tree: Path) -> None:
    path = tree / "maxsim" / mutant.file
    text = path.read_text()
    if text.count(mutant.before) != 1:
        raise LookupError(f"{mutant.file}: the mutated text occurs {text.count(mutant.before)} "
                          "times (expected once)")
    path.write_text(text.replace(mutant.before, mutant.after))


def run_tests(mutant: Mutant, tree: Path) -> tuple[bool, str]:
    """(killed, the first failing test or the survivors' summary line)."""
    env = {**os.environ, "PYTHONPATH": f"{tree}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
           "CUDA_VISIBLE_DEVICES": ""}
    where = subprocess.run([sys.executable, "-c", "import maxsim; print(maxsim.__file__)"],
                           env=env, cwd=ROOT, capture_output=True, text=True).stdout.strip()
    if not where.startswith(str(tree)):
        raise RuntimeError(f"the tests would import maxsim from {where!r}, not the scratch copy")
    out = subprocess.run([sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider",
                          *mutant.tests], env=env, cwd=ROOT, capture_output=True, text=True).stdout
    failed = [line for line in out.splitlines() if line.startswith(("FAILED", "ERROR"))]
    last = out.strip().splitlines()[-1] if out.strip() else "no output"
    return bool(failed), (failed[0].split(" - ")[0] if failed else last)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", help="comma-separated substrings of mutant names")
    ap.add_argument("--list", action="store_true", help="list the mutants and exit")
    args = ap.parse_args(argv)
    chosen = [m for m in MUTANTS
              if not args.only or any(k in m.name for k in args.only.split(","))]
    if args.list:
        for m in chosen:
            print(f"{m.file:<14} {m.name:<52} {' '.join(m.tests)}")
        return 0
    survivors = 0
    for m in chosen:
        t0 = time.perf_counter()
        with tempfile.TemporaryDirectory(prefix="maxsim-mutant-") as tmp:
            tree = Path(tmp) / "torch-ext"
            shutil.copytree(ROOT / "torch-ext", tree,
                            ignore=shutil.ignore_patterns("__pycache__", "*.so", "build"))
            try:
                apply(m, tree)
                killed, detail = run_tests(m, tree)
            except (LookupError, RuntimeError) as e:
                killed, detail = False, f"not applied: {e}"
        survivors += not killed
        print(f"{'killed  ' if killed else 'SURVIVED'} {m.name:<52} {detail} "
              f"({time.perf_counter() - t0:.0f} s)", flush=True)
    print(f"{len(chosen) - survivors} of {len(chosen)} mutants killed")
    return 1 if survivors else 0


if __name__ == "__main__":
    sys.exit(main())
