"""What a new user sees first: ``import maxsim`` adds no warning of its own, and a GPU machine
where the CUDA kernels cannot load says so once, loudly, instead of falling back in silence."""

import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
from maxsim import dispatch

TORCH_EXT = str(Path(__file__).resolve().parent.parent / "torch-ext")


def stderr_of(code: str) -> str:
    """What a fresh interpreter prints to stderr running ``code`` with every warning shown."""
    done = subprocess.run(
        [sys.executable, "-W", "always", "-c", f"import sys; sys.path.insert(0, {TORCH_EXT!r}); "
         + code],
        capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stderr
    return done.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU the first import may compile")
def test_import_adds_no_warning_to_torchs():
    """Whatever torch itself prints on import (without numpy: 'Failed to initialize NumPy'),
    importing maxsim after it prints nothing more."""
    assert stderr_of("import torch; import maxsim") == stderr_of("import torch")


def test_cuda_without_kernels_warns_once_with_the_reason(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(dispatch, "load_cuda_ops", lambda: (None, "ninja not found"))
    monkeypatch.delenv("MAXSIM_NO_JIT", raising=False)
    with pytest.warns(RuntimeWarning, match="PyTorch fallback.*ninja not found"):
        assert dispatch._load_cuda() == (None, "ninja not found")


def test_no_warning_when_the_build_is_switched_off(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(dispatch, "load_cuda_ops", lambda: (None, "JIT build disabled"))
    monkeypatch.setenv("MAXSIM_NO_JIT", "1")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        dispatch._load_cuda()


def test_no_warning_without_a_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert dispatch._load_cuda()[0] is None


def test_import_does_not_import_dynamo():
    """torch._dynamo (over a second to import) is for torch.compile, which imports it itself."""
    loaded = subprocess.run(
        [sys.executable, "-c", f"import sys; sys.path.insert(0, {TORCH_EXT!r}); import maxsim; "
         "print('torch._dynamo' in sys.modules)"],
        capture_output=True, text=True, timeout=300,
    )
    assert loaded.returncode == 0, loaded.stderr
    assert loaded.stdout.strip() == "False"


def fake_compiler(folder: Path, name: str) -> Path:
    """A C++ compiler that tells its version, logs the arguments of every other call (one line a
    call) and fails it."""
    script = folder / name
    script.write_text(
        f'#!/bin/sh\ncase "$1" in -v|--version|-dump*) echo "{name} 1.0"; exit 0;; esac\n'
        f'echo "$@" >> {folder / "calls.log"}\nexit 1\n'
    )
    script.chmod(0o755)
    return script


def load_cpu_with(compiler: Path, cache: Path) -> str:
    """Stderr of a fresh process that looks up the CPU kernels with ``compiler`` as CXX."""
    env = {k: v for k, v in os.environ.items() if k != "MAXSIM_NO_JIT"}
    env.update(CXX=str(compiler), TORCH_EXTENSIONS_DIR=str(cache))
    done = subprocess.run(
        [sys.executable, "-W", "always", "-c", f"import sys; sys.path.insert(0, {TORCH_EXT!r}); "
         "import maxsim; ops, why = maxsim.cpu_ops(); assert ops is None, why; print(why)"],
        capture_output=True, text=True, timeout=300, env=env,
    )
    assert done.returncode == 0, done.stderr
    return done.stderr


def compile_calls(folder: Path) -> int:
    log = folder / "calls.log"
    return sum(".cpp" in line for line in log.read_text().splitlines()) if log.exists() else 0


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA build serves CPU tensors there")
def test_failed_cpu_build_warns_once_and_is_not_retried_until_the_compiler_changes(tmp_path):
    warning = "CPU tensors will take the PyTorch fallback"
    failing = fake_compiler(tmp_path, "failing-c++")
    first = load_cpu_with(failing, tmp_path / "cache")
    assert first.count(warning) == 1, first
    calls = compile_calls(tmp_path)
    assert calls > 0, "the first process did not try to build"

    second = load_cpu_with(failing, tmp_path / "cache")
    assert warning not in second, second
    assert compile_calls(tmp_path) == calls, "the second process tried the build again"

    other = fake_compiler(tmp_path, "other-c++")
    third = load_cpu_with(other, tmp_path / "cache")
    assert third.count(warning) == 1, third
    assert compile_calls(tmp_path) > calls, "a new compiler did not get its own try"


def test_tf32_switch_is_marked_constant_as_torch_compile_expects():
    """settings marks it without importing torch._dynamo: the mark must be the one torch sets."""
    from maxsim import settings

    def probe():
        return True

    marked = torch.compiler.assume_constant_result(probe)
    attributes = {k for k in vars(marked) if k.startswith("_dynamo")}
    assert attributes == {"_dynamo_marked_constant"}
    assert settings.fp32_on_tf32._dynamo_marked_constant is True
