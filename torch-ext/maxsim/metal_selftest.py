"""The known-answer check the Metal kernels pass on the device before any call uses them.

One case per dtype reaches every loop of the shaders: ragged query and document lengths, masks
with holes, packed documents, a NaN and an inf in valid document tokens and junk in invalid ones,
H = 136 (two staged chunks of dims), Ld up to 40 (three document tiles of 16) and Lq = 70 (three
query passes of 32), forward with argmax, then the backward. The answer is what the PyTorch path
gives on the same device. Similarities are built so that no two valid document tokens tie for a
query token (each token adds its own multiple of 1/4096 on dim 0), and every value is a multiple
of 1/4096 small enough that fp16, bf16 and fp32 hold it and every sum exactly: the answers must
match bit for bit.
"""

import torch

from . import fallback
from .layouts import ALLPAIRS

H, LQ, LD = 136, 70, 40
Q_LENGTHS = (70, 33, 0)  # three passes, two passes, an empty query
D_LENGTHS = (40, 17, 0, 31)  # three tiles, two tiles, an empty document, two tiles
DTYPES = (torch.float32, torch.float16, torch.bfloat16)


class SelfTestError(RuntimeError):
    """The Metal kernels gave an answer other than the PyTorch path's."""


def _tokens(n, length, generator):
    """``[n, length, H]`` values k/8 (|k| <= 4), dim 0 of token j set to j / 4096."""
    x = torch.randint(-4, 5, (n, length, H), generator=generator).float() / 8
    x[..., 0] = torch.arange(length).float() / 4096
    return x


def known_case(dtype, device):
    """fwd arguments: padded queries ``[3, 70, 136]`` and packed documents (4 segments)."""
    g = torch.Generator().manual_seed(20251)
    q = _tokens(len(Q_LENGTHS), LQ, g)
    q[..., 0] = 1.0  # weighs each document token's own tie-breaker
    q_mask = torch.rand(len(Q_LENGTHS), LQ, generator=g) < 0.9
    docs = _tokens(len(D_LENGTHS), LD, g)
    docs[0, 5, 7] = float("nan")  # a valid NaN: the first NaN wins those rows
    docs[3, 2, 9] = float("inf")  # a valid inf: +inf, -inf or NaN by the sign of q
    d = torch.cat([docs[i, :n] for i, n in enumerate(D_LENGTHS)])
    d_mask = torch.rand(d.size(0), generator=g) < 0.85
    d_mask[5] = d_mask[sum(D_LENGTHS[:3]) + 2] = True  # the NaN and the inf stay valid
    d = torch.where(d_mask[:, None], d, torch.full_like(d, 1e4))  # junk where masked
    d[3] = float("nan")  # masked NaN: ignored
    d_mask[3] = False
    d_offsets = torch.tensor((0,) + D_LENGTHS).cumsum(0).int()
    q_lengths = torch.tensor(Q_LENGTHS, dtype=torch.int32)
    q = torch.where(torch.arange(LQ)[None, :, None] < q_lengths[:, None, None], q, -3e4)
    on = [t.to(device) for t in (q.to(dtype), d.to(dtype), q_lengths, q_mask, d_offsets, d_mask)]
    q, d, q_lengths, q_mask, d_offsets, d_mask = on
    return (q, d, None, q_lengths, q_mask, d_offsets, None, d_mask, None, None, ALLPAIRS, 0, LQ,
            True, False)


def _same(name, got, want):
    if got.shape != want.shape or got.dtype != want.dtype:
        raise SelfTestError(f"{name}: got {got.dtype} {tuple(got.shape)}, "
                            f"expected {want.dtype} {tuple(want.shape)}")
    g, w = got.cpu(), want.cpu()
    same = (g == w) | (g.isnan() & w.isnan()) if g.is_floating_point() else g == w
    if not bool(same.all()):
        bad = (~same).nonzero()[0].tolist()
        raise SelfTestError(f"{name}: {int((~same).sum())} of {same.numel()} values differ, "
                            f"first at {bad}: got {g[tuple(bad)].item()}, "
                            f"expected {w[tuple(bad)].item()}")


def check(lib, device, launch_fwd, launch_bwd):
    """Run the known case for every dtype through ``launch_fwd`` / ``launch_bwd`` on ``lib``;
    raise :class:`SelfTestError` on the first value that differs from the PyTorch path."""
    for dtype in DTYPES:
        name = str(dtype).removeprefix("torch.")
        args = known_case(dtype, device)
        scores, argmax = launch_fwd(lib, *args[:-1])
        want_scores, want_argmax = fallback.fwd(*args)
        _same(f"{name} forward scores", scores, want_scores)
        _same(f"{name} forward argmax", argmax, want_argmax)
        grad = (torch.arange(scores.numel()).float().view(scores.shape) % 7 - 3) / 4
        bwd_args = (grad.to(device), args[0], args[1], want_argmax, args[2], args[5], None, None,
                    ALLPAIRS, 0)
        dq, dd = launch_bwd(lib, *bwd_args)
        want_dq, want_dd = fallback.bwd(*bwd_args)
        _same(f"{name} backward dQ", dq, want_dq)
        _same(f"{name} backward dD", dd, want_dd)
