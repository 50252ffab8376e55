#!/usr/bin/env bash
# Runs the quickstart example, setting up .venv on first use.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/_setup_venv.sh
python examples/01_quickstart.py
