"""Builds the CUDA ops straight from the sources and checks them against a float64 reference of
the op contract (docs/ARCHITECTURE.md). Runs on a GPU machine:

    python scripts/gpu_check.py [--profile-run]

Timings live in benchmarks/ (bench.py, call_profile.py); scripts/gpu_check.sh runs them all.
"""
import argparse
import glob
import os
import sys
import time

import torch
from torch.utils import cpp_extension

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ALL, GROUPED, PAIRS = 0, 1, 2


def build():
    t = time.time()
    if os.environ.get("MAXSIM_EMULATE_GPU"):  # the package's build of that GPU's PTX only
        sys.path.insert(0, os.path.join(ROOT, "torch-ext"))
        import maxsim

        ops, reason = maxsim.cuda_ops()
        assert ops is not None, reason
        print(f"build: {time.time() - t:.1f} s ({reason})", flush=True)
        return ops
    major, minor = torch.cuda.get_device_capability()
    arch = f"{major}{minor}" + ("a" if major == 9 else "")
    name = "_maxsim_cuda_check"
    cpp_extension.load(
        name=name,
        sources=sorted(glob.glob(os.path.join(ROOT, "csrc", "*.cu")))
        + [os.path.join(ROOT, "torch-ext", "torch_binding.cpp")],
        extra_include_paths=[os.path.join(ROOT, "csrc"), os.path.join(ROOT, "torch-ext")],
        extra_cflags=["-O3"],
        extra_cuda_cflags=["-O3", "-lineinfo", f"-gencode=arch=compute_{arch},code=sm_{arch}"],
        is_python_module=False,
        verbose=False,
    )
    print(f"build: {time.time() - t:.1f} s", flush=True)
    return getattr(torch.ops, name)


# ---------------------------------------------------------------- float64 reference of the op
def segments(x, offsets, lengths, mask):
    """List of (rows [R, D] float64, valid [R] bool) per segment."""
    out = []
    if x.dim() == 3:
        for n in range(x.shape[0]):
            rows = x[n].double()
            valid = torch.ones(x.shape[1], dtype=torch.bool, device=x.device)
            if lengths is not None:
                valid &= torch.arange(x.shape[1], device=x.device) < lengths[n]
            if mask is not None:
                valid &= mask[n]
            out.append((rows, valid))
    else:
        off = offsets.tolist()
        for n in range(len(off) - 1):
            rows = x[off[n]:off[n + 1]].double()
            valid = torch.ones(rows.shape[0], dtype=torch.bool, device=x.device)
            if mask is not None:
                valid &= mask[off[n]:off[n + 1]]
            out.append((rows, valid))
    return out


def pair_list(layout, nq, nd, group, pq, pd):
    if layout == ALL:
        return [(i, j) for i in range(nq) for j in range(nd)]
    if layout == GROUPED:
        return [(i, i * group + k) for i in range(nq) for k in range(group)]
    return list(zip(pq.tolist(), pd.tolist()))


def ref_fwd(q, d, qo, ql, qm, do, dl, dm, pq, pd, layout, group, max_lq):
    qs, ds = segments(q, qo, ql, qm), segments(d, do, dl, dm)
    pairs = pair_list(layout, len(qs), len(ds), group, pq, pd)
    scores = torch.zeros(len(pairs), dtype=torch.float64, device=q.device)
    arg = torch.full((len(pairs), max_lq), -1, dtype=torch.int32, device=q.device)
    for p, (i, j) in enumerate(pairs):
        (qr, qv), (dr, dv) = qs[i], ds[j]
        if qr.shape[0] == 0 or dr.shape[0] == 0 or not dv.any():
            continue
        sim = (qr @ dr.T).masked_fill(~dv[None, :], float("-inf"))
        best, idx = sim.max(dim=1)
        # every valid similarity -inf: the argmax is the first valid token
        idx = torch.where(best == float("-inf"), dv.long().argmax(), idx)
        scores[p] = best[qv].sum()
        idx = torch.where(qv, idx, -1).int()
        arg[p, : min(max_lq, idx.numel())] = idx[:max_lq]
    return scores.float(), arg, pairs


def ref_bwd(grad, q, d, arg, qo, do, pairs):
    """float64 gradients on the CPU, one vectorised gather / index_add per pair."""
    q, d, arg, grad = q.cpu().double(), d.cpu().double(), arg.cpu().long(), grad.cpu().double()
    qf, df = q.reshape(-1, q.shape[-1]), d.reshape(-1, d.shape[-1])
    dq, dd = torch.zeros_like(qf), torch.zeros_like(df)
    def first_row(x, off, n):
        return n * x.shape[1] if x.dim() == 3 else int(off[n])
    for p, (i, j) in enumerate(pairs):
        t = torch.nonzero(arg[p] >= 0).flatten()
        if t.numel() == 0:
            continue
        qrows = first_row(q, qo, i) + t
        drows = first_row(d, do, j) + arg[p, t]
        dq.index_add_(0, qrows, grad[p] * df[drows])
        dd.index_add_(0, drows, grad[p] * qf[qrows])
    return dq.view(q.shape), dd.view(d.shape)


