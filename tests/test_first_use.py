"""What a new user sees first: ``import maxsim`` adds no warning of its own, and a GPU machine
where the CUDA kernels cannot load says so once, loudly, instead of falling back in silence."""

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
