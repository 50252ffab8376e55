"""Every example runs end to end in a subprocess, small, writing into a temporary folder."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("matplotlib")

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"

CASES = {
    "01_quickstart.py": ([], []),
    "02_alignment.py": ([], ["02_alignment.png"]),
    "03_contrastive_training.py": (["--compare"],
                                   ["03_contrastive_training.png", "03_contrastive_training.json"]),
    "04_memory.py": ([], ["04_memory.png"]),
    "05_quantized_index.py": ([], ["05_quantized_index.png"]),
    "06_search.py": ([], []),
}


def run_example(name, device, out, extra=()):
    env = dict(os.environ, MPLBACKEND="Agg")
    paths = [str(ROOT / "torch-ext"), env.get("PYTHONPATH")]
    env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    cmd = [sys.executable, str(EXAMPLES / name), "--quick", "--device", device, "--out", str(out),
           *CASES[name][0], *extra]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, f"{' '.join(cmd)}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    for png in CASES[name][1]:
        assert (out / png).stat().st_size > 0, f"{name} did not write {png}"
    return proc.stdout


def check_output(name, stdout):
    """What each example must show, read from what it prints."""
    if name == "01_quickstart.py":
        for line in ("vs maxsim: max |diff|", "scores vs float64 reference",
                     "gradients vs float64 reference"):
            err = float(re.search(re.escape(line) + r".*=\s*(\S+)", stdout).group(1))
            assert err < 1e-3, f"{line}: {err}\n{stdout}"
    if name == "02_alignment.py":
        assert re.search(r"causes\s+because", stdout), stdout
    if name == "03_contrastive_training.py":
        first, last = map(float, re.search(r"maxsim .*loss (\S+) -> (\S+)", stdout).groups())
        assert last < 0.5 * first, stdout
        diff = re.search(r"max \|loss difference\| over all \d+ steps: (\S+)", stdout)
        diff = float(diff.group(1))
        assert diff < 1e-3, stdout
    if name == "04_memory.py":
        assert "OOM" not in stdout and "wrote" in stdout, stdout
    if name == "05_quantized_index.py":
        for fmt in ("int8", "fp8_e4m3"):
            overlap = float(re.search(rf"^{fmt}\s+\S+\s+(\S+)", stdout, re.M).group(1))
            assert overlap >= 0.9, stdout
    if name == "06_search.py":
        for line in ("exact scan", "8-bit scan + exact rescore"):
            recall = float(re.search(re.escape(line) + r".*recall@10 (\S+)", stdout).group(1))
            assert recall >= 0.95, stdout


@pytest.mark.parametrize("name", sorted(CASES))
def test_example_cpu(name, tmp_path):
    check_output(name, run_example(name, "cpu", tmp_path))


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("name", sorted(CASES))
def test_example_cuda(name, tmp_path):
    check_output(name, run_example(name, "cuda", tmp_path))


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_contrastive_half_precision_cuda(dtype, tmp_path):
    stdout = run_example("03_contrastive_training.py", "cuda", tmp_path, ["--dtype", dtype])
    first, last = map(float, re.search(r"maxsim .*loss (\S+) -> (\S+)", stdout).groups())
    assert last < 0.5 * first, stdout


def test_half_precision_needs_cuda(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT / "torch-ext"))
    cmd = [sys.executable, str(EXAMPLES / "03_contrastive_training.py"), "--device", "cpu",
           "--dtype", "bf16", "--out", str(tmp_path)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 2 and "needs --device cuda" in proc.stderr, proc.stderr
