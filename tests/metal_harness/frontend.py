"""A front end that checks what Apple's Metal compiler checks, on Linux: clang in C++ for OpenCL
mode over the shader text as Metal reads it (``__METAL_VERSION__`` defined, ``<metal_stdlib>``
from frontend/: Metal's address spaces as OpenCL's, Metal's attributes as clang::annotate).

What it refuses: a pointer or reference converted to another address space, one declared without
an address space (Metal has no generic space; clang leaves such a declaration in OpenCL's generic
space, which :func:`generic_declarations` reports), an attribute Metal does not have, a Metal
function called with memory it does not take (``simdgroup_load`` from thread memory), and every
ordinary C++ error. Two rewrites of the preprocessed text make it OpenCL-legal without changing a
type: the ``[[host_name]]`` of explicit kernel instances is dropped (OpenCL allows no attribute
there; tests/test_metal_source.py checks those names), and a threadgroup array declared in a
function body becomes a local pointer to threadgroup memory (OpenCL allows ``__local`` arrays in
kernel functions only, and kernels cannot be templates in OpenCL), which keeps every use of it
type-checked as the decayed array it was.
"""

import re
import shutil
import subprocess
from pathlib import Path

HERE = Path(__file__).resolve().parent
SHIM = HERE / "frontend"
CLANG = shutil.which("clang") or shutil.which("clang-14")
MODE = ["-x", "clcpp", "-cl-std=clc++2021", "-cl-no-stdinc"]
INSTANCE_ATTRIBUTE = re.compile(r'template\s*\[\[clang::annotate\("metal_host_name",\s*"\w+"\)\]\]')
# A threadgroup array declared as a statement: `__local T name[n];` after `;`, `{` or `}`.
LOCAL_ARRAY = re.compile(r"(?<=[;{}])(\s*)__local\s+([\w:<>, ]+?)\s+(\w+)\s*\[[^;\]]*\]\s*;")
LOCATION = re.compile(r"0x[0-9a-f]+ (?:(?:prev|parent) 0x[0-9a-f]+ )*<(<stdin>[^>]*|[^<>]*)>")
DECLARATION = re.compile(r"^[\s|`-]*(ParmVarDecl|VarDecl|FieldDecl)\b.*'([^']*)'")


class FrontEndError(AssertionError):
    """clang refused the shader text (its diagnostics inside)."""


def available() -> bool:
    return CLANG is not None


def preprocess(text: str, include_dirs=()) -> str:
    """The text after Metal's preprocessor, with line markers (diagnostics name the source)."""
    cmd = [CLANG, *MODE, "-E", "-D__METAL_VERSION__=320", f"-I{SHIM}",
           *(f"-I{d}" for d in include_dirs), "-"]
    done = subprocess.run(cmd, input=text, capture_output=True, text=True)
    if done.returncode != 0:
        raise FrontEndError(f"preprocessing failed:\n{done.stderr[-4000:]}")
    return done.stdout


def rewrite(preprocessed: str):
    """``(text, instances, arrays)``: the two OpenCL-legal rewrites and how many of each."""
    text, instances = INSTANCE_ATTRIBUTE.subn("template", preprocessed)
    text, arrays = LOCAL_ARRAY.subn(r"\1__local \2* \3 = 0;", text)
    return text, instances, arrays


def check(text: str, include_dirs=()):
    """Compile ``text`` as Metal source; raise :class:`FrontEndError` with clang's diagnostics or
    the declarations left without an address space. Returns the rewrite counts."""
    source, instances, arrays = rewrite(preprocess(text, include_dirs))
    # Metal's own pragmas (`#pragma METAL fp ...`) are unknown to clang, as unknown ones are to
    # Metal.
    cmd = [CLANG, *MODE, "-fsyntax-only", "-Werror", "-Werror=unknown-attributes",
           "-Wno-unknown-pragmas",
           "-Xclang", "-ast-dump", "-fno-color-diagnostics", "-"]
    done = subprocess.run(cmd, input=source, capture_output=True, text=True)
    if done.returncode != 0:
        raise FrontEndError(f"clang refused the shader text:\n{done.stderr[-6000:]}")
    generic = generic_declarations(done.stdout)
    if generic:
        raise FrontEndError("declared without an address space (Metal requires one):\n"
                            + "\n".join(generic[:20]))
    return {"instances": instances, "threadgroup arrays": arrays}


def generic_declarations(ast_dump: str):
    """Parameters, variables and fields written outside frontend/ whose type names OpenCL's
    generic address space; declarations inside implicit ones (copy constructors) are clang's."""
    found, current, implicit_depth = [], "", None
    for line in ast_dump.splitlines():
        depth = len(line) - len(line.lstrip(" |`-"))
        if implicit_depth is not None and depth <= implicit_depth:
            implicit_depth = None
        where = LOCATION.search(line)
        if where:
            first = where.group(1).split(",")[0]
            if not first.startswith(("line:", "col:", "<invalid", "<built-in", "<scratch")):
                current = first.rsplit(":", 2)[0]
        if implicit_depth is None and " implicit " in line:
            implicit_depth = depth
        match = DECLARATION.match(line)
        if implicit_depth is not None or not match or "__generic" not in match.group(2):
            continue
        if str(SHIM) in current:
            continue
        name = re.search(r"\s(\w+)\s+'", line)
        found.append(f"{current}: {match.group(1)} {name.group(1) if name else '?'} "
                     f"'{match.group(2)}'")
    return found
