"""Adapters for the peers' PyPI packages: ``flash-maxsim`` 0.3.0 and ``late-interaction-kernels``
0.4.5. Each workload goes to the peer's entry point that computes the same function in one call;
where none does, the row says ``unsupported`` and why. Lengths and masks: each peer gets the
padding information in the form its API takes (flash-maxsim: per-document lengths;
late-interaction-kernels: boolean masks). Work a peer's API makes the caller do (replicating
queries, say) is inside the timed call."""

from __future__ import annotations

from importlib import metadata

import torch
from impls import Impl
from workloads import Unsupported, train_step


def _dist_version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


class _Peer(Impl):
    peer = True
    dist = ""

    def version(self):
        return _dist_version(self.dist)


class FlashMaxsim(_Peer):
    """flash-maxsim through its autograd-aware entry points.

    rerank   flash_maxsim_batched(Q, D[B,K,Ld,H], doc_lengths=[B*K], shared_docs=False): one
             launch. (Its score_candidates_padded look-alike, flash_maxsim_rerank_padded, loops
             over queries in Python whenever lengths differ, so it is not used.)
    allpairs flash_maxsim_batched(Q, D, doc_lengths=[Nd], shared_docs=True).
    varlen   flash_maxsim_varlen scores pair i = (query segment i, document segment i), so each
             query is replicated once per candidate (index_select, timed) before the call.
    train    flash_maxsim_batched_train(Q, D, shared_docs=True, doc_lengths=[Nb]).
    int8     flash_maxsim_int8_symmetric(Q[Lq, H], D_int8, scales fp16, doc_lengths) scores one
             query per call: one call per query (its scales converted to fp16 outside the timing).
             With int8 queries too, flash_maxsim_int8x8 (INT8 x INT8 tensor cores) with the same
             codes and fp16 scales. It has no FP8 path.
    """

    name = "flash-maxsim"
    module = "flash_maxsim"
    dist = "flash-maxsim"

    def path(self, case):
        return "per-query loop" if case.params.get("quant") else super().path(case)

    def bind(self, case, s):
        fm, meta, kind = self.mod, case.meta, case.kind.name
        if case.params.get("holes"):
            raise Unsupported("flash-maxsim takes prefix lengths only; these masks have holes")
        if "D_codes" in s:
            if case.params["quant"] != "int8":
                raise Unsupported("flash-maxsim has no FP8 path (INT8 only)")
            Q, codes, scales = s["Q"], s["D_codes"], s["D_scale"].half()
            lens, f = meta["d_len"], fm.flash_maxsim_int8_symmetric
            if "Q_codes" in s:
                q8, q_sc, f8 = s["Q_codes"], s["Q_scale"].half(), fm.flash_maxsim_int8x8
                if kind == "rerank":
                    return lambda: torch.stack(
                        [f8(Q[b], codes[b], scales[b], Q_int8=q8[b], q_scales=q_sc[b],
                            doc_lengths=lens[b]) for b in range(Q.size(0))])
                return lambda: torch.stack(
                    [f8(Q[i], codes, scales, Q_int8=q8[i], q_scales=q_sc[i], doc_lengths=lens)
                     for i in range(Q.size(0))])
            if kind == "rerank":
                return lambda: torch.stack(
                    [f(Q[b], codes[b], scales[b], doc_lengths=lens[b]) for b in range(Q.size(0))])
            return lambda: torch.stack(
                [f(Q[i], codes, scales, doc_lengths=lens) for i in range(Q.size(0))])
        if kind == "rerank":
            lens = meta["d_len"].reshape(-1)
            return lambda: fm.flash_maxsim_batched(s["Q"], s["D"], doc_lengths=lens,
                                                   shared_docs=False)
        if kind == "allpairs":
            return lambda: fm.flash_maxsim_batched(s["Q"], s["D"], doc_lengths=meta["d_len"],
                                                   shared_docs=True)
        if kind == "varlen":
            Nq, K = case.params["Nq"], case.params["K"]
            rows, cu_rep = meta["rep_rows"], meta["cu_q_rep"]

            def call():
                q_rep = s["q"].index_select(0, rows)
                out = fm.flash_maxsim_varlen(q_rep, s["d"], cu_rep, meta["cu_d"], meta["max_q"],
                                             meta["max_d"])
                return out.view(Nq, K)

            return call
        if kind == "train":
            Q, D = s["Q"], s["D"]
            f = fm.flash_maxsim_batched_train
            return lambda: train_step(
                lambda: f(Q, D, shared_docs=True, doc_lengths=meta["d_len"]), Q, D,
                meta["targets"])
        raise Unsupported(f"no flash-maxsim entry point for kind {kind!r}")


