"""The mutations of the fuzz corpus (tests/fuzz_corpus.py): static ones, wrong on every device
(types, ranks, shapes, dtypes, devices, Python values), and random index values."""

import math
from dataclasses import dataclass

import maxsim
import torch

INT32_MAX = 2**31 - 1


@dataclass(frozen=True)
class Elsewhere:
    """A tensor the case puts on another device than the call's (meta beside the CPU)."""

    tensor: torch.Tensor


def _role(value):
    if isinstance(value, maxsim.QuantizedTokens):
        return "quantized"
    if not isinstance(value, torch.Tensor):
        return "python"
    if value.dtype == torch.bool:
        return "mask"
    return "tokens" if value.is_floating_point() else "index"


def _drop_last(v):
    return v[..., :-1] if v.dim() else v[None]


# (mutation, change, error) for each role; the error names the argument changed
_TENSOR_MUTATIONS = {
    "tokens": [
        ("a list", lambda v: v.tolist(), TypeError),
        ("two more dims", lambda v: v[None, None], ValueError),
        ("float64", lambda v: v.double(), TypeError),
        ("int32", lambda v: v.int(), TypeError),
    ],
    "index": [
        ("a list", lambda v: v.tolist(), TypeError),
        ("float32", lambda v: v.float(), TypeError),
        ("bool", lambda v: v != 0, TypeError),
        ("int16", lambda v: v.short(), TypeError),
        ("one more dim", lambda v: v[None], ValueError),
        ("one fewer entry", _drop_last, ValueError),
    ],
    "mask": [
        ("a list", lambda v: v.tolist(), TypeError),
        ("complex64", lambda v: v.to(torch.complex64), TypeError),
        ("one fewer column", _drop_last, ValueError),
    ],
    "quantized": [
        ("a list", lambda v: v.codes.tolist(), TypeError),
        ("two more dims", lambda v: v[None, None], ValueError),
    ],
}

_PYTHON_VALUES = {
    "top_k": [-1, 1.5, True, "2", 10**6],
    "chunk_size": [0, -2, 2.0],
    "max_q_len": [-1, 2.5, True, "3", 2**31],
    "max_seqlen_q": [-1, 2.5, True, "3", 2**40],
    "num_candidates": [-1, 1.5, True],
    "dtype": ["int4", None],
    "temperature": [0, -1.0, math.nan, math.inf, "1", True],
    "backend": ["triton", 1],
    "metric": ["cosine"],
    "candidates": [-1, 10**6],
}

# calls that accept a value (the mutation is then no error): (entry, argument, mutation)
_ACCEPTED = {
    ("quantize", "x", "two more dims"), ("quantize", "x", "float64"),
    ("dequantize", "q", "two more dims"), ("QuantizedTokens", "scale", "float64"),
    ("maxsim[quantized]", "Q", "float64"),  # quantized calls score in fp32 (quantize.resolve)
    ("maxsim[quantized candidates]", "Q", "float64"),
    ("maxsim_segments", "starts", "one fewer entry"),  # starts sets N; lengths mismatch
}
# where the error names another argument than the one changed (a count set by the first)
_NAMED = {
    "pair_q": "pair_d", "pair_query_ids": "pair_document_ids", "starts": "lengths",
}
_EXTRA = {  # Python arguments the corpus adds (the valid calls leave them at their defaults)
    "contrastive_": ["temperature"], "chamfer": ["metric"], "retrieve[rescore]": ["candidates"],
}


def static_mutations(entry, kw, draw):
    """``(what, kwargs, name, error)`` for each wrong-everywhere change of one argument."""
    first = next(k for k, v in kw.items() if _role(v) in ("tokens", "quantized"))
    no_backend = ("quantize", "dequantize", "QuantizedTokens", "MaxSimScorer", "Corpus")
    names = list(kw) + ["backend"] * (entry not in no_backend)
    names += [x for key, extra in _EXTRA.items() if entry.startswith(key) for x in extra]
    for arg in names:
        value = kw.get(arg)
        role = _role(value)
        for what, change, error in _TENSOR_MUTATIONS.get(role, []):
            if (entry, arg, what) in _ACCEPTED:
                continue
            name = _NAMED.get(arg, arg) if what == "one fewer entry" else arg
            if what == "one fewer entry" and ("offsets" in arg or "cu_seqlens" in arg):
                what, change = "no entry", lambda v: v[:0]  # one fewer is one segment fewer
            if entry == "QuantizedTokens" and arg == "codes" and what != "a list":
                continue  # int8 codes are no index: see below
            yield f"{arg}: {what}", {**kw, arg: change(value)}, name, error
        # Corpus takes its offsets on the host too (it keeps a host copy to slice chunks)
        host_ok = entry == "Corpus" and arg == "offsets"
        if role in ("tokens", "index", "mask", "quantized") and arg not in (first, "codes") \
                and not host_ok:
            yield f"{arg}: on another device", {**kw, arg: Elsewhere(value)}, arg, ValueError
        if role == "tokens" and arg != first and entry not in ("QuantizedTokens", "quantize"):
            wider = torch.cat([value, value[..., :1]], dim=-1)
            yield f"{arg}: another embedding dim", {**kw, arg: wider}, arg, ValueError
        for bad in _PYTHON_VALUES.get(arg, []) if role == "python" else []:
            yield f"{arg} = {bad!r}", {**kw, arg: bad}, arg, ValueError
    if entry == "QuantizedTokens":
        codes, scale = kw["codes"], kw["scale"]
        yield "codes: float32", {**kw, "codes": codes.float()}, "codes", TypeError
        yield "scale: one per row", {**kw, "scale": scale[..., :1]}, "scale", ValueError
        yield "scale: int32", {**kw, "scale": scale.int()}, "scale", TypeError


def value_mutation(kw, checks, draw):
    """``(what, kwargs)`` with one to two index values of one argument changed at random."""
    arg, kind, extent = draw.rng.choice(checks)
    value = kw[arg]
    if kind == "hint":
        longest = int((kw[extent][1:] - kw[extent][:-1]).max())
        hint = draw.rng.choice([None, max(longest - 1, 0), draw.int(0, max(longest, 0))])
        return f"{arg} = {hint}", {**kw, arg: hint}
    flat = value.flatten().clone()
    wide = flat.dtype == torch.int64
    changes = []
    for _ in range(draw.int(1, 2)):
        i = draw.int(0, flat.numel() - 1)
        flat[i] = new = draw.rng.choice(_bad_values(kind, extent, flat, i, draw, wide))
        changes.append(f"[{i}] = {new}")
    return f"{arg}{', '.join(changes)}", {**kw, arg: flat.view(value.shape)}


def _bad_values(kind, extent, flat, i, draw, wide):
    """Candidate values for entry ``i``: mostly out of range, now and then a valid one."""
    if kind == "lengths":
        values = [-1, -draw.int(2, 9), extent + 1, extent + draw.int(2, 9), draw.int(0, extent)]
    elif kind == "offsets":
        values = [-1, extent + 1, extent + draw.int(2, 9), draw.int(0, extent)]
        if i > 0:
            values.append(int(flat[i - 1]) - 1)  # decreasing
    else:  # ids or targets in [0, extent)
        values = [-1, -draw.int(2, 9), extent, extent + draw.int(1, 9), draw.int(0, extent - 1)]
    values += [INT32_MAX, -(2**31)]
    if wide:  # past the int32 range: saturates, never wraps into range
        values += [2**32 + 1, -(2**40)]
    return values
