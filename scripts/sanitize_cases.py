"""A few small calls that reach every CUDA kernel once, for compute-sanitizer, and with ``--fuzz``
the malformed calls of the fuzz corpus (tests/fuzz_corpus.py) with their index tensors on the GPU:

    compute-sanitizer --tool memcheck --error-exitcode 1 python3 scripts/sanitize_cases.py --fuzz
    compute-sanitizer --tool racecheck --error-exitcode 1 python3 scripts/sanitize_cases.py

The kernel calls cover the streaming (32- and 64-row), 128-row (and on Hopper its wgmma form, which
needs calls with enough document tiles) and CUDA-core forward tiles, the mask-extent kernel
(documents given by a mask alone), long-query partial sums, 8-bit documents (INT8 and FP8, fp16
and bf16 queries, quantized queries, the wgmma tile's codes in registers), argmax, every backward
kernel (dQ, sorted dD of padded and packed documents, malformed offsets included, the row-block
dD of long padded documents) and the loss (fused into the training step's backward, and on
its own).

Each fuzz case must raise a clear error naming its argument or return NaN exactly where
docs/API.md says (index values are checked on the GPU only with MAXSIM_DEBUG=1, so without it bad
values give NaN), and the process's CUDA context must be alive after it. Prints one summary line;
exits 1 on any mismatch. ``--only-fuzz`` skips the kernel cases, ``--variants N`` sizes the corpus.
"""

import argparse
import os
import sys

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "torch-ext"))
sys.path.insert(0, os.path.join(ROOT, "tests"))
import maxsim  # noqa: E402


def tokens(*shape, dtype=torch.float16):
    return torch.nn.functional.normalize(torch.randn(*shape, device="cuda"), dim=-1).to(dtype)


