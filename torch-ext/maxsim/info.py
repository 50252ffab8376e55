"""What maxsim will run on this machine: versions, device, the CUDA extension, and the backend of
every layout and dtype, with the reason. ``python -m maxsim.info`` prints it; attach it to bug
reports."""

import os
import platform
import sys

import torch

from . import _ops
from .dispatch import cpu_ops, cuda_ops, metal_ops
from .emulation import device_capability, emulated_gpu

LAYOUTS = {
    "padded candidates": "maxsim(Q, D[Nq,K,Ld,H]), score_candidates_padded",
    "all-pairs": "maxsim(Q, D[Nd,Ld,H]), score_contrastive",
    "packed pairs": "maxsim_pairs, score_pairs_packed",
    "varlen": "maxsim_varlen",
    "retrieve": "retrieve",
}
DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _package_version():
    try:
        from importlib.metadata import version

        return version("maxsim")
    except Exception:  # running from a source tree or a kernels-hub folder
        return getattr(sys.modules.get(__package__), "__version__", "unknown")


def _nvcc():
    home = _ops.find_cuda_home()
    if home is None:
        return "not found"
    return f"{_ops.cuda_version_of(home) or '?'} ({home})"


def _cuda_kernel_path(dtype, capability, layout=None):
    """The kernel the extension picks (mirrors make_plan and launch_simt in csrc/fwd.cu)."""
    if dtype == torch.float32:
        if layout in ("all-pairs", "retrieve"):
            return ("exact fp32 SIMT kernel; register tiles when queries and documents are padded, "
                    "Lq <= 128, H % 4 == 0 and H <= 128")
        return "exact fp32 SIMT kernel"
    if capability >= (8, 0):
        return (
            "tensor cores (mma.sync) when H % 8 == 0, H <= 256 and rows are 16-byte aligned; "
            "exact SIMT kernel otherwise"
        )
    return "exact SIMT kernel (tensor-core path needs sm_80+)"


def backend_plan(ops, reason):
    """{layout: {dtype name: (backend, why)}} for CUDA tensors on this machine (CPU and MPS
    tensors: :func:`cpu_path`, :func:`mps_path`)."""
    plan = {}
    capability = device_capability() if ops is not None else None
    for layout in LAYOUTS:
        plan[layout] = {}
        for dtype in DTYPES:
            name = str(dtype).removeprefix("torch.")
            if ops is None:
                plan[layout][name] = ("torch fallback", reason)
            else:
                plan[layout][name] = ("cuda", _cuda_kernel_path(dtype, capability, layout))
    return plan


def cpu_path():
    """(backend, why) for CPU tensors: the compiled CPU kernels and their inner loop, or the
    PyTorch fallback and why the kernels are unavailable."""
    ops, reason = cpu_ops()
    if ops is None:
        return "torch fallback", reason
    try:
        isa = ops.cpu_isa()
    except (AttributeError, RuntimeError, ValueError) as exc:  # a bad MAXSIM_CPU_ISA, say
        isa = f"none ({str(exc).strip().splitlines()[0]})"
    forced = os.environ.get("MAXSIM_CPU_ISA")
    how = f"forced by MAXSIM_CPU_ISA={forced}" if forced else "the best this CPU has"
    return "cpu", f"{isa} inner loop ({how}); {reason}"


def mps_path():
    """(backend, why) for MPS tensors: the Metal kernels once they passed their first-use
    self-test here (running it now if no call did yet), else the PyTorch fallback and why."""
    metal, why = metal_ops()
    return ("metal", why) if metal is not None else ("torch fallback", why)


def info(file=sys.stdout):
    """Collect the report as a dict; print it to ``file`` unless ``file`` is None."""
    ops, reason = cuda_ops()
    if torch.cuda.is_available():
        major, minor = device_capability()
        count = torch.cuda.device_count()
        emulating = f", emulated on {torch.cuda.get_device_name()}" if emulated_gpu() else ""
        name = emulated_gpu().name.upper() if emulated_gpu() else torch.cuda.get_device_name()
        device = f"{name} (sm_{major}{minor}, {count} visible{emulating})"
    elif torch.backends.mps.is_available():
        device = "Apple MPS"
    else:
        device = "CPU only"
    report = {
        "maxsim": _package_version(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch CUDA": torch.version.cuda or "none (CPU build)",
        "nvcc": _nvcc(),
        "device": device,
        "extension": f"loaded: {reason}" if ops is not None else f"not loaded: {reason}",
        "namespace": ops.fwd.default.namespace if ops is not None else "maxsim_torch",
        "CPU tensors": "{}: {}".format(*cpu_path()),
        "MPS tensors": "{}: {}".format(*mps_path()),
        "backends": backend_plan(ops, reason),
    }
    if file is not None:
        _print(report, file)
    return report


def _print(report, file):
    width = max(len(k) for k in report)
    for key, value in report.items():
        if key != "backends":
            lines = str(value).splitlines() or [""]
            print(f"{key:<{width}}  {lines[0]}", file=file)
            for line in lines[1:]:
                print(f"{'':<{width}}  {line}", file=file)
    print(
        "\nbackend for CUDA tensors, by layout and dtype (CPU and MPS tensors: above):",
        file=file,
    )
    for layout, by_dtype in report["backends"].items():
        print(f"  {layout} ({LAYOUTS[layout]})", file=file)
        choices = set(by_dtype.values())
        if len(choices) == 1:  # the same for every dtype: say it once
            backend, why = choices.pop()
            print(f"    every dtype: {backend}: {why.splitlines()[0]}", file=file)
            continue
        for dtype, (backend, why) in by_dtype.items():
            print(f"    {dtype:<9} {backend}: {why.splitlines()[0]}", file=file)
    print(
        "  training losses (contrastive_loss, contrastive_step): the forward above with argmax,\n"
        "    then the fused loss and the backward, on the same backend\n"
        "  quantized inputs (QuantizedTokens): on sm_80+ with fp16 / bf16 or quantized\n"
        "    queries and H a multiple of 16 up to 256, 8-bit codes on the tensor cores\n"
        "    (op fwd_scaled); otherwise dequantized to fp32, then the float32 path above",
        file=file,
    )


if __name__ == "__main__":
    info()
