"""Locates the compiled CUDA ops, and holds the one build recipe that every build path shares.

`load_cuda_ops()` tries, in order:

1. a module built ahead of time into this package (`pip install --no-build-isolation .` writes it
   and `_build_info.py`, which names it);
2. a just-in-time build of the CUDA sources with ninja, cached on disk (first use on a GPU machine);
3. nothing, with a sentence saying why.

The recipe (sources, hash, flags, architectures) lives here rather than in setup.py so that the
JIT build, `pip install` and `scripts/build_variant.py` compile exactly the same thing. This file
imports nothing from the package, so the build scripts can load it by path before the package is
installed.
"""

import contextlib
import functools
import hashlib
import importlib
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import threading
import warnings
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
EXTENSION_PREFIX = "_maxsim_cuda_"

# Architectures of an ahead-of-time build. "X.Ya" is arch-specific (Hopper wgmma); "+PTX" adds
# portable PTX so that newer GPUs can run the build too (compute_90: it runs on every GPU from
# Hopper on). Blackwell (10.0, 12.0) takes the tiles of every GPU but Hopper, as machine code.
DEFAULT_ARCHS = "7.5 8.0 8.6 8.9 9.0a+PTX 10.0 12.0"
# What a GPU newer than the toolkit gets: compute_90 PTX, JIT-compiled by the driver at first use.
NEWER_GPU_FALLBACK = "9.0+PTX-only"

# Exact arithmetic: no --use_fast_math (it flushes denormals and approximates division). The C++
# standard is left to torch.utils.cpp_extension: torch's own headers need C++20 from torch 2.10 on.
# Py_LIMITED_API keeps the module importable from any CPython 3.10+ (an abi3 build).
# -fopenmp: the CPU kernels run on torch's intra-op pool (at::parallel_for), which is OpenMP in
# torch's Linux builds; the compiled code calls torch's own libgomp, already loaded by then.
CPU_OPENMP_FLAGS = ["-fopenmp"] if sys.platform.startswith("linux") else []
CXX_FLAGS = ["-O3", "-DPy_LIMITED_API=0x030A0000"] + CPU_OPENMP_FLAGS
# --threads=0: the arch targets of one source compile in parallel.
NVCC_BASE_FLAGS = ["-O3", "-lineinfo", "--threads=0"]

# What the CPU kernels and the binding compile from (both builds), then each build's own.
_SHARED_GLOBS = (
    "csrc/cpu/*.cpp",
    "csrc/cpu/*.h",
    "torch-ext/torch_binding.cpp",
    "torch-ext/torch_binding_cpu.cpp",
    "torch-ext/*.h",
    "torch-ext/maxsim/schemas.h",
)
_SOURCE_GLOBS = ("csrc/*.cu", "csrc/*.cuh", "csrc/*.h") + _SHARED_GLOBS

# The CPU-only extension: the CPU kernels, the op schemas and autograd (torch_binding.cpp without
# its CUDA part: CPU_KERNEL, as kernel-builder's cpu backend defines it) and the CPU registrations.
# The AVX2, AVX-512 and AVX512-BF16 inner loops are compiled in target regions and picked at run
# time (csrc/cpu/isa.h), so the build itself needs no -march flag and runs on any x86-64.
EXTENSION_PREFIX_CPU = "_maxsim_cpu_"
CPU_CXX_FLAGS = ["-O3", "-DCPU_KERNEL", "-DPy_LIMITED_API=0x030A0000"] + CPU_OPENMP_FLAGS
_CPU_SOURCE_GLOBS = ("csrc/params.h",) + _SHARED_GLOBS


# ---------------------------------------------------------------------------------------------
# What to compile
# ---------------------------------------------------------------------------------------------


