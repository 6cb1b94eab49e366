#!/usr/bin/env bash
# One batched run on a lent GPU machine:
#   bash benchmarks/device_run.sh tests   # every GPU test, then a tuning run of the small corpus
#   bash benchmarks/device_run.sh bench   # every benchmark script
#   bash benchmarks/device_run.sh tune [matplan tune args]   # a tuning run into a fresh database,
#        exported (with the planner's online calibrations) to tuning.jsonl, e.g. `tune --size medium --real`;
#        stopped after TUNE_SECONDS (default 540) and still exported; TUNE_FROM=earlier.jsonl resumes one
# Logs and JSON go to a work folder packed into $OUT/<mode>.tgz (the device tool returns at most
# 8 files); a one-line status per step is printed. Needs $OUT, MATPLAN_COMMIT (the tree on the
# device has no .git) and the real matrices in .data/matrices (git-ignored; carry it).
set -uo pipefail
cd "$(dirname "$0")/.."
: "${OUT:?set OUT to a folder for the results}"
mode=${1:-}
work=$(mktemp -d)
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 MATPLAN_MATRICES=${MATPLAN_MATRICES:-$PWD/.data/matrices}
status=0
step() {  # step NAME COMMAND...: log to NAME.log, keep going, remember a failure
    local name=$1; shift
    local t0=$SECONDS
    "$@" > "$work/$name.log" 2>&1; local rc=$?
    echo "== $name: exit $rc, $((SECONDS - t0)) s: $(tail -n 1 "$work/$name.log")"
    [ $rc -eq 0 ] || status=1
}
case "$mode" in
  tests)
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
    step gpu_tests python3 -m pytest -q -m gpu -p no:cacheprovider -rfE tests
    step tune python3 -m matplan.cli tune --size small --no-progress --db "$work/tuning.sqlite"
    step export python3 -m matplan.cli db --db "$work/tuning.sqlite" export "$work/tuning.jsonl"
    rm -f "$work"/tuning.sqlite* ;;
  bench)
    for b in spmv spgemm sptrans tsgemm; do
      [ -f "benchmarks/$b.py" ] && step "bench_$b" python3 "benchmarks/$b.py" --out "$work"
    done
    step bench_dispatch python3 benchmarks/dispatch.py
    OUT=$work step bench_launch_overhead python3 benchmarks/launch_overhead.py ;;
  tune)
    shift
    [ -z "${TUNE_FROM:-}" ] || step import python3 -m matplan.cli db --db "$work/tuning.sqlite" import "$TUNE_FROM"
    step tune timeout "${TUNE_SECONDS:-540}" python3 -m matplan.cli tune --no-progress --db "$work/tuning.sqlite" "$@"
    step export python3 -m matplan.cli db --db "$work/tuning.sqlite" export "$work/tuning.jsonl"
    rm -f "$work"/tuning.sqlite* ;;
  *) echo "usage: $0 tests|bench|tune [args]" >&2; exit 2 ;;
esac
tar -C "$work" -czf "$OUT/$mode.tgz" .
exit $status
