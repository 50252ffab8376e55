"""Build steps that pyproject.toml cannot express.

The package itself is pure Python (torch-ext/maxsim). Two additions:

* The CUDA sources ship inside it (maxsim/_src), so an installed package can compile the
  extension on first use on a GPU; the sdist carries them too.
* Where this build environment has a CUDA build of torch and nvcc, the extension is compiled
  ahead of time into the package as maxsim/_maxsim_cuda_<hash>.abi3.so. pip's default isolated
  build has no torch, so this needs `pip install --no-build-isolation .`.

Environment: MAXSIM_CUDA_ARCHS (default "7.5 8.0 8.6 8.9 9.0a+PTX 10.0 12.0", less what the
toolkit cannot compile: sm_100 / sm_120 need CUDA 12.8), MAXSIM_BUILD_CUDA=0 to skip the compile,
MAX_JOBS for ninja's parallelism.
"""

import importlib.util
import os
import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.sdist import sdist

ROOT = Path(__file__).resolve().parent


def load_recipe():
    """torch-ext/maxsim/_ops.py, loaded by path: the package may not be importable yet."""
    spec = importlib.util.spec_from_file_location(
        "maxsim_build_recipe", ROOT / "torch-ext/maxsim/_ops.py"
    )
    recipe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(recipe)
    return recipe


recipe = load_recipe()


def shipped_sources():
    return [p.relative_to(ROOT) for p in recipe.source_files(ROOT)]


def metal_sources():
    return sorted(p.relative_to(ROOT) for p in (ROOT / "metal").glob("*") if p.is_file())


def copy_files(relative_paths, dest):
    for rel in relative_paths:
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / rel, dest / rel)


class BuildPyWithSources(build_py):
    """Copies the CUDA sources into the package, where the loader looks for them."""

    def run(self):
        super().run()
        if not self.editable_mode:  # an editable install finds them in the repository
            copy_files(shipped_sources(), Path(self.build_lib) / "maxsim" / "_src")
            # The Metal shaders' text, compiled on a Mac at first use (maxsim/metal.py).
            copy_files(metal_sources(), Path(self.build_lib) / "maxsim")


class SdistWithSources(sdist):
    """Adds the CUDA sources and the kernel-builder recipe to the source distribution."""

    def make_release_tree(self, base_dir, files):
        super().make_release_tree(base_dir, files)
        extra = [Path("build.toml"), Path("flake.nix"), *metal_sources()]
        copy_files(shipped_sources() + extra, Path(base_dir))


def cuda_build():
    """(ext_modules, cmdclass, what) for the ahead-of-time CUDA build; empty ones and the reason
    when this environment cannot compile it."""
    if os.environ.get("MAXSIM_BUILD_CUDA") == "0":
        return [], {}, "MAXSIM_BUILD_CUDA=0"
    if not any(ROOT.glob("csrc/*.cu")):
        return [], {}, "no CUDA sources"
    try:
        import torch
    except ImportError:
        return [], {}, "no torch in the build environment (use --no-build-isolation)"
    if torch.version.cuda is None:
        return [], {}, f"torch {torch.__version__} has no CUDA"
    home = recipe.find_cuda_home()
    if home is None:
        return [], {}, "nvcc not found"
    recipe.use_cuda_home(home)
    from torch.utils.cpp_extension import BuildExtension, CUDAExtension

    archs_spec = os.environ.get("MAXSIM_CUDA_ARCHS", recipe.DEFAULT_ARCHS)
    archs = recipe.parse_archs(archs_spec)
    if "MAXSIM_CUDA_ARCHS" not in os.environ:  # the default list: what this toolkit compiles
        archs, dropped = recipe.buildable(archs, recipe.toolkit_archs(home))
        if dropped:
            print(f"maxsim: nvcc {recipe.cuda_version_of(home)} lacks {' '.join(dropped)}: "
                  "left out")
    name = recipe.extension_name(ROOT, archs)
    extension = CUDAExtension(
        name=f"maxsim.{name}",
        sources=[str(p.relative_to(ROOT)) for p in recipe.compiled_sources(ROOT)],
        include_dirs=recipe.include_dirs(ROOT),
        extra_compile_args={"cxx": recipe.cxx_flags(), "nvcc": recipe.nvcc_flags(archs)},
        py_limited_api=True,
    )

    class BuildExtensionWithInfo(BuildExtension):
        """Also writes maxsim/_build_info.py, which tells the loader what was compiled."""

        def run(self):
            super().run()
            info = Path(self.get_ext_fullpath(extension.name)).parent / "_build_info.py"
            info.write_text(
                '"""Written by setup.py: the CUDA extension compiled into this package."""\n\n'
                f"EXTENSION_NAME = {name!r}\n"
                f"CUDA_ARCHS = {' '.join(archs)!r}\n"
                f"TORCH_VERSION = {torch.__version__!r}\n"
                f"CUDA_VERSION = {torch.version.cuda!r}\n"
            )

    return [extension], {"build_ext": BuildExtensionWithInfo}, f"{name} for {' '.join(archs)}"


ext_modules, build_cmdclass, what = cuda_build()
if ext_modules:
    print(f"maxsim: compiling the CUDA extension {what}")
else:
    print(f"maxsim: pure-Python install, the CUDA extension compiles on first use ({what})")

setup(
    ext_modules=ext_modules,
    cmdclass={"build_py": BuildPyWithSources, "sdist": SdistWithSources, **build_cmdclass},
)
