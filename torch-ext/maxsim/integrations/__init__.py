"""Drop-in patches that route other libraries' MaxSim scoring through maxsim.

Each submodule has `patch()` and `unpatch()` and reproduces the library's own results (its masking
and padding rules included); docs/INTEGRATIONS.md lists those rules. Importing a submodule does not
import its library; `patch()` does. MAXSIM_DISABLE=1 turns every `patch()` into a no-op that returns
False.

    from maxsim.integrations import pylate, colpali, sentence_transformers
"""

from ._patching import UnsupportedVersionError

__all__ = ["UnsupportedVersionError", "colpali", "pylate", "sentence_transformers"]


def __getattr__(name):
    # Submodules load on first use, so `import maxsim.integrations` stays free of their imports.
    if name in ("colpali", "pylate", "sentence_transformers"):
        import importlib

        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