def rel(a, b):
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


# ---------------------------------------------------------------- random problems
def token_set(n, L, D, dtype, packed, with_mask, gen_len):
    dev = "cuda"
    lens = torch.tensor([gen_len() for _ in range(n)], dtype=torch.int32)
    if packed:
        off = torch.zeros(n + 1, dtype=torch.int32)
        off[1:] = lens.cumsum(0)
        x = torch.randn(int(off[-1]), D, device=dev).to(dtype)
        m = (torch.rand(x.shape[0], device=dev) > 0.2) if with_mask else None
        return x, off.to(dev), None, m, int(lens.max()) if n else 0
    x = torch.randn(n, L, D, device=dev) * 30  # padding holds large values
    for k in range(n):
        x[k, : lens[k]] = torch.randn(int(lens[k]), D, device=dev)
    x = x.to(dtype)
    m = (torch.rand(n, L, device=dev) > 0.2) if with_mask else None
    return x, None, lens.to(dev), m, L


def argmax_bad(a, ra, args, pairs, tol):
    """Argmax entries that differ from the float64 one, where the similarity at the kernel's index
    is not within ``tol`` (relative to the largest |similarity| of the row) of the maximum: near
    ties that rounding may order either way pass."""
    q, d, qo, ql, qm, do, dl, dm = args[:8]
    diff = torch.nonzero(a != ra).tolist()
    if not diff:
        return 0
    qs, ds = segments(q, qo, ql, qm), segments(d, do, dl, dm)
    bad = 0
    for p, t in diff:
        (qr, _), (dr, dv) = qs[pairs[p][0]], ds[pairs[p][1]]
        k, rk = int(a[p, t]), int(ra[p, t])
        if k < 0 or rk < 0 or k >= dr.shape[0] or not dv[k]:
            bad += 1
            continue
        sim = qr[t] @ dr.T
        bad += bool(sim[rk] - sim[k] > tol * sim[dv].abs().max())
    return bad


def check_case(ops, rng, layout, dtype, D, Lq, Ld, nq, nd_or_group, packed_q, packed_d, masks,
               argmax=True, backward=True, tf32=None, npairs=None):
    """One random call against float64. ``tf32`` (fp32 calls on the TF32 tiles, which only calls
    of 2^24+ multiply-adds take): False the split-TF32 products, within 1e-6 and argmax equal up
    to near ties; True single TF32, within 3e-3 and argmax at a maximum up to 1e-2."""
    g = nd_or_group
    q, qo, ql, qm, max_lq = token_set(nq, Lq, D, dtype, packed_q, masks, lambda: rng.randint(0, Lq))
    ndocs = nq * g if layout == GROUPED else g
    d, do, dl, dm, _ = token_set(ndocs, Ld, D, dtype, packed_d, masks, lambda: rng.randint(0, Ld))
    pq = pd = None
    if layout == PAIRS:
        npairs = npairs or 3 * nq
        pq = torch.sort(torch.randint(0, nq, (npairs,), dtype=torch.int32)).values.cuda()
        pd = torch.randint(0, ndocs, (npairs,), dtype=torch.int32).cuda()
    if not packed_q:
        max_lq = Lq
    args = (q, d, qo, ql, qm, do, dl, dm, pq, pd, layout, g if layout == GROUPED else 0, max_lq)
    s, a = ops.fwd(*args, argmax, bool(tf32))
    rs, ra, pairs = ref_fwd(*args)
    err = rel(s.flatten(), rs)
    tol = 3e-3 if tf32 else 1e-6 if tf32 is not None else 1e-5
    flat = a.reshape(ra.shape) if argmax else a  # the reference's shape; bwd takes the op's
    if dtype != torch.float32:  # exact products: the float64 argmax itself
        arg_ok = not argmax or torch.equal(flat, ra)
    else:  # rounded fp32 sums may order near ties either way
        arg_ok = not argmax or argmax_bad(flat, ra, args, pairs, 1e-2 if tf32 else 1e-6) == 0
    ok = err <= tol and arg_ok
    mode = "" if tf32 is None else " tf32" if tf32 else " split-tf32"
    msg = (f"layout={layout} {str(dtype)[6:]}{mode} D={D} Lq={Lq} Ld={Ld} nq={nq} g={g} "
           f"pq={packed_q} pd={packed_d} m={masks} am={argmax}: err={err:.2e}")
    if not ok:
        bad = (flat != ra).sum().item() if argmax else 0
        print("FAIL", msg, f"argmax mismatches={bad}", flush=True)
        return False
    if backward and argmax:
        # positive upstream gradients: identical pairs with opposite-sign gradients would cancel
        # and turn fp32 rounding into a large relative error of a near-zero result
        grad = torch.rand(s.shape, device="cuda") + 0.5
        dq, dd = ops.bwd(grad, q, d, a, qo, do, pq, pd, layout, g if layout == GROUPED else 0)
        rdq, rdd = ref_bwd(grad.flatten(), q, d, flat, qo.tolist() if qo is not None else None,
                           do.tolist() if do is not None else None, pairs)
        e1, e2 = rel(dq.cpu(), rdq), rel(dd.cpu(), rdd)
        gtol = 1e-5 if dtype == torch.float32 else (2e-3 if dtype == torch.float16 else 1e-2)
        dq2, dd2 = ops.bwd(grad, q, d, a, qo, do, pq, pd, layout, g if layout == GROUPED else 0)
        same = torch.equal(dq, dq2) and torch.equal(dd, dd2)
        if e1 > gtol or e2 > gtol or not same:
            print("FAIL bwd", msg, f"dq={e1:.2e} dd={e2:.2e} deterministic={same}", flush=True)
            return False
    return True


