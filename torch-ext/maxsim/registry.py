"""The op pair ``fwd`` / ``bwd``: the pure-PyTorch namespace, and the fake kernels and autograd
formula that every namespace (this one and the CUDA extension's) shares.

Schemas: schemas.h (read by schemas.py); semantics: docs/ARCHITECTURE.md.
"""

import functools

import torch

from . import fallback
from .layouts import scores_shape
from .schemas import BWD_SCHEMA, CE_SCHEMA, FWD_SCHEMA, STEP_SCHEMA, FwdArgs

NAMESPACE = "maxsim_torch"


def _fwd_fake(*args):
    a = FwdArgs(*args)
    shape = scores_shape(a.q, a.d, a.q_offsets, a.d_offsets, a.pair_q, a.layout, a.group)
    scores = a.q.new_empty(shape, dtype=torch.float32)
    argmax = a.q.new_empty((*shape, a.max_lq) if a.with_argmax else (0,), dtype=torch.int32)
    return scores, argmax


def _fwd_scaled_fake(q, q_scale, d, d_scale, *rest):
    return _fwd_fake(q, d, *rest, False)


def _bwd_fake(grad, q, d, argmax, q_offsets, d_offsets, pair_q, pair_d, layout, group):
    # Contiguous like the real kernels' outputs, whatever the strides of q and d.
    return (
        torch.empty_like(q, memory_format=torch.contiguous_format),
        torch.empty_like(d, memory_format=torch.contiguous_format),
    )


def _ce_fake(scores, targets, scale):
    return (
        scores.new_empty((), dtype=torch.float32),
        torch.empty_like(scores, dtype=torch.float32, memory_format=torch.contiguous_format),
    )


def _step_fake(q, d, q_offsets, q_lengths, q_mask, d_offsets, d_lengths, d_mask, layout, group,
               max_lq, targets, scale):
    return (q.new_empty((), dtype=torch.float32),) + _bwd_fake(None, q, d, *([None] * 7))


def _setup_context(ctx, inputs, output):
    a = FwdArgs(*inputs)
    ctx.layout, ctx.group, ctx.with_argmax = a.layout, a.group, a.with_argmax
    # q and d are inputs (no copy); the argmax is the only tensor fwd adds for backward.
    ctx.save_for_backward(a.q, a.d, output[1], a.q_offsets, a.d_offsets, a.pair_q, a.pair_d)


def _backward_through(ops):
    """The autograd formula of ``fwd``, routed through the ``bwd`` op of the same namespace."""

    def backward(ctx, grad_scores, grad_argmax):
        if not ctx.with_argmax:
            raise RuntimeError(
                "fwd: backward needs the argmax, but fwd ran with with_argmax=False; "
                "call it with with_argmax=True when an input requires grad"
            )
        q, d, argmax, q_offsets, d_offsets, pair_q, pair_d = ctx.saved_tensors
        dq, dd = ops.bwd(
            grad_scores.float().contiguous(),
            q,
            d,
            argmax,
            q_offsets,
            d_offsets,
            pair_q,
            pair_d,
            ctx.layout,
            ctx.group,
        )
        needs = ctx.needs_input_grad
        return (dq if needs[0] else None, dd if needs[1] else None) + (None,) * (
            len(FwdArgs._fields) - 2
        )

    return backward


def _ce_setup_context(ctx, inputs, output):
    ctx.save_for_backward(output[1])


def _ce_backward(ctx, grad_loss, grad_grad):
    (grad,) = ctx.saved_tensors
    return grad * grad_loss, None, None


def register_fakes(namespace: str) -> None:
    """Register the fake kernels of the ops on ``namespace``."""
    torch.library.register_fake(f"{namespace}::fwd", _fwd_fake)
    torch.library.register_fake(f"{namespace}::bwd", _bwd_fake)
    if hasattr(getattr(torch.ops, namespace), "fwd_scaled"):  # CUDA extension only
        torch.library.register_fake(f"{namespace}::fwd_scaled", _fwd_scaled_fake)
    torch.library.register_fake(f"{namespace}::ce", _ce_fake)
    torch.library.register_fake(f"{namespace}::contrastive_step", _step_fake)


def register_autograd(namespace: str) -> None:
    """Register the autograd formulas of ``fwd`` and ``ce`` on ``namespace`` (the CUDA extension
    registers the same formulas in C++)."""
    torch.library.register_autograd(
        f"{namespace}::fwd",
        _backward_through(getattr(torch.ops, namespace)),
        setup_context=_setup_context,
    )
    torch.library.register_autograd(
        f"{namespace}::ce", _ce_backward, setup_context=_ce_setup_context
    )


def _exact(fn):
    """``fn`` with autocast off inside: the fallback's own matmuls must keep their fp32 arithmetic
    when the caller runs under autocast (the inputs were already cast by then)."""

    @functools.wraps(fn)
    def run(*args):
        with torch.autocast(device_type=args[0].device.type, enabled=False):
            return fn(*args)

    return run


def _define_torch_namespace():
    """Define ``torch.ops.maxsim_torch`` once per process (another package copy reuses it)."""
    if hasattr(torch.ops.maxsim_torch, "fwd"):
        return None
    library = torch.library.Library(NAMESPACE, "DEF")
    library.define(FWD_SCHEMA)
    library.define(BWD_SCHEMA)
    library.impl("fwd", _exact(fallback.fwd), "CompositeExplicitAutograd")
    library.define(CE_SCHEMA)
    library.impl("bwd", _exact(fallback.bwd), "CompositeExplicitAutograd")
    library.define(STEP_SCHEMA)
    library.impl("ce", _exact(fallback.ce), "CompositeExplicitAutograd")
    library.impl(
        "contrastive_step", _exact(fallback.contrastive_step), "CompositeExplicitAutograd"
    )
    register_fakes(NAMESPACE)
    register_autograd(NAMESPACE)
    return library


_LIBRARY = _define_torch_namespace()  # kept alive: dropping the Library would unregister the ops
torch_ops = torch.ops.maxsim_torch
