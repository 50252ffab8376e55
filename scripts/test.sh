#!/usr/bin/env bash
# Runs the test suite (CPU; GPU tests skip without a GPU), setting up .venv on first use.
# Arguments go to pytest: bash scripts/test.sh -k padded -x
# MAXSIM_TEST_INTEGRATIONS=1 also installs PyLate, colpali-engine and sentence-transformers (pinned)
# so that their integration tests run instead of skipping.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/_setup_venv.sh
# testpaths: tests/ and benchmarks/ (pyproject.toml); `kernels` lives in .venv/st63
python -m pytest -q -m "not kernels_hub" "$@"
if [ -d .venv/st63 ]; then  # sentence-transformers 6.3 + transformers 5.25 + kernels 0.19
  PYTHONPATH=".venv/st63${PYTHONPATH:+:$PYTHONPATH}" python -m pytest -q \
    tests/test_integrations_sentence_transformers.py tests/test_hub_loading.py tests/test_build.py \
    "$@"
fi
