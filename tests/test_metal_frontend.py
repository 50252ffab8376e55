"""What Apple's compiler and the launch would check, on Linux: the exact shader text through a real
clang front end that enforces Metal's address spaces and attributes (tests/metal_harness/
frontend.py), every ``[[buffer(i)]]`` against the argument the launch plan binds at position i
(for compile_shader and for the Hub binding), and the thread-position attributes against the ones
the CPU harness passes. Each check has a negative control (a planted mistake of its kind must
fail) and a positive one: the Metal source of the late-interaction-kernels wheel, which runs on
Macs, passes the front end unchanged."""

import re
import sys

import pytest
import torch
from conftest import op_args, token_set
from maxsim import metal
from maxsim.layouts import ALLPAIRS, PAIRS
from metal_harness import REPO, frontend

pytestmark = [
    pytest.mark.metal,
    pytest.mark.skipif(not frontend.available(),
                       reason="needs clang (apt-get install clang): the Metal front-end check"),
]

METAL = REPO / "metal"
FWD, BWD = METAL / "maxsim_fwd.metal", METAL / "maxsim_bwd.metal"
BINDING = METAL / "maxsim_metal.mm"
TEMPLATE_ARG = {"float": "float", "half": "half", "bfloat": "bf16_bits"}
ELEMENT_DTYPE = {"float": torch.float32, "half": torch.float16, "bf16_bits": torch.bfloat16,
                 "int": torch.int32, "uchar": torch.uint8}
# The builtins the harness passes, in its order (msl_shim.h's Binder: group, thread in group).
HARNESS_BUILTINS = [("uint3", "threadgroup_position_in_grid"),
                    ("uint", "thread_index_in_threadgroup")]


def edited(path, old, new):
    text = path.read_text()
    assert text.count(old) == 1, f"{path.name}: expected one {old!r}"
    return text.replace(old, new)


def shader_text(fwd=None, bwd=None):
    """The compile_shader text, with a shader's text replaced."""
    folder_text = {FWD.name: fwd or FWD.read_text(), BWD.name: bwd or BWD.read_text()}
    header = (METAL / metal.COMMON_HEADER).read_text().replace("#pragma once\n", "")
    parts = [header] + [folder_text[name].replace(f'#include "{metal.COMMON_HEADER}"\n', "")
                        for name in metal.SHADER_FILES]
    return "\n".join(parts)


# ---- the front end ------------------------------------------------------------------------------


def test_compile_shader_text_passes_the_front_end():
    assert shader_text() == metal.shader_source()
    counts = frontend.check(metal.shader_source())
    assert counts == {"instances": 6, "threadgroup arrays": 4}


@pytest.mark.parametrize("name", metal.SHADER_FILES)
def test_metallib_sources_pass_the_front_end(name):
    frontend.check((METAL / name).read_text(), include_dirs=[METAL])


@pytest.mark.parametrize("mistake, old, new, message", [
    ("pointer in the wrong space", "device const T* x, long start",
     "threadgroup const T* x, long start", "no matching function"),
    ("dropped qualifier", "device int* out_argmax =", "int* out_argmax =",
     "without an address space"),
    ("unknown attribute", "uint lane [[thread_index_in_threadgroup]]) {\n  typedef",
     "uint lane [[thread_index_in_simd_group]]) {\n  typedef", "unknown attribute"),
    ("matrix load from thread memory", "threadgroup const S* q_tile,\n",
     "thread const S* q_tile,\n", "no matching function"),
])
def test_front_end_refuses_a_planted_mistake(mistake, old, new, message):
    with pytest.raises(frontend.FrontEndError, match=message):
        frontend.check(shader_text(fwd=edited(FWD, old, new)))


def late_interaction_kernels_source():
    """Its shader text as its loader builds it (scripts/_setup_venv.sh installs the wheel, without
    its dependencies, in .venv/lik)."""
    apart = REPO / ".venv" / "lik"
    if apart.is_dir() and str(apart) not in sys.path:
        sys.path.append(str(apart))
    module = pytest.importorskip("late_interaction_kernels.mps.metal",
                                 reason="late-interaction-kernels is not installed")
    return module._build_kernel_source()


def test_metal_source_that_runs_on_macs_passes_unchanged():
    """Positive control: the shader of the late-interaction-kernels wheel (used by PyLate users on
    Apple Silicon), read from the installed package."""
    counts = frontend.check(late_interaction_kernels_source())
    assert counts["threadgroup arrays"] > 0