def source_root():
    """The folder holding `csrc/` and `torch-ext/`: `_src` inside an installed package (wheels and
    sdists ship the sources there), else the repository around an editable install; None if
    neither exists."""
    for root in (PACKAGE_DIR / "_src", PACKAGE_DIR.parent.parent):
        if (root / "torch-ext" / "torch_binding.cpp").is_file() and any(root.glob("csrc/*.cu")):
            return root
    return None


def source_files(root, globs=_SOURCE_GLOBS):
    """Every file whose content goes into the build, sorted: kernels, headers and the binding."""
    root = Path(root)
    return sorted({p for pattern in globs for p in root.glob(pattern) if p.is_file()})


def cpu_compiled_sources(root):
    """The translation units of the CPU kernels and their registrations."""
    root = Path(root)
    return sorted(root.glob("csrc/cpu/*.cpp")) + [root / "torch-ext" / "torch_binding_cpu.cpp"]


def compiled_sources(root):
    """The translation units: each `csrc/*.cu`, the torch binding, and the CPU kernels (a CUDA
    build serves CPU tensors too)."""
    root = Path(root)
    return (
        sorted(root.glob("csrc/*.cu"))
        + [root / "torch-ext" / "torch_binding.cpp"]
        + cpu_compiled_sources(root)
    )


def include_dirs(root):
    root = Path(root)
    return [str(root / "csrc"), str(root / "torch-ext")]


def source_hash(root, globs=_SOURCE_GLOBS):
    """Ten hex digits over the names and contents of the sources: a new version of the sources
    gets a new op namespace, so two versions never register the same one in a process."""
    digest = hashlib.sha256()
    for path in source_files(root, globs):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()[:10]


def extension_name(root, archs=None):
    """Module and op-namespace name of a build of these sources, e.g. `_maxsim_cuda_1a2b3c4d5e`;
    a PTX-only build (emulation) gets its own, e.g. `..._ptx80`, so it never takes another's."""
    ptx_only = archs and all(a.endswith("+PTX-only") for a in archs)
    suffix = "_ptx" + "_".join(a.split("+")[0].replace(".", "") for a in archs) if ptx_only else ""
    return EXTENSION_PREFIX + source_hash(root) + suffix


def cpu_extension_name(root):
    """Module and op-namespace name of a CPU-only build, e.g. `_maxsim_cpu_1a2b3c4d5e`."""
    return EXTENSION_PREFIX_CPU + source_hash(root, _CPU_SOURCE_GLOBS)


def parse_archs(spec):
    """Split an arch list on spaces, commas or semicolons: "8.0;9.0a+PTX" -> ["8.0", "9.0a+PTX"].
    "8.0+PTX-only" is compute_80 PTX without machine code (the emulation builds)."""
    archs = [a for a in re.split(r"[\s,;]+", spec.strip()) if a]
    for arch in archs:
        if not re.fullmatch(r"\d+\.\d+[af]?(\+PTX(-only)?)?", arch):
            raise ValueError(
                f"CUDA arch {arch!r}: expected e.g. 8.0, 9.0a, 9.0a+PTX or 8.0+PTX-only"
            )
    return archs


def gencode_flags(archs):
    """nvcc -gencode flags: machine code per arch, plus PTX for "+PTX" entries. The PTX is for the
    plain compute capability ("9.0a+PTX" -> compute_90), since arch-specific PTX runs only on its
    own GPU; kernels must therefore guard arch-specific code (`__CUDA_ARCH_FEAT_SM90_ALL`)."""
    flags = []
    for arch in archs:
        cc, _, ptx = arch.partition("+")
        num = cc.replace(".", "")
        if ptx != "PTX-only":
            flags.append(f"-gencode=arch=compute_{num},code=sm_{num}")
        if ptx:
            plain = num.rstrip("af")
            flags.append(f"-gencode=arch=compute_{plain},code=compute_{plain}")
    return flags


