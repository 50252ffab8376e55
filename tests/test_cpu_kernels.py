"""What only the compiled CPU kernels have: they build wherever a compiler and ninja exist, their
results do not depend on the thread count, long documents span several chunks, and unchecked bad
pair ids read nothing outside the tensors."""

import importlib.util
import os
import shutil

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
