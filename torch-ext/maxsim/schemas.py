"""The op schemas, read from schemas.h (the C++ binding defines its ops with the same strings),
and ``FwdArgs``, the ``fwd`` op's arguments by name."""

import re
from collections import namedtuple
from pathlib import Path


def _read_schemas(path):
    """``{"fwd": "fwd(Tensor q, ...) -> (...)", ...}`` from the header's string constants."""
    text = path.read_text()
    schemas = {}
    for block in re.findall(r"^constexpr char k\w+\[\] =((?:\s*\"[^\"]*\")+);", text, re.M):
        schema = "".join(re.findall(r"\"([^\"]*)\"", block))
        schemas[schema.split("(", 1)[0]] = schema
    return schemas


def argument_names(schema):
    """The argument names of ``schema``, in order: ``"f(Tensor q, int? n) -> ..."`` -> q, n."""
    arguments = schema.split("(", 1)[1].split(") ->", 1)[0]
    return [argument.split()[-1] for argument in arguments.split(",")]


SCHEMAS = _read_schemas(Path(__file__).resolve().parent / "schemas.h")
FWD_SCHEMA = SCHEMAS["fwd"]
BWD_SCHEMA = SCHEMAS["bwd"]
CE_SCHEMA = SCHEMAS["ce"]
STEP_SCHEMA = SCHEMAS["contrastive_step"]


# The arguments of ``fwd`` by name, in schema order: ``a = FwdArgs(*args)``.
FwdArgs = namedtuple("FwdArgs", argument_names(FWD_SCHEMA))
