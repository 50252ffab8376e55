"""The build and distribution plumbing, on the CPU: variant naming, the hub layout and its
metadata, the build recipe, the loader's answer without a GPU, and ``python -m maxsim.info``."""

import importlib.util
import json
import os
import platform
import re
import subprocess
import sys
import tomllib
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from conftest import import_or_skip
from maxsim import _ops

ROOT = Path(__file__).resolve().parents[1]


def load_script(name):
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


build_variant = load_script("build_variant")
BUILD_TOML = tomllib.loads((ROOT / "build.toml").read_text())


def torch_like(cuda="13.0"):
    """The running torch's version and C++ ABI, with a CUDA version (a CPU build has none)."""
    return SimpleNamespace(
        __version__=torch.__version__,
        version=SimpleNamespace(cuda=cuda),
        compiled_with_cxx11_abi=torch.compiled_with_cxx11_abi,
    )


def test_variant_name_follows_the_kernels_rules():
    # torch{major}{minor}-{cxx11|cxx98}-cu{major}{minor}-{cpu}-{os}, as `kernels` parses it
    major, minor = torch.__version__.split("+")[0].split(".")[:2]
    abi = "cxx11" if torch.compiled_with_cxx11_abi() else "cxx98"
    expected = f"torch{major}{minor}-{abi}-cu130-{platform.machine()}-{platform.system().lower()}"
    assert build_variant.variant_name(torch_like("13.0")) == expected
    assert build_variant.variant_name(torch_like("12.8")).split("-")[2] == "cu128"
    assert re.fullmatch(r"torch\d\d+-cxx(11|98)-cu\d\d+-[a-z0-9_]+-[a-z]+", expected)


@pytest.mark.kernels_hub
def test_variant_name_parses_with_kernels():
    variants = import_or_skip("kernels._internals.variants")  # kernels 0.19's parser
    variant = variants.parse_variant(build_variant.variant_name(torch_like("13.0")))
    running = torch.__version__.split("+")[0].split(".")[:2]
    assert str(variant.framework.version) == ".".join(running)
    assert variant.framework.cxx11_abi == torch.compiled_with_cxx11_abi()
    assert str(variant.backend.version) == "13.0"
    cpu = variants.parse_variant(build_variant.variant_name(torch_like(None)))
    assert type(cpu.backend).__name__ == "CPU"


def test_metadata_has_the_fields_kernels_requires():
    meta = build_variant.metadata(
        "_maxsim_cuda_0123456789_hub", _ops.parse_archs(_ops.DEFAULT_ARCHS)
    )
    assert meta["name"] == BUILD_TOML["general"]["name"] == "maxsim"
    assert meta["id"] == "_maxsim_cuda_0123456789_hub"
    assert isinstance(meta["version"], int)
    assert meta["license"] == "Apache-2.0"
    assert meta["python-depends"] == []
    assert meta["backend"] == {
        "type": "cuda",
        "archs": ["7.5", "8.0", "8.6", "8.9", "9.0a", "9.0+PTX", "10.0", "12.0"],
    }


@pytest.mark.kernels_hub
def test_layout_of_a_variant(tmp_path):
    fake_so = tmp_path / "fake.so"
    fake_so.write_bytes(b"")
    name = "_maxsim_cuda_0123456789_hub"
    variant = tmp_path / "torch00-cxx11-cu130-x86_64-linux"
    build_variant.lay_out(variant, name, ["8.0", "9.0a+PTX"], fake_so)

    assert (variant / f"{name}.abi3.so").is_file()
    assert (variant / "maxsim" / "__init__.py").is_file()
    assert (variant / "schemas.h").is_file()  # read by schemas.py at import
    assert (variant / "layers.py").is_file()  # the Hub kernel layers, imported by __init__.py
    assert not (variant / "_build_info.py").exists()
    init = (variant / "__init__.py").read_text()
    original = (ROOT / "torch-ext" / "maxsim" / "__init__.py").read_text()
    assert "from ._ops import ops" in init and "from . import layers" in init
    assert [
        line for line in init.splitlines() if line.strip() and "from ._ops import ops" not in line
    ] == [line for line in original.splitlines() if line.strip()]
    ops_py = (variant / "_ops.py").read_text()
    assert f"from . import {name}" in ops_py and f"ops = torch.ops.{name}" in ops_py
    assert "def add_op_namespace_prefix" in ops_py and "def load_cuda_ops" in ops_py
    meta = json.loads((variant / "metadata.json").read_text())
    assert meta["backend"]["archs"] == ["8.0", "9.0a", "9.0+PTX"]
    kernels = import_or_skip("kernels")
    assert kernels.Metadata.read_from_file(variant / "metadata.json").id == name


