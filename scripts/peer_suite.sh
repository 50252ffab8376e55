#!/usr/bin/env bash
# Runs erikkaum/maxsim's own test suite against this package (the compatibility surface), on
# whatever device torch sees first, and prints pytest's summary.
#
#   bash scripts/peer_suite.sh PATH_TO_ERIKKAUM_MAXSIM_CHECKOUT [pytest args]
#
# Four of its test files import its private op table (`from maxsim._ops import ops`) to call its
# raw backward ops; scripts/peer_ops_shim.py gives them a stand-in whose every op raises, so those
# files collect and only the tests of the raw ops fail.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
peer="$(cd "$1" && pwd)"
shift
cd "$peer"
PYTHONPATH="$root/torch-ext:$root/scripts${PYTHONPATH:+:$PYTHONPATH}" \
  python -m pytest -q -p no:cacheprovider -p peer_ops_shim tests "$@"
