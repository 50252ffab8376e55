"""What only the compiled CPU kernels have: they build wherever a compiler and ninja exist, their
results do not depend on the thread count, long documents span several chunks, unchecked bad
pair ids read nothing outside the tensors, every ISA path (MAXSIM_CPU_ISA) matches the float64
reference and the others, and the kernels run on torch's own OpenMP threads."""

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import maxsim
import pytest
import torch
from conftest import HAS_CPU_OPS, assert_exact, op_args, reference_of, token_set
from maxsim.layouts import ALLPAIRS, PAIRS

needs_cpu_ops = pytest.mark.skipif(not HAS_CPU_OPS, reason="the CPU kernels did not build")


@pytest.mark.skipif(
    shutil.which("c++") is None
    or importlib.util.find_spec("ninja") is None
    or os.environ.get("MAXSIM_NO_JIT") == "1",
    reason="no C++ compiler or ninja",
)
def test_cpu_kernels_build_where_a_compiler_exists():
    ops, reason = maxsim.cpu_ops()
    assert ops is not None, reason


@needs_cpu_ops
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_results_do_not_depend_on_the_thread_count(dtype):
    ops = maxsim.select_ops(torch.device("cpu"), "cpu")
    q = token_set("packed", 6, 11, 40, dtype, "cpu")
    d = token_set("padded", 9, 37, 40, dtype, "cpu")
    args = op_args(q, d, layout=ALLPAIRS, max_lq=13, with_argmax=True)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = ops.fwd(*args)
        grad = torch.randn(one[0].shape)
        one_grads = ops.bwd(grad, args[0], args[1], one[1], args[2], args[5], None, None,
                            ALLPAIRS, 0)
        torch.set_num_threads(max(2, threads))
        many = ops.fwd(*args)
        many_grads = ops.bwd(grad, args[0], args[1], many[1], args[2], args[5], None, None,
                             ALLPAIRS, 0)
    finally:
        torch.set_num_threads(threads)
    for a, b in zip(one + one_grads, many + many_grads, strict=True):
        assert torch.equal(a, b)


@needs_cpu_ops
@pytest.mark.parametrize("h", [8, 128])
def test_long_documents_span_several_chunks(h):
    # The kernel reads a document 65536 / h tokens at a time: 2000 tokens are several chunks.
    ops = maxsim.select_ops(torch.device("cpu"), "cpu")
    q = token_set("padded", 3, 17, h, torch.float32, "cpu", data="grid")
    d = token_set("packed", 4, 2000, h, torch.float32, "cpu", data="grid")
    row = int(d["offsets"][1]) + 1500  # document 1 spans 2000 tokens: a NaN in a later chunk
    d["x"][row, 0] = float("nan")
    if d["mask"] is not None:
        d["mask"][row] = True
    args = op_args(q, d, layout=ALLPAIRS, with_argmax=True)
    assert_exact(*ops.fwd(*args), *reference_of(args))


@needs_cpu_ops
def test_out_of_range_pair_ids_give_nan_and_no_argmax():
    ops = maxsim.select_ops(torch.device("cpu"), "cpu")
    q = token_set("padded", 3, 5, 16, torch.float32, "cpu")
    d = token_set("padded", 4, 7, 16, torch.float32, "cpu")
    pair_q = torch.tensor([0, 3, -1, 2], dtype=torch.int32)
    pair_d = torch.tensor([1, 0, 2, 4], dtype=torch.int32)
    args = list(op_args(q, d, layout=PAIRS, pair_q=pair_q, pair_d=pair_d, with_argmax=True))
    scores, argmax = ops.fwd(*args)
    assert not scores[0].isnan() and scores[1:].isnan().all()
    assert (argmax[1:] == -1).all()


ISAS = ("scalar", "avx2", "avx512", "avx512bf16", "neon")
TESTS = Path(__file__).resolve().parent


