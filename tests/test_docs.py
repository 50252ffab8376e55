"""The snippets of README.md and docs/*.md run: every ```python block whose line above is
``<!-- runnable -->`` is executed here on CPU, so a documented call cannot drift from the code.

``<!-- runnable requires=NAME -->`` runs the block only where NAME imports (``cuda``: only with a
GPU), e.g. the integration recipes, which run in CI where the libraries are installed. In the
README every python block says which it is: runnable, or ``<!-- not runnable: why -->``.
"""

import importlib.util
import re
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
MARKER = re.compile(r"^<!-- runnable(?: requires=(?P<requires>[\w.]+))? -->$")
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def runnable_blocks(path: Path):
    """``(line, requires, code)`` of each marked block of ``path``; a marker not followed by a
    ```python block is an error, so that a typo cannot drop a snippet silently."""
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks = []
    for i, line in enumerate(lines):
        found = MARKER.match(line.strip())
        if found is None:
            continue
        if i + 1 >= len(lines) or lines[i + 1].strip() != "```python":
            raise ValueError(f"{path.name}:{i + 1}: the runnable marker must precede ```python")
        end = next(j for j in range(i + 2, len(lines)) if lines[j].strip() == "```")
        blocks.append((i + 3, found["requires"], "\n".join(lines[i + 2:end]) + "\n"))
    return blocks


SNIPPETS = [
    pytest.param(path, line, requires, code, id=f"{path.name}:{line}",
                 marks=[pytest.mark.cuda] if requires == "cuda" else [])
    for path in DOCS
    for line, requires, code in runnable_blocks(path)
]


def available(requires) -> bool:
    if requires is None:
        return True
    if requires == "cuda":
        return torch.cuda.is_available()
    return importlib.util.find_spec(requires) is not None


def unpatch_integrations():
    """A snippet that patches a library must not leave it patched for the tests after it."""
    for name in ("pylate", "colpali", "sentence_transformers"):
        module = sys.modules.get(f"maxsim.integrations.{name}")
        if module is not None:
            module.unpatch()


def test_every_readme_python_block_is_marked():
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    unmarked = [
        i + 1 for i, line in enumerate(lines)
        if line.strip() == "```python" and not (
            i > 0 and (MARKER.match(lines[i - 1].strip())
                       or lines[i - 1].startswith("<!-- not runnable: "))
        )
    ]
    assert not unmarked, f"README.md lines {unmarked}: mark each runnable or not runnable"
    assert sum(1 for p in SNIPPETS if p.values[0].name == "README.md") >= 5


README_MAX_BYTES = 20_000
# 7 to 40 hex digits with a letter and a digit among them: a commit, not a number or a word
COMMIT_HASH = re.compile(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}\b", re.IGNORECASE)


def test_readme_is_a_short_guide_without_commit_hashes():
    """The README is the user guide: measurement history and the commits behind each benchmark
    row live in docs/BENCHMARKS.md, docs/PERF_NOTES.md and bench_results/*.json."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    size = len(text.encode("utf-8"))
    assert size <= README_MAX_BYTES, f"README.md is {size} bytes, over {README_MAX_BYTES}"
    assert not COMMIT_HASH.findall(text), "README.md names commits; move them to docs/"
    assert COMMIT_HASH.findall("measured at 21b965f and a41a2fba2b") == ["21b965f", "a41a2fba2b"]
    assert not COMMIT_HASH.findall("Nd10000, 2026-11-25, 580.159.04, 1000000, defaced, e4m3")


@pytest.mark.parametrize("path, line, requires, code", SNIPPETS)
def test_snippet_runs(path, line, requires, code, capsys):
    if not available(requires):
        pytest.skip(f"needs {requires}")
    try:
        exec(compile(code, f"{path.name}:{line}", "exec"), {"__name__": "__snippet__"})
    finally:
        unpatch_integrations()
