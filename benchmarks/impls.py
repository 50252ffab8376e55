"""The implementations the harness measures: ``maxsim`` (this package) and ``naive`` (plain
PyTorch). The peers live in peers.py. Each implementation binds one input set of a ``Case`` to a
zero-argument callable that returns the scores (inference) or ``(dQ, dD)`` (training step)."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from typing import Callable

import torch

from workloads import Case, Unsupported, floor_scores, train_step

REPO = Path(__file__).resolve().parent.parent


def on_cuda(case: Case) -> bool:
    return next(iter(case.sets[0].values())).is_cuda


class Impl:
    name = ""
    peer = False
    kinds: tuple = ("rerank", "allpairs", "varlen", "train")
    module = ""  # the package this implementation imports, on first use ("" for none)
    counts_memory = True  # False where the call's memory is held outside the caching allocator
    stand_in = False  # True: computes something else (a floor of the call's cost), not checked
    # How a training row gets its gradients: "fused step" (one op, no autograd graph), "autograd",
    # "graph replay"; ratios compare rows of one path only.
    train_path = "autograd"

    def applies(self, case: Case) -> bool:
        """False: this implementation has no row at all for the workload (not even unsupported)."""
        return True

    def path(self, case: Case) -> str:
        """How this row computes its result, for like-with-like ratios (see ``train_path``)."""
        return self.train_path if case.kind.train else "one call"

    def _import(self):
        return importlib.import_module(self.module)

    @property
    def mod(self):
        """The imported package, or None (the failure is kept for ``unavailable``)."""
        if self.module and not hasattr(self, "_mod"):
            self._mod, self._err = None, None
            try:
                self._mod = self._import()
            except Exception as e:  # noqa: BLE001 - any import failure means "not available"
                self._err = f"{type(e).__name__}: {e}"
        return getattr(self, "_mod", None)

    def unavailable(self) -> str | None:
        """None when usable here, else why not (its rows are then left out)."""
        if not self.module or self.mod is not None:
            return None
        return f"cannot import {self.module} ({self._err})"

    def version(self) -> str | None:
        return None

    def note(self, case: Case) -> str:
        """Extra words for every row of this implementation (e.g. which entry point ran)."""
        return ""

    def bind(self, case: Case, s: dict) -> Callable[[], object]:
        raise NotImplementedError

    def output(self, out, case: Case):
        """What a call returned, in the form the workload checks (e.g. gradients of packed
        tokens scattered back to the padded documents); called outside the timing."""
        return out


class Naive(Impl):
    """einsum in the input dtype (tensor cores, fp32 accumulation inside the GEMM), padding set to
    -inf with masked_fill, max over document tokens, sum over query tokens in fp32."""

    name = "naive"

    def bind(self, case, s):
        return case.kind.naive(s, case.meta)


def _import_maxsim():
    try:
        return importlib.import_module("maxsim")
    except ImportError:
        ext = str(REPO / "torch-ext")
        if ext not in sys.path:
            sys.path.append(ext)
        return importlib.import_module("maxsim")


class Maxsim(Impl):
    """This package through its native surface. The workloads pad on the right, so the padding is
    given as prefix lengths (``d_lengths``, as flash-maxsim gets it): the kernels then skip it.
    Train rows run ``contrastive_step`` (loss and both gradients from one op, no autograd)."""

    name = "maxsim"
    module = "maxsim"
    train_path = "fused step"

    def __init__(self, backend="auto"):
        self.backend = backend

    def _import(self):
        return _import_maxsim()

    def version(self):
        return getattr(self.mod, "__version__", None)

    def note(self, case):
        words = [] if self.backend == "auto" else [f"backend={self.backend}"]
        if self.backend == "auto" and on_cuda(case):
            try:
                ops, reason = self.mod.cuda_ops()
            except Exception as e:  # noqa: BLE001 - report whatever stops the lookup
                ops, reason = None, f"{type(e).__name__}: {e}"
            if ops is None:
                words.append(f"ran the PyTorch fallback ({reason})")
        return "; ".join(words)

    def bind(self, case, s):
        M, meta, kind, b = self.mod, case.meta, case.kind.name, self.backend
        if kind in ("rerank", "allpairs") and "D_codes" in s:  # 8-bit documents
            D = M.QuantizedTokens(s["D_codes"], s["D_scale"])
            Q = M.QuantizedTokens(s["Q_codes"], s["Q_scale"]) if "Q_codes" in s else s["Q"]
            return lambda: M.maxsim(Q, D, d_lengths=meta["d_len"], backend=b)
        if kind in ("rerank", "allpairs") and case.params.get("holes"):  # masks with holes
            return lambda: M.maxsim(s["Q"], s["D"], d_mask=meta["d_mask"], backend=b)
        if kind in ("rerank", "allpairs"):  # D is 4-D [B, K, Ld, H] or 3-D [Nd, Ld, H]
            return lambda: M.maxsim(s["Q"], s["D"], d_lengths=meta["d_len"], backend=b)
        if kind == "varlen":
            K, mq = case.params["K"], meta["max_q"]
            return lambda: M.maxsim_varlen(s["q"], meta["cu_q"], s["d"], meta["cu_d"],
                                           max_seqlen_q=mq, num_candidates=K, backend=b)
        if kind == "train":
            Q, D, t = s["Q"], s["D"], meta["targets"]

            # The fused step: loss and both gradients from one op, no autograd graph.
            return lambda: M.contrastive_step(Q, D, d_lengths=meta["d_len"], targets=t,
                                              backend=b)[1:]
        raise Unsupported(f"no maxsim entry point for kind {kind!r}")


class MaxsimAutograd(Maxsim):
    """The training step built from parts: ``maxsim`` scores, then torch's cross-entropy, so
    autograd runs torch's loss backward before the MaxSim backward (the path of any custom loss)."""

    name = "maxsim-autograd"
    kinds = ("train",)
    train_path = "autograd"

    def bind(self, case, s):
        if case.kind.name != "train":
            raise Unsupported("training rows only")
        M, meta, Q, D = self.mod, case.meta, s["Q"], s["D"]
        return lambda: train_step(
            lambda: M.maxsim(Q, D, d_lengths=meta["d_len"], backend=self.backend), Q, D,
            meta["targets"])


