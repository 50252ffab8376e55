#!/usr/bin/env bash
# Runs the test suite (CPU; GPU tests skip without a GPU), setting up .venv on first use.
# Arguments go to pytest: bash scripts/test.sh -k padded -x
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/_setup_venv.sh
python -m pytest tests -q "$@"
