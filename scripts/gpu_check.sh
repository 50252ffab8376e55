#!/usr/bin/env bash
# Everything a GPU machine runs, in one call: build + kernel checks, the test suite, the
# benchmark, the hub-variant check, the call profile, an ncu summary. Logs and results go to $OUT.
#
#   [BENCH_ARGS=...] bash scripts/gpu_check.sh [stage ...]
#                                             stages: check test integ bench hub profile ncu
#                                             ncu_rerank sanitize fuzz archs jit search
#                                             (default: check test bench)
#
# Peer and helper wheels placed in .whl/ are installed into /tmp/site first. `integ` installs the
# wheels in .whl/pylate/ (PyLate and what it needs beyond the machine's packages, colpali-engine)
# into /tmp/integ and runs those integration tests plus the PyLate training-step timing. The
# benchmark takes its commit from MAXSIM_COMMIT / MAXSIM_DIRTY when set (a copied tree's .git
# may be stale). The exit status is non-zero when any stage's test run, check, benchmark or
# sanitizer failed, whatever pipes its output goes through. `archs` runs check, the CUDA tests,
# memcheck and maxsim-vs-naive kernel times per emulated GPU (ARCHS="t4 a100 a10g l4 b200
# rtx5090" selects; scripts/arch_check.py) into $OUT/archs.json; `jit` times the first use of a
# compute_90 PTX build against sm_90a machine code (scripts/jit_cost.py) into $OUT/jit_cost.json.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/maxsim_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
if compgen -G ".whl/*.whl" > /dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl && export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="torch-ext${PYTHONPATH:+:$PYTHONPATH}"
stages=("$@")
[ ${#stages[@]} -eq 0 ] && stages=(check test bench)
status=0
# Call right after a pipeline: fails the run when its first command failed (the tee / tail /
# grep after it only shape the log).
ran() {
  local rc=${PIPESTATUS[0]}
  if [ "$rc" -ne 0 ]; then
    echo "::: $stage: $1 failed (exit $rc)"
    status=1
  fi
}
for stage in "${stages[@]}"; do
  echo "::: $stage"
  start=$SECONDS
  case "$stage" in
    check) python3 scripts/gpu_check.py 2>&1 | grep -v "^  ok" | tee "$OUT/check.log"; ran "gpu_check.py" ;;
    test)
      python3 -m pytest tests -q -p no:cacheprovider --ignore=tests/test_integrations_pylate.py \
        --ignore=tests/test_integrations_colpali.py 2>&1 | tail -n 30 | tee "$OUT/pytest.log"
      ran "pytest" ;;
    integ)
      # The integration tests must run here: a library that does not import is a failure.
      export MAXSIM_TEST_INTEGRATIONS=1
      python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/integ .whl/pylate/*.whl
      ran "installing .whl/pylate"
      PYTHONPATH="/tmp/integ:$PYTHONPATH" python3 -m pytest -q -p no:cacheprovider \
        tests/test_integrations_pylate.py tests/test_integrations_colpali.py 2>&1 | tail -n 15 \
        | tee "$OUT/integ.log"
      ran "PyLate and colpali-engine tests"
      python3 -m pytest -q -p no:cacheprovider tests/test_integrations_sentence_transformers.py \
        2>&1 | tail -n 5 | tee -a "$OUT/integ.log"
      ran "sentence-transformers tests"
      PYTHONPATH="/tmp/integ:$PYTHONPATH" python3 benchmarks/pylate_step.py \
        --out "$OUT/pylate_step.json" 2>&1 | tail -n 6 | tee -a "$OUT/integ.log"
      ran "pylate_step.py" ;;
    bench)
      # BENCH_ARGS selects rows (e.g. "--only train_small"); a selection merges into
      # $OUT/bench.json, so copy bench_results/<gpu>.json there first to keep the other rows.
      # shellcheck disable=SC2086
      python3 benchmarks/bench.py --out "$OUT/bench.json" ${BENCH_ARGS:-} 2>&1 | tail -n 80 \
        | tee "$OUT/bench.log"
      ran "bench.py" ;;
    hub) python3 scripts/hub_check.py --build 2>&1 | grep -v "warning" | tail -n 20 | tee "$OUT/hub.log"; ran "hub_check.py" ;;
    profile) python3 benchmarks/call_profile.py --out "$OUT/profile.json" 2>&1 | tee "$OUT/profile.log"; ran "call_profile.py" ;;
    ncu)
      ncu --target-processes all -k regex:"fwd_tc|bwd_" --launch-count 6 \
        --section SpeedOfLight --section Occupancy --section WarpStateStats \
        python3 scripts/gpu_check.py --profile-run > "$OUT/ncu.txt" 2>&1
      ran "ncu"
      grep -E "fwd_tc|bwd_|Duration|Throughput|Achieved Occupancy|Warp Cycles Per Issued" \
        "$OUT/ncu.txt" | head -n 80
      # Per-instruction counts of the first two forward kernels: where the instructions go.
      ncu --target-processes all -k regex:"fwd_tc" --launch-count 2 --section SourceCounters \
        --page source --print-source=sass --csv python3 scripts/gpu_check.py --profile-run \
        > "$OUT/sass.csv" 2>/dev/null
      python3 benchmarks/sass_histogram.py "$OUT/sass.csv" | tee "$OUT/sass.txt" | head -n 60 ;;
    ncu_rerank)
      # Per-instruction counts of our streaming kernel and the peers' on two reranking rows.
      ncu --profile-from-start off --section SourceCounters --page source --print-source=sass \
        --csv python3 benchmarks/call_profile.py --ncu --only rerank,rerank_heavy \
        --impl maxsim,flash-maxsim > "$OUT/sass_rerank.csv" 2>/dev/null
      python3 benchmarks/sass_histogram.py "$OUT/sass_rerank.csv" | tee "$OUT/sass_rerank.txt" \
        | head -n 120 ;;
    sanitize)
      python3 scripts/sanitize_cases.py > /dev/null  # builds the extension outside the tools
      ran "sanitize_cases.py"
      # memcheck also runs the malformed calls of the fuzz corpus (index tensors on the GPU)
      compute-sanitizer --tool memcheck --error-exitcode 1 python3 scripts/sanitize_cases.py \
        --fuzz 2>&1 | grep -E "MISMATCH|CONTEXT|fuzz:|Invalid|Program hit|ERROR SUMMARY|done" \
        | tail -n 40 | tee -a "$OUT/sanitize.log"
      ran "compute-sanitizer --tool memcheck"
      # racecheck reports the TMA stages' mbarrier handshake (which it does not model) as
      # warnings: the stage fails on errors, read from its summary line
      compute-sanitizer --tool racecheck python3 scripts/sanitize_cases.py 2>&1 | tail -n 4 \
        | tee "$OUT/racecheck.log"
      ran "compute-sanitizer --tool racecheck"
      cat "$OUT/racecheck.log" >> "$OUT/sanitize.log"
      grep -q "RACECHECK SUMMARY: .*(0 errors" "$OUT/racecheck.log"
      ran "racecheck errors (0 expected)" ;;
    fuzz)
      # the fuzz corpus without the tools: bad values give NaN, then with MAXSIM_DEBUG=1 errors
      python3 scripts/sanitize_cases.py --only-fuzz 2>&1 | tail -n 30 | tee "$OUT/fuzz.log"
      ran "fuzz corpus"
      MAXSIM_DEBUG=1 python3 scripts/sanitize_cases.py --only-fuzz 2>&1 | tail -n 30 \
        | tee -a "$OUT/fuzz.log"
      ran "fuzz corpus (MAXSIM_DEBUG=1)" ;;
    archs) python3 scripts/arch_check.py --out "$OUT" 2>&1 | tee "$OUT/archs.log"; ran "arch_check.py" ;;
    jit) python3 scripts/jit_cost.py --out "$OUT" 2>&1 | tee "$OUT/jit_cost.log"; ran "jit_cost.py" ;;
    search)
      # Corpus search against fast-plaid: its wheels (.whl/search/) go to /tmp/search only. Fetch
      # them where pip reaches PyPI: python3 -m pip download --no-deps --only-binary=:all:
      #   --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64 -d .whl/search
      #   fast-plaid==1.7.0.2110 fastkmeans==0.5.0 usearch==2.26.6 numkong==7.8.6 joblib==1.6.0
      # SEARCH_ARGS selects (e.g. "--corpora fiqa --dims 96 --budget-s 480"); rows merge into
      # $OUT/search.json, seeded from bench_results/search-<gpu>.json when SEARCH_SEED names it.
      if compgen -G ".whl/search/*.whl" > /dev/null; then
        python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
          --target /tmp/search .whl/search/*.whl
        ran "installing .whl/search"
      fi
      [ -n "${SEARCH_SEED:-}" ] && [ -f "$SEARCH_SEED" ] && cp "$SEARCH_SEED" "$OUT/search.json"
      # shellcheck disable=SC2086
      PYTHONPATH="/tmp/search:$PYTHONPATH" python3 benchmarks/search.py --out "$OUT/search.json" \
        ${SEARCH_ARGS:-} 2>&1 | tail -n 120 | tee "$OUT/search.log"
      ran "search.py" ;;
    *) echo "unknown stage $stage (check test integ bench hub profile ncu ncu_rerank sanitize fuzz archs jit search)"; status=2 ;;
  esac
  echo "::: $stage took $((SECONDS - start)) s"
done
exit $status
