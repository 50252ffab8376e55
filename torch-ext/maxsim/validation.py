"""Every argument check of the package, in one place.

Checks on shapes, dtypes and devices always run and never read device values. Checks on values
(offsets, ids, lengths, hints, targets) run where reading them is free, on index tensors that live
on the CPU, and elsewhere only with ``MAXSIM_DEBUG=1`` (a device->host sync); unchecked bad values
give NaN scores (docs/API.md). Errors name the argument, the bad position and the allowed range.
"""

from typing import NamedTuple, Optional

import torch

from .settings import debug_enabled

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
CODE_DTYPES = (torch.int8, torch.float8_e4m3fn)
INDEX_DTYPES = (torch.int32, torch.int64)
_INT32 = torch.iinfo(torch.int32)


class DtypeMismatch(ValueError, TypeError):
    """Queries and documents of different dtypes: a TypeError as `erikkaum/maxsim` raises, and a
    ValueError like the package's other argument errors, so code catching either catches it."""


class IndexOutOfRange(ValueError, RuntimeError):
    """An id or length outside its range: a RuntimeError as `erikkaum/maxsim` raises, and a
    ValueError like the package's other argument errors."""


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
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name}: expected a tensor {_dims(dims)}, got {type(x).__name__}")
    shape = x.shape
    if len(shape) != len(dims):
        raise ValueError(f"{name}: expected {len(dims)}-D {_dims(dims)}, got shape {_shape(x)}")
    if x.dtype not in FLOAT_DTYPES and not (codes and x.dtype in CODE_DTYPES):
        raise TypeError(f"{name}: expected float32, float16 or bfloat16, got {x.dtype}")
    if shape[-1] == 0:
        raise ValueError(f"{name}: expected a non-empty embedding dim H, got shape {_shape(x)}")
    return x if x.stride()[-1] == 1 else x.contiguous()


def _dims(dims: tuple) -> str:
    return "[" + ", ".join(dims) + "]"


def values_checked(t: torch.Tensor) -> bool:
    """Whether the values of index tensor ``t`` are checked: always on the CPU (reading them is
    free), elsewhere only with ``MAXSIM_DEBUG=1``; never on ``meta`` nor while torch.compile
    traces (a check would break the graph)."""
    if t.is_cpu:
        return not torch.compiler.is_compiling()
    return not t.is_meta and debug_enabled()


def autocast_enabled(device_type: str) -> bool:
    """``torch.is_autocast_enabled`` that answers False for ``meta`` (which it rejects)."""
    return device_type != "meta" and torch.is_autocast_enabled(device_type)