class MaxsimGraph(Maxsim):
    """The fused training step captured once per input set in a CUDA graph and replayed: what a
    training loop under CUDA graphs pays, the host's launch work gone. The graph's memory pool is
    allocated at capture, so a replay's memory is not counted (the ``maxsim`` row has it)."""

    name = "maxsim-graph"
    kinds = ("train",)
    counts_memory = False
    train_path = "graph replay"

    def note(self, case):
        return "replays a captured CUDA graph"

    def bind(self, case, s):
        if case.kind.name != "train" or not on_cuda(case):
            raise Unsupported("training rows on CUDA only")
        import torch

        step = super().bind(case, s)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up outside the capture, as torch.cuda.graph asks
            for _ in range(2):
                step()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = step()

        def replay():
            graph.replay()
            return out
        return replay



class MaxsimCompat(Maxsim):
    """The compatibility surface. On the rows that measure a call's host cost (``host_floor``):
    ``score_candidates_padded(Q, D, query_lengths, doc_lengths)``, next to ``maxsim``. On the
    training rows: ``score_contrastive_train(Q, tokens, offsets)`` with the documents' valid
    tokens packed by offsets (once, at bind), torch's cross-entropy and autograd, next to
    ``maxsim-autograd``."""

    name = "maxsim-compat"
    kinds = ("rerank", "train")
    train_path = "autograd"

    def applies(self, case):
        return case.kind.train or (case.workload.host_floor and case.kind.name == "rerank")

    def bind(self, case, s):
        if "D_codes" in s or case.params.get("holes"):
            raise Unsupported("score_candidates_padded takes float tokens and prefix lengths")
        M, Q, D, b = self.mod, s["Q"], s["D"], self.backend
        if case.kind.train:
            tokens = D.detach()[case.meta["d_mask"]].requires_grad_()
            lengths = case.meta["d_len"].long()
            offsets = torch.cat([lengths.new_zeros(1), lengths.cumsum(0)]).int()
            return lambda: train_step(
                lambda: M.score_contrastive_train(Q, tokens, offsets, backend=b), Q, tokens,
                case.meta["targets"])
        q_len = Q.new_full((Q.size(0),), Q.size(1), dtype=case.meta["d_len"].dtype)
        d_len = case.meta["d_len"]
        return lambda: M.score_candidates_padded(Q, D, q_len, d_len, backend=b)

    def output(self, out, case):
        if not case.kind.train:
            return out
        dq, d_tokens = out  # the packed tokens' gradient, back in the padded documents' places
        mask = case.meta["d_mask"]
        dd = d_tokens.new_zeros((*mask.shape, d_tokens.size(-1)))
        dd[mask] = d_tokens
        return dq, dd


class TorchFloor(Impl):
    """A stand-in, not MaxSim: what one PyTorch call of one kernel costs on the same inputs, the
    floor of a call's host cost. Inference rows: one batched matmul giving scores of MaxSim's
    shape (workloads.floor_scores); training rows: the same step (cross-entropy, autograd) with
    those scores. Only on workloads marked ``host_floor``."""

    name = "torch-floor"
    kinds = ("rerank", "allpairs", "train")
    stand_in = True

    def applies(self, case):
        return case.workload.host_floor and case.kind.name in self.kinds

    def note(self, case):
        return "stand-in: scores from one matmul (not MaxSim), not checked"

    def bind(self, case, s):
        if "D_codes" in s:
            raise Unsupported("float tokens only")
        Q, D = s["Q"], s["D"]
        if case.kind.train:
            t = case.meta["targets"]
            return lambda: train_step(lambda: floor_scores(Q, D), Q, D, t)
        return lambda: floor_scores(Q, D)
