#!/usr/bin/env bash
# Runs the test suite (CPU; GPU tests skip without a GPU), setting up .venv on first use.
# Arguments go to pytest: bash scripts/test.sh -k padded -x
# MAXSIM_TEST_INTEGRATIONS=1 also installs PyLate, colpali-engine and sentence-transformers (pinned)
# so that their integration tests run instead of skipping.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/_setup_venv.sh
if [ -d .venv/kernels ]; then  # `kernels` apart from transformers (see _setup_venv.sh)
  python -m pytest -q -m "not kernels_hub" "$@"   # testpaths: tests/ and benchmarks/
  PYTHONPATH=".venv/kernels${PYTHONPATH:+:$PYTHONPATH}" python -m pytest -q -m kernels_hub tests/test_build.py
else
  python -m pytest -q "$@"   # testpaths: tests/ and benchmarks/ (pyproject.toml)
fi
if [ -d .venv/st6 ]; then  # sentence-transformers 6, kept apart from PyLate's pinned 5
  PYTHONPATH=".venv/st6${PYTHONPATH:+:$PYTHONPATH}" \
    python -m pytest tests/test_integrations_sentence_transformers.py -q "$@"
fi