# ---- buffer indices and thread-position attributes ----------------------------------------------


def _split_top_level(params):
    parts, depth, start = [], 0, 0
    for i, char in enumerate(params):
        depth += char in "([" and 1 or (char in ")]" and -1 or 0)
        if char == "," and depth == 0:
            parts.append(params[start:i])
            start = i + 1
    return parts + [params[start:]]


def kernel_signatures(text, include_dirs=()):
    """{function: [(type, attribute, index or None)]} of every function whose parameters carry
    Metal attributes, read from the text after Metal's preprocessor."""
    pre = frontend.preprocess(text, include_dirs)
    found = {}
    for hit in re.finditer(r'clang::annotate\("metal_buffer", 0\)', pre):
        depth, i = 0, hit.start()
        while depth >= 0:  # back to the parameter list's opening parenthesis
            i -= 1
            depth += {")": 1, "(": -1}.get(pre[i], 0)
        name = re.search(r"(\w+)\s*$", pre[:i]).group(1)
        depth, j = 0, i
        while True:  # forward to its closing one
            j += 1
            depth += {"(": 1, ")": -1}.get(pre[j], 0)
            if depth < 0:
                break
        params = []
        for param in _split_top_level(pre[i + 1:j]):
            m = re.match(r'\s*(.*?)\s*\w+\s*\[\[clang::annotate\("metal_(\w+)"(?:,\s*(\d+))?\)\]\]',
                         param, flags=re.S)
            assert m, f"{name}: a parameter without a Metal attribute: {param.strip()!r}"
            params.append((m.group(1), m.group(2), None if m.group(3) is None else int(m.group(3))))
        found[name] = params
    return found


def check_buffer_indices(signatures):
    """Buffers first, buffer(i) on the i-th parameter, then the builtins the harness passes."""
    for name, params in signatures.items():
        buffers = [p for p in params if p[1] == "buffer"]
        if [index for _, _, index in buffers] != list(range(len(buffers))):
            raise AssertionError(f"{name}: buffer indices {[p[2] for p in buffers]} are not the "
                                 f"parameter positions 0..{len(buffers) - 1}")
        builtins = [(kind.replace(" ", ""), attr) for kind, attr, _ in params[len(buffers):]]
        if builtins != HARNESS_BUILTINS:
            raise AssertionError(f"{name}: after the buffers {builtins}, but the harness passes "
                                 f"{HARNESS_BUILTINS}")


def check_call(kernel, args, signatures):
    """The arguments a launch binds, position by position, against the kernel's buffers."""
    stem, suffix = kernel.rsplit("_", 1)
    buffers = [p for p in signatures[stem] if p[1] == "buffer"]
    if len(args) != len(buffers):
        raise AssertionError(f"{kernel}: the plan binds {len(args)} arguments, the kernel has "
                             f"{len(buffers)} buffers")
    for position, (arg, (kind, _, index)) in enumerate(zip(args, buffers)):
        spelled = kind.replace("__global", "").replace("__constant", "").replace("const", "")
        element = spelled.replace("*", "").replace("&", "").strip()
        element = TEMPLATE_ARG[suffix] if element == "T" else element
        if "&" in kind:  # a constant scalar: compile_shader binds an int as 8 bytes, a float as 4
            want = {"long": int, "float": float}[element]
            ok = type(arg) is want
        else:
            ok = isinstance(arg, torch.Tensor) and arg.dtype == ELEMENT_DTYPE[element]
        if not ok:
            got = arg.dtype if isinstance(arg, torch.Tensor) else type(arg).__name__
            raise AssertionError(f"{kernel}: argument {position} is {got}, buffer({index}) is "
                                 f"{kind.strip()}")


class Recorder:
    """A library with compile_shader's call convention that records every launch."""

    def __init__(self):
        self.calls = []

    def __getattr__(self, kernel):
        def launch(*args, threads, group_size):
            self.calls.append((kernel, list(args)))

        return launch


def plan_calls(lib):
    """Every kernel launch of the plan, each dtype, forward and backward, padded and packed."""
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        q = token_set("packed", 3, 9, 20, dtype, "cpu", "grid")
        d = token_set("padded", 4, 7, 20, dtype, "cpu", "grid")
        pq, pd = torch.tensor([0, 2, 1]), torch.tensor([3, 0, 1])
        for args in (op_args(q, d, ALLPAIRS), op_args(q, d, PAIRS, 0, pq, pd)):
            scores, argmax = metal.launch_fwd(lib, *args[:-1])
            argmax.copy_(torch.randint(-1, 7, argmax.shape))
            metal.launch_bwd(lib, torch.ones_like(scores), args[0], args[1], argmax, args[2],
                             args[5], args[8], args[9], args[10], 0)


