"""Every argument check of the package, in one place.

Checks on shapes, dtypes and devices always run and never read device values. Checks on values
(offsets, ids, lengths, segment bounds) need a device->host sync, so they run only when
``MAXSIM_DEBUG=1``. Errors name the argument, what was expected and what came.
"""

from typing import NamedTuple, Optional

import torch

from .settings import debug_enabled

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
CODE_DTYPES = (torch.int8, torch.float8_e4m3fn)
INDEX_DTYPES = (torch.int32, torch.int64)


class TokenSet(NamedTuple):
    """One side of a call, as the ops take it.

    Shapes: padded ``x [N, L, H]`` with ``lengths`` int32 ``[N]`` and ``mask`` bool ``[N, L]``, or
    packed ``x [T, H]`` with ``offsets`` int32 ``[N+1]`` and ``mask`` bool ``[T]``.
    """

    x: torch.Tensor
    offsets: Optional[torch.Tensor] = None
    lengths: Optional[torch.Tensor] = None
    mask: Optional[torch.Tensor] = None
    scale: Optional[torch.Tensor] = None  # fp32, one per token: quantized tokens on CUDA

    @property
    def count(self) -> int:
        return self.x.size(0) if self.x.dim() == 3 else self.offsets.size(0) - 1


def _shape(t) -> str:
    return str(tuple(t.shape)) if isinstance(t, torch.Tensor) else type(t).__name__


def require_tensor(name: str, t, what: str) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a tensor {what}, got {type(t).__name__}")


def embeddings(name: str, x, dims: tuple, *, codes: bool = False) -> torch.Tensor:
    """Token vectors ``x`` of rank ``len(dims)``, e.g. ``("N", "L", "H")``; ``codes=True`` also
    accepts the 8-bit codes of quantized tokens.

    Returned as is unless ``x.stride(-1) != 1`` (then a contiguous copy).
    """
    what = "[" + ", ".join(dims) + "]"
    require_tensor(name, x, what)
    if x.dim() != len(dims):
        raise ValueError(f"{name}: expected {len(dims)}-D {what}, got shape {_shape(x)}")
    if x.dtype not in FLOAT_DTYPES and not (codes and x.dtype in CODE_DTYPES):
        raise TypeError(f"{name}: expected float32, float16 or bfloat16, got {x.dtype}")
    if x.size(-1) == 0:
        raise ValueError(f"{name}: expected a non-empty embedding dim H, got shape {_shape(x)}")
    return x if x.stride(-1) == 1 else x.contiguous()


def autocast_pair(q, d):
    """Under autocast on the inputs' device, both sides in the autocast dtype (as a matmul would
    be); otherwise unchanged. Scores stay fp32 either way."""
    if not (isinstance(q, torch.Tensor) and isinstance(d, torch.Tensor)):
        return q, d
    device_type = q.device.type
    if not torch.is_autocast_enabled(device_type):
        return q, d
    dtype = torch.get_autocast_dtype(device_type)
    if q.is_floating_point() and q.dtype != dtype:
        q = q.to(dtype)
    if d.is_floating_point() and d.dtype != dtype:
        d = d.to(dtype)
    return q, d


def same_space(
    q_name: str, q: torch.Tensor, d_name: str, d: torch.Tensor, *, same_dtype: bool = True
) -> None:
    """Queries and documents share dtype (unless ``same_dtype=False``), embedding dim and
    device."""
    if same_dtype and d.dtype != q.dtype:
        raise TypeError(f"{d_name}: expected dtype {q.dtype} to match {q_name}, got {d.dtype}")
    if d.size(-1) != q.size(-1):
        raise ValueError(
            f"{d_name}: expected last dim {q.size(-1)} to match {q_name}, got shape {_shape(d)}"
        )
    if d.device != q.device:
        raise ValueError(f"{d_name}: expected device {q.device} like {q_name}, got {d.device}")


def _on_device(name: str, t: torch.Tensor, device: torch.device) -> None:
    if t.device != device:
        raise ValueError(f"{name}: expected device {device} like the embeddings, got {t.device}")


def require_index(name: str, t, shape: tuple, device: torch.device) -> None:
    """Lengths, offsets or ids: an int32/int64 tensor of ``shape`` on ``device``."""
    if isinstance(t, torch.Tensor) and t.dtype in INDEX_DTYPES and t.shape == shape and (
        t.device == device
    ):
        return  # the common case, without building any message
    require_tensor(name, t, f"of shape {list(shape)}")
    if t.dtype not in INDEX_DTYPES:
        raise TypeError(f"{name}: expected int32 or int64, got {t.dtype}")
    if t.shape != shape:
        raise ValueError(f"{name}: expected shape {list(shape)}, got {list(t.shape)}")
    _on_device(name, t, device)


def index(name: str, t, shape: tuple, device: torch.device) -> torch.Tensor:
    """:func:`require_index`, returned as int32 (no copy when it already is a contiguous int32
    tensor)."""
    require_index(name, t, shape, device)
    if t.dtype == torch.int32 and t.is_contiguous():
        return t
    return t.to(torch.int32).contiguous()