# ---------------------------------------------------------------- packed against padded dD
def bits(x):
    """The tensor's bits as integers: NaN compares equal to a NaN of the same bits."""
    return x.contiguous().view({2: torch.int16, 4: torch.int32}[x.element_size()])


def same_bits(a, b):
    return a.shape == b.shape and torch.equal(bits(a), bits(b))


def packed_docs(D, lens, tail):
    """The padded documents' valid rows packed by offsets, then ``tail`` rows that no document
    holds (junk)."""
    rows = [D[j, : int(n)] for j, n in enumerate(lens.tolist())]
    rows.append(torch.randn(tail, D.shape[-1], device="cuda").to(D.dtype) * 30)
    off = torch.zeros(len(lens) + 1, dtype=torch.int32)
    off[1:] = lens.cpu().cumsum(0)
    return torch.cat(rows), off.cuda()


def check_packed_dd(ops, rng, layout, dtype, D_dim, Lq, lens, nq, g, nan=False):
    """The same documents padded (+ lengths) and packed (+ offsets): with the padded forward's
    argmax, both backward calls give bit-identical dQ and dD (packed rows against the padded
    documents' valid rows; padding and rows outside every document zero), deterministic, and
    within tolerance of float64 (without NaN). ``nan``: a NaN document token and a NaN upstream
    gradient, compared bit for bit."""
    nd, Ld = len(lens), max(1, max(lens))
    lens = torch.tensor(lens, dtype=torch.int32, device="cuda")
    Q = torch.randn(nq, Lq, D_dim, device="cuda").to(dtype)
    D = torch.randn(nd, Ld, D_dim, device="cuda")
    D[:, min(Ld - 1, 2)] *= 3  # a dominant token: many query rows pick the same row
    for k in range(nd):
        if int(lens[k]) > 40:  # a duplicate row: equal similarities, the lower index wins
            D[k, 40] = D[k, 39]
        D[k, int(lens[k]):] = float("nan") if k % 2 else 30.0  # padding: NaN or large values
    if nan and nd > 1 and int(lens[1]) > 0:
        D[1, int(lens[1]) - 1, 0] = float("nan")
    D = D.to(dtype)
    grp = g if layout == GROUPED else 0
    pq = pd = None
    if layout == PAIRS:
        pq = torch.sort(torch.randint(0, nq, (3 * nq,), dtype=torch.int32)).values.cuda()
        pd = torch.randint(0, nd, (3 * nq,), dtype=torch.int32).cuda()
    s, a = ops.fwd(Q, D, None, None, None, None, lens, None, pq, pd, layout, grp, Lq, True, False)
    grad = torch.rand(s.shape, device="cuda") + 0.5
    if nan:
        grad.view(-1)[0] = float("nan")
    Dp, off = packed_docs(D, lens, tail=rng.choice([0, 3]))
    dq1, dd1 = ops.bwd(grad, Q, D, a, None, None, pq, pd, layout, grp)
    dq2, dd2 = ops.bwd(grad, Q, Dp, a, None, off, pq, pd, layout, grp)
    dq3, dd3 = ops.bwd(grad, Q, Dp, a, None, off, pq, pd, layout, grp)
    valid = torch.arange(Ld, device="cuda")[None, :] < lens[:, None]
    total = int(off[-1])
    ok = (same_bits(dq1, dq2) and same_bits(dd1[valid], dd2[:total])
          and not bits(dd1[~valid]).any() and not bits(dd2[total:]).any()
          and same_bits(dq2, dq3) and same_bits(dd2, dd3))
    errs = ""
    if ok and not nan:
        pairs = pair_list(layout, nq, nd, grp, pq, pd)
        rdq, rdd = ref_bwd(grad.flatten(), Q, Dp[:total], a.reshape(len(pairs), Lq), None,
                           off.tolist(), pairs)
        e1, e2 = rel(dq2.cpu(), rdq), rel(dd2[:total].cpu(), rdd)
        gtol = 1e-5 if dtype == torch.float32 else (2e-3 if dtype == torch.float16 else 1e-2)
        ok = e1 <= gtol and e2 <= gtol
        errs = f" dq={e1:.2e} dd={e2:.2e}"
    if not ok:
        print(f"FAIL packed dd layout={layout} {str(dtype)[6:]} D={D_dim} Lq={Lq} nq={nq} g={g} "
              f"nan={nan} lens={lens.tolist()[:12]}{errs}", flush=True)
    return ok