def kernel_cases():
    """Every kernel once, on valid input."""
    lens = torch.tensor([5, 33, 64, 0, 70], device="cuda", dtype=torch.int32)
    for dtype in (torch.float16, torch.bfloat16, torch.float32):
        Q, D = tokens(3, 20, 64, dtype=dtype), tokens(5, 70, 64, dtype=dtype)
        maxsim.maxsim(Q, D, d_lengths=lens)  # streaming tile (fp32: CUDA-core kernel)
        maxsim.maxsim_with_argmax(tokens(2, 50, 64, dtype=dtype), D)  # 64-row tile
        maxsim.maxsim(tokens(2, 130, 64, dtype=dtype), D)  # 128-row tile, partial sums
        maxsim.maxsim_with_argmax(tokens(1, 16, 64, dtype=dtype), tokens(2, 700, 64, dtype=dtype))
    # fp32 on the TF32 tiles (calls of 2^24+ multiply-adds): split and single-TF32 products, the
    # 32-, 64- and 128-row tiles, lengths and argmax
    D32 = tokens(40, 200, 128, dtype=torch.float32)
    lens32 = torch.randint(0, 201, (40,), device="cuda", dtype=torch.int32)
    for mode in ("exact", "tf32"):
        os.environ["MAXSIM_FP32"] = mode
        for lq in (20, 50, 130):
            maxsim.maxsim_with_argmax(tokens(8, lq, 128, dtype=torch.float32), D32, d_lengths=lens32)
        # all pairs with enough document tiles for the block tile (on Hopper: exact as fp16 parts
        # on the 16-bit wgmma tile, with the argmax too; TF32 scores on the transposed tile), a
        # query holding Inf (the signed split), then a document too, and D 64
        Qw = tokens(32, 32, 128, dtype=torch.float32)
        Dw, w_lens = tokens(70, 1000, 128, dtype=torch.float32), lens32.repeat(2)[:70] * 5
        maxsim.maxsim(Qw, Dw, d_lengths=w_lens)
        maxsim.maxsim_with_argmax(Qw, Dw, d_lengths=w_lens)
        Qw[3, 7, 0] = float("inf")
        maxsim.maxsim(Qw, Dw, d_lengths=w_lens)
        Dw[5, 3, 9] = float("-inf")
        maxsim.maxsim_with_argmax(Qw, Dw, d_lengths=w_lens)
        maxsim.maxsim(Qw[..., :64].contiguous(), Dw[..., :64].contiguous(), d_lengths=w_lens)
    del os.environ["MAXSIM_FP32"]
    # the 32-row tile at D 128 (on Hopper its transposed wgmma form): masks, argmax, pairs
    Qs, Ds = tokens(3, 20, 128), tokens(3, 4, 150, 128)
    s_mask = torch.rand(3, 4, 150, device="cuda") > 0.2
    maxsim.maxsim_with_argmax(Qs, Ds, d_mask=s_mask)
    cu_q = torch.tensor([0, 20, 35, 60], device="cuda", dtype=torch.int32)
    cu_d = torch.tensor([0, 150, 220, 230, 400], device="cuda", dtype=torch.int32)
    maxsim.maxsim_varlen(tokens(60, 128), cu_q, tokens(400, 128), cu_d,
                         pair_q=torch.tensor([0, 0, 1, 2], device="cuda", dtype=torch.int32),
                         pair_d=torch.tensor([1, 3, 0, 2], device="cuda", dtype=torch.int32))
    # many short queries share the 128-row tile
    maxsim.maxsim(tokens(40, 16, 64), tokens(9, 70, 64), d_lengths=lens.repeat(2)[:9])
    # the compute-bound tile at the sizes that take wgmma on Hopper (D 128 and 64, masks, argmax)
    d_mask = torch.rand(70, 1000, device="cuda") > 0.1
    maxsim.maxsim_with_argmax(tokens(32, 32, 128), tokens(70, 1000, 128), d_mask=d_mask)
    g_mask = torch.rand(4, 70, 1024, device="cuda") > 0.1
    Qg, Dg = tokens(4, 200, 64, dtype=torch.bfloat16), tokens(4, 70, 1024, 64, dtype=torch.bfloat16)
    maxsim.maxsim(Qg, Dg, d_mask=g_mask)
    for fmt in ("int8", "fp8_e4m3"):
        for dtype in (torch.float16, torch.bfloat16):
            Q, D = tokens(3, 20, 64, dtype=dtype), maxsim.quantize(tokens(5, 70, 64), fmt)
            maxsim.maxsim_with_argmax(Q, D, d_lengths=lens)
            maxsim.maxsim(tokens(40, 16, 64, dtype=dtype), D)
            maxsim.maxsim(Q, maxsim.quantize(tokens(2, 700, 64), fmt))  # few long documents
        both = maxsim.quantize(tokens(3, 20, 64), fmt), maxsim.quantize(tokens(5, 70, 64), fmt)
        maxsim.maxsim(*both)
        # both query types over the formats
        dtype = torch.float16 if fmt == "int8" else torch.bfloat16
        # candidates of 512+ tokens: 128-row tiles of codes on Hopper (D 128, lengths, argmax)
        long = maxsim.quantize(tokens(6, 600, 128), fmt)
        cand = maxsim.QuantizedTokens(long.codes.view(2, 3, 600, 128), long.scale.view(2, 3, 600))
        long_len = torch.tensor([[600, 1, 300], [0, 599, 513]], device="cuda", dtype=torch.int32)
        maxsim.maxsim_with_argmax(tokens(2, 32, 128, dtype=dtype), cand, d_lengths=long_len)
        maxsim.maxsim(tokens(2, 32, 128, dtype=dtype), cand, d_lengths=long_len)  # four-warp blocks
        pages = maxsim.quantize(tokens(130, 520, 128), fmt)  # all pairs, four-warp blocks
        page_len = torch.randint(0, 521, (130,), device="cuda")
        maxsim.maxsim(tokens(1, 32, 128, dtype=dtype), pages, d_lengths=page_len)
        # the wgmma tile's size: codes turned into its register operand on Hopper (with and
        # without argmax: different register budgets)
        big = maxsim.quantize(tokens(70, 1000, 128), fmt)
        maxsim.maxsim_with_argmax(tokens(32, 32, 128, dtype=dtype), big, d_mask=d_mask)
        big_len = torch.randint(0, 1001, (70,), device="cuda", dtype=torch.int32)
        maxsim.maxsim(tokens(32, 32, 128, dtype=dtype), big, d_lengths=big_len)
    # backward: padded and packed documents (sorted dD), the loss
    Q = tokens(4, 12, 64).requires_grad_()
    D = tokens(6, 40, 64).requires_grad_()
    maxsim.contrastive_step(Q.detach(), D[:4].detach(), d_lengths=lens[:4].clamp(1))
    maxsim.contrastive_step(tokens(2, 8, 64), tokens(1100, 6, 64))  # too many columns to fuse
    maxsim.contrastive_loss(Q, D[:4], d_lengths=lens[:4].clamp(1)).backward()  # the ce op
    maxsim.maxsim(Q, D).sum().backward()
    cu_q = torch.tensor([0, 5, 12], device="cuda", dtype=torch.int32)
    cu_d = torch.tensor([0, 7, 30, 31], device="cuda", dtype=torch.int32)
    q, d = tokens(12, 64).requires_grad_(), tokens(31, 64).requires_grad_()
    maxsim.maxsim_varlen(q, cu_q, d, cu_d, max_seqlen_q=7).sum().backward()
    packed_backward_cases()
    torch.cuda.synchronize()
    print("sanitize cases: done")


