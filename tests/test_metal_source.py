"""The shader text as Apple's compiler reads it (``__METAL_VERSION__`` defined, so the Metal branch
of metal/maxsim_common.h expands, not the CPU harness's shim): every kernel instance carries its
``[[host_name("...")]]``, and the names are exactly the ones both loaders look up."""

import os
import re
import shutil
import subprocess

import pytest
from maxsim import metal
from metal_harness import REPO

pytestmark = pytest.mark.metal

CXX = os.environ.get("CXX", "g++")
METAL = REPO / "metal"
# template [[host_name("maxsim_fwd_float")]] kernel decltype(maxsim_fwd<float>) maxsim_fwd<float>;
INSTANCE = re.compile(
    r'template\s*\[\[\s*host_name\(\s*"(\w+)"\s*\)\s*\]\]\s*kernel\s+decltype\(\s*(\w+)\s*<\s*(\w+)'
    r'\s*>\s*\)\s*(\w+)\s*<\s*(\w+)\s*>\s*;'
)
SUFFIX = {"float": "float", "half": "half", "bf16_bits": "bfloat"}


def preprocess(text, tmp_path, include=METAL, version=310):
    """``text`` through the C preprocessor as Metal's front end sees it: ``__METAL_VERSION__``
    defined and an empty ``<metal_stdlib>`` (its declarations do not matter to macro expansion)."""
    if shutil.which(CXX) is None:
        pytest.skip(f"needs a C preprocessor ({CXX})")
    (tmp_path / "metal_stdlib").write_text("")
    cmd = [CXX, "-E", "-P", "-x", "c++", f"-D__METAL_VERSION__={version}", f"-I{tmp_path}",
           f"-I{include}", "-"]
    done = subprocess.run(cmd, input=text, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return done.stdout


def instances(expanded):
    """[(host name, template, type argument)] of every explicit kernel instance, and how many
    ``MS_KERNEL_INSTANCE``-like lines did not parse as one."""
    found = []
    for name, fn, arg, fn2, arg2 in INSTANCE.findall(expanded):
        assert (fn, arg) == (fn2, arg2), f"{name}: decltype({fn}<{arg}>) vs {fn2}<{arg2}>"
        found.append((name, fn, arg))
    explicit = len(re.findall(r"^\s*template\s*\[\[", expanded, flags=re.M))
    return found, explicit - len(found)


def assert_names_match_lookups(expanded):
    found, unparsed = instances(expanded)
    assert unparsed == 0, "an explicit instance without a host_name attribute:\n" + expanded[-600:]
    names = [name for name, _, _ in found]
    assert sorted(names) == sorted(metal.KERNELS), f"host names {names}, lookups {metal.KERNELS}"
    for name, fn, arg in found:  # the name says which template and dtype it is
        assert name == f"{fn}_{SUFFIX[arg]}", (name, fn, arg)


def test_compile_shader_text_gives_every_kernel_its_host_name(tmp_path):
    """The exact text torch.mps.compile_shader receives."""
    assert_names_match_lookups(preprocess(metal.shader_source(), tmp_path))


def test_metallib_sources_give_every_kernel_its_host_name(tmp_path):
    """What kernel-builder compiles: each .metal on its own, the header found by include path."""
    expanded = "".join(preprocess((METAL / f).read_text(), tmp_path) for f in metal.SHADER_FILES)
    assert_names_match_lookups(expanded)


def test_both_loaders_look_up_the_same_names():
    """metal.py names a kernel as stem_dtype; the Hub binding builds every name of its list."""
    import torch

    planned = {metal.kernel_name(stem, dt) for stem in metal.KERNEL_STEMS
               for dt in (torch.float32, torch.float16, torch.bfloat16)}
    assert planned == set(metal.KERNELS)
    binding = (METAL / "maxsim_metal.mm").read_text()
    listed = re.search(r"kKernelNames\[\]\s*=\s*\{(.*?)\};", binding, flags=re.S)
    assert listed, "maxsim_metal.mm: no kKernelNames list"
    assert sorted(re.findall(r'"(\w+)"', listed.group(1))) == sorted(metal.KERNELS)


def test_negative_control_a_macro_parameter_named_host_name_is_caught(tmp_path):
    """The instance macro with its parameter spelled like the attribute: the preprocessor
    rewrites the attribute's word too, and the check must refuse the result."""
    header = (METAL / "maxsim_common.h").read_text()
    broken = re.sub(r"#define MS_KERNEL_INSTANCE\(name,", "#define MS_KERNEL_INSTANCE(host_name,",
                    header).replace("host_name(#name)", "host_name(#host_name)")
    assert broken != header
    (tmp_path / "inc").mkdir()
    (tmp_path / "inc" / "maxsim_common.h").write_text(broken)
    expanded = preprocess((METAL / "maxsim_fwd.metal").read_text(), tmp_path,
                          include=tmp_path / "inc")
    assert "[[maxsim_fwd_float(" in expanded.replace('"maxsim_fwd_float"', "")
    with pytest.raises(AssertionError, match="without a host_name"):
        assert_names_match_lookups(expanded)


@pytest.mark.parametrize("loader", ["compile_shader", "metallib"])
def test_math_mode_is_safe_for_both_loaders(loader, tmp_path):
    """From MSL 3.2 on, the text sets IEEE math itself (NaN in, NaN out), whatever fast-math
    default the loader compiles with; below it the pragma would be unknown, so it is left out."""
    texts = ([metal.shader_source()] if loader == "compile_shader" else
             [(METAL / f).read_text() for f in metal.SHADER_FILES])
    for text in texts:
        assert "#pragma METAL fp math_mode(safe)" in preprocess(text, tmp_path, version=320)
        assert "math_mode" not in preprocess(text, tmp_path, version=310)


def check_binding_uses_the_stream_encoder(binding):
    """The Hub binding encodes on the current MPS stream's encoder, on that stream's queue, and
    ends or commits nothing: PyTorch owns the encoder and the command buffer."""
    code = re.sub(r"//.*", "", binding)
    assert "at::mps::getCurrentMPSStream()" in code, "no current MPS stream"
    assert re.search(r"dispatch_sync\(\s*stream->queue\(\)", code), "not on the stream's queue"
    assert "stream->commandEncoder()" in code, "not the stream's compute encoder"
    for owned in ("endEncoding", "commit", "computeCommandEncoder]", "get_command_buffer"):
        assert owned not in code, f"the binding calls {owned}: PyTorch owns it"


def test_hub_binding_encodes_on_the_stream_encoder():
    check_binding_uses_the_stream_encoder((METAL / "maxsim_metal.mm").read_text())


def test_negative_control_a_binding_that_commits_is_caught():
    own_encoder = """
    id<MTLCommandBuffer> command_buffer = torch::mps::get_command_buffer();
    dispatch_sync(torch::mps::get_dispatch_queue(), ^() {
      id<MTLComputeCommandEncoder> encoder = [command_buffer computeCommandEncoder];
      [encoder endEncoding];
      torch::mps::commit();
    });"""
    with pytest.raises(AssertionError):
        check_binding_uses_the_stream_encoder(own_encoder)
    stream_then_commit = (METAL / "maxsim_metal.mm").read_text().replace(
        "[encoder dispatchThreads:grid threadsPerThreadgroup:group];",
        "[encoder dispatchThreads:grid threadsPerThreadgroup:group];\n      [encoder endEncoding];")
    with pytest.raises(AssertionError, match="endEncoding"):
        check_binding_uses_the_stream_encoder(stream_then_commit)
