"""Shared machinery of the integrations: the off switch, version gates and reversible swaps."""

from __future__ import annotations

import importlib
import importlib.metadata
import logging
import os
import sys
import types
import warnings

import torch

logger = logging.getLogger("maxsim.integrations")

# The dtypes the maxsim ops take; anything else (float64, ints) goes to the library's own code.
KERNEL_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


class UnsupportedVersionError(RuntimeError):
    """The installed library is outside the version range the integration was tested against."""


def disabled(library: str) -> bool:
    """True when MAXSIM_DISABLE turns every patch into a no-op (and logs the skipped patch)."""
    if os.environ.get("MAXSIM_DISABLE", "").strip().lower() in ("", "0", "false", "no"):
        return False
    logger.info("MAXSIM_DISABLE is set: the %s integration is not applied", library)
    return True


def _release(version: str) -> tuple[int, ...]:
    """The numeric release part of a version string: '1.6.0rc1' -> (1, 6, 0)."""
    parts = []
    for piece in version.split("+")[0].split("."):
        digits = ""
        for char in piece:
            if not char.isdigit():
                break
            digits += char
        if not digits:
            break
        parts.append(int(digits))
    return tuple(parts)


def require_version(distribution: str, minimum: str, below: str, hint: str = "") -> str:
    """The installed version of `distribution`; raises unless minimum <= version < below."""
    try:
        version = importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError as err:
        raise ImportError(f"{distribution} is not installed") from err
    if not _release(minimum) <= _release(version) < _release(below):
        raise UnsupportedVersionError(
            f"{distribution} {version} is not supported by maxsim.integrations: "
            f"tested with {distribution}>={minimum},<{below}.{' ' + hint if hint else ''}"
        )
    return version


def import_optional(*names: str) -> None:
    """Import the modules that hold import-time copies of the functions we swap, so that the sweep
    finds them; modules that fail to import (an optional extra missing) cannot hold a copy."""
    for name in names:
        try:
            importlib.import_module(name)
        except ImportError:
            pass


def supported_tensors(*tensors) -> bool:
    """True when the maxsim ops can take these embeddings: non-empty tensors of one kernel dtype on
    one device. Anything else is left to the library's own code, which defines its result."""
    if not all(isinstance(t, torch.Tensor) for t in tensors):
        return False
    first = tensors[0]
    return (
        all(t.dtype == first.dtype and t.device == first.device and t.numel() > 0 for t in tensors)
        and first.dtype in KERNEL_DTYPES
    )


class Patcher:
    """Records every attribute swap so that `restore` puts the originals back exactly."""

    def __init__(self) -> None:
        self._swaps: list[tuple[object, str, object]] = []

    @property
    def active(self) -> bool:
        return bool(self._swaps)

    def swap(self, owner: object, name: str, replacement: object) -> None:
        self._swaps.append((owner, name, owner.__dict__[name]))
        setattr(owner, name, replacement)

    def sweep(self, prefix: str, replacements: dict[int, object]) -> None:
        """Replace, in every loaded module under `prefix`, each module attribute and each default
        argument of a function or method that is one of the originals (keyed by `id`). This covers
        `from ..scores import f` copies and `def __init__(self, fn=f)` defaults alike."""
        for module_name, module in list(sys.modules.items()):
            if module is None or not (
                module_name == prefix or module_name.startswith(prefix + ".")
            ):
                continue
            for name, value in list(vars(module).items()):
                if id(value) in replacements:
                    self.swap(module, name, replacements[id(value)])
                elif isinstance(value, type) and value.__module__ == module_name:
                    for member in vars(value).values():
                        self._swap_defaults(member, replacements)
                elif isinstance(value, types.FunctionType):
                    self._swap_defaults(value, replacements)

    def _swap_defaults(self, function: object, replacements: dict[int, object]) -> None:
        if not isinstance(function, types.FunctionType):
            return
        defaults = function.__defaults__
        if defaults and any(id(d) in replacements for d in defaults):
            self._swaps.append((function, "__defaults__", defaults))
            function.__defaults__ = tuple(replacements.get(id(d), d) for d in defaults)
        kwdefaults = function.__kwdefaults__
        if kwdefaults and any(id(d) in replacements for d in kwdefaults.values()):
            self._swaps.append((function, "__kwdefaults__", kwdefaults))
            function.__kwdefaults__ = {k: replacements.get(id(d), d) for k, d in kwdefaults.items()}

    def restore(self) -> bool:
        restored = bool(self._swaps)
        for owner, name, original in reversed(self._swaps):
            setattr(owner, name, original)
        self._swaps.clear()
        return restored


class WarnOnce:
    """Issues one warning per key for the life of the process."""

    def __init__(self) -> None:
        self._seen: set[str] = set()

    def __call__(self, key: str, message: str) -> None:
        if key not in self._seen:
            self._seen.add(key)
            warnings.warn(message, RuntimeWarning, stacklevel=3)