def autocast_pair(q, d):
    """Under autocast on the inputs' device, both sides in the autocast dtype (as a matmul would
    be); otherwise unchanged. Scores stay fp32 either way."""
    if not (isinstance(q, torch.Tensor) and isinstance(d, torch.Tensor)):
        return q, d
    device_type = q.device.type
    if not autocast_enabled(device_type):
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
        raise DtypeMismatch(
            f"{d_name}: expected {q.dtype}, the same dtype as {q_name} (they share dtype), "
            f"got {d.dtype}"
        )
    h = q.shape[-1]
    if d.shape[-1] != h:
        raise ValueError(
            f"{d_name}: expected last dim {h} (it must match {q_name}), got shape {_shape(d)}"
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
    tensor). int64 values past the int32 range saturate (so they stay out of range) rather than
    wrap."""
    require_index(name, t, shape, device)
    return int32(t)


def int32(t: torch.Tensor) -> torch.Tensor:
    """Index values as a contiguous int32 tensor (no copy when they are one already)."""
    if t.dtype == torch.int32:
        return t if t.is_contiguous() else t.contiguous()
    return t.clamp(_INT32.min, _INT32.max).to(torch.int32).contiguous()


def op_index(t: torch.Tensor) -> torch.Tensor:
    """Index values as the ops take them: on CUDA int64 as they are (the CUDA op narrows all of
    a call's in one launch, saturating as :func:`int32` does; the torch path reads them as
    int64), elsewhere :func:`int32`."""
    if t.is_cuda and t.dtype == torch.int64:
        return t if t.is_contiguous() else t.contiguous()
    return int32(t)


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
    x: torch.Tensor, *, lengths=None, lengths_name="lengths", lengths_shape=None, m=None,
    mask_name="mask",
) -> TokenSet:
    """A padded token set ``x [N, L, H]``, optional prefix ``lengths`` (of ``lengths_shape``,
    ``[N]`` by default, e.g. ``[Nq, K]`` for ``N = Nq * K``) and ``mask [N, L]``."""
    n, width = x.shape[:2]
    if lengths is None and m is None:
        return TokenSet(x)
    if lengths is not None:
        require_index(lengths_name, lengths, lengths_shape or (n,), x.device)
        check_lengths(lengths_name, lengths, width)
        lengths = op_index(lengths).view(n)
    return TokenSet(x, lengths=lengths, mask=mask(mask_name, m, (n, width), x.device))


def check_lengths(name: str, lengths: torch.Tensor, width: int) -> None:
    """Prefix lengths lie in ``[0, width]``, where their values are checked."""
    if values_checked(lengths):
        check_range(name, lengths, 0, width, f"a length in [0, {width}] (the padded size)")


def packed(
    x: torch.Tensor, offsets, *, offsets_name="offsets", m=None, mask_name="mask"
) -> TokenSet:
    """A packed token set ``x [T, H]`` split by ``offsets [N+1]``, optional ``mask [T]``."""
    offsets = segment_offsets(offsets_name, offsets, x)
    m = None if m is None else mask(mask_name, m, (x.shape[0],), x.device)
    return TokenSet(x, offsets, None, m)


def segment_offsets(name: str, offsets, x: torch.Tensor) -> torch.Tensor:
    """CSR offsets ``[N+1]`` of the packed tokens ``x [T, H]``, returned as the ops take them
    (:func:`op_index`; checked where their values are)."""
    require_tensor(name, offsets, "of shape [N+1]")
    shape = offsets.shape
    if len(shape) != 1 or shape[0] < 1:
        raise ValueError(
            f"{name}: expected 1-D [N+1] with at least one entry, got shape {_shape(offsets)}"
        )
    require_index(name, offsets, shape, x.device)
    if values_checked(offsets):
        _check_offsets(name, offsets, x.shape[0])
    return op_index(offsets)


def pair_ids(q_name: str, pair_q, d_name: str, pair_d, nq: int, nd: int, device) -> tuple:
    """Pair lists ``[P]`` each, indexing existing segments (checked where values are)."""
    require_tensor(q_name, pair_q, "of shape [P]")
    shape = pair_q.shape
    if len(shape) != 1:
        raise ValueError(f"{q_name}: expected 1-D [P], got shape {_shape(pair_q)}")
    require_index(q_name, pair_q, shape, device)
    require_index(d_name, pair_d, shape, device)
    if values_checked(pair_q):
        check_range(q_name, pair_q, 0, nq - 1, f"a query id in [0, {nq}) (others are out of range)")
    if values_checked(pair_d):
        check_range(
            d_name, pair_d, 0, nd - 1, f"a document id in [0, {nd}) (others are out of range)"
        )
    return op_index(pair_q), op_index(pair_d)


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


def query_width(name: str, value, queries: TokenSet) -> int:
    """``max_lq`` for packed ``queries``: the caller's bound ``value`` (checked where the offsets'
    values are), else the longest query, read with one device->host sync.

    Kernels size their work by it (and the argmax is that wide); a query longer than it scores
    NaN where it is not checked.
    """
    offsets = queries.offsets
    if value is None:
        if offsets.device.type == "meta":
            raise ValueError(
                f"{name}: expected an int for tensors on meta (whose values are unknown)"
            )
        return longest_segment(offsets, queries.x.size(0))
    value = integer(name, value, 0, _INT32.max)  # the kernels index in int32
    if values_checked(offsets) and offsets.size(0) > 1:
        sizes = offsets[1:] - offsets[:-1]
        i = int(sizes.argmax())
        if int(sizes[i]) > value:
            raise ValueError(
                f"{name}: expected at least the longest query, got {value} < query {i}'s "
                f"{int(sizes[i])} tokens"
            )
    return value


def longest_segment(offsets: torch.Tensor, total: int) -> int:
    """Length of the longest segment of ``offsets`` over ``total`` tokens (one device->host
    sync); offsets outside ``[0, total]`` are clamped into it (their segments score NaN)."""
    if offsets.size(0) < 2:
        return 0
    bounded = offsets.clamp(0, total)
    return int((bounded[1:] - bounded[:-1]).max().clamp(min=0))


def check_range(name: str, t: torch.Tensor, low: int, high: int, what: str) -> None:
    """``t`` holds only values in ``[low, high]``; the error names the first bad position."""
    if t.numel() == 0:
        return
    smallest, largest = torch.aminmax(t)
    if int(smallest) >= low and int(largest) <= high:
        return
    position = tuple((((t < low) | (t > high)).nonzero()[0]).tolist())
    at = ", ".join(str(i) for i in position)
    raise IndexOutOfRange(
        f"{name}: expected {what}, got {name}[{at}] = {int(t[position])}"
    )


def _check_offsets(name: str, offsets: torch.Tensor, total: int) -> None:
    """CSR offsets: ``[0, ..., total]``, non-decreasing."""
    values = offsets.numpy() if offsets.device.type == "cpu" else offsets  # numpy: fewer us
    first, last = int(values[0]), int(values[-1])
    if first != 0:
        raise ValueError(f"{name}: expected {name}[0] == 0, got {first}")
    if bool((values[1:] < values[:-1]).any()):
        i = int((offsets[1:] < offsets[:-1]).nonzero()[0, 0])
        raise ValueError(
            f"{name}: expected non-decreasing offsets, got {name}[{i + 1}] = {int(offsets[i + 1])} "
            f"< {name}[{i}] = {int(offsets[i])}"
        )
    if last != total:
        raise ValueError(
            f"{name}: expected {name}[-1] == {total} (the number of tokens), got {last}"
        )
