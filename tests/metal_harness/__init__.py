"""Runs metal/*.metal on the CPU: the shader source compiled as C++ with msl_shim.h under
AddressSanitizer, launched through an object with ``torch.mps.compile_shader``'s call convention.

``lib = HarnessLibrary(runner, lane_layout=1, schedule=2)``; ``lib.maxsim_fwd_float(*args,
threads=..., group_size=...)`` binds argument i to ``[[buffer(i)]]`` (a tensor: its bytes; a Python
int: 8 bytes; a float: 4 bytes), runs every threadgroup, and copies every tensor back.
"""

import hashlib
import os
import shutil
import struct
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
SHADERS = sorted((REPO / "metal").glob("*.metal"))
CXX = os.environ.get("CXX", "g++")
# -ffp-contract=off: a*b+c rounds twice, as written; -O1 keeps the fibers' build fast.
FLAGS = ["-std=c++20", "-O1", "-g", "-fno-omit-frame-pointer", "-ffp-contract=off",
         "-Wall", "-Wno-attributes", "-Wno-unused-variable", "-Wno-unused-function"]
SANITIZE = ["-fsanitize=address"]
CACHE = REPO / "build" / "metal_harness"


class HarnessError(RuntimeError):
    """The runner stopped: AddressSanitizer or the shim found a fault (its message inside)."""


def compiler_available() -> bool:
    return shutil.which(CXX) is not None


def _compile(source: Path, text: str, sanitize: bool) -> Path:
    """One translation unit to an object file, cached by the hash of everything it reads."""
    flags = FLAGS + (SANITIZE if sanitize else [])
    digest = hashlib.sha256(" ".join(flags).encode() + text.encode())
    for header in (HERE / "msl_shim.h", REPO / "metal" / "maxsim_common.h"):
        digest.update(header.read_bytes())
    obj = CACHE / f"{source.stem}-{digest.hexdigest()[:16]}.o"
    if obj.exists():
        return obj
    CACHE.mkdir(parents=True, exist_ok=True)
    tmp = obj.with_suffix(f".{os.getpid()}.tmp")
    # The text goes through stdin so that a test can compile an edited copy of a shader.
    cmd = [CXX, *flags, f"-I{HERE}", f"-I{REPO / 'metal'}", "-x", "c++", "-c", "-", "-o", str(tmp)]
    done = subprocess.run(cmd, input=text, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"harness: compiling {source} failed:\n{done.stderr[-4000:]}")
    os.replace(tmp, obj)
    return obj


def build_runner(shaders=SHADERS, *, edits=None, sanitize=True) -> Path:
    """Compile ``shaders`` (with ``edits``: {path: text} replacing a file's text) with the shim
    and the runner, one object per file, compiled in parallel and cached; returns the runner."""
    sources = [HERE / "runner.cpp", *shaders]
    texts = [(edits or {}).get(s, None) or Path(s).read_text() for s in sources]
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        objects = list(pool.map(lambda st: _compile(Path(st[0]), st[1], sanitize),
                                zip(sources, texts)))
    digest = hashlib.sha256("".join(str(o) for o in objects).encode()).hexdigest()[:16]
    out = CACHE / f"runner-{digest}"
    if not out.exists():
        tmp = out.with_suffix(f".{os.getpid()}.tmp")
        link = [CXX, *(SANITIZE if sanitize else []), *map(str, objects), "-o", str(tmp)]
        subprocess.run(link, check=True, capture_output=True, text=True)
        os.replace(tmp, out)
    return out


def _dims(value):
    dims = [value] if isinstance(value, int) else list(value)
    return dims + [1] * (3 - len(dims))


def _encode(arg) -> bytes:
    if isinstance(arg, torch.Tensor):
        if not arg.is_contiguous():
            raise ValueError("harness: tensors must be contiguous (Metal binds raw storage)")
        return arg.detach().cpu().reshape(-1).view(torch.uint8).numpy().tobytes()
    if isinstance(arg, bool):
        raise TypeError("harness: pass bools as ints")
    if isinstance(arg, int):
        return struct.pack("<q", arg)
    if isinstance(arg, float):
        return struct.pack("<f", arg)
    raise TypeError(f"harness: cannot bind {type(arg).__name__}")


class HarnessLibrary:
    """``torch.mps.compile_shader``'s result, on the CPU: kernels are attributes."""

    def __init__(self, runner: Path, *, lane_layout: int = 0, schedule: int = 1):
        self.runner, self.lane_layout, self.schedule = Path(runner), lane_layout, schedule
        self.launches = []  # (kernel, threads, group_size) of every call, for the tests

    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)

        def launch(*args, threads, group_size):
            self.launches.append((name, _dims(threads), _dims(group_size)))
            self._run(name, args, _dims(threads), _dims(group_size))

        return launch

    def _run(self, name, args, threads, group):
        blobs = [_encode(a) for a in args]
        header = struct.pack("<I", len(name)) + name.encode()
        header += struct.pack("<7I", *threads, *group, self.lane_layout)
        header += struct.pack("<2I", self.schedule, len(args))
        payload = header + b"".join(struct.pack("<Q", len(b)) + b for b in blobs)
        env = dict(os.environ, ASAN_OPTIONS="detect_leaks=0:abort_on_error=0:exitcode=86")
        done = subprocess.run([str(self.runner)], input=payload, capture_output=True, env=env)
        if done.returncode != 0:
            raise HarnessError(f"{name}: runner exited {done.returncode}\n"
                               f"{done.stderr.decode(errors='replace')[-4000:]}")
        out, pos = done.stdout, 0
        for arg, blob in zip(args, blobs):
            if isinstance(arg, torch.Tensor) and blob:
                chunk = torch.frombuffer(bytearray(out[pos:pos + len(blob)]), dtype=torch.uint8)
                arg.view(-1).view(torch.uint8).copy_(chunk)
            pos += len(blob)
