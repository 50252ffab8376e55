"""The README's example as users run it: load maxsim as a Hub kernel, score, and use its layers.

    python scripts/readme_example.py            # this checkout's build/ (scripts/build_variant.py)
    python scripts/readme_example.py --hub      # get_kernel("maxsim/maxsim", version=2)
"""

import argparse
from pathlib import Path

import torch
from kernels import get_kernel, get_local_kernel

ROOT = Path(__file__).resolve().parent.parent


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hub", action="store_true", help="load from the Hub, not build/")
    parser.add_argument("--build", type=Path, default=ROOT / "build", help="the variants' folder")
    args = parser.parse_args()
    if args.hub:
        maxsim = get_kernel("maxsim/maxsim", version=2, trust_remote_code=True)
    else:
        maxsim = get_local_kernel(args.build, trust_remote_code=True)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    torch.manual_seed(0)

    # Rerank: each of 4 queries (32 tokens) against its own 50 candidates of up to 180 tokens.
    Q = torch.nn.functional.normalize(torch.randn(4, 32, 128, device=device), dim=-1).to(dtype)
    D = torch.nn.functional.normalize(torch.randn(4, 50, 180, 128, device=device), dim=-1).to(dtype)
    d_lengths = torch.randint(90, 181, (4, 50), device=device)
    scores = maxsim.maxsim(Q, D, d_lengths=d_lengths)  # [4, 50] fp32
    valid = torch.arange(180, device=device) < d_lengths[..., None]
    sims = torch.einsum("bid,bkjd->bkij", Q.float(), D.float()).masked_fill(
        ~valid[:, :, None, :], float("-inf")
    )
    expected = sims.amax(-1).sum(-1)
    print(f"rerank {tuple(scores.shape)} max |error| {(scores - expected).abs().max().item():.2e}")
    print("top-3 candidates per query:", scores.topk(3).indices.tolist())

    # sentence-transformers' layer: every query against every document, masks as its scorer
    # passes them; a document without a valid token scores -1e9.
    docs, doc_mask = D[0, :8], valid[0, :8].clone()
    doc_mask[7] = False
    layer_scores = maxsim.layers.MaxSim()(Q, docs, None, doc_mask)
    print("layers.MaxSim", tuple(layer_scores.shape), "empty document:", layer_scores[0, 7].item())


if __name__ == "__main__":
    main()