class FlashMaxsimFused(_Peer):
    """flash-maxsim's fused training step, colbert_contrastive_step(Q, D): MaxSim, mean
    cross-entropy with diagonal targets and backward in one kernel, accumulating into Q.grad and
    D.grad. It takes fixed-length documents only (no lengths or masks) and Lq <= 32."""

    name = "flash-maxsim-fused"
    module = "flash_maxsim.flash_maxsim_contrastive"
    dist = "flash-maxsim"
    kinds = ("train",)
    train_path = "fused step"

    def bind(self, case, s):
        p, meta = case.params, case.meta
        if meta["valid_d"] != p["Nb"] * p["Ld"]:
            raise Unsupported("colbert_contrastive_step takes fixed-length documents only (no "
                              "lengths or masks); these documents have random lengths")
        if p["Lq"] > 32:
            raise Unsupported(f"colbert_contrastive_step takes Lq <= 32, this row has {p['Lq']}")
        step = self.mod.colbert_contrastive_step
        Q, D = s["Q"], s["D"]

        def call():
            Q.grad = None
            D.grad = None
            step(Q, D)
            dq, dd = Q.grad, D.grad
            Q.grad = None
            D.grad = None
            return dq, dd

        return call


class LateInteractionKernels(_Peer):
    """late-interaction-kernels through its autograd-aware entry points, boolean masks.

    rerank   maxsim(Q, D[B,K,Ld,H], d_mask=[B,K,Ld]) (the 4-D per-query-candidates layout, one
             launch; what PyLate's colbert_kd_scores maps to).
    allpairs maxsim(Q, D, d_mask=[Nd,Ld]).
    varlen   late_interaction_kernels.score_pairs.score_pairs_packed with the pair lists (query
             i, document i*K+k) built once outside the timed call; maxsim_varlen would score all
             Nq x Nd pairs.
    train    maxsim(Q, D, d_mask) with its default backward (no fused training step exists).
    fp8      late_interaction_kernels.fp8.maxsim_inference_fp8 takes FP8 queries and documents
             with per-token scales and scores all pairs: one call per query for per-query
             candidates (queries quantized with its quantize_fp8_per_token outside the timing).
             It has no INT8 path.
    """

    name = "late-interaction-kernels"
    module = "late_interaction_kernels"
    dist = "late-interaction-kernels"

    def path(self, case):
        loop = case.params.get("quant") and case.kind.name == "rerank"
        return "per-query loop" if loop else super().path(case)

    def bind(self, case, s):
        lik, meta, kind = self.mod, case.meta, case.kind.name
        if "D_codes" in s:
            if case.params["quant"] != "fp8":
                raise Unsupported("late-interaction-kernels has no INT8 path (FP8 only)")
            if "Q_codes" in s:
                raise Unsupported("late-interaction-kernels has no INT8 queries")
            from late_interaction_kernels import fp8

            q8, q_scale = fp8.quantize_fp8_per_token(s["Q"])
            codes, scale, mask = s["D_codes"], s["D_scale"], meta["d_mask"]
            if kind == "rerank":
                return lambda: torch.cat([
                    fp8.maxsim_inference_fp8(q8[b:b + 1], codes[b], scale_Q=q_scale[b:b + 1],
                                             scale_D=scale[b], d_mask=mask[b])
                    for b in range(q8.size(0))])
            return lambda: fp8.maxsim_inference_fp8(q8, codes, scale_Q=q_scale, scale_D=scale,
                                                    d_mask=mask)
        if kind in ("rerank", "allpairs"):
            return lambda: lik.maxsim(s["Q"], s["D"], d_mask=meta["d_mask"])
        if kind == "varlen":
            from late_interaction_kernels.score_pairs import score_pairs_packed

            Nq, K = case.params["Nq"], case.params["K"]
            return lambda: score_pairs_packed(
                s["q"], s["d"], meta["cu_q"], meta["cu_d"], meta["pair_q"], meta["pair_d"],
                max_seqlen_q=meta["max_q"], max_seqlen_d=meta["max_d"]).view(Nq, K)
        if kind == "train":
            Q, D = s["Q"], s["D"]
            return lambda: train_step(lambda: lik.maxsim(Q, D, d_mask=meta["d_mask"]), Q, D,
                                      meta["targets"])
        raise Unsupported(f"no late-interaction-kernels entry point for kind {kind!r}")


PEERS = (FlashMaxsim, FlashMaxsimFused, LateInteractionKernels)
