"""A packed search corpus: every document's tokens back to back, split by offsets, so a scan never
computes on padding. Built once from ragged embeddings, saved and loaded with safetensors.

A corpus holds the tokens in a float dtype (fp16 for search), 8-bit codes of the same tokens
(:func:`maxsim.quantize`, one fp32 scale per token), or both: the codes for a fast first scan,
the tokens for the exact rescoring of its candidates (:func:`maxsim.retrieve`).

Memory of the two-stage search, per token of dim H, against the fp16 tokens' 2H bytes: codes and
tokens on the GPU hold 3H + 4 bytes (1.52x at H = 96: no second fp16 copy, the rescoring reads
the tokens in place by id); codes on the GPU with the tokens in host memory hold H + 4 (0.52x),
plus the candidates' tokens copied per call. Either way the scan adds at most its working budget
(``MAXSIM_TORCH_MEMORY_MB``: the scores of one chunk of documents and their top-k).
"""

from typing import Optional, Sequence

import torch

from .quantize import DTYPES, QuantizedTokens, quantize

_FLOATS = (torch.float32, torch.float16, torch.bfloat16)
# Tokens quantized per step when codes are made from a stored corpus: bounds the fp32 temporaries.
_QUANTIZE_TOKENS = 1 << 22


class Corpus:
    """``offsets [N+1]`` (int64, ``offsets[0] == 0``, non-decreasing, ``offsets[-1] == T``) over
    ``tokens [T, H]`` (float) and / or ``codes`` (:class:`QuantizedTokens` ``[T, H]``).

    Document ``i`` is ``tokens[offsets[i]:offsets[i + 1]]``; an empty document scores 0.
    The offsets are checked once, here, and kept on the host too, so a scan slices chunks of
    documents without a device sync. Codes and tokens may live on different devices (codes on
    the GPU, tokens in host memory): the scan runs where the codes are, and the rescoring copies
    only the candidates' tokens over (:meth:`gather`).
    """

    def __init__(self, offsets, tokens: Optional[torch.Tensor] = None,
                 codes: Optional[QuantizedTokens] = None):
        if tokens is None and codes is None:
            raise ValueError("Corpus: expected tokens, codes or both, got neither")
        if tokens is not None:
            if not isinstance(tokens, torch.Tensor) or tokens.dtype not in _FLOATS:
                got = getattr(tokens, "dtype", type(tokens).__name__)
                raise TypeError(f"tokens: expected a float32, float16 or bfloat16 tensor [T, H], "
                                f"got {got}")
            if tokens.dim() != 2:
                raise ValueError(f"tokens: expected [T, H], got shape {list(tokens.shape)}")
        if codes is not None:
            if not isinstance(codes, QuantizedTokens) or codes.dim() != 2:
                raise TypeError(f"codes: expected QuantizedTokens [T, H], got {codes!r}")
            if tokens is not None and codes.shape != tokens.shape:
                raise ValueError(f"codes: expected shape {list(tokens.shape)} like tokens, got "
                                 f"{list(codes.shape)}")
        side = codes.codes if codes is not None else tokens
        self.tokens, self.codes = tokens, codes
        self.host_offsets = _checked_offsets(offsets, side.size(0), side.device)
        self.offsets = self.host_offsets.to(side.device)

    @classmethod
    def from_embeddings(cls, embeddings: Sequence[torch.Tensor], *, dtype=torch.float16,
                        device=None, codes: Optional[str] = None,
                        keep_tokens: bool = True) -> "Corpus":
        """Pack ragged ``embeddings`` (a list of ``[Ld_i, H]``) in ``dtype`` on ``device`` (the
        first embedding's by default); ``codes`` ("int8" or "fp8_e4m3") adds 8-bit codes, and
        ``keep_tokens=False`` then keeps only those."""
        embeddings = list(embeddings)
        if not embeddings:
            raise ValueError("embeddings: expected at least one document, got none")
        dim = embeddings[0].size(-1) if isinstance(embeddings[0], torch.Tensor) else None
        for i, e in enumerate(embeddings):
            if not isinstance(e, torch.Tensor) or e.dim() != 2 or e.size(-1) != dim:
                got = list(e.shape) if isinstance(e, torch.Tensor) else type(e).__name__
                raise ValueError(f"embeddings[{i}]: expected [Ld, {dim}], got {got}")
        device = embeddings[0].device if device is None else torch.device(device)
        lengths = torch.tensor([e.size(0) for e in embeddings], dtype=torch.int64)
        offsets = torch.cat([lengths.new_zeros(1), lengths.cumsum(0)])
        tokens = torch.cat([e.to(device=device, dtype=dtype) for e in embeddings])
        corpus = cls(offsets, tokens)
        if codes is not None:
            corpus = corpus.with_codes(codes, keep_tokens=keep_tokens)
        return corpus

    def with_codes(self, fmt: str = "int8", *, keep_tokens: bool = True,
                   device=None) -> "Corpus":
        """This corpus with 8-bit codes of its tokens, made a slice of tokens at a time (no
        full-size fp32 copy) on ``device`` (the tokens' by default), where the codes are kept;
        ``keep_tokens=False`` drops the float tokens."""
        if self.tokens is None:
            raise ValueError("with_codes: this corpus holds codes only, no tokens to quantize")
        if fmt not in DTYPES:
            raise ValueError(f"fmt: expected one of {sorted(DTYPES)}, got {fmt!r}")
        t, h = self.tokens.shape
        device = self.tokens.device if device is None else torch.device(device)
        codes = torch.empty((t, h), dtype=DTYPES[fmt], device=device)
        scale = torch.empty((t,), dtype=torch.float32, device=device)
        for start in range(0, t, _QUANTIZE_TOKENS):
            part = quantize(self.tokens[start:start + _QUANTIZE_TOKENS].to(device), fmt)
            codes[start:start + part.codes.size(0)] = part.codes
            scale[start:start + part.codes.size(0)] = part.scale
        return Corpus(self.host_offsets, self.tokens if keep_tokens else None,
                      QuantizedTokens(codes, scale))

    def codes_only(self) -> "Corpus":
        """The same corpus without its float tokens (shares the codes)."""
        if self.codes is None:
            raise ValueError("codes_only: this corpus has no codes (see with_codes)")
        return Corpus(self.host_offsets, None, self.codes)

    def tokens_only(self) -> "Corpus":
        """The same corpus without its codes (shares the tokens)."""
        if self.tokens is None:
            raise ValueError("tokens_only: this corpus has no float tokens")
        return Corpus(self.host_offsets, self.tokens)

    def __len__(self) -> int:
        return self.host_offsets.numel() - 1

    @property
    def num_tokens(self) -> int:
        return int(self.host_offsets[-1])

    @property
    def dim(self) -> int:
        return (self.tokens if self.tokens is not None else self.codes.codes).size(1)

    @property
    def device(self) -> torch.device:
        """Where the scan runs: the codes' device, else the tokens'."""
        return (self.codes.codes if self.codes is not None else self.tokens).device

    @property
    def nbytes(self) -> int:
        """Bytes held: tokens, codes with their scales, and offsets (wherever each lives)."""
        held = self.offsets.numel() * 8
        if self.tokens is not None:
            held += self.tokens.numel() * self.tokens.element_size()
        return held + (self.codes.nbytes if self.codes is not None else 0)

    def lengths(self) -> torch.Tensor:
        """Tokens per document, ``[N]`` int64 on the host."""
        return self.host_offsets.diff()

    def chunk(self, start: int, stop: int, use_codes: bool):
        """Documents ``start:stop`` as ``(x [t, H], offsets [stop - start + 1], scale or None)``
        with offsets from 0: a view of the tokens (or codes), no copy."""
        first, last = int(self.host_offsets[start]), int(self.host_offsets[stop])
        offsets = self.offsets[start:stop + 1] - first
        if use_codes:
            return self.codes.codes[first:last], offsets, self.codes.scale[first:last]
        return self.tokens[first:last], offsets, None

    def gather(self, ids: torch.Tensor, device) -> tuple:
        """The float tokens of documents ``ids`` (1-D, any device) packed on ``device``:
        ``(tokens [t, H], offsets [len(ids) + 1])``. One host sync (the ids' lengths)."""
        if self.tokens is None:
            raise ValueError("gather: this corpus has no float tokens")
        ids = ids.to("cpu", torch.int64)
        lengths = self.host_offsets.diff()[ids]
        offsets = torch.cat([lengths.new_zeros(1), lengths.cumsum(0)])
        within = torch.arange(int(offsets[-1])) - torch.repeat_interleave(offsets[:-1], lengths)
        rows = torch.repeat_interleave(self.host_offsets[ids], lengths) + within
        tokens = self.tokens.index_select(0, rows.to(self.tokens.device))
        device = torch.device(device)
        if tokens.device.type == "cpu" and device.type == "cuda":
            tokens = tokens.pin_memory()  # an asynchronous copy from page-locked memory
        return tokens.to(device, non_blocking=True), offsets.to(device)

    def to(self, device) -> "Corpus":
        codes = None if self.codes is None else QuantizedTokens(
            self.codes.codes.to(device), self.codes.scale.to(device))
        tokens = None if self.tokens is None else self.tokens.to(device)
        return Corpus(self.host_offsets, tokens, codes)

    def save(self, path) -> None:
        """Write offsets, tokens and codes (whichever are held) to one ``.safetensors`` file."""
        save_file = _safetensors().save_file
        tensors = {"offsets": self.host_offsets}
        if self.tokens is not None:
            tensors["tokens"] = self.tokens.contiguous()
        if self.codes is not None:
            tensors["codes"] = self.codes.codes.contiguous()
            tensors["scale"] = self.codes.scale.contiguous()
        save_file(tensors, str(path), metadata={"format": "maxsim.Corpus"})

    @classmethod
    def load(cls, path, device="cpu") -> "Corpus":
        """A corpus written by :meth:`save`, its tensors loaded onto ``device``."""
        tensors = _safetensors().load_file(str(path), device=str(device))
        if "offsets" not in tensors:
            raise ValueError(f"path: {path} holds no 'offsets': not a saved maxsim Corpus")
        codes = None
        if "codes" in tensors:
            codes = QuantizedTokens(tensors["codes"], tensors["scale"])
        return cls(tensors["offsets"], tensors.get("tokens"), codes)

    def __repr__(self) -> str:
        held = [n for n, t in (("tokens", self.tokens), ("codes", self.codes)) if t is not None]
        return (f"Corpus({len(self)} documents, {self.num_tokens:,} tokens, dim {self.dim}, "
                f"{'+'.join(held)}, {self.nbytes:,} bytes on {self.device})")


