#!/usr/bin/env bash
# Runs erikkaum/maxsim's own test suite against this package (the compatibility surface), on
# whatever device torch sees first, and prints pytest's summary.
#
#   bash scripts/peer_suite.sh PATH_TO_ERIKKAUM_MAXSIM_CHECKOUT [pytest args]
#
# Its raw backward ops (`from maxsim._ops import ops`) are served by maxsim.compat_ops. Expected
# failures: the two documented choices (zero lengths accepted, NaN gives NaN).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
peer="$(cd "$1" && pwd)"
shift
cd "$peer"
PYTHONPATH="$root/torch-ext${PYTHONPATH:+:$PYTHONPATH}" \
  python -m pytest -q -p no:cacheprovider tests "$@"