def packed_dd_checks(ops, rng):
    """Packed documents' dD against the padded path, bit for bit: ragged lengths with 0 / 1 / 63
    / 64 / 65 rows, ties, NaN, every layout, each dtype; packed documents longer than the dD
    sort's counters (several passes: past the whole budget, and one long document among short
    ones) against the padded path's row-block kernel. Returns (passed, run)."""
    n_ok = n = 0
    for dtype in (torch.float16, torch.bfloat16, torch.float32):
        for layout in (ALL, GROUPED, PAIRS):
            for D_dim, Lq in ((128, 32), (64, 17), (24, 1), (100, 65)):
                nq, g = rng.choice([1, 3, 5]), rng.choice([1, 4, 7])
                nd = nq * g if layout == GROUPED else g + 2
                fixed = [0, 1, 63, 64, 65]
                lens = [fixed[k] if k < len(fixed) else rng.randint(0, 200) for k in range(nd)]
                rng.shuffle(lens)
                for nan in (False, True):
                    n += 1
                    n_ok += check_packed_dd(ops, rng, layout, dtype, D_dim, Lq, lens, nq, g, nan)
        n += 1  # 40,000 rows: several passes of the sort, and past the padded sort's rows
        n_ok += check_packed_dd(ops, rng, ALL, dtype, 128, 32, [20000, 5, 40000, 0], 4, 1)
        n += 1  # one long document among short ones: past the counters of the average's ranges
        n_ok += check_packed_dd(ops, rng, ALL, dtype, 128, 32, [1] * 40 + [3000], 4, 1)
    return n_ok, n


def contrastive_step_packed_checks(ops):
    """The training step with packed documents (the fused loss) equals fwd + ce + bwd on the
    same packed documents bit for bit, run after run, and float64 within tolerance."""
    n_ok = n = 0
    for dtype, nq, Lq, (lo, hi) in ((torch.float16, 32, 32, (40, 80)),
                                    (torch.bfloat16, 16, 128, (512, 1024)),
                                    (torch.float32, 9, 20, (1, 70))):
        lens = torch.randint(lo, hi + 1, (nq,), dtype=torch.int32)
        off = torch.zeros(nq + 1, dtype=torch.int32)
        off[1:] = lens.cumsum(0)
        off = off.cuda()
        Q = torch.nn.functional.normalize(torch.randn(nq, Lq, 128, device="cuda"), dim=-1)
        Dp = torch.nn.functional.normalize(torch.randn(int(off[-1]), 128, device="cuda"), dim=-1)
        Q, Dp = Q.to(dtype), Dp.to(dtype)
        t = torch.arange(nq, device="cuda")
        step = [ops.contrastive_step(Q, Dp, None, None, None, off, None, None, ALL, 0, Lq, t, 5.0)
                for _ in range(2)]
        s, a = ops.fwd(Q, Dp, None, None, None, off, None, None, None, None, ALL, 0, Lq, True,
                       False)
        loss, grad = ops.ce(s, t, 5.0)
        dq, dd = ops.bwd(grad, Q, Dp, a, None, off, None, None, ALL, 0)
        ok = all(same_bits(x, y) for x, y in zip(step[0], (loss, dq, dd)))
        ok = ok and all(same_bits(x, y) for x, y in zip(step[0], step[1]))
        pairs = pair_list(ALL, nq, nq, 0, None, None)
        rs, _, _ = ref_fwd(Q, Dp, None, None, None, off, None, None, None, None, ALL, 0, Lq)
        rloss = torch.nn.functional.cross_entropy(rs.double().view(nq, nq) * 5.0, t)
        e0 = abs(float(loss) - float(rloss)) / abs(float(rloss))
        _, rdd = ref_bwd(grad.flatten(), Q, Dp, a.reshape(len(pairs), Lq), None, off.tolist(),
                         pairs)
        e2 = rel(dd.cpu(), rdd)
        gtol = 1e-5 if dtype == torch.float32 else (2e-3 if dtype == torch.float16 else 1e-2)
        ok = ok and e0 <= 1e-3 and e2 <= gtol
        if not ok:
            print(f"FAIL contrastive_step packed {str(dtype)[6:]} nq={nq}: loss={e0:.2e} "
                  f"dd={e2:.2e}", flush=True)
        n, n_ok = n + 1, n_ok + ok
    return n_ok, n


