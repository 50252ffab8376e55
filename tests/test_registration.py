"""The ops are proper torch.library ops: opcheck passes on ``fwd`` and ``bwd`` of every namespace,
and torch.compile(fullgraph=True) goes through forward and backward without a graph break."""

import maxsim
import pytest
import torch
from conftest import op_args, ops_for, token_set, values
from maxsim.layouts import ALLPAIRS, GROUPED, PAIRS
from maxsim.schemas import SCHEMAS, FwdArgs

CASES = {
    "allpairs-padded": ("padded", "padded", ALLPAIRS),
    "grouped-padded-packed": ("padded", "packed", GROUPED),
    "pairs-packed": ("packed", "packed", PAIRS),
    "allpairs-packed-padded": ("packed", "padded", ALLPAIRS),
}


@pytest.mark.parametrize("op", sorted(SCHEMAS))
def test_ops_define_the_schemas_of_the_header(backend_device, op):
    """Every namespace, the C++ extension's included, defines its ops from maxsim/schemas.h."""
    ops = ops_for(backend_device)
    if not hasattr(ops, op):
        pytest.skip(f"{op}: not defined on this namespace (the CUDA extension's only)")
    schema = getattr(ops, op).default._schema
    assert str(schema).split("::", 1)[1] == SCHEMAS[op]
    if op == "fwd":
        assert FwdArgs._fields == tuple(argument.name for argument in schema.arguments)


def sample(case, device, dtype=torch.float16, with_argmax=True):
    q_kind, d_kind, layout = CASES[case]
    q = token_set(q_kind, 3, 5, 8, dtype, device)
    d = token_set(d_kind, 6, 7, 8, dtype, device)
    extra = {}
    if layout == GROUPED:
        extra["group"] = 2
    if layout == PAIRS:
        extra = dict(
            pair_q=torch.tensor([0, 2, 2, 1], device=device),
            pair_d=torch.tensor([5, 0, 1, 5], device=device),
        )
    return op_args(q, d, layout, with_argmax=with_argmax, **extra)


@pytest.mark.parametrize("with_argmax", [True, False])
@pytest.mark.parametrize("case", list(CASES))
def test_opcheck_fwd(backend_device, case, with_argmax):
    ops = ops_for(backend_device)
    args = list(sample(case, backend_device[1], with_argmax=with_argmax))
    args[0].requires_grad_(with_argmax)
    args[1].requires_grad_(with_argmax)
    torch.library.opcheck(ops.fwd.default, tuple(args))


@pytest.mark.parametrize("case", list(CASES))
def test_opcheck_bwd(backend_device, case):
    ops = ops_for(backend_device)
    args = sample(case, backend_device[1])
    scores, argmax = ops.fwd(*args)
    q, d, q_off, _, _, d_off, _, _, pq, pd, layout, group = args[:12]
    grad = torch.randn_like(scores)
    torch.library.opcheck(
        ops.bwd.default, (grad, q, d, argmax, q_off, d_off, pq, pd, layout, group)
    )


def test_opcheck_ce(backend_device):
    ops = ops_for(backend_device)
    device = backend_device[1]
    scores = values((4, 6), torch.float32, device).requires_grad_()
    for targets in (None, torch.tensor([5, 0, 2, 2], device=device)):
        torch.library.opcheck(ops.ce.default, (scores, targets, 2.0))


@pytest.mark.parametrize("case", ["allpairs-padded", "grouped-padded-packed"])
def test_opcheck_contrastive_step(backend_device, case):
    ops = ops_for(backend_device)
    args = sample(case, backend_device[1])
    q, d, q_off, q_len, q_mask, d_off, d_len, d_mask = args[:8]
    layout, group, max_lq = args[10:13]
    cols = d.size(0) if layout == ALLPAIRS else group
    targets = torch.arange(q.size(0), device=q.device) % cols  # both cases have padded queries
    torch.library.opcheck(
        ops.contrastive_step.default,
        (q, d, q_off, q_len, q_mask, d_off, d_len, d_mask, layout, group, max_lq, targets, 1.0),
    )


def compiled_matches_eager(fn, inputs, backend="aot_eager"):
    """Forward and backward of ``fn(*inputs)`` compiled with fullgraph=True equal eager."""
    leaves = [x.detach().clone().requires_grad_() for x in inputs]
    compiled = torch.compile(fn, fullgraph=True, backend=backend)
    out = compiled(*leaves)
    out.square().sum().backward()
    eager_leaves = [x.detach().clone().requires_grad_() for x in inputs]
    expected = fn(*eager_leaves)
    expected.square().sum().backward()
    torch.testing.assert_close(out, expected)
    for got, want in zip(leaves, eager_leaves, strict=True):
        torch.testing.assert_close(got.grad, want.grad)


