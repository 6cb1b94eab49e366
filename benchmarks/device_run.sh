#!/usr/bin/env bash
# One batched run on a lent GPU machine, from the root of its copy of the tree:
#   bash benchmarks/device_run.sh tests   # every GPU test, then a tuning run of the small corpus
#   bash benchmarks/device_run.sh bench   # every benchmark script
#   bash benchmarks/device_run.sh tune [matplan tune args]   # a tuning run into a fresh database, e.g.
#        `tune --size medium --real`; stopped after TUNE_SECONDS (default 540) and still exported;
#        TUNE_FROM=earlier.jsonl resumes one
# Everything is packed into $OUT/<mode>.tgz (the device tool returns at most 8 files):
#   logs/<step>.log          each step's console output (logs never go to benchmarks/results/)
#   results/                 bench: the result files the run rewrote (<benchmark>-<device>.json) and
#                            the regenerated SUMMARY.md and plots; update the tree with
#                            `tar -xzf bench.tgz -C benchmarks results`
#   tuning-<device>.jsonl    tests, tune: the timings exported with the planner's online calibrations
#                            (a model refitted on them ships with it as results/training-<device>.jsonl)
# A one-line status per step is printed. Results record the commit git reads in this checkout at run
# time, or "unknown (no .git)" in a copy without .git, with a digest of matplan's sources either way.
# Real matrices: .data/matrices (git-ignored; carry it).
set -uo pipefail
cd "$(dirname "$0")/.."
: "${OUT:?set OUT to a folder for the results}"
mode=${1:-}
work=$(mktemp -d)
mkdir -p "$work/logs" "$work/results"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 MATPLAN_MATRICES=${MATPLAN_MATRICES:-$PWD/.data/matrices}
slug=$(python3 benchmarks/_common.py slug 2>/dev/null || echo gpu)
status=0
step() {  # step NAME COMMAND...: log to logs/NAME.log, keep going, remember a failure
    local name=$1; shift
    local t0=$SECONDS
    "$@" > "$work/logs/$name.log" 2>&1; local rc=$?
    echo "== $name: exit $rc, $((SECONDS - t0)) s: $(tail -n 1 "$work/logs/$name.log")"
    [ $rc -eq 0 ] || status=1
}
case "$mode" in
  tests)
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
    step gpu_tests python3 -m pytest -q -m gpu -p no:cacheprovider -rfE tests
    step tune python3 -m matplan.cli tune --size small --no-progress --db "$work/tuning.sqlite"
    step export python3 -m matplan.cli db --db "$work/tuning.sqlite" export "$work/tuning-$slug.jsonl"
    rm -f "$work"/tuning.sqlite* ;;
  bench)
    touch "$work/started"
    for b in spmv spgemm sptrans tsgemm; do
      [ -f "benchmarks/$b.py" ] && step "bench_$b" python3 "benchmarks/$b.py" --out benchmarks/results
    done
    step bench_dispatch python3 benchmarks/dispatch.py --out benchmarks/results
    step bench_launch_overhead python3 benchmarks/launch_overhead.py --out benchmarks/results
    find benchmarks/results -maxdepth 1 -type f -newer "$work/started" -exec cp {} "$work/results/" \; ;;
  tune)
    shift
    [ -z "${TUNE_FROM:-}" ] || step import python3 -m matplan.cli db --db "$work/tuning.sqlite" import "$TUNE_FROM"
    step tune timeout "${TUNE_SECONDS:-540}" python3 -m matplan.cli tune --no-progress --db "$work/tuning.sqlite" "$@"
    step export python3 -m matplan.cli db --db "$work/tuning.sqlite" export "$work/tuning-$slug.jsonl"
    rm -f "$work"/tuning.sqlite* ;;
  *) echo "usage: $0 tests|bench|tune [args]" >&2; exit 2 ;;
esac
rm -f "$work/started"
tar -C "$work" -czf "$OUT/$mode.tgz" .
exit $status
