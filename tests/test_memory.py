"""The PyTorch fallback and ``retrieve`` stay within their memory budget.

8 queries x 1000 documents (Lq 32, Ld 512, H 64, fp32): the naive similarity tensor alone would
take 524 MB. ``maxsim`` runs the compiled CPU kernels where they build, ``maxsim-torch`` the
PyTorch path. Each check runs in a fresh process (peak RSS is per process) with a 64 MB budget and
requires the peak RSS, measured once the inputs exist, to grow by less than 150 MB.
"""

import os
import subprocess
import sys

import pytest

SCRIPT = """
import resource, torch, maxsim
torch.manual_seed(0)
Q, D = torch.randn(8, 32, 64), torch.randn(1000, 512, 64)
maxsim.{call}(Q[:2, :4], D[:3, :5]{args})  # warm-up: load libraries and code paths
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
out = maxsim.{call}(Q, D{args})
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print((after - before) / 1024)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="ru_maxrss is in KiB on Linux")
@pytest.mark.parametrize(
    "call, args",
    [("maxsim", ""), ("maxsim", ", backend='torch'"), ("retrieve", ", 2")],
    ids=["maxsim", "maxsim-torch", "retrieve"],
)
def test_peak_memory_stays_bounded(call, args):
    env = dict(os.environ, MAXSIM_TORCH_MEMORY_MB="64", CUDA_VISIBLE_DEVICES="")
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT.format(call=call, args=args)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    grew_mb = float(result.stdout.strip().splitlines()[-1])
    assert grew_mb < 150, f"{call}: peak RSS grew by {grew_mb:.0f} MB (limit 150 MB)"
