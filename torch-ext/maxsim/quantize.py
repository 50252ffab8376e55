"""8-bit token embeddings: symmetric per-token INT8 or FP8 (e4m3) codes with one fp32 scale per
token, so that a stored index takes about half the bytes of fp16.

Every inference entry point takes a :class:`QuantizedTokens` for ``Q`` or ``D``. Scores are those of
the dequantized values, computed exactly: the ranking matches float64 arithmetic on
``dequantize(x)``. On CUDA (sm_80+, embedding dim a multiple of 16 up to 256) the documents' codes
stream through the tensor-core kernels at one byte per value: every int8 and e4m3 code is exact in
fp16 / bf16, so each code product is exact in fp32, and the token scales multiply the fp32 dot
products before the max. INT8 queries against INT8 documents run on the integer tensor cores
(int32 sums, exact) with neither side converted. Elsewhere (CPU, other dims, fp32 queries, or a
call that needs gradients or ``normalize=True``) the codes are dequantized to fp32 and take the
exact fp32 path.
"""

import functools
from dataclasses import dataclass

import torch

from .emulation import device_capability

DTYPES = {"int8": torch.int8, "fp8_e4m3": torch.float8_e4m3fn}
_LIMIT = {"int8": 127.0, "fp8_e4m3": 448.0}  # largest code magnitude of each format


@dataclass(frozen=True, repr=False)
class QuantizedTokens:
    """8-bit codes ``[..., H]`` and fp32 per-token scales ``[...]``: token = codes * scale."""

    codes: torch.Tensor
    scale: torch.Tensor

    def __post_init__(self):
        # the kernels read one scale per token: a scale tensor of another shape would be overrun
        codes, scale = self.codes, self.scale
        if not isinstance(codes, torch.Tensor) or codes.dtype not in DTYPES.values():
            raise TypeError(
                f"codes: expected an int8 or float8_e4m3fn tensor, got "
                f"{getattr(codes, 'dtype', type(codes).__name__)}"
            )
        if not isinstance(scale, torch.Tensor) or not scale.is_floating_point():
            got = getattr(scale, "dtype", type(scale).__name__)
            raise TypeError(f"scale: expected a float tensor, got {got}")
        if codes.dim() < 1 or scale.shape != codes.shape[:-1]:
            raise ValueError(
                f"scale: expected shape {list(codes.shape[:-1])} (one per token of codes "
                f"{list(codes.shape)}), got {list(scale.shape)}"
            )
        if scale.device != codes.device:
            raise ValueError(
                f"scale: expected device {codes.device} like codes, got {scale.device}"
            )

    @property
    def format(self) -> str:
        return "int8" if self.codes.dtype == torch.int8 else "fp8_e4m3"

    @property
    def shape(self) -> torch.Size:
        return self.codes.shape

    @property
    def device(self) -> torch.device:
        return self.codes.device

    def dim(self) -> int:
        return self.codes.dim()

    def size(self, d=None):
        return self.codes.size() if d is None else self.codes.size(d)

    @property
    def nbytes(self) -> int:
        return self.codes.numel() * self.codes.element_size() + self.scale.numel() * 4

    def __getitem__(self, index) -> "QuantizedTokens":
        """Slices along the token dims (never the embedding dim), e.g. ``corpus[i:j]``."""
        return QuantizedTokens(self.codes[index], self.scale[index])

    def dequantize(self, dtype=torch.float32) -> torch.Tensor:
        return dequantize(self, dtype)

    def __repr__(self) -> str:  # a summary: the codes of a corpus would fill the screen
        return (f"QuantizedTokens({self.format}, shape={list(self.shape)}, "
                f"device={self.device}, {self.nbytes:,} bytes)")


