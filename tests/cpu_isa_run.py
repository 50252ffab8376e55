"""Runs the compiled CPU kernels on one ISA path (MAXSIM_CPU_ISA, read once per process, so each
path runs in its own process) and checks them against the float64 reference: random data with
random padding and masks, odd H, 1/8-grid data (exact sums, exact ties), a NaN token, documents
without valid tokens; gradients bit-identical on 1 and 2 threads. Saves every output to the file
named by its argument, for tests/test_cpu_kernels.py to compare across ISAs.

    MAXSIM_CPU_ISA=avx512 python tests/cpu_isa_run.py out.pt
"""

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import maxsim  # noqa: E402
from conftest import assert_close_rel, assert_exact, op_args, reference_of, token_set  # noqa: E402
from maxsim.layouts import ALLPAIRS, GROUPED  # noqa: E402

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def case(layout, dtype, h, data):
    """Op arguments: packed queries x padded documents (all pairs), or padded x packed (grouped),
    with a NaN in one valid document token of grid cases and one document without tokens."""
    grouped = layout == GROUPED
    q = token_set("padded" if grouped else "packed", 5, 11, h, dtype, "cpu", data=data)
    d = token_set("packed", 15 if grouped else 9, 37, h, dtype, "cpu", data=data)
    offsets = d["offsets"]
    offsets[2] = offsets[1]  # document 1 has no tokens
    first = int(offsets[3])
    if data == "grid" and int(offsets[4]) > first:
        d["x"][first, h // 2] = float("nan")
        if d["mask"] is not None:
            d["mask"][first] = True
    return op_args(q, d, layout, group=3 if grouped else 0, with_argmax=True)


def grads(ops, args, scores, argmax, threads):
    torch.set_num_threads(threads)
    grad = torch.linspace(-1, 1, scores.numel()).reshape(scores.shape)
    return ops.bwd(grad, args[0], args[1], argmax, args[2], args[5], None, None, args[10],
                   args[11])


def main(out_path):
    ops = maxsim.select_ops(torch.device("cpu"), "cpu")
    out = {"isa": ops.cpu_isa()}
    torch.manual_seed(1234)
    for dtype_name, dtype in DTYPES.items():
        for h in (1, 7, 17, 33, 128, 131):
            for data in ("grid", "normal"):
                for layout in (ALLPAIRS, GROUPED):
                    args = case(layout, dtype, h, data)
                    scores, argmax = ops.fwd(*args)
                    ref_scores, ref_argmax = reference_of(args)
                    if data == "grid":
                        assert_exact(scores, argmax, ref_scores, ref_argmax)
                    else:
                        assert_close_rel(scores, ref_scores.float(), 1e-6)
                    one = grads(ops, args, scores, argmax, 1)
                    for a, b in zip(one, grads(ops, args, scores, argmax, 2), strict=True):
                        torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True)  # bitwise
                    key = f"{dtype_name}-h{h}-{data}-layout{layout}"
                    out[key] = (scores, argmax, *one)
    torch.save(out, out_path)
    print(f"{out['isa']}: {len(out) - 1} cases match the float64 reference")


if __name__ == "__main__":
    main(sys.argv[1])
