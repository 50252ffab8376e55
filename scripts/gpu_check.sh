#!/usr/bin/env bash
# Everything the GPU machine runs in one call: kernel checks, quick timings, an ncu summary.
# Usage (repository root, GPU machine): bash scripts/gpu_check.sh [profile]
set -uo pipefail
OUT=${OUT:-/tmp/maxsim_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
python3 scripts/gpu_check.py --bench 2>&1 | tee "$OUT/check.log"
if [ "${1:-}" = profile ]; then
  ncu --target-processes all -k regex:"fwd_tc|bwd_" --launch-count 5 \
    --section SpeedOfLight --section Occupancy --section WarpStateStats --section SourceCounters \
    python3 scripts/gpu_check.py --profile-run > "$OUT/ncu.txt" 2>&1
  grep -E "fwd_tc|bwd_|Duration|Compute \(SM\) Throughput|Memory Throughput|Achieved Occupancy|Warp Cycles Per Issued|stalled" "$OUT/ncu.txt" | head -80
fi
