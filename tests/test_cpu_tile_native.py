"""The CPU tile on every ISA, without torch: tests/cpu_tile/tile_test.cpp built natively and, where
the AArch64 cross toolchain and qemu-user exist (Debian: g++-aarch64-linux-gnu, qemu-user), for
AArch64 and run under qemu (the NEON tile against the scalar one and float64); and the whole CPU
extension's sources compiled for AArch64 against torch's headers (syntax only)."""

import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TEST_SOURCE = ROOT / "tests" / "cpu_tile" / "tile_test.cpp"
CROSS_CXX = "aarch64-linux-gnu-g++"
QEMU = "qemu-aarch64"


def build_and_run(cxx, out, extra=(), runner=()):
    subprocess.run([cxx, "-std=c++17", "-O2", "-Wall", "-Werror", *extra, f"-I{ROOT / 'csrc'}",
                    str(TEST_SOURCE), "-o", str(out)], check=True, timeout=600)
    done = subprocess.run([*runner, str(out)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


@pytest.mark.parametrize("cxx", ["c++", "clang++"])  # GCC's and clang's target pragmas
def test_tile_on_this_cpus_isas(tmp_path, cxx):
    if shutil.which(cxx) is None:
        pytest.skip(f"no {cxx}")
    out = build_and_run(cxx, tmp_path / "tile_test")
    assert " 0 mismatches" in out and "cases compared" in out, out


@pytest.mark.skipif(
    shutil.which(CROSS_CXX) is None or shutil.which(QEMU) is None,
    reason=f"no {CROSS_CXX} or {QEMU} (apt-get install g++-aarch64-linux-gnu qemu-user)",
)
def test_neon_tile_under_qemu(tmp_path):
    out = build_and_run(CROSS_CXX, tmp_path / "tile_test_aarch64", extra=["-static"],
                        runner=[QEMU])
    assert out.startswith("best ISA neon:") and " 0 mismatches" in out, out


@pytest.mark.skipif(shutil.which(CROSS_CXX) is None, reason=f"no {CROSS_CXX}")
def test_cpu_extension_compiles_for_aarch64():
    from torch.utils import cpp_extension

    sys.path.insert(0, str(ROOT / "torch-ext"))
    from maxsim import _ops

    includes = [*cpp_extension.include_paths(), sysconfig.get_paths()["include"],
                *_ops.include_dirs(ROOT)]
    sources = [ROOT / "torch-ext" / "torch_binding.cpp", *_ops.cpu_compiled_sources(ROOT)]
    for source in sources:
        subprocess.run([CROSS_CXX, "-std=c++20", "-fsyntax-only", "-Werror=return-type",
                        *_ops.CPU_CXX_FLAGS, "-DTORCH_EXTENSION_NAME=maxsim_aarch64",
                        *(f"-I{p}" for p in includes), str(source)], check=True, timeout=600)