# ---------------------------------------------------------------- every valid similarity -inf
# The op contract: a query token whose every product with the document's valid tokens is -inf
# (here [+inf, 0, ...] against tokens with a negative first entry) has the term -inf and the
# document's first valid token as its argmax; a document with no valid token still gives 0 and -1.
# Invalid document tokens (masked, past a length) hold a positive first entry, so a product of
# one of them (+inf) would win if it took part.
def rel_inf(a, b):
    """rel() over the finite entries, inf unless a and b hold the same Inf / NaN entries."""
    a, b = a.double().flatten().cpu(), b.double().flatten().cpu()
    fin = torch.isfinite(b)
    if not (torch.equal(torch.isfinite(a), fin) and torch.equal(a.isnan(), b.isnan())
            and torch.equal(a[a.isinf()], b[b.isinf()])):
        return float("inf")
    return rel(a[fin], b[fin]) if fin.any() else 0.0


def signed_first_entry(rows, valid, draw):
    """rows[:, 0] = -draw where valid, +draw elsewhere (draw > 0)."""
    rows[:, 0] = torch.where(valid, -draw, draw).to(rows.dtype)


def minus_inf_inputs(rng, layout, dtype, D, Lq, Ld, nq, g, packed_q, packed_d, masks, d_lengths,
                     codes, npairs):
    """Random queries with [+inf, 0, ...] rows (row 0 of every even query, ~30% of all rows) and
    documents signed as above (codes: 8-bit codes with fp32 scales). Documents 0 and 1 lose their
    first 40 tokens and every token to the mask, where there is one. Query 0 spans Lq rows (the
    tile is chosen by the longest query). Returns the queries, the op's document arguments (d,
    d_scale), the reference's (dequantized d) and the rest of fwd's arguments."""
    q_lens = iter([Lq] + [rng.randint(1, Lq) for _ in range(nq - 1)])
    q, qo, ql, qm, max_lq = token_set(nq, Lq, D, dtype, packed_q, masks, lambda: next(q_lens))
    ndocs = nq * g if layout == GROUPED else g
    d, do, dl, dm, _ = token_set(ndocs, Ld, D, torch.float32, packed_d, masks,
                                 lambda: rng.randint(0, Ld))
    dl = dl if d_lengths or packed_d else None
    if dm is not None:
        starts = do.tolist() if packed_d else [k * Ld for k in range(ndocs + 1)]
        flat_m = dm.view(-1)
        flat_m[starts[0]:min(starts[0] + 40, starts[1])] = False
        if ndocs > 1:
            flat_m[starts[1]:starts[2]] = False
    if qm is not None:
        qm.view(-1)[(qo[:-1].long() if packed_q else torch.arange(nq, device="cuda") * Lq)] = True
    valid = torch.cat([v for _, v in segments(d, do, dl, dm)])
    rows = d.view(-1, D)
    draw = torch.rand(rows.shape[0], device="cuda") + 0.5
    d_scale = None
    if codes is None:
        signed_first_entry(rows, valid, draw)
        d_op = d.to(dtype)
        d_ref = d_op
    else:
        if codes == "int8":
            c = torch.randint(-127, 128, rows.shape, device="cuda", dtype=torch.int8)
            signed_first_entry(c, valid, torch.randint(1, 128, draw.shape, device="cuda"))
        else:
            c = (torch.randn(rows.shape, device="cuda") * 2).clamp(-8, 8).to(torch.float8_e4m3fn)
            signed_first_entry(c, valid, draw * 4)
        scale = torch.rand(rows.shape[0], device="cuda") + 0.5
        d_op = c.view(d.shape)
        d_scale = scale.view(d.shape[:-1])
        d_ref = (c.double() * scale.double()[:, None]).view(d.shape)
    qrows = q.view(-1, D)
    inf_rows = torch.rand(qrows.shape[0], device="cuda") < 0.3
    firsts = qo[:-1:2].long() if packed_q else torch.arange(0, nq, 2, device="cuda") * Lq
    inf_rows[firsts] = True
    qrows[inf_rows] = 0
    qrows[inf_rows, 0] = float("inf")
    pq = pd = None
    if layout == PAIRS:  # query 0 (a [+inf, 0, ...] row 0) among them
        pq = torch.randint(0, nq, (npairs,), dtype=torch.int32)
        pq[0] = 0
        pq = torch.sort(pq).values.cuda()
        pd = torch.randint(0, ndocs, (npairs,), dtype=torch.int32).cuda()
    rest = (qo, ql, qm, do, dl, dm, pq, pd, layout, g if layout == GROUPED else 0,
            max_lq if packed_q else Lq)
    return q, d_op, d_scale, d_ref, rest