def kernels_archs(archs):
    """The `backend.archs` of a kernels-hub metadata.json, in the `kernels` matching rules:
    "9.0a" runs on 9.0 only; "9.0+PTX" on 9.0 and newer."""
    out = []
    for arch in archs:
        cc, _, ptx = arch.partition("+")
        if ptx != "PTX-only":
            out.append(cc)
        if ptx:
            out.append(cc.rstrip("af") + "+PTX")
    return out


def runs_on(archs, capability):
    """Whether a build for `archs` has code for a GPU of `capability` (major, minor): machine code
    runs on its own major version at the same or a higher minor, "a" code only on its exact GPU,
    PTX on its capability and anything newer."""
    for arch in archs:
        cc, _, ptx = arch.partition("+")
        major, minor = (int(x) for x in cc.rstrip("af").split("."))
        machine_code = ptx != "PTX-only"
        if machine_code and cc.endswith("a") and capability == (major, minor):
            return True
        if machine_code and not cc.endswith("a") and capability[0] == major and \
                capability[1] >= minor:
            return True
        if ptx and capability >= (major, minor):
            return True
    return False


def device_arch(major, minor):
    """The arch a JIT build targets for a GPU: Hopper gets its arch-specific variant (wgmma)."""
    return f"{major}.{minor}a" if (major, minor) == (9, 0) else f"{major}.{minor}"


def toolkit_archs(home):
    """The compute capabilities that nvcc at `home` compiles, e.g. {"7.5", ..., "12.0"}, or None
    where it does not say."""
    out = _nvcc_says(home, "--list-gpu-arch") or ""
    found = {f"{num[:-1]}.{num[-1]}" for num in re.findall(r"compute_(\d+)", out)}
    return found or None


def buildable(archs, known):
    """(the archs of `archs` that a toolkit compiling `known` capabilities can build, the rest);
    `known` None keeps them all. A toolkit before CUDA 12.8 has no sm_100 / sm_120."""
    if known is None:
        return list(archs), []
    keep = [a for a in archs if a.split("+")[0].rstrip("af") in known]
    return keep, [a for a in archs if a not in keep]


def nvcc_flags(archs):
    return NVCC_BASE_FLAGS + gencode_flags(archs) + cuda_wheel_include_flags()


def cxx_flags():
    return CXX_FLAGS + cuda_wheel_include_flags()


def cuda_wheel_include_flags():
    """`-isystem` for the headers of the NVIDIA pip wheels (cuBLAS, cuSPARSE, ... that torch's
    headers include), searched after the toolkit's own: a toolkit installed from pip lacks them."""
    includes = {
        str(inc) for site in sys.path if site for inc in Path(site).glob("nvidia/*/include")
    }
    return [flag for inc in sorted(includes) for flag in ("-isystem", inc)]