def packed_backward_cases():
    """dD of packed documents (the sorted path) with malformed offsets and argmax: out of range,
    decreasing, negative, overlapping, no documents at all, a document longer than the sort's
    counters; every layout, and the training step."""
    ops = maxsim.cuda_ops()[0]
    i32 = lambda xs: torch.tensor(xs, dtype=torch.int32, device="cuda")  # noqa: E731
    q, d = tokens(3, 20, 64), tokens(300, 64)
    for d_off in ([0, 50, 120, 121, 200, 300], [0, 50, 120, 121, 200, 301],
                  [0, 50, 20, 121, 200, 300], [-7, 50, 120, 121, 200, 300],
                  [0, 50, 120, 1 << 30, 200, 300], [0, 290, 10, 300, 5, 300],
                  [300, 0, 0, 0, 0, 0]):
        off = i32(d_off)
        for layout, group, pq, pd in ((0, 0, None, None), (1, 5, None, None),
                                      (2, 0, i32([0, 2, 2, 1]), i32([4, 0, 3, -1]))):
            qq = q[:1] if layout == 1 else q
            npairs = {0: 15, 1: 5, 2: 4}[layout]
            # argmax from every range: valid rows, past a document's end, negative, huge
            arg = torch.randint(-5, 310, (npairs, 20), device="cuda", dtype=torch.int32)
            arg[:, 0] = 1 << 30
            shape = (3, 5) if layout == 0 else (1, 5) if layout == 1 else (4,)
            grad = torch.rand(shape, device="cuda")
            ops.bwd(grad, qq, d, arg.view(*shape, 20), None, off, pq, pd, layout, group)
        ops.contrastive_step(q, d, None, None, None, off[:4], None, None, 0, 0, 20, None, 1.0)
    ops.bwd(torch.rand(3, 0, device="cuda"), q, d, torch.zeros(3, 0, 20, dtype=torch.int32,
            device="cuda"), None, i32([0]), None, None, 0, 0)  # rows but no documents
    long_d = tokens(20000, 64)
    arg = torch.randint(0, 20000, (3, 2, 20), device="cuda", dtype=torch.int32)
    ops.bwd(torch.rand(3, 2, device="cuda"), q, long_d, arg, None, i32([0, 19000, 20000]), None,
            None, 0, 0)
    # padded documents past the sort's rows: the row-block dD kernel
    ops.bwd(torch.rand(3, 2, device="cuda"), q, long_d.view(2, 10000, 64), arg, None, None, None,
            None, 0, 0)


def context_alive(device: str) -> bool:
    """A trivial CUDA op and a synchronize: False once a kernel fault has killed the context."""
    if device == "cpu":
        return True
    try:
        alive = torch.ones(4, device="cuda").add_(1).sum().item() == 8
        torch.cuda.synchronize()
        return alive
    except Exception:  # noqa: BLE001 - any CUDA error means the context is gone
        return False


def fuzz(seed: int, variants: int, device: str = "cuda") -> int:
    """The fuzz corpus on ``device``; returns the number of mismatches."""
    import fuzz_corpus

    checked = device == "cpu" or os.environ.get("MAXSIM_DEBUG", "0") not in ("", "0")
    cases = fuzz_corpus.corpus(seed=seed, variants=variants)
    counts = {"error": 0, "answer": 0, "mismatch": 0}
    nan_cases = 0
    for i, case in enumerate(cases):
        kind, detail = fuzz_corpus.outcome(case, device, checked)
        counts[kind] += 1
        nan_cases += kind == "answer" and case.nan is not None and bool(case.nan.any())
        if kind == "mismatch":
            print(f"MISMATCH {case.entry} ({case.what}): {detail}")
        if not context_alive(device):
            print(f"CONTEXT LOST after case {i}: {case.entry} ({case.what})")
            counts["mismatch"] += 1
            break
    name = torch.cuda.get_device_name() if device == "cuda" else "cpu"
    print(
        f"fuzz: {len(cases)} cases on {name} "
        f"(index values {'checked' if checked else 'unchecked'}), {counts['error']} errors raised, "
        f"{nan_cases} NaN as documented, {counts['answer'] - nan_cases} valid answers, "
        f"{counts['mismatch']} mismatches"
    )
    return counts["mismatch"]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--fuzz", action="store_true", help="also run the fuzz corpus")
    parser.add_argument("--only-fuzz", action="store_true", help="only the fuzz corpus")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--variants", type=int, default=2, help="valid calls per entry point")
    parser.add_argument("--device", default="cuda", help="cpu: the fuzz corpus without a GPU")
    args = parser.parse_args()
    torch.manual_seed(0)
    if args.device == "cuda":
        assert maxsim.cuda_ops()[0] is not None, maxsim.cuda_ops()[1]
    if not args.only_fuzz:
        kernel_cases()
    if (args.fuzz or args.only_fuzz) and fuzz(args.seed, args.variants, args.device):
        sys.exit(1)


if __name__ == "__main__":
    main()