def minus_inf_entries(args, pairs):
    """[pairs, max_lq]: the argmax entries of valid [+inf, 0, ...] query rows against documents
    with a valid token, and how many of those entries have a first valid token past 0."""
    q, d, qo, ql, qm, do, dl, dm = args[:8]
    qs, ds = segments(q, qo, ql, qm), segments(d, do, dl, dm)
    e = torch.zeros(len(pairs), args[12], dtype=torch.bool, device=q.device)
    late = 0
    for p, (i, j) in enumerate(pairs):
        (qr, qv), (_, dv) = qs[i], ds[j]
        if dv.any():
            rows = ((qr[:, 0] == float("inf")) & qv)[: args[12]]
            e[p, : rows.numel()] = rows
            late += int(rows.sum()) if int(dv.long().argmax()) > 0 else 0
    return e, late


def check_minus_inf(ops, rng, tile, layout, dtype, D, Lq, Ld, nq, g, packed_q=False,
                    packed_d=False, masks=False, d_lengths=True, argmax=True, tf32=None,
                    codes=None, npairs=None):
    """One call of the -inf rule on the shape that takes `tile` on Hopper (the name is a label):
    scores and argmax against float64, the rule's entries exactly, and the gradient."""
    q, d, d_scale, d_ref, rest = minus_inf_inputs(rng, layout, dtype, D, Lq, Ld, nq, g, packed_q,
                                                  packed_d, masks, d_lengths, codes,
                                                  npairs or 3 * nq)
    if codes is None:
        s, a = ops.fwd(q, d, *rest, argmax, bool(tf32))
    else:
        s, a = ops.fwd_scaled(q, None, d, d_scale, *rest, argmax)
    args = (q, d_ref, *rest)
    rs, ra, pairs = ref_fwd(*args)
    err = rel_inf(s, rs)
    tol = 3e-3 if tf32 else 1e-6 if tf32 is not None else 1e-5
    entries, late = minus_inf_entries(args, pairs)
    n_inf = int((rs == float("-inf")).sum())
    msg = (f"-inf {tile}: layout={layout} {str(dtype)[6:]}{' ' + codes if codes else ''}"
           f"{'' if tf32 is None else ' tf32' if tf32 else ' split-tf32'} D={D} Lq={Lq} Ld={Ld} "
           f"nq={nq} g={g} pq={packed_q} pd={packed_d} m={masks} lengths={d_lengths} am={argmax}: "
           f"err={err:.2e}, {n_inf} -inf scores, {int(entries.sum())} rule entries ({late} past 0)")
    ok = err <= tol and n_inf > 0
    if ok and argmax:
        flat = a.reshape(ra.shape)
        rule_ok = torch.equal(flat[entries], ra[entries])
        others = argmax_bad(torch.where(entries, ra, flat), ra, args, pairs, 1e-2 if tf32 else 1e-6)
        ok = rule_ok and others == 0
        msg += f", rule argmax exact={rule_ok}, other argmax mismatches={others}"
    if ok and argmax and codes is None:
        grad = torch.rand(s.shape, device="cuda") + 0.5
        qo, do, pq, pd, layout_, group = rest[0], rest[3], rest[6], rest[7], rest[8], rest[9]
        dq, dd = ops.bwd(grad, q, d, a, qo, do, pq, pd, layout_, group)
        rdq, rdd = ref_bwd(grad.flatten(), q, d, flat, qo.tolist() if qo is not None else None,
                           do.tolist() if do is not None else None, pairs)
        e1, e2 = rel_inf(dq, rdq), rel_inf(dd, rdd)
        gtol = 1e-5 if dtype == torch.float32 else (2e-3 if dtype == torch.float16 else 1e-2)
        ok = e1 <= gtol and e2 <= gtol
        msg += f", dq={e1:.2e} dd={e2:.2e}"
    if not ok:
        print("FAIL", msg, flush=True)
    return ok


