"""Builds the kernels-hub variant of maxsim for the running torch.

    python scripts/build_variant.py [--archs "7.5 8.0 8.6 8.9 9.0a+PTX"] [--out build]

writes build/torch<MAJ><MIN>-cxx11-cu<CUDA>-<cpu>-<os>/ (with a CPU-only torch: the CPU kernels
alone, build/torch<MAJ><MIN>-cxx11-cpu-<cpu>-<os>/), which `kernels.get_local_kernel(".")`
loads exactly as `get_kernel("<org>/maxsim")` would from the Hub:

    metadata.json                     name, id, version, license, python-depends, backend + archs
    __init__.py                       the package's __init__, first importing the bundled ops;
                                      it exposes `layers` (MaxSim, MaxSimPairwise), the Hub
                                      kernel layers sentence-transformers' KernelConfig loads
    _ops.py                           generated: ops = torch.ops.<ns>, add_op_namespace_prefix
    _maxsim_cuda_<hash>_hub.abi3.so   the extension; its TORCH_LIBRARY namespace is its name
    *.py                              the rest of the package (torch-ext/maxsim), copied
    maxsim/__init__.py                entry for loaders that import <variant>/<name>/__init__.py

The extension is compiled in a child process: loading a build registers its op namespace, and a
namespace can be registered only once per process. The `_hub` suffix keeps it apart from the
namespace a pip-installed maxsim registers, so both can be loaded in one process.

Not a stable-ABI build: the binding takes at::Tensor and uses ATen/c10 CUDA APIs (streams, device
guards, allocation) that the torch stable ABI does not cover, so each variant fits one torch
minor version (hence torch<MAJ><MIN> in the name rather than torch-stable-abi...).
"""

import argparse
import ast
import importlib.util
import json
import os
import platform
import shutil
import subprocess
import sys
from itertools import takewhile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "torch-ext" / "maxsim"


def load_recipe():
    """torch-ext/maxsim/_ops.py by path: the build recipe, without importing the package."""
    spec = importlib.util.spec_from_file_location("maxsim_build_recipe", PACKAGE / "_ops.py")
    recipe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(recipe)
    return recipe


recipe = load_recipe()


def variant_name(torch):
    """The `kernels` variant string for this torch: torch{M}{m}-{cxx11|cxx98}-cu{XY}-{cpu}-{os},
    or torch{M}{m}-{cxx11|cxx98}-cpu-{cpu}-{os} for a CPU-only torch."""
    major, minor = torch.__version__.split("+")[0].split(".")[:2]
    abi = "cxx11" if torch.compiled_with_cxx11_abi() else "cxx98"
    cuda_version = torch.version.cuda
    cuda = "cpu" if cuda_version is None else "cu" + "".join(cuda_version.split(".")[:2])
    return f"torch{major}{minor}-{abi}-{cuda}-{platform.machine()}-{platform.system().lower()}"


def hub_extension_name(root, cpu=False, archs=None):
    """A PTX-only arch list (an emulation build, "8.0+PTX-only") gets a name of its own."""
    return (recipe.cpu_extension_name(root) if cpu else recipe.extension_name(root, archs)) + "_hub"


def build_config():
    import tomllib  # Python 3.11+

    with open(ROOT / "build.toml", "rb") as f:
        return tomllib.load(f)


def metadata(name, archs):
    general = build_config()["general"]
    return {
        "name": general["name"],
        "id": name,
        "version": general["version"],
        "license": general["license"],
        "python-depends": [],
        "backend": {"type": "cpu"} if archs is None
        else {"type": "cuda", "archs": recipe.kernels_archs(archs)},
    }


def ops_module(name, cpu=False, archs=()):
    if cpu:
        cuda_body = 'return None, "a CPU-only kernels-hub build"'
    else:
        # MAXSIM_EMULATE_GPU refuses a build without exactly that GPU's PTX (maxsim/emulation.py)
        cuda_body = (f'check_build({list(archs)!r}, "the bundled {name}")\n    '
                     f'if not torch.cuda.is_available():\n        return None, "no GPU is visible '
                     f'to torch"\n    return ops, "bundled {name} (kernels-hub build)"')
    return f'''"""The extension bundled with this kernels-hub build (from build_variant.py)."""

import torch

from . import {name}  # noqa: F401  (importing it registers the ops)
from .emulation import check_build  # noqa: F401

ops = torch.ops.{name}


def add_op_namespace_prefix(op_name: str) -> str:
    return f"{name}::{{op_name}}"


def load_cuda_ops():
    """The package loader's contract: (ops, where they came from) or (None, why not)."""
    {cuda_body}


def load_cpu_ops():
    """The same for the CPU kernels, which every build carries."""
    return ops, "bundled {name} (kernels-hub build)"
'''


COMPAT_INIT = '''"""Entry for loaders that import <variant>/maxsim/__init__.py: loads the variant's
root package under a name unique to its folder (so relative imports resolve) and re-exports it."""

import hashlib
import importlib.util
import sys
from pathlib import Path

_root = Path(__file__).resolve().parent.parent
_name = "_maxsim_variant_" + hashlib.sha256(str(_root).encode()).hexdigest()[:12]
if _name not in sys.modules:
    _spec = importlib.util.spec_from_file_location(
        _name, _root / "__init__.py", submodule_search_locations=[str(_root)]
    )
    sys.modules[_name] = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(sys.modules[_name])
_skip = {"__name__", "__file__", "__path__", "__spec__", "__loader__", "__package__", "__cached__",
         "__builtins__"}
globals().update({k: v for k, v in vars(sys.modules[_name]).items() if k not in _skip})
'''


OPS_IMPORT = "from ._ops import ops  # noqa: F401  (the bundled extension's op namespace)\n"


