"""Exact MaxSim (late-interaction scoring) for ColBERT / ColPali / PyLate models.

Two surfaces over one op pair: the native one (``maxsim``, ``maxsim_pairs``, ``maxsim_varlen``,
``retrieve``, ``MaxSimScorer``) and the ``erikkaum/maxsim`` compatibility one (``score_*``).
Fused CUDA kernels where the extension is built, a memory-bounded PyTorch fallback elsewhere.
"""

from . import layers
from .chamfer import chamfer
from .compat import (
    score_candidates_padded,
    score_candidates_padded_train,
    score_candidates_padded_with_argmax,
    score_contrastive,
    score_contrastive_train,
    score_contrastive_with_argmax,
    score_pairs_packed,
    score_pairs_packed_train,
    score_pairs_packed_with_argmax,
)
from .corpus import Corpus
from .dispatch import BACKENDS, cpu_ops, cuda_ops, select_ops
from .losses import contrastive_loss, contrastive_step
from .native import MaxSimScorer, maxsim, maxsim_pairs, maxsim_varlen, maxsim_with_argmax
from .quantize import QuantizedTokens, dequantize, quantize
from .reference import (
    maxsim_reference,
    maxsim_reference_with_argmax,
    score_candidates_padded_reference,
    score_candidates_padded_with_argmax_reference,
    score_contrastive_reference,
    score_contrastive_with_argmax_reference,
    score_pairs_packed_reference,
    score_pairs_packed_with_argmax_reference,
)
from .retrieve import retrieve
from .segments import maxsim_segments

__version__ = "0.1.0"

__all__ = [
    "__version__",
    # native surface
    "maxsim",
    "maxsim_with_argmax",
    "maxsim_pairs",
    "maxsim_varlen",
    "maxsim_segments",
    "retrieve",
    "Corpus",
    "MaxSimScorer",
    "contrastive_loss",
    "contrastive_step",
    "quantize",
    "dequantize",
    "QuantizedTokens",
    "chamfer",
    # sentence-transformers' hub kernel layers (MaxSim, MaxSimPairwise)
    "layers",
    # compatibility surface
    "score_candidates_padded",
    "score_candidates_padded_with_argmax",
    "score_candidates_padded_train",
    "score_candidates_padded_reference",
    "score_candidates_padded_with_argmax_reference",
    "score_contrastive",
    "score_contrastive_with_argmax",
    "score_contrastive_train",
    "score_contrastive_reference",
    "score_contrastive_with_argmax_reference",
    "score_pairs_packed",
    "score_pairs_packed_with_argmax",
    "score_pairs_packed_train",
    "score_pairs_packed_reference",
    "score_pairs_packed_with_argmax_reference",
    "maxsim_reference",
    "maxsim_reference_with_argmax",
    # backends
    "BACKENDS",
    "cpu_ops",
    "cuda_ops",
    "select_ops",
]
