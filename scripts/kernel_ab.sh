#!/usr/bin/env bash
# A/B kernel timing of several source trees in one GPU call.
#
#   bash scripts/kernel_ab.sh prepare REF...     here: exports each git ref to build/ab/<ref>
#   bash scripts/kernel_ab.sh run [CASES]        on the GPU machine (carry build/ab): builds
#                                                every tree in parallel, checks each against
#                                                float64 (scripts/gpu_check.py), then times
#                                                the cases (benchmarks/kernel_ab.py, default all)
#
# Results go to $OUT: kernel_ab.jsonl, trees.txt (each tree's build time and check summary), and
# build_<tree>.log / check_<tree>.log only for a tree whose build or checks failed (a GPU machine
# returns few files). The timing script is this tree's, so every tree is timed the same way
# whatever its age.
set -uo pipefail
cd "$(dirname "$0")/.."
AB=build/ab
case "${1:-}" in
  prepare)
    shift
    rm -rf "$AB" && mkdir -p "$AB"
    for ref in "$@"; do
      mkdir -p "$AB/$ref" && git archive "$ref" csrc scripts torch-ext | tar -x -C "$AB/$ref" || exit 1
    done
    du -sh "$AB" ;;
  run)
    OUT=${OUT:-/tmp/kernel_ab}; mkdir -p "$OUT"
    trees=$(ls "$AB")
    jobs=$(( $(nproc) / $(echo "$trees" | wc -w) )); [ "$jobs" -ge 1 ] || jobs=1
    for t in $trees; do
      (cd "$AB/$t" && TORCH_EXTENSIONS_DIR=/tmp/ab_ext/$t MAX_JOBS=$jobs python3 -c \
        "import sys; sys.path.insert(0, 'scripts'); import gpu_check; gpu_check.build()" \
        > "$OUT/build_$t.log" 2>&1
       rc=$?; echo "build $t: rc $rc, $(tail -n 1 "$OUT/build_$t.log")" | tee -a "$OUT/trees.txt"
       [ $rc -eq 0 ] && rm -f "$OUT/build_$t.log") &
    done
    wait
    for t in $trees; do
      (cd "$AB/$t" && TORCH_EXTENSIONS_DIR=/tmp/ab_ext/$t timeout 300 python3 scripts/gpu_check.py \
        2>&1 | grep -v "^  ok" > "$OUT/check_$t.log")
      summary=$(tail -n 1 "$OUT/check_$t.log")
      echo "check $t: $summary" | tee -a "$OUT/trees.txt"
      if [[ "$summary" =~ checks:\ ([0-9]+)/([0-9]+)\ passed ]] && [ "${BASH_REMATCH[1]}" = "${BASH_REMATCH[2]}" ]; then
        rm -f "$OUT/check_$t.log"
      fi
      TORCH_EXTENSIONS_DIR=/tmp/ab_ext/$t timeout 300 python3 benchmarks/kernel_ab.py --root "$AB/$t" \
        --label "$t" ${2:+--only "$2"} | tee -a "$OUT/kernel_ab.jsonl"
    done ;;
  *) echo "usage: bash scripts/kernel_ab.sh prepare REF... | run [CASES]"; exit 2 ;;
esac