def init_with_ops_import(source):
    """The package's __init__.py with OPS_IMPORT after its docstring and __future__ imports, as
    kernels-hub packages start."""
    tree = ast.parse(source)
    after_doc = tree.body[1:] if ast.get_docstring(tree) is not None else tree.body
    futures = takewhile(
        lambda n: isinstance(n, ast.ImportFrom) and n.module == "__future__", after_doc
    )
    header = tree.body[: len(tree.body) - len(after_doc) + len(list(futures))]
    lines = source.splitlines(keepends=True)
    split = header[-1].end_lineno if header else 0
    head, rest = "".join(lines[:split]), "".join(lines[split:])
    return (
        head + ("\n" if head else "") + OPS_IMPORT + ("" if rest.startswith("\n") else "\n") + rest
    )


def compile_in_child(name, archs, build_dir):
    """Runs `--compile` below in a fresh interpreter (archs None: the CPU-only build); returns
    the built .so."""
    cmd = [sys.executable, __file__, "--compile", name, "--build-dir", str(build_dir)]
    cmd += ["--archs", " ".join(archs)] if archs else ["--cpu"]
    subprocess.run(cmd, check=True)
    return build_dir / f"{name}.so"


def compile_cpu_here(name, build_dir):
    """The CPU-only extension, as the package's JIT build compiles it."""
    import torch
    from torch.utils import cpp_extension

    build_dir.mkdir(parents=True, exist_ok=True)
    cpp_extension.load(
        name=name,
        sources=[str(ROOT / "torch-ext" / "torch_binding.cpp")]
        + [str(s) for s in recipe.cpu_compiled_sources(ROOT)],
        extra_cflags=recipe.CPU_CXX_FLAGS,
        extra_include_paths=recipe.include_dirs(ROOT),
        build_directory=str(build_dir),
        is_python_module=False,
        with_cuda=False,
        verbose=True,
    )
    for op in ("fwd", "bwd"):
        getattr(getattr(torch.ops, name), op)


def compile_here(name, archs, build_dir):
    """Compiles and loads the extension (in the child), then checks that both ops registered."""
    home = recipe.find_cuda_home()
    if home is None:
        sys.exit("nvcc not found: put it on PATH or set CUDA_HOME")
    recipe.use_cuda_home(home)
    print(f"CUDA toolkit {recipe.cuda_version_of(home)} at {home}", flush=True)
    import torch
    from torch.utils import cpp_extension

    build_dir.mkdir(parents=True, exist_ok=True)
    cpp_extension.load(
        name=name,
        sources=[str(s) for s in recipe.compiled_sources(ROOT)],
        extra_cflags=recipe.cxx_flags(),
        extra_cuda_cflags=recipe.nvcc_flags(archs),
        extra_include_paths=recipe.include_dirs(ROOT),
        build_directory=str(build_dir),
        is_python_module=False,
        verbose=True,
    )
    namespace = getattr(torch.ops, name)
    for op in ("fwd", "bwd"):
        getattr(namespace, op)  # raises AttributeError if the binding did not register it


def lay_out(variant_dir, name, archs, so_path):
    if variant_dir.exists():
        shutil.rmtree(variant_dir)
    for src in sorted(PACKAGE.rglob("*")):
        rel = src.relative_to(PACKAGE)
        # schemas.h: the op schemas, which maxsim/schemas.py reads at import
        if "__pycache__" in rel.parts or src.suffix not in (".py", ".pyi", ".h"):
            continue
        if rel.as_posix() in ("_ops.py", "_build_info.py"):
            continue
        (variant_dir / rel).parent.mkdir(parents=True, exist_ok=True)
        text = src.read_text()
        (variant_dir / rel).write_text(
            init_with_ops_import(text) if rel.as_posix() == "__init__.py" else text
        )
    (variant_dir / "_ops.py").write_text(ops_module(name, cpu=archs is None, archs=archs or ()))
    shutil.copy2(so_path, variant_dir / f"{name}.abi3.so")
    (variant_dir / "metadata.json").write_text(json.dumps(metadata(name, archs), indent=2) + "\n")
    (variant_dir / "maxsim").mkdir(exist_ok=True)
    (variant_dir / "maxsim" / "__init__.py").write_text(COMPAT_INIT)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--archs",
        default=os.environ.get("MAXSIM_CUDA_ARCHS", recipe.DEFAULT_ARCHS),
        help="CUDA archs, e.g. '8.0 9.0a+PTX', or '8.0+PTX-only' (emulation: docs/ARCHITECTURE.md) "
        "(default: %(default)s)",
    )
    parser.add_argument(
        "--out", type=Path, default=ROOT / "build", help="folder holding the variant"
    )
    parser.add_argument("--compile", metavar="NAME", help=argparse.SUPPRESS)
    parser.add_argument("--build-dir", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--cpu", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    archs = recipe.parse_archs(args.archs)

    if args.compile:
        if args.cpu:
            compile_cpu_here(args.compile, args.build_dir)
        else:
            compile_here(args.compile, archs, args.build_dir)
        return

    import torch

    if recipe.source_root() != ROOT:
        sys.exit(f"no sources under {ROOT} (csrc/*.cu, torch-ext/torch_binding.cpp)")
    cpu = torch.version.cuda is None  # a CPU-only torch builds the CPU variant
    archs = None if cpu else archs
    name = hub_extension_name(ROOT, cpu=cpu, archs=archs)
    variant = variant_name(torch)
    so_path = compile_in_child(name, archs, args.out / ".objects" / name)
    lay_out(args.out / variant, name, archs, so_path)
    print(f"built {args.out / variant} ({name}, {'CPU' if cpu else 'archs ' + ' '.join(archs)})")


if __name__ == "__main__":
    main()