def test_ops_import_goes_after_docstring_and_future_imports():
    source = '"""Doc."""\n\nfrom __future__ import annotations\n\nimport torch\n'
    out = build_variant.init_with_ops_import(source)
    assert (
        out.index("from __future__")
        < out.index("from ._ops import ops")
        < out.index("import torch")
    )
    compile(out, "__init__.py", "exec")
    assert build_variant.init_with_ops_import("x = 1\n").startswith("from ._ops import ops")


def test_build_toml_matches_the_sources_and_archs():
    kernel = BUILD_TOML["kernel"]["maxsim"]
    sources = sorted(
        p.relative_to(ROOT).as_posix()
        for pattern in ("*.cu", "*.cuh", "*.h", "cpu/*.cpp", "cpu/*.h")
        for p in (ROOT / "csrc").glob(pattern)
    )
    assert sorted(kernel["src"]) == sources, "list every csrc/*.cu, *.cuh, *.h in build.toml"
    cpu_sources = sorted(
        p.relative_to(ROOT).as_posix()
        for p in list((ROOT / "csrc/cpu").glob("*")) + [ROOT / "csrc/params.h"]
    )
    assert BUILD_TOML["kernel"]["maxsim_cpu"]["backend"] == "cpu"
    assert sorted(BUILD_TOML["kernel"]["maxsim_cpu"]["src"]) == cpu_sources
    binding = sorted(
        ["torch-ext/torch_binding.cpp", "torch-ext/torch_binding_cpu.cpp"]
        + [p.relative_to(ROOT).as_posix() for p in (ROOT / "torch-ext").glob("*.h")]
        + [p.relative_to(ROOT).as_posix() for p in (ROOT / "torch-ext/maxsim").glob("*.h")]
    )
    assert sorted(BUILD_TOML["torch"]["src"]) == binding
    assert kernel["cuda-capabilities"] == _ops.kernels_archs(_ops.parse_archs(_ops.DEFAULT_ARCHS))


def test_gencode_flags_and_archs():
    assert _ops.gencode_flags(["8.0", "9.0a+PTX"]) == [
        "-gencode=arch=compute_80,code=sm_80",
        "-gencode=arch=compute_90a,code=sm_90a",
        "-gencode=arch=compute_90,code=compute_90",  # portable PTX, not the arch-specific one
    ]
    assert _ops.parse_archs("7.5, 8.0;9.0a+PTX") == ["7.5", "8.0", "9.0a+PTX"]
    with pytest.raises(ValueError, match="sm_90"):
        _ops.parse_archs("sm_90")
    assert _ops.device_arch(9, 0) == "9.0a" and _ops.device_arch(8, 6) == "8.6"


def test_which_gpus_a_build_runs_on():
    archs = ["7.5", "8.0", "9.0a+PTX"]
    assert _ops.runs_on(archs, (8, 6))  # sm_80 code runs on later minors
    assert _ops.runs_on(archs, (9, 0))  # sm_90a
    assert _ops.runs_on(archs, (12, 0))  # compute_90 PTX
    assert not _ops.runs_on(archs, (7, 0))
    assert not _ops.runs_on(["8.0", "9.0a"], (10, 0))  # arch-specific code, no PTX
    assert not _ops.runs_on(["8.0"], (9, 0))
    assert "--use_fast_math" not in _ops.nvcc_flags(["8.0"])


def test_source_hash_names_the_sources(tmp_path):
    for rel, text in {
        "csrc/a.cu": "x",
        "csrc/a.cuh": "y",
        "torch-ext/torch_binding.cpp": "z",
    }.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    first = _ops.extension_name(tmp_path)
    assert re.fullmatch(r"_maxsim_cuda_[0-9a-f]{10}", first)
    assert _ops.extension_name(tmp_path) == first
    (tmp_path / "csrc/a.cuh").write_text("y2")  # a header change is a new build
    assert _ops.extension_name(tmp_path) != first


@pytest.mark.skipif(
    torch.cuda.is_available(), reason="checks the answer on a machine without a GPU"
)
def test_loader_says_why_without_a_gpu():
    ops, reason = _ops.load_cuda_ops()
    assert ops is None
    assert "CUDA" in reason or "GPU" in reason


def test_info_runs_as_a_module():
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(ROOT / "torch-ext"), env.get("PYTHONPATH")])
    )
    out = subprocess.run(
        [sys.executable, "-m", "maxsim.info"], env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr
    for key in ("maxsim", "torch", "device", "extension", "all-pairs", "retrieve"):
        assert key in out.stdout
