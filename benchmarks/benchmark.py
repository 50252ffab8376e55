"""`kernels benchmark` entry: our workloads, timed through the kernel as the Hub loads it.

    kernels benchmark .            # this checkout's build/<variant> (scripts/build_variant.py)
    kernels benchmark <org>/maxsim --version 1

`kernels` loads the kernel (``self.kernel``), runs each ``benchmark_<workload>`` after its
``setup_<workload>``, checks ``self.out`` against ``verify_<workload>`` (plain PyTorch on fp32
copies of the inputs, whose time it prints as the reference) and prints a table per class. The
shapes are benchmarks/workloads.py's; on the CPU, where a GPU's shapes take minutes, each
workload keeps its token shapes with fewer queries or documents (``CPU_SHAPES``).
"""

import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from kernels.benchmark import Benchmark

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the script is loaded by path
import workloads as wl  # noqa: E402

# The same token shapes with fewer items: a CPU run of every workload takes seconds, not minutes.
CPU_SHAPES = {
    "rerank": dict(B=4, K=50),
    "rerank_colpali": dict(B=1, K=25),
    "allpairs_fp32": dict(Nq=16, Nd=64),
    "train_small": dict(Nq=8, Nb=8),
}


def case(name: str, dtype_name: str, device: str) -> "wl.Case":
    """One input set of a registered workload (the CLI's own warm-up and repetitions stand in for
    the harness's rotation of sets)."""
    workload = wl.BY_NAME[name]
    if device == "cpu":
        workload = wl.Workload(name, workload.kind, dict(workload.params, **CPU_SHAPES[name]),
                               workload.smoke, workload.dtypes)
    return wl.setup(workload, dtype_name, torch.device(device), max_sets=1)


def naive_fp32(Q, D, d_mask, grouped):
    """The plain PyTorch scores on fp32 copies: exact products, like the kernels'."""
    return wl.padded_scores(Q.float(), D.float(), None, d_mask, grouped=grouped)


class MaxSimBenchmark(Benchmark):
    """Scores through ``maxsim``: reranking (per-query candidates) and all-pairs. The CLI finds
    workloads by method name: ``PADDED_WORKLOADS`` below adds each one's three methods."""

    seed = 0

    def _padded(self, name, dtype_name, grouped):
        c = case(name, dtype_name, self.device)
        self.Q, self.D = c.sets[0]["Q"], c.sets[0]["D"]
        self.d_len, self.d_mask, self.grouped = c.meta["d_len"], c.meta["d_mask"], grouped

    def _score(self):
        self.out = self.kernel.maxsim(self.Q, self.D, d_lengths=self.d_len)

    def _reference(self):
        return naive_fp32(self.Q, self.D, self.d_mask, self.grouped)


# (workload, dtype, per-query candidates rather than all pairs)
PADDED_WORKLOADS = (("rerank", "bf16", True), ("rerank_colpali", "bf16", True),
                    ("allpairs_fp32", "fp32", False))
for _name, _dtype, _grouped in PADDED_WORKLOADS:
    setattr(MaxSimBenchmark, f"setup_{_name}",
            lambda self, n=_name, t=_dtype, g=_grouped: self._padded(n, t, g))
    setattr(MaxSimBenchmark, f"benchmark_{_name}", MaxSimBenchmark._score)
    setattr(MaxSimBenchmark, f"verify_{_name}", MaxSimBenchmark._reference)


class SentenceTransformersLayerBenchmark(Benchmark):
    """sentence-transformers' ``STMaxSim`` layer (``kernel.layers.MaxSim``) on all-pairs shapes,
    bool masks as their scorer passes them; -1e9 for an empty document as theirs."""

    seed = 0

    def setup_st_maxsim(self):
        c = case("allpairs_fp32", "fp32", self.device)
        self.a, self.b = c.sets[0]["Q"].bfloat16(), c.sets[0]["D"].bfloat16()
        self.a_mask = torch.ones(self.a.shape[:2], dtype=torch.bool, device=self.device)
        self.b_mask = c.meta["d_mask"]
        self.layer = self.kernel.layers.MaxSim()

    def benchmark_st_maxsim(self):
        self.out = self.layer(self.a, self.b, self.a_mask, self.b_mask)

    def verify_st_maxsim(self):
        return naive_fp32(self.a, self.b, self.b_mask, grouped=False)


class ContrastiveStepBenchmark(Benchmark):
    """Forward, cross-entropy with diagonal targets and backward: ``self.out`` is dQ."""

    seed = 0

    def setup_train_small(self):
        c = case("train_small", "bf16", self.device)
        self.Q, self.D = c.sets[0]["Q"], c.sets[0]["D"]
        self.d_len, self.d_mask = c.meta["d_len"], c.meta["d_mask"]
        self.targets = c.meta["targets"]

    def _step(self, scores_fn, Q, D):
        loss = F.cross_entropy(scores_fn(Q, D), self.targets)
        return torch.autograd.grad(loss, (Q, D))[0].float()

    def benchmark_train_small(self):
        self.out = self._step(
            lambda Q, D: self.kernel.maxsim(Q, D, d_lengths=self.d_len), self.Q, self.D
        )

    def verify_train_small(self):
        Q = self.Q.detach().float().requires_grad_()
        D = self.D.detach().float().requires_grad_()
        return self._step(lambda Q, D: naive_fp32(Q, D, self.d_mask, grouped=False), Q, D)