def run_isa(isa, out):
    """tests/cpu_isa_run.py on one forced ISA path; None where this CPU lacks it."""
    env = dict(os.environ, MAXSIM_CPU_ISA=isa)
    done = subprocess.run([sys.executable, str(TESTS / "cpu_isa_run.py"), str(out)], env=env,
                          capture_output=True, text=True, timeout=900)
    if done.returncode != 0 and "expected one this CPU runs" in done.stderr:
        return None
    assert done.returncode == 0, f"MAXSIM_CPU_ISA={isa}:\n{done.stdout}\n{done.stderr[-3000:]}"
    return torch.load(out)


@needs_cpu_ops
@pytest.mark.slow
def test_every_isa_path_matches_float64_and_the_others(tmp_path):
    """Each path against float64 (in its own process); then across paths: the fp32-accumulating
    FMA paths (scalar, AVX2, AVX-512, NEON) round alike, so their scores, argmax and gradients are
    bit-identical in every dtype; the bf16 pair path is too on fp32 / fp16 inputs (it takes only
    bf16 ones) and on grid data, where every sum is exact."""
    outputs = {isa: run_isa(isa, tmp_path / f"{isa}.pt") for isa in ISAS}
    ran = {isa: out for isa, out in outputs.items() if out is not None}
    assert "scalar" in ran and len(ran) >= 2, sorted(ran)
    base = ran["scalar"]
    for isa, out in ran.items():
        assert out["isa"] == isa
        for key, tensors in base.items():
            if key == "isa" or (isa == "avx512bf16" and key.startswith("bf16") and "normal" in key):
                continue
            for a, b in zip(tensors, out[key], strict=True):
                torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True,
                                           msg=f"{isa} differs from scalar on {key}")


@needs_cpu_ops
def test_an_isa_the_cpu_lacks_is_refused_by_name():
    env = dict(os.environ, MAXSIM_CPU_ISA="sse1")
    code = ("import maxsim, torch; ops = maxsim.select_ops(torch.device('cpu'), 'cpu')\n"
            "try:\n    ops.cpu_isa()\nexcept ValueError as e:\n    print(e)")
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=300)
    assert "MAXSIM_CPU_ISA=sse1: expected one this CPU runs (scalar" in done.stdout, done.stderr


@needs_cpu_ops
def test_one_openmp_runtime_and_set_num_threads_obeyed_after_an_einsum():
    """The kernels join torch's OpenMP pool: one libgomp in a process of torch and maxsim alone
    (other packages may bring their own), results after an einsum (whose workers may still spin)
    equal at 1 and 2 threads."""
    ops = maxsim.select_ops(torch.device("cpu"), "cpu")
    if Path("/proc/self/maps").exists():
        code = ("import json, maxsim, torch, pathlib\n"
                "maxsim.select_ops(torch.device('cpu'), 'cpu')\n"
                "maps = pathlib.Path('/proc/self/maps').read_text().splitlines()\n"
                "print(json.dumps(sorted({m.split()[-1] for m in maps if 'libgomp' in m})))")
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              timeout=300)
        gomp = json.loads(done.stdout.strip().splitlines()[-1]) if done.returncode == 0 else None
        assert gomp is not None and len(gomp) <= 1, (gomp, done.stderr[-2000:])
    q = token_set("padded", 7, 13, 33, torch.float32, "cpu")
    d = token_set("padded", 40, 29, 33, torch.float32, "cpu")
    args = op_args(q, d, layout=ALLPAIRS, with_argmax=True)
    threads = torch.get_num_threads()
    results = []
    try:
        for n in (1, 2, 1):
            torch.set_num_threads(n)
            torch.einsum("qih,djh->qdij", q["x"], d["x"]).amax(-1)
            results.append(ops.fwd(*args))
            assert torch.get_num_threads() == n
    finally:
        torch.set_num_threads(threads)
    for other in results[1:]:
        assert all(torch.equal(a, b) for a, b in zip(results[0], other, strict=True))
