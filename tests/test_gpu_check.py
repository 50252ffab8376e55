"""scripts/gpu_check.sh fails its run when any stage's command fails, whatever pipes its output
goes through: the stages run here against stand-in commands that fail on demand."""

import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")


def _stub(bin_dir: Path, name: str, fail_when: str, says: str = ""):
    """A command that prints a line (and ``says``) and exits 1 when its arguments contain
    ``fail_when``."""
    path = bin_dir / name
    path.write_text(f'#!/bin/sh\necho "{name} $*"\necho "{says}"\n'
                    f'case "$*" in *{fail_when}*) exit 1;; esac\nexit 0\n')
    path.chmod(path.stat().st_mode | stat.S_IEXEC)


def _run(tmp_path, stages, fail_when, race_errors=0):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    _stub(bin_dir, "python3", fail_when)
    _stub(bin_dir, "compute-sanitizer", fail_when, "========= RACECHECK SUMMARY: 2 hazards "
          f"displayed ({race_errors} errors, {2 - race_errors} warnings)")
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
           "OUT": str(tmp_path / "out")}
    return subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh"), *stages], env=env,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("stages, fail_when", [
    (["check"], "gpu_check.py"),
    (["test"], "pytest"),
    (["integ"], "test_integrations_pylate.py"),  # the first of three commands of the stage
    (["integ"], "test_integrations_sentence_transformers.py"),
    (["bench"], "bench.py"),
    (["sanitize"], "memcheck"),  # the first tool of the loop
    (["check", "test"], "gpu_check.py"),  # a later stage's success does not hide it
])
def test_a_failing_stage_fails_the_run(tmp_path, stages, fail_when):
    run = _run(tmp_path, stages, fail_when)
    assert run.returncode == 1, run.stdout + run.stderr
    assert "failed (exit 1)" in run.stdout


def test_passing_stages_pass(tmp_path):
    run = _run(tmp_path, ["check", "test", "integ", "bench", "sanitize"], "no-such-argument")
    assert run.returncode == 0, run.stdout + run.stderr


def test_racecheck_fails_on_errors_not_on_warnings(tmp_path):
    assert _run(tmp_path, ["sanitize"], "no-such-argument", race_errors=0).returncode == 0
    run = _run(tmp_path, ["sanitize"], "no-such-argument", race_errors=1)
    assert run.returncode == 1 and "racecheck errors" in run.stdout