def native_calls(backend, device):
    Q = values((3, 5, 16), torch.float32, device)
    D = values((4, 6, 16), torch.float32, device)
    D4 = values((3, 2, 6, 16), torch.float32, device)
    q_mask = torch.rand(3, 5, device=device) > 0.3
    d_mask = torch.rand(4, 6, device=device) > 0.3
    q_off = torch.tensor([0, 2, 2, 7], dtype=torch.int32, device=device)
    d_off = torch.tensor([0, 3, 9, 10], dtype=torch.int32, device=device)
    pq, pd = torch.tensor([0, 2, 1], device=device), torch.tensor([1, 1, 2], device=device)
    q_len = torch.tensor([5, 0, 2], device=device)
    d_len = torch.tensor([[6, 1], [3, 0], [2, 6]], device=device)
    return {
        "maxsim": (
            lambda Q, D: maxsim.maxsim(Q, D, q_mask, d_mask, normalize=True, backend=backend),
            (Q, D),
        ),
        "maxsim 4-D": (lambda Q, D: maxsim.maxsim(Q, D, backend=backend), (Q, D4)),
        "maxsim plain lengths": (  # int32 lengths and bool masks: the short path
            lambda Q, D: maxsim.maxsim(
                Q, D, q_mask, q_lengths=q_len.int(), d_lengths=d_len.int(), backend=backend
            ),
            (Q, D4),
        ),
        "maxsim_pairs": (lambda Q, D: maxsim.maxsim_pairs(Q, D, backend=backend), (Q, D[:3])),
        "scorer": (maxsim.MaxSimScorer(backend=backend), (Q, D)),
        "maxsim_varlen": (
            lambda q, d: maxsim.maxsim_varlen(q, q_off, d, d_off, max_seqlen_q=5, backend=backend),
            (Q.reshape(-1, 16)[:7], D.reshape(-1, 16)[:10]),
        ),
        "score_candidates_padded": (
            lambda Q, D: maxsim.score_candidates_padded(Q, D, q_len, d_len, backend=backend),
            (Q, D4),
        ),
        "score_candidates_padded int32": (
            lambda Q, D: maxsim.score_candidates_padded(
                Q, D, q_len.int(), d_len.int(), backend=backend
            ),
            (Q, D4),
        ),
        "score_contrastive": (
            lambda Q, d: maxsim.score_contrastive(Q, d, d_off, backend=backend),
            (Q, D.reshape(-1, 16)[:10]),
        ),
        "contrastive_loss": (
            lambda Q, D: maxsim.contrastive_loss(
                Q, D, d_mask=d_mask, temperature=0.5, backend=backend
            ),
            (Q, D),
        ),
        "score_pairs_packed": (
            lambda q, d: maxsim.score_pairs_packed(
                q, q_off, d, d_off, pq, pd, max_q_len=5, backend=backend
            ),
            (Q.reshape(-1, 16)[:7], D.reshape(-1, 16)[:10]),
        ),
    }


@pytest.mark.parametrize("name", list(native_calls("torch", "cpu")))
def test_compile_fullgraph_forward_and_backward(backend_device, name):
    backend, device = backend_device
    torch._dynamo.reset()
    fn, inputs = native_calls(backend, device)[name]
    compiled_matches_eager(fn, inputs)


@pytest.mark.slow
# inductor's first import defines torch.utils.mkldnn's classes with torch.jit.script_method,
# which warns from inside torch: not ours to fix
@pytest.mark.filterwarnings("ignore:.*torch.jit.script_method.*:DeprecationWarning")
def test_compile_fullgraph_inductor(backend_device):
    backend, device = backend_device
    torch._dynamo.reset()
    fn, inputs = native_calls(backend, device)["maxsim 4-D"]
    compiled_matches_eager(fn, inputs, backend="inductor")


def test_compile_with_batch_strided_inputs(backend_device):
    """Fake kernels promise the strides the real ones produce, also for permuted inputs."""
    backend, device = backend_device
    torch._dynamo.reset()
    Q = values((5, 3, 16), torch.float32, device).transpose(0, 1)  # [3, 5, 16], last dim contiguous
    D = values((6, 4, 16), torch.float32, device).transpose(0, 1)
    compiled_matches_eager(lambda Q, D: maxsim.maxsim(Q, D, backend=backend) * 2, (Q, D))