def minus_inf_cases():
    """(tile on Hopper, layout, dtype, D, Lq, Ld, nq, g, options) for every tensor-core tile (on
    other GPUs the same shapes take the mma.sync tiles): 16-bit rows, fp32 on the TF32 tiles
    (2^24+ multiply-adds), 8-bit codes against fp16 / bf16 queries. A mask without lengths takes
    the mask-extent path; "g" is the group (grouped) or the document count."""
    mask_only = dict(masks=True, d_lengths=False)
    cases = []
    for dt in (torch.float16, torch.bfloat16):
        cases += [
            ("wgmma_stream", GROUPED, dt, 128, 20, 150, 3, 4, dict(masks=True)),
            ("wgmma_stream", GROUPED, dt, 128, 20, 150, 3, 4, dict(mask_only, argmax=False)),
            ("wgmma_stream", PAIRS, dt, 128, 20, 150, 3, 4,
             dict(packed_q=True, packed_d=True, masks=True)),
            ("wgmma_deep", GROUPED, dt, 128, 16, 600, 2, 3, mask_only),
            ("wgmma_deep", ALL, dt, 128, 16, 600, 2, 3, dict(argmax=False)),
            ("mma_stream", ALL, dt, 96, 20, 70, 2, 5, dict(masks=True)),
            ("mma_stream", PAIRS, dt, 96, 20, 70, 3, 5, dict(packed_d=True, argmax=False)),
            ("mma_split", ALL, dt, 64, 50, 90, 2, 6, mask_only),
            ("mma_split", PAIRS, dt, 64, 50, 90, 3, 6, dict(packed_q=True, argmax=False)),
            ("mma_block", PAIRS, dt, 64, 130, 70, 2, 5, dict(masks=True)),  # two row tiles
            ("mma_block", ALL, dt, 64, 16, 70, 9, 11, dict(mask_only, argmax=False)),  # 8 queries
        ]
    cases += [
        ("wgmma_block", ALL, torch.float16, 128, 32, 1000, 32, 70, mask_only),
        ("wgmma_block", GROUPED, torch.bfloat16, 64, 200, 1024, 4, 70, dict(argmax=False)),
        ("wgmma_block", GROUPED, torch.float16, 64, 200, 1024, 4, 70, dict(masks=True)),
    ]
    for k, tf32 in enumerate((False, True)):
        f32 = torch.float32
        cases += [
            ("mma_stream", GROUPED, f32, 128, 32, 180, 5, 40, dict(masks=True, tf32=tf32)),
            ("mma_split", GROUPED, f32, 64, 50, 100, 3, 40, dict(mask_only, tf32=tf32)),
            ("mma_block", ALL, f32, 128, 16, 100, 9, 100, dict(argmax=k == 0, tf32=tf32)),
            ("mma_block", PAIRS, f32, 128, 130, 70, 2, 20,
             dict(packed_d=True, masks=True, tf32=tf32, npairs=200)),
            ("wgmma_converted", ALL, f32, 128, 32, 1000, 32, 70, dict(mask_only, tf32=tf32)),
            ("wgmma_converted", ALL, f32, 64, 32, 1000, 32, 70,
             dict(argmax=k == 1, packed_d=True, masks=True, tf32=tf32)),
        ]
    for fmt in ("int8", "e4m3"):
        for dt in (torch.float16, torch.bfloat16):
            scores = dict(argmax=False, codes=fmt)
            cases += [
                ("mma_stream", GROUPED, dt, 64, 20, 70, 3, 4, dict(masks=True, codes=fmt)),
                ("mma_codes", GROUPED, dt, 128, 32, 600, 2, 3, dict(mask_only, codes=fmt)),
                ("mma_codes", ALL, dt, 64, 32, 600, 2, 3, scores),
                ("warp_stream", GROUPED, dt, 128, 32, 150, 3, 4, dict(scores, masks=True)),
                ("warp_stream", ALL, dt, 128, 20, 150, 2, 6, dict(scores, **mask_only)),
                ("warp_stream", ALL, dt, 128, 20, 150, 2, 6,
                 dict(scores, packed_d=True, masks=True)),
                ("warp_stream", ALL, dt, 128, 20, 70, 2, 129, dict(scores, masks=True)),
                # documents of 512+ stored rows on average, of given lengths: four-warp blocks
                ("warp_stream_fine", GROUPED, dt, 128, 32, 1100, 2, 3, dict(scores, masks=True)),
                ("warp_stream_fine", GROUPED, dt, 128, 32, 600, 3, 100,
                 dict(scores, packed_d=True)),
                ("warp_stream_fine", ALL, dt, 128, 20, 600, 1, 140, dict(scores, masks=True)),
                ("warp_stream_fine", ALL, dt, 128, 20, 1100, 1, 150,
                 dict(scores, packed_d=True, masks=True)),
                ("mma_split", PAIRS, dt, 128, 50, 90, 3, 5, dict(masks=True, codes=fmt)),
                ("mma_block", PAIRS, dt, 64, 130, 70, 2, 5, scores),
            ]
        cases += [
            ("wgmma_converted", ALL, torch.float16, 128, 32, 1000, 32, 70, dict(mask_only, codes=fmt)),
            ("wgmma_converted", ALL, torch.bfloat16, 128, 32, 1000, 32, 70,
             dict(argmax=False, codes=fmt)),
        ]
    return cases