def _checked_offsets(offsets, total: int, device: torch.device) -> torch.Tensor:
    """The offsets (on ``device`` or the host) as a host int64 tensor, checked: ``[0, ...,
    total]``, non-decreasing."""
    if not isinstance(offsets, torch.Tensor) or offsets.dtype not in (torch.int32, torch.int64):
        got = getattr(offsets, "dtype", type(offsets).__name__)
        raise TypeError(f"offsets: expected an int32 or int64 tensor [N+1], got {got}")
    if offsets.dim() != 1 or offsets.numel() < 1:
        raise ValueError(f"offsets: expected 1-D [N+1] with at least one entry, got shape "
                         f"{list(offsets.shape)}")
    if offsets.device not in (device, torch.device("cpu")):
        raise ValueError(f"offsets: expected device {device} (the tokens') or cpu, got "
                         f"{offsets.device}")
    host = offsets.detach().to("cpu", torch.int64)
    if int(host[0]) != 0 or int(host[-1]) != total:
        raise ValueError(f"offsets: expected offsets[0] == 0 and offsets[-1] == {total} (the "
                         f"number of tokens), got {int(host[0])} and {int(host[-1])}")
    if bool((host[1:] < host[:-1]).any()):
        i = int((host[1:] < host[:-1]).nonzero()[0, 0])
        raise ValueError(f"offsets: expected non-decreasing, got offsets[{i + 1}] = "
                         f"{int(host[i + 1])} < offsets[{i}] = {int(host[i])}")
    return host


def _safetensors():
    try:
        import safetensors.torch as st
    except ImportError:
        raise ImportError(
            "Corpus.save / Corpus.load need the safetensors package: pip install safetensors"
        ) from None
    return st