def mask(name: str, m, shape: tuple, device: torch.device) -> Optional[torch.Tensor]:
    """A validity mask (True / nonzero = valid) of ``shape`` on ``device``, returned as a
    contiguous bool tensor."""
    if m is None:
        return None
    require_tensor(name, m, f"of shape {list(shape)}")
    if m.dtype.is_complex:
        raise TypeError(f"{name}: expected a bool, integer or float mask, got {m.dtype}")
    if tuple(m.shape) != tuple(shape):
        raise ValueError(f"{name}: expected shape {list(shape)}, got {list(m.shape)}")
    _on_device(name, m, device)
    return (m if m.dtype == torch.bool else m != 0).contiguous()


def padded(
    x: torch.Tensor, *, lengths=None, lengths_name="lengths", m=None, mask_name="mask"
) -> TokenSet:
    """A padded token set ``x [N, L, H]``, optional prefix ``lengths [N]`` and ``mask [N, L]``."""
    n, width = x.shape[:2]
    if lengths is not None:
        lengths = index(lengths_name, lengths, (n,), x.device)
        if debug_enabled():
            check_range(
                lengths_name, lengths, 0, width, f"a length in [0, {width}] (the padded size)"
            )
    return TokenSet(x, lengths=lengths, mask=mask(mask_name, m, (n, width), x.device))


def packed(
    x: torch.Tensor, offsets, *, offsets_name="offsets", m=None, mask_name="mask"
) -> TokenSet:
    """A packed token set ``x [T, H]`` split by ``offsets [N+1]``, optional ``mask [T]``."""
    require_tensor(offsets_name, offsets, "of shape [N+1]")
    if offsets.dim() != 1 or offsets.size(0) < 1:
        raise ValueError(
            f"{offsets_name}: expected 1-D [N+1] with at least one entry, "
            f"got shape {_shape(offsets)}"
        )
    offsets = index(offsets_name, offsets, tuple(offsets.shape), x.device)
    if debug_enabled():
        _check_offsets(offsets_name, offsets, x.size(0))
    return TokenSet(x, offsets=offsets, mask=mask(mask_name, m, (x.size(0),), x.device))


def pair_ids(q_name: str, pair_q, d_name: str, pair_d, nq: int, nd: int, device) -> tuple:
    """Pair lists ``[P]`` each; with ``MAXSIM_DEBUG=1`` also checks they index existing segments."""
    require_tensor(q_name, pair_q, "of shape [P]")
    if pair_q.dim() != 1:
        raise ValueError(f"{q_name}: expected 1-D [P], got shape {_shape(pair_q)}")
    pair_q = index(q_name, pair_q, tuple(pair_q.shape), device)
    pair_d = index(d_name, pair_d, tuple(pair_q.shape), device)
    if debug_enabled():
        check_range(q_name, pair_q, 0, nq - 1, f"a query id in [0, {nq})")
        check_range(d_name, pair_d, 0, nd - 1, f"a document id in [0, {nd})")
    return pair_q, pair_d


def integer(name: str, value, low: int = 0, high=None) -> int:
    """A Python int in ``[low, high]`` (``high`` None: unbounded)."""
    if (
        isinstance(value, bool)
        or not isinstance(value, int)
        or value < low
        or (high is not None and value > high)
    ):
        expected = f"an int >= {low}" if high is None else f"an int in [{low}, {high}]"
        raise ValueError(f"{name}: expected {expected}, got {value!r}")
    return value


def query_width(name: str, value, offsets: torch.Tensor) -> int:
    """``max_lq`` for packed queries split by ``offsets``: the caller's bound ``value`` (checked in
    debug mode), else the longest query, read with one device->host sync.

    Kernels size their work by it (and the argmax is that wide), so it must be tight.
    """
    if value is None:
        return longest_segment(offsets)
    value = integer(name, value)
    if debug_enabled() and longest_segment(offsets) > value:
        raise ValueError(
            f"{name}: expected at least the longest query ({longest_segment(offsets)}), got {value}"
        )
    return value


def longest_segment(offsets: torch.Tensor) -> int:
    """Length of the longest segment of ``offsets`` (one device->host sync)."""
    return int((offsets[1:] - offsets[:-1]).max()) if offsets.size(0) > 1 else 0


def check_range(name: str, t: torch.Tensor, low: int, high: int, what: str) -> None:
    """1-D ``t`` holds only values in ``[low, high]``."""
    bad = (t < low) | (t > high)
    if bool(bad.any()):
        i = int(bad.nonzero()[0, 0])
        raise ValueError(f"{name}: expected {what}, got {name}[{i}] = {int(t[i])}")


def _check_offsets(name: str, offsets: torch.Tensor, total: int) -> None:
    first, last = int(offsets[0]), int(offsets[-1])
    if first != 0:
        raise ValueError(f"{name}: expected {name}[0] == 0, got {first}")
    steps = offsets[1:] < offsets[:-1]
    if bool(steps.any()):
        i = int(steps.nonzero()[0, 0])
        raise ValueError(
            f"{name}: expected non-decreasing offsets, got {name}[{i + 1}] = {int(offsets[i + 1])} "
            f"< {name}[{i}] = {int(offsets[i])}"
        )
    if last != total:
        raise ValueError(
            f"{name}: expected {name}[-1] == {total} (the number of tokens), got {last}"
        )
