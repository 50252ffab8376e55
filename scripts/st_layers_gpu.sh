#!/usr/bin/env bash
# On a GPU machine: builds this checkout's CUDA variant, runs sentence-transformers 6.3's scorer
# through its layers (CPU and CUDA), the hub-loading tests, and `kernels benchmark`. Logs to $OUT.
#
#   bash scripts/st_layers_gpu.sh
#
# The machine needs no network: the wheels it installs (with --no-deps, into /tmp/st63, ahead of
# the machine's own packages) are put in .whl/st63 beforehand, for its Python (3.12 here):
#   pip download --no-deps --only-binary=:all: --python-version 3.12 \
#     --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 -d .whl/st63 \
#     sentence-transformers==6.3.0 transformers==5.25.0 kernels==0.19.1 huggingface-hub==2.4.0 \
#     httpx2==2.17.0 httpcore2==2.17.0 hf-xet==1.8.0 h11==0.16.0 anyio==4.16.0 idna==3.21 \
#     truststore==0.10.5 tomlkit==0.15.3 tabulate==0.10.0 typer==0.29.2 regex==2026.12.2 \
#     tokenizers==0.23.3 safetensors==0.8.0 shellingham==1.5.4 rich==15.0.0 click==8.5.1 \
#     annotated-doc==0.0.7 pygments==2.21.0 markdown-it-py==4.3.0 mdurl==0.1.2 \
#     typing-extensions==4.16.0 pydantic==2.14.4 pydantic-core==2.50.5 typing-inspection==0.4.5 \
#     annotated-types==0.8.0
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/maxsim_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/st63 .whl/st63/*.whl || exit 1
export PYTHONPATH="/tmp/st63:torch-ext${PYTHONPATH:+:$PYTHONPATH}"
status=0
# The device's arch only (the full list is for a release); the tests' own rebuilds read it too.
MAXSIM_CUDA_ARCHS=$(python3 -c "import sys, torch; sys.path.insert(0, 'scripts'); \
from build_variant import recipe; print(recipe.device_arch(*torch.cuda.get_device_capability()))")
export MAXSIM_CUDA_ARCHS
python3 scripts/build_variant.py --out build 2>&1 | tail -n 3 | tee "$OUT/build.log"
[ "${PIPESTATUS[0]}" -eq 0 ] || exit 1
python3 -m pytest -q -p no:cacheprovider -rs tests/test_integrations_sentence_transformers.py \
  tests/test_hub_loading.py tests/test_layers.py 2>&1 | tail -n 25 \
  | tee "$OUT/st_layers.log"
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1
python3 -c "import sys; from kernels._internals.cli import main; \
sys.argv = ['kernels', 'benchmark', '.', '--iterations', '100', '--warmup', '10']; main()" 2>&1 \
  | tee "$OUT/kernels_benchmark.log"
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1
exit $status