def quantize(
    x: torch.Tensor, dtype: str = "int8", dim: int = -1, *, check_finite: bool = True
) -> QuantizedTokens:
    """Symmetric per-token quantization of embeddings ``x [..., H]`` along the embedding dim.

    ``dtype``: ``"int8"`` (codes in [-127, 127], round to nearest) or ``"fp8_e4m3"`` (codes in
    [-448, 448], torch's float8_e4m3fn rounding). Each token's scale is its largest magnitude over
    the code limit; an all-zero token gets scale 0 and zero codes. Non-finite values raise, unless
    ``check_finite=False`` (no device sync; a non-finite token's codes are then unspecified).
    """
    if not isinstance(x, torch.Tensor) or not x.is_floating_point():
        raise TypeError(f"x: expected a float tensor [..., H], got {getattr(x, 'dtype', type(x))}")
    if dtype not in DTYPES:
        raise ValueError(f"dtype: expected one of {sorted(DTYPES)}, got {dtype!r}")
    if x.dim() < 1 or dim not in (-1, x.dim() - 1):
        raise ValueError(
            f"dim: expected -1 (the embedding dim, last), got {dim} for shape {tuple(x.shape)}"
        )
    xf = x.detach().float()
    if check_finite and not bool(torch.isfinite(xf).all()):
        raise ValueError("x: expected finite values, got NaN or inf")
    scale = xf.abs().amax(dim=-1) / _LIMIT[dtype]
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))[..., None]
    if dtype == "int8":
        codes = torch.round(xf / safe).clamp_(-127, 127).to(torch.int8)
    else:
        codes = (xf / safe).clamp_(-448, 448).to(torch.float8_e4m3fn)
    return QuantizedTokens(codes.contiguous(), scale.contiguous())


def dequantize(q: QuantizedTokens, dtype=torch.float32) -> torch.Tensor:
    """``codes * scale`` in fp32 (exact for int8 codes up to the one rounding of the product),
    returned in ``dtype``."""
    if not isinstance(q, QuantizedTokens):
        raise TypeError(f"q: expected QuantizedTokens, got {type(q).__name__}")
    return (q.codes.float() * q.scale[..., None]).to(dtype)


def resolve(*xs):
    """The inputs of one call with every :class:`QuantizedTokens` dequantized to fp32, and then
    every other float tensor among ``xs`` in fp32 too (both sides must share a dtype). Unchanged
    when nothing is quantized."""
    for x in xs:  # the common case, no quantized input, stays a few type checks
        if type(x) is QuantizedTokens:
            break
    else:
        return xs
    return tuple(
        x.dequantize() if isinstance(x, QuantizedTokens)
        else x.float() if isinstance(x, torch.Tensor) and x.is_floating_point() else x
        for x in xs
    )


_HALF = (torch.float16, torch.bfloat16)


@functools.lru_cache(maxsize=None)
def _tensor_cores(device: torch.device) -> bool:
    return device_capability(device) >= (8, 0)


def scaled_operands(Q, D, *, normalize: bool, ops):
    """``(Q, q_scale, D, d_scale)`` for the CUDA kernels' ``fwd_scaled`` when a quantized call can
    run on them, else None (the call then dequantizes). Quantized documents stay 8-bit codes with
    ``d_scale``. Quantized queries stay int8 codes against int8 documents (integer tensor cores);
    otherwise they become their codes in fp16 / bf16 (exact), with ``q_scale`` either way."""
    q_quant, d_quant = type(Q) is QuantizedTokens, type(D) is QuantizedTokens
    if not (q_quant or d_quant) or normalize or not hasattr(ops, "fwd_scaled"):
        return None
    if not (
        isinstance(Q, (torch.Tensor, QuantizedTokens))
        and isinstance(D, (torch.Tensor, QuantizedTokens))
    ):
        return None
    dim = Q.size(-1)
    if dim != D.size(-1) or dim % 16 or dim > 256 or Q.device != D.device:
        return None
    if Q.device.type != "cuda" or not _tensor_cores(Q.device):
        return None
    if q_quant and d_quant:
        dtype = torch.float16
    elif q_quant:
        dtype = D.dtype
    else:
        dtype = Q.dtype
    if dtype not in _HALF:
        return None
    float_side = D if q_quant and not d_quant else Q if not q_quant else None
    if float_side is not None and float_side.requires_grad and torch.is_grad_enabled():
        return None  # gradients go through the dequantized, differentiable path
    int8x8 = q_quant and d_quant and Q.codes.dtype == torch.int8 and D.codes.dtype == torch.int8
    if q_quant:
        q = Q.codes if int8x8 else Q.codes.to(dtype)
        q_scale = _fp32(Q.scale)
    else:
        q, q_scale = Q, None
    if d_quant:
        d, d_scale = D.codes, _fp32(D.scale)
    else:
        d, d_scale = D, None
    return q, q_scale, d, d_scale


def _fp32(scale: torch.Tensor) -> torch.Tensor:
    # quantize() already gives contiguous fp32 scales: no conversion call on the common path
    if scale.dtype == torch.float32 and scale.is_contiguous():
        return scale
    return scale.float().contiguous()
