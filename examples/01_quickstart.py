"""Quickstart: rerank padded candidates, score them through the compatibility surface, take one
training step and check everything against the float64 reference.

    python examples/01_quickstart.py [--device cpu|cuda] [--quick]
"""

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

try:
    import maxsim
except ImportError:  # a source checkout without `pip install .`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "torch-ext"))
    import maxsim


def max_err(a, b):
    return (a.double() - b.double()).abs().max().item()


def make_batch(B, K, Lq, Ld, H, device, seed=0):
    """B queries with K candidates each; candidate ``relevant[b]`` starts with noisy copies of
    query b's tokens, so it should rank first. Padding holds random values, not zeros: it must
    not matter."""
    g = torch.Generator().manual_seed(seed)
    queries = F.normalize(torch.randn(B, Lq, H, generator=g), dim=-1)
    documents = F.normalize(torch.randn(B, K, Ld, H, generator=g), dim=-1)
    relevant = torch.randint(K, (B,), generator=g)
    for b in range(B):
        noisy = queries[b] + 2 * torch.randn(Lq, H, generator=g) / H**0.5
        documents[b, relevant[b], :Lq] = F.normalize(noisy, dim=-1)
    query_lengths = torch.randint(Lq // 2, Lq + 1, (B,), generator=g)
    doc_lengths = torch.randint(Lq, Ld + 1, (B, K), generator=g)  # >= Lq keeps the copies valid
    q_mask = torch.arange(Lq) < query_lengths[:, None]  # [B, Lq]
    d_mask = torch.arange(Ld) < doc_lengths[..., None]  # [B, K, Ld]
    return tuple(t.to(device) for t in
                 (queries, documents, q_mask, d_mask, query_lengths, doc_lengths, relevant))


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--quick", action="store_true", help="smaller shapes")
    p.add_argument("--out", default=str(Path(__file__).resolve().parent / "out"),
                   help="output folder (unused here; accepted like the other examples)")
    args = p.parse_args()
    device = torch.device(args.device)

    B, K, Lq, Ld, H = (2, 8, 16, 48, 64) if args.quick else (4, 32, 32, 180, 128)
    Q, D, q_mask, d_mask, q_len, d_len, relevant = make_batch(B, K, Lq, Ld, H, device)
    print(f"device {device}; queries {list(Q.shape)}, candidates {list(D.shape)}")

    # 1. Native surface: 4-D documents mean "K candidates per query" -> [B, K] fp32.
    scores = maxsim.maxsim(Q, D, q_mask, d_mask)
    top = scores.topk(3, dim=1)
    for b in range(B):
        ranked = ", ".join(f"#{i} ({s:.3f})" for s, i in zip(top.values[b].tolist(),
                                                             top.indices[b].tolist()))
        print(f"query {b}: top candidates {ranked}   relevant: #{relevant[b].item()}")

    # 2. Compatibility surface: prefix lengths instead of masks, same scores.
    compat = maxsim.score_candidates_padded(Q, D, q_len.to(torch.int32), d_len.to(torch.int32))
    print(f"score_candidates_padded vs maxsim: max |diff| = {max_err(compat, scores):.2e}")

    # 3. Reference: pure PyTorch, float64 inside.
    ref = maxsim.score_candidates_padded_reference(Q, D, q_len, d_len)
    print(f"scores vs float64 reference:       max |err|  = {max_err(scores, ref):.2e}")

    # 4. One training step: scores -> cross-entropy over the candidates -> backward.
    Qg = Q.clone().requires_grad_()
    Dg = D.clone().requires_grad_()
    loss = F.cross_entropy(maxsim.maxsim(Qg, Dg, q_mask, d_mask), relevant)
    loss.backward()
    print(f"loss {loss.item():.4f}; |dQ| = {Qg.grad.norm().item():.4f}, "
          f"|dD| = {Dg.grad.norm().item():.4f}")
    pad_grad = max(Qg.grad[~q_mask].abs().max().item(), Dg.grad[~d_mask].abs().max().item())
    winners = (Dg.grad.abs().sum(-1) > 0).sum().item()
    print(f"gradient on padding: {pad_grad:.1e}; document tokens with a gradient "
          f"(argmax winners): {winners} of {int(d_mask.sum())} valid")

    Qr = Q.double().requires_grad_()
    Dr = D.double().requires_grad_()
    ref_loss = F.cross_entropy(maxsim.score_candidates_padded_reference(Qr, Dr, q_len, d_len)
                               .double(), relevant)
    ref_loss.backward()
    grad_err = max(max_err(Qg.grad, Qr.grad), max_err(Dg.grad, Dr.grad))
    print(f"gradients vs float64 reference:    max |err|  = {grad_err:.2e}")


if __name__ == "__main__":
    main()
