#!/usr/bin/env bash
# scripts/stress_test.sh — the functional suite on a loaded machine: no test may depend on timing.
#
#   scripts/stress_test.sh [RUNS] [CTEST ARGS...]
#
# Runs ctest over an existing build (default build-release; build it first, e.g. with
# scripts/setup.sh test or the README's cmake lines) RUNS times in a row (default 3) while a CPU
# hog per core (`yes > /dev/null`, at the tests' own priority) keeps every core busy; stops at the
# first run with a failed test and exits 1. Extra arguments go to ctest (e.g. -R kvtier_cli to
# stress a subset). The hogs are stopped on any exit (their pids, nothing else).
#
# How long: a loaded run takes about twice the unloaded ctest time of that build dir, since the
# tests get half the CPU. Measured on the 2-core Debian box (2026-12-07, build-release of 3b9fd3e,
# the box also running a CI build, a 30-minute soak and three helpers' builds: load average ~20):
# 24, 22 and 35 min for the three runs of the whole suite (1,313 tests); run 3 failed two tests
# that depended on timing, fixed in 37259df. Again at 1c9a7cf (the hogs plus four helpers'
# builds, load 11-14): 22, 21 and 17 min (1,333 tests), all passed: about an hour for the default
# 3 runs. Each run's time is printed.
#
# Environment:
#   KVTIER_BUILD_DIR=DIR   the build to test (default: build-release under the repository)
#   KVTIER_STRESS_HOGS=N   CPU hogs (default: one per online core, nproc)
#   KVTIER_JOBS=N          ctest's parallel jobs (default 2, as setup.sh)
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
runs=3
if [[ $# -gt 0 && $1 =~ ^[0-9]+$ ]]; then
  runs=$1
  shift
fi
build=${KVTIER_BUILD_DIR:-$repo/build-release}
hogs=${KVTIER_STRESS_HOGS:-$(nproc)}
jobs=${KVTIER_JOBS:-2}
[[ -f $build/CTestTestfile.cmake ]] || {
  echo "stress_test.sh: $build is not a configured build (no CTestTestfile.cmake)" >&2
  exit 2
}

hog_pids=()
stop_hogs() {
  for pid in "${hog_pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${hog_pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  hog_pids=()
}
trap stop_hogs EXIT
trap 'exit 130' INT TERM
for ((i = 0; i < hogs; i++)); do
  yes >/dev/null &
  hog_pids+=($!)
done
echo "stress_test.sh: $hogs CPU hog(s) running (pids ${hog_pids[*]}); $runs ctest run(s) of $build"

start=$(date +%s)
for ((run = 1; run <= runs; run++)); do
  t0=$(date +%s)
  printf '\n==== stress run %d/%d [%s]\n' "$run" "$runs" "$(date -u +%H:%M:%S)"
  if ! (cd "$build" && ctest --output-on-failure --no-tests=error -j "$jobs" "$@"); then
    echo "stress_test.sh: run $run of $runs FAILED after $(($(date +%s) - t0)) s" >&2
    exit 1
  fi
  echo "stress_test.sh: run $run of $runs passed in $(($(date +%s) - t0)) s"
done
echo "stress_test.sh: $runs loaded run(s) passed in $(($(date +%s) - start)) s"
