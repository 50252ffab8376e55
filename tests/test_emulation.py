"""The emulation test device (MAXSIM_EMULATE_GPU): its build recipe, its refusals and its two
tables (Python and the C++ planner's) agreeing. The emulated runs themselves happen on the GPU
machine (scripts/gpu_check.sh archs)."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from maxsim import _ops, emulation

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def emulate(monkeypatch):
    """Sets MAXSIM_EMULATE_GPU for one test (the module reads it once: the cache is cleared)."""

    def set_gpu(name):
        monkeypatch.setenv(emulation.ENV, name)
        emulation.emulated_gpu.cache_clear()

    yield set_gpu
    monkeypatch.delenv(emulation.ENV, raising=False)
    emulation.emulated_gpu.cache_clear()


def test_planner_table_matches_python_table():
    source = (ROOT / "csrc" / "emulated_gpus.h").read_text()
    rows = re.findall(
        r'\{"(\w+)", \{(\d+), (\d+), (\d+) \* 1024, (\d+)\}\}', source.split("kEmulatedGpus")[1]
    )
    cpp = {name: (int(cc), int(sms), int(kb) * 1024, int(gbps)) for name, cc, sms, kb, gbps in rows}
    python = {
        g.name: (g.capability[0] * 10 + g.capability[1], g.sms, g.smem_per_block, g.dram_gbps)
        for g in emulation.GPUS.values()
    }
    assert cpp == python


@pytest.mark.parametrize("gpu", sorted(emulation.GPUS))
def test_build_is_the_gpus_ptx_only(gpu):
    archs = emulation.build_archs(emulation.GPUS[gpu])
    assert archs == _ops.parse_archs(" ".join(archs))
    num = emulation.GPUS[gpu].ptx.replace(".", "")
    assert _ops.gencode_flags(archs) == [f"-gencode=arch=compute_{num},code=compute_{num}"]
    assert _ops.runs_on(archs, (9, 0)) and not _ops.runs_on(archs, (int(num[0]) - 1, 0))
    assert _ops.kernels_archs(archs) == [f"{emulation.GPUS[gpu].ptx}+PTX"]


def test_each_ptx_build_has_its_own_name():
    names = {_ops.extension_name(ROOT, emulation.build_archs(g)) for g in emulation.GPUS.values()}
    assert len(names) == len({g.ptx for g in emulation.GPUS.values()})
    assert _ops.extension_name(ROOT) not in names
    assert _ops.extension_name(ROOT, ["8.0", "9.0a+PTX"]) == _ops.extension_name(ROOT)


def test_blackwell_takes_the_plain_compute_90():
    for name in ("b200", "rtx5090"):
        assert emulation.GPUS[name].capability >= (10, 0)
        assert _ops.gencode_flags(emulation.build_archs(emulation.GPUS[name])) == [
            "-gencode=arch=compute_90,code=compute_90"
        ]


def test_capability_follows_the_override(emulate):
    emulate("L4")
    assert emulation.device_capability() == (8, 9)
    emulate("a100")
    assert emulation.device_capability(0) == (8, 0)


def test_unknown_gpu_is_refused(emulate):
    emulate("v100")
    with pytest.raises(ValueError, match="MAXSIM_EMULATE_GPU: expected one of t4, a100"):
        emulation.emulated_gpu()


@pytest.mark.parametrize(
    "archs", [["7.5", "8.0", "8.6", "8.9", "9.0a+PTX"], ["9.0a+PTX-only"], ["8.6+PTX-only"]]
)
def test_build_with_other_code_is_refused(emulate, archs):
    emulate("a100")
    with pytest.raises(emulation.EmulationRefused, match="expected only 8.0\\+PTX-only"):
        emulation.check_build(archs, "the prebuilt x")
    emulation.check_build(["8.0+PTX-only"], "the prebuilt x")


def test_not_emulating_accepts_any_build():
    emulation.check_build(["9.0a"], "the prebuilt x")


def test_hub_ops_module_checks_the_build():
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import build_variant
    finally:
        sys.path.pop(0)
    text = build_variant.ops_module("_x_hub", archs=["8.0+PTX-only"])
    assert "check_build(['8.0+PTX-only'], \"the bundled _x_hub\")" in text
    compile(text, "_ops.py", "exec")


def test_import_under_emulation_without_a_gpu():
    """Setting the variable on a machine without the build must not break import."""
    code = "import maxsim, maxsim.info; print(maxsim.emulation.device_capability())"
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(ROOT / "torch-ext"), emulation.ENV: "t4", "MAXSIM_NO_JIT": "1",
             "PATH": "/usr/bin:/bin"},
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().endswith("(7, 5)")


def _arch_check():
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import arch_check
    finally:
        sys.path.pop(0)
    return arch_check


def test_arch_check_entries_and_table(tmp_path):
    ac = _arch_check()
    run = ac.Run(tmp_path, 60)
    ok = ac.new_entry(emulation.GPUS["a100"], "H100", "abc")
    ok.update(gpu_check={"passed": 9, "failed": 0}, tests={"passed": 5, "failed": 0},
              memcheck_errors=0, bench={"rerank/fp16": {"maxsim_ms": 0.5, "naive_ms": 2.0},
                                        "corpus/bf16": {"maxsim_ms": 1.0, "naive_ms": 1.5}})
    bad = ac.new_entry(emulation.GPUS["t4"], "H100", "abc")
    bad.update(gpu_check={"passed": 9, "failed": 1}, tests={"passed": 5, "failed": 0},
               memcheck_errors=0)
    assert ac.passed(ok) and not ac.passed(bad)
    assert ac.slowest(ok) == (1.5, "corpus/bf16")
    entries = ac.write(run, [ok, bad])
    assert [e["arch"] for e in entries][:2] == ["t4", "a100"]
    assert json.loads((tmp_path / "archs.json").read_text())["entries"] == entries
    text = ac.table(entries)
    assert "1.50x corpus/bf16" in text and "FAIL" in text.splitlines()[1]
    unrun = ac.new_entry(emulation.GPUS["l4"], "H100", "abc")
    assert not ac.passed(unrun) and "FAIL" in ac.table([unrun])


def test_arch_check_refuses_unknown_names():
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "arch_check.py")],
                         capture_output=True, text=True, timeout=120,
                         env={"ARCHS": "t4 v100", "PATH": "/usr/bin:/bin"})
    assert out.returncode != 0 and "got v100" in out.stderr


def test_blackwell_machine_code_in_the_default_list():
    archs = _ops.parse_archs(_ops.DEFAULT_ARCHS)
    flags = _ops.gencode_flags(archs)
    for num in ("100", "120"):
        assert f"-gencode=arch=compute_{num},code=sm_{num}" in flags
    assert "-gencode=arch=compute_90,code=compute_90" in flags  # PTX for GPUs after these
    assert _ops.runs_on(archs, (10, 0)) and _ops.runs_on(archs, (12, 0))
    assert _ops.device_arch(10, 0) == "10.0" and _ops.device_arch(12, 0) == "12.0"


def test_a_toolkit_without_blackwell_leaves_it_out():
    known = {"7.5", "8.0", "8.6", "8.9", "9.0"}  # CUDA 12.4's list
    keep, dropped = _ops.buildable(_ops.parse_archs(_ops.DEFAULT_ARCHS), known)
    assert dropped == ["10.0", "12.0"] and "9.0a+PTX" in keep
    assert _ops.buildable(["10.0"], None) == (["10.0"], [])
    assert _ops.gencode_flags([_ops.NEWER_GPU_FALLBACK]) == [
        "-gencode=arch=compute_90,code=compute_90"
    ]


def test_toolkit_archs_reads_nvcc(tmp_path):
    nvcc = tmp_path / "bin" / "nvcc"
    nvcc.parent.mkdir()
    nvcc.write_text("#!/bin/sh\nprintf 'compute_75\\ncompute_90\\ncompute_100\\ncompute_121\\n'\n")
    nvcc.chmod(0o755)
    assert _ops.toolkit_archs(tmp_path) == {"7.5", "9.0", "10.0", "12.1"}
    assert _ops.toolkit_archs(tmp_path / "none") is None


def test_arch_check_reads_each_steps_output(tmp_path, monkeypatch):
    """The stages against canned step outputs: what each log line becomes in the entry."""
    ac = _arch_check()
    logs = {
        "build": (0, "JIT-built x\n"),
        "gpu_check": (0, "build: 1.0 s\nchecks: 958/958 passed in 50.1 s\n"),
        "tests": (1, "....F\nFAILED tests/test_x.py::t\n"
                  "1 failed, 812 passed, 9 skipped in 80.2s\n"),
        "memcheck": (0, "memcheck cases: done (0 fuzz mismatches, 0 failed calls)\n"
                        "========= ERROR SUMMARY: 0 errors\n"),
    }

    def fake_step(run, gpu, name, cmd, jobs=16):
        if name == "bench":
            (run.logs / f"{gpu.name}_bench.json").write_text(
                json.dumps({"rerank/fp16": {"maxsim_ms": 0.1, "naive_ms": 0.5}}))
            return 0, "", 1.0
        return (*logs[name], 2.0)

    monkeypatch.setattr(ac, "step", fake_step)
    run = ac.Run(tmp_path, 60)
    gpus = [emulation.GPUS["b200"], emulation.GPUS["rtx5090"]]
    assert ac.build(run, gpus) == {"9.0": (True, 2.0)}  # one build serves both
    entry = ac.new_entry(gpus[0], "H100", "abc")
    ac.guarded(ac.checks, run, gpus[0], entry)
    ac.guarded(ac.bench, run, gpus[0], entry)
    assert entry["gpu_check"] == {"passed": 958, "failed": 0}
    assert entry["tests"] == {"passed": 812, "failed": 1, "skipped": 9}
    assert entry["memcheck_errors"] == 0 and "memcheck_error" not in entry
    assert entry["bench"] == {"rerank/fp16": {"maxsim_ms": 0.1, "naive_ms": 0.5}}
    assert not ac.passed(entry)  # the failed test
    entry["tests"]["failed"] = 0
    assert ac.passed(entry)
    monkeypatch.setattr(ac, "step", lambda *a, **k: (None, "", 0.0))  # out of time
    late = ac.new_entry(gpus[1], "H100", "abc")
    ac.guarded(ac.checks, run, gpus[1], late)
    assert late["gpu_check"]["failed"] is None and not ac.passed(late)
