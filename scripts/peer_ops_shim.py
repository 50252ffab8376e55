"""pytest plugin for scripts/peer_suite.sh: `maxsim._ops.ops` for test files that import
erikkaum/maxsim's private op table; each of its ops raises, naming what it is."""

import maxsim._ops as _ops


class PrivateOps:
    def __getattr__(self, name):
        raise AttributeError(
            f"{name}: a private op of erikkaum/maxsim, outside the compatibility surface"
        )


if not hasattr(_ops, "ops"):
    _ops.ops = PrivateOps()