def run_checks(ops):
    import random
    rng = random.Random(0)
    torch.manual_seed(0)
    n_ok = n = 0
    t = time.time()
    cases = []
    for dtype in (torch.float16, torch.bfloat16, torch.float32):
        for layout in (ALL, GROUPED, PAIRS):
            for (D, Lq, Ld) in ((128, 32, 180), (64, 17, 65), (128, 128, 300), (24, 31, 33),
                                (100, 5, 40), (256, 40, 129), (128, 300, 70), (8, 1, 1),
                                (520, 5, 20), (128, 32, 1030), (64, 40, 600), (64, 20, 700),
                                (128, 1, 513)):
                for packed in ((False, False), (True, True), (False, True)):
                    cases.append((layout, dtype, D, Lq, Ld, packed))
    for (layout, dtype, D, Lq, Ld, (pq_, pd_)) in cases:
        for masks in (False, True):
            nq = rng.choice([1, 3, 5])
            g = rng.choice([1, 4, 7])
            n += 1
            n_ok += check_case(ops, rng, layout, dtype, D, Lq, Ld, nq, g, pq_, pd_, masks,
                               argmax=rng.random() < 0.8)
    # all-pairs with several short queries per row tile (the batched training layout; fp32: the
    # split-TF32 128-row tile)
    for dtype in (torch.float16, torch.bfloat16, torch.float32):
        for (nq, Lq, Ld) in ((33, 32, 80), (9, 16, 50), (6, 64, 129)):
            n += 1
            n_ok += check_case(ops, rng, ALL, dtype, 128, Lq, Ld, nq, 11, False, False, True)
            n += 1
            n_ok += check_case(ops, rng, ALL, dtype, 128, Lq, Ld, nq, 11, False, False, False,
                               argmax=False)
    # fp32 on the TF32 tensor-core tiles (calls of 2^24+ multiply-adds; at most 2,000 pairs for
    # the reference's loop): odd dims and lengths, long queries cut into row tiles, packed sets,
    # masks, explicit pairs, the two modes in turn
    turn = 0
    for (D, Lq, Ld, nq, g) in ((128, 32, 180, 5, 40), (64, 17, 65, 7, 100), (100, 5, 60, 9, 200),
                               (24, 31, 45, 11, 150), (256, 40, 129, 3, 60), (8, 64, 100, 5, 300),
                               (128, 300, 70, 2, 30), (128, 1, 513, 3, 200)):
        for layout in (ALL, GROUPED, PAIRS):
            for packed in ((False, False), (True, True), (False, True)):
                turn += 1
                n += 1
                n_ok += check_case(ops, rng, layout, torch.float32, D, Lq, Ld, nq, g, *packed,
                                   rng.random() < 0.5, argmax=rng.random() < 0.8, backward=False,
                                   tf32=turn % 2 == 0, npairs=nq * g)
    # fp32 all pairs with enough document tiles for the block tile (on Hopper the transposed
    # wgmma tile): both modes, both dims it takes, packed sets
    for D in (128, 64):
        for packed in ((False, False), (True, True), (False, True)):
            for tf32 in (False, True):
                n += 1
                n_ok += check_case(ops, rng, ALL, torch.float32, D, 32, 1000, 32, 70, *packed,
                                   rng.random() < 0.5, argmax=rng.random() < 0.7, backward=False,
                                   tf32=tf32)
    for more in (packed_dd_checks(ops, rng), contrastive_step_packed_checks(ops)):
        n_ok, n = n_ok + more[0], n + more[1]
    for (tile, layout, dtype, D, Lq, Ld, nq, g, opts) in minus_inf_cases():
        n += 1
        n_ok += check_minus_inf(ops, rng, tile, layout, dtype, D, Lq, Ld, nq, g, **opts)
    print(f"checks: {n_ok}/{n} passed in {time.time() - t:.1f} s", flush=True)
    return n_ok == n


def profile_run(ops):
    def norm(t):
        return torch.nn.functional.normalize(t.float(), dim=-1).to(torch.float16)
    Q = norm(torch.randn(16, 32, 128, device="cuda"))
    Dm = norm(torch.randn(2000, 1024, 128, device="cuda"))
    ops.fwd(Q, Dm, None, None, None, None, None, None, None, None, ALL, 0, 32, False, False)
    Q = norm(torch.randn(8, 32, 128, device="cuda"))
    Dm = norm(torch.randn(800, 1024, 128, device="cuda"))
    mask = torch.rand(800, 1024, device="cuda") > 0.1
    ops.fwd(Q, Dm, None, None, None, None, None, mask, None, None, GROUPED, 100, 32, False, False)
    Q = norm(torch.randn(128, 128, 128, device="cuda"))
    Dm = norm(torch.randn(128, 1024, 128, device="cuda"))
    s, a = ops.fwd(Q, Dm, None, None, None, None, None, None, None, None, ALL, 0, 128, True, False)
    ops.bwd(torch.randn_like(s), Q, Dm, a, None, None, None, None, ALL, 0)
    Q = norm(torch.randn(32, 32, 128, device="cuda"))
    Dm = norm(torch.randn(32, 80, 128, device="cuda"))
    s, a = ops.fwd(Q, Dm, None, None, None, None, None, None, None, None, ALL, 0, 32, True, False)
    ops.bwd(torch.randn_like(s), Q, Dm, a, None, None, None, None, ALL, 0)
    torch.cuda.synchronize()


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--no-check", action="store_true")
    ap.add_argument("--profile-run", action="store_true",
                    help="one call of each heavy kernel, for ncu")
    args = ap.parse_args()
    print(torch.cuda.get_device_name(), torch.__version__, torch.version.cuda, flush=True)
    ops = build()
    if args.profile_run:
        profile_run(ops)
        sys.exit(0)
    ok = True if args.no_check else run_checks(ops)
    sys.exit(0 if ok else 1)