@pytest.fixture(scope="module")
def signatures():
    return kernel_signatures(metal.shader_source())


def test_buffer_indices_match_the_launch_plan(signatures):
    """compile_shader binds argument i to buffer(i): every launch's arguments fit its kernel."""
    check_buffer_indices(signatures)
    lib = Recorder()
    plan_calls(lib)
    assert {kernel for kernel, _ in lib.calls} == set(metal.KERNELS)
    for kernel, args in lib.calls:
        check_call(kernel, args, signatures)


def test_metallib_sources_have_the_same_signatures(signatures):
    for name in metal.SHADER_FILES:
        for fn, params in kernel_signatures((METAL / name).read_text(), [METAL]).items():
            assert params == signatures[fn]


def test_hub_binding_binds_argument_i_to_buffer_i(signatures):
    """The Hub loader: ints and floats travel as 8- and 4-byte CPU tensors, in order, and the
    binding sets args[i] at index i (setBytes for CPU tensors, setBuffer for MPS ones)."""
    check_binding_indices(BINDING.read_text())
    recorded = []
    plan_calls(metal._ExtensionLibrary(lambda kernel, tensors, threads, group:
                                       recorded.append((kernel, tensors))))
    reference = Recorder()
    plan_calls(reference)
    for (kernel, tensors), (same_kernel, args) in zip(recorded, reference.calls, strict=True):
        assert kernel == same_kernel
        as_values = [t.item() if t.dtype in (torch.int64, torch.float32) and t.numel() == 1
                     and not isinstance(a, torch.Tensor) else t for t, a in zip(tensors, args)]
        check_call(kernel, as_values, signatures)
        for t, a in zip(tensors, args):
            if isinstance(a, int):
                assert t.dtype == torch.int64 and t.nbytes == 8  # `constant long&`


def check_binding_indices(text):
    loop = re.search(r"for \(NSUInteger (\w+) = 0; \1 < args\.size\(\); \+\+\1\) \{(.*?)\n      \}",
                     text, flags=re.S)
    if not loop:
        raise AssertionError("maxsim_metal.mm: no loop over args")
    index, body = loop.group(1), loop.group(2)
    binds = re.findall(r"atIndex:([^\]]+)\]", body)
    if len(binds) != 2 or any(b.strip() != index for b in binds):
        raise AssertionError(f"maxsim_metal.mm: binds at {binds}, expected atIndex:{index} twice")


def test_negative_controls_of_the_index_checks(signatures):
    swapped = edited(FWD, "constant long& H [[buffer(12)]]", "constant long& H [[buffer(13)]]")
    swapped = swapped.replace("constant long& q_rows [[buffer(13)]]",
                              "constant long& q_rows [[buffer(12)]]")
    with pytest.raises(AssertionError, match="buffer indices"):
        check_buffer_indices(kernel_signatures(shader_text(fwd=swapped)))
    lib = Recorder()
    plan_calls(lib)
    kernel, args = lib.calls[0]
    with pytest.raises(AssertionError, match="binds 18 arguments"):
        check_call(kernel, args[:-1], signatures)
    reordered = args[:3] + [args[4], args[3]] + args[5:]  # q_count <-> q_valid
    with pytest.raises(AssertionError, match="argument 3 is torch.uint8"):
        check_call(kernel, reordered, signatures)
    with pytest.raises(AssertionError, match="expected atIndex"):
        check_binding_indices(BINDING.read_text().replace("atIndex:i];", "atIndex:i + 1];", 1))


def test_negative_control_a_builtin_the_harness_does_not_pass():
    """thread_position_in_grid is Metal (the front end takes it), but the harness passes the
    thread's index in its group: the harness would run something other than the Mac."""
    planted = edited(BWD, "uint lane [[thread_index_in_threadgroup]]",
                     "uint lane [[thread_position_in_grid]]")
    frontend.check(shader_text(bwd=planted))
    with pytest.raises(AssertionError, match="the harness passes"):
        check_buffer_indices(kernel_signatures(shader_text(bwd=planted)))