def find_cuda_home():
    """The CUDA toolkit folder (with bin/nvcc and lib64/libcudart), or None. Honours CUDA_HOME and
    CUDA_PATH; otherwise asks nvcc where it lives, since `nvcc` on PATH may be a wrapper script."""
    for var in ("CUDA_HOME", "CUDA_PATH"):
        home = os.environ.get(var)
        if home and (Path(home) / "bin" / "nvcc").exists():
            return Path(home)
    nvcc = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
    if not Path(nvcc).exists():
        return None
    guess = Path(nvcc).resolve().parent.parent
    if (guess / "include" / "cuda_runtime.h").exists():
        return guess
    try:
        out = subprocess.run(
            [nvcc, "--dryrun", "-x", "cu", "-c", os.devnull, "-o", os.devnull],
            capture_output=True,
            text=True,
            timeout=60,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    match = re.search(r"^#\$ _HERE_=(.+)$", out.stdout + out.stderr, re.MULTILINE)
    return Path(match.group(1).strip()).parent if match else None


def use_cuda_home(home):
    """Point torch.utils.cpp_extension at `home` (it guesses once, at import, from PATH)."""
    os.environ["CUDA_HOME"] = str(home)
    if "torch.utils.cpp_extension" in sys.modules:
        sys.modules["torch.utils.cpp_extension"].CUDA_HOME = str(home)


def cuda_version_of(home):
    """The toolkit's version ("13.0") as its nvcc reports it, or None."""
    match = re.search(r"release (\d+\.\d+)", _nvcc_says(home, "--version") or "")
    return match.group(1) if match else None


def _nvcc_says(home, flag):
    """What nvcc at `home` prints for `flag`, or None where it cannot run."""
    try:
        return subprocess.run(
            [str(Path(home) / "bin" / "nvcc"), flag], capture_output=True, text=True, timeout=60
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None


# ---------------------------------------------------------------------------------------------
# How to load it
# ---------------------------------------------------------------------------------------------

_lock = threading.Lock()


def load_cuda_ops():
    """Return ``(ops, reason)``: the extension's ``torch.ops`` namespace (with ``fwd`` and ``bwd``)
    and a sentence saying where it came from, or ``None`` and a sentence saying why it is
    unavailable. Cached; never raises."""
    return _load_once(_load, "CUDA")


def _load_once(load, what):
    with _lock:
        return _load_cached(load, what)


@functools.cache
def _load_cached(load, what):
    try:
        return load()
    except _emulation().EmulationRefused:
        raise  # a test device that cannot run what it claims must fail the run, not fall back
    except Exception as exc:  # a broken build must degrade to the fallback, not break import
        return None, f"loading the {what} extension failed: {type(exc).__name__}: {exc}"


@functools.cache
def _emulation():
    """maxsim/emulation.py (MAXSIM_EMULATE_GPU): through the package, or by path where this file
    was itself loaded by path."""
    if __package__:
        return importlib.import_module(f"{__package__}.emulation")
    spec = importlib.util.spec_from_file_location("maxsim_emulation", PACKAGE_DIR / "emulation.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _load():
    import torch

    if torch.version.cuda is None:
        return None, f"torch {torch.__version__} has no CUDA"
    if not torch.cuda.is_available():
        return None, "no GPU is visible to torch"

    root = source_root()
    ops, shipped_reason = _load_shipped(torch, root)
    if ops is not None:
        return ops, shipped_reason

    if os.environ.get("MAXSIM_NO_JIT") == "1":
        return None, f"{shipped_reason}; JIT build disabled by MAXSIM_NO_JIT=1"
    if root is None:
        return None, f"{shipped_reason}; the CUDA sources are not part of this installation"
    ops, jit_reason = _load_jit(torch, root)
    return ops, jit_reason if ops is not None else f"{shipped_reason}; {jit_reason}"


def _registered(torch, name):
    """Whether some earlier load in this process registered the namespace already."""
    try:
        return getattr(torch.ops, name).fwd is not None
    except (AttributeError, RuntimeError):
        return False


def _load_shipped(torch, root):
    """The module a `pip install` compiled into the package, if it fits this torch and sources."""
    try:
        info = importlib.import_module(f"{__package__}._build_info") if __package__ else None
    except ImportError:
        info = None
    if info is None:
        return None, "no prebuilt extension in the package"
    name = info.EXTENSION_NAME
    archs = parse_archs(info.CUDA_ARCHS)
    _emulation().check_build(archs, f"the prebuilt {name}")
    if root is not None and extension_name(root, archs) != name:
        return None, f"the prebuilt {name} is older than the sources beside it"
    built, running = info.TORCH_VERSION.split("+")[0], torch.__version__.split("+")[0]
    if built.split(".")[:2] != running.split(".")[:2]:
        return None, f"the prebuilt {name} was built for torch {built}, this is torch {running}"
    for i in range(torch.cuda.device_count()):
        major, minor = torch.cuda.get_device_capability(i)
        if not runs_on(archs, (major, minor)):
            return (
                None,
                f"the prebuilt {name} ({info.CUDA_ARCHS}) has no code for sm_{major}{minor}",
            )
    if not _registered(torch, name):
        importlib.import_module(f"{__package__}.{name}")  # its static initialisers register the ops
    return getattr(torch.ops, name), f"prebuilt {name} ({info.CUDA_ARCHS})"


def _put_ninja_on_path():
    """A venv's python run without activating the venv still finds the venv's ninja."""
    bin_dir = str(Path(sys.executable).parent)
    if shutil.which("ninja") is None and shutil.which("ninja", path=bin_dir):
        os.environ["PATH"] = bin_dir + os.pathsep + os.environ.get("PATH", "")


def _load_jit(torch, root):
    """Compile the sources for this GPU with ninja once; later processes reuse the cached build."""
    home = find_cuda_home()
    if home is None:
        return None, "nvcc not found (put it on PATH or set CUDA_HOME)"
    use_cuda_home(home)
    from torch.utils import cpp_extension

    _put_ninja_on_path()
    try:
        cpp_extension.verify_ninja_availability()
    except RuntimeError:
        return None, "ninja not found (pip install ninja)"

    gpu = _emulation().emulated_gpu()
    if gpu is not None:  # the emulated GPU's PTX only, JIT-compiled by the driver for this card
        archs = _emulation().build_archs(gpu)
    else:
        archs = sorted(
            {
                device_arch(*torch.cuda.get_device_capability(i))
                for i in range(torch.cuda.device_count())
            }
        )
        # Only a GPU newer than Hopper can be unknown to a toolkit that builds these sources
        # (CUDA 12+): ask nvcc then, and only then (a subprocess at every first use otherwise).
        if any(int(a.split(".")[0]) >= 10 for a in archs):
            archs, newer = buildable(archs, toolkit_archs(home))
            if newer:  # GPUs this toolkit does not know: the driver JIT-compiles compute_90 PTX
                archs = sorted(set(archs) | {NEWER_GPU_FALLBACK})
    name = extension_name(root, archs)
    if _registered(torch, name):
        return getattr(torch.ops, name), f"JIT-built {name} (already loaded)"
    sm = "-".join(("compute" if "PTX" in a else "sm") + a.split("+")[0].replace(".", "")
                  for a in archs)

    build_dir = _build_dir(torch, name, sm)
    failed = _compile_once(
        name,
        build_dir,
        f"the CUDA extension for {sm}",
        sources=[str(s) for s in compiled_sources(root)],
        extra_cflags=cxx_flags(),
        extra_cuda_cflags=nvcc_flags(archs),
        extra_include_paths=include_dirs(root),
    )
    if failed:
        return None, failed
    return getattr(torch.ops, name), f"JIT-built {name} for {sm} in {build_dir}"


# ---------------------------------------------------------------------------------------------
# The CPU-only extension
# ---------------------------------------------------------------------------------------------


def load_cpu_ops():
    """Return ``(ops, reason)`` for the CPU-only extension: built once with the C++ compiler and
    ninja (cached on disk), or None and why not. Cached; never raises."""
    return _load_once(_load_cpu, "CPU")


def _load_cpu():
    import torch

    if os.environ.get("MAXSIM_NO_JIT") == "1":
        return None, "JIT build disabled by MAXSIM_NO_JIT=1"
    root = source_root()
    if root is None:
        return None, "the C++ sources are not part of this installation"
    name = cpu_extension_name(root)
    if _registered(torch, name):
        return getattr(torch.ops, name), f"JIT-built {name} (already loaded)"
    compiler = shutil.which(os.environ.get("CXX", "c++"))
    if compiler is None:
        return None, "no C++ compiler (c++ on PATH, or CXX)"
    from torch.utils import cpp_extension

    _put_ninja_on_path()
    try:
        cpp_extension.verify_ninja_availability()
    except RuntimeError:
        return None, "ninja not found (pip install ninja)"
    build_dir = _build_dir(torch, name, "cpu")
    # The folder is keyed on the sources and torch; the marker adds the toolchain. Checked only
    # while nothing is built, so a loaded build never runs the compiler.
    marker = build_dir / FAILED_BUILD_MARKER
    toolchain = None if (build_dir / f"{name}.so").exists() else cpu_toolchain(compiler)
    if toolchain is not None:
        earlier = earlier_failure(marker, toolchain)
        if earlier is not None:
            return None, earlier
    failed = _compile_once(
        name,
        build_dir,
        "the CPU extension",
        sources=[str(root / "torch-ext" / "torch_binding.cpp")]
        + [str(s) for s in cpu_compiled_sources(root)],
        extra_cflags=CPU_CXX_FLAGS,
        extra_include_paths=include_dirs(root),
        with_cuda=False,
    )
    if failed:
        if toolchain is not None:
            with contextlib.suppress(OSError):  # a read-only cache: warn, retry next process
                marker.write_text(toolchain + "\n" + failed)
        # Said once per toolchain: later processes find the marker and skip the build quietly.
        warnings.warn(
            f"maxsim: CPU tensors will take the PyTorch fallback, not the compiled CPU kernels "
            f"(not retried until the sources, torch or the compiler change; delete {marker} to "
            f"retry): {failed}",
            RuntimeWarning,
            stacklevel=2,
        )
        return None, failed
    marker.unlink(missing_ok=True)
    return getattr(torch.ops, name), f"JIT-built {name} in {build_dir}"


FAILED_BUILD_MARKER = "build-failed.txt"


def cpu_toolchain(compiler):
    """One line naming what compiles the CPU extension: the compiler's path, its version line
    and the flags. A failed build is retried only once this line changes."""
    try:
        done = subprocess.run(
            [compiler, "--version"], capture_output=True, text=True, errors="replace", timeout=60
        )
        version = (done.stdout.strip().splitlines() or [f"exit {done.returncode}"])[0]
    except (OSError, subprocess.SubprocessError) as exc:
        version = type(exc).__name__
    return f"{os.path.realpath(compiler)} | {version} | {' '.join(CPU_CXX_FLAGS)}"


def earlier_failure(marker, toolchain):
    """Why the build failed before with this toolchain (the reason kept in `marker`), or None."""
    try:
        kept_toolchain, _, reason = marker.read_text().partition("\n")
    except OSError:
        return None
    if kept_toolchain != toolchain:
        return None
    return f"the build failed before with this compiler (delete {marker} to retry): {reason}"


def _build_dir(torch, name, tag):
    """The cache folder of one build (TORCH_EXTENSIONS_DIR, else ~/.cache/torch_extensions)."""
    cache = Path(
        os.environ.get("TORCH_EXTENSIONS_DIR") or Path.home() / ".cache" / "torch_extensions"
    )
    build_dir = cache / "maxsim" / f"{name}-torch{torch.__version__}-{tag}"
    build_dir.mkdir(parents=True, exist_ok=True)
    return build_dir


def _compile_once(name, build_dir, what, **load_args):
    """Builds (or reuses) and loads extension `name` in `build_dir`; None, or why it failed."""
    from torch.utils import cpp_extension

    if not (build_dir / f"{name}.so").exists():
        print(f"maxsim: compiling {what} once (cached in {build_dir})", file=sys.stderr)
    try:
        cpp_extension.load(
            name=name,
            build_directory=str(build_dir),
            is_python_module=False,
            verbose=os.environ.get("MAXSIM_JIT_VERBOSE") == "1",
            **load_args,
        )
    except Exception as exc:
        tail = "\n".join(str(exc).strip().splitlines()[-12:])
        return f"the JIT build of {name} failed:\n{tail}"
    return None


def __getattr__(name):
    """``ops``: erikkaum/maxsim's raw op table (its ``maxsim._ops.ops``), for code written
    against it (maxsim.compat_ops); imported on first use."""
    if name == "ops":
        from .compat_ops import RAW_OPS

        return RAW_OPS
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
