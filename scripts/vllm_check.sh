#!/usr/bin/env bash
# scripts/vllm_check.sh — kvtier as a vLLM secondary tier, checked with vLLM's own classes, then
# the side-by-side bench (vLLM's file-system tier vs kvtier's tier on one disk). Fetches nothing.
#
#   scripts/vllm_check.sh <vllm-src-dir> [--skip-bench] [--bench-args "..."]
#
# <vllm-src-dir>: a folder holding vLLM's vllm/v1/kv_offload (the reconstruction in .engines/vllm,
# see docs/vllm.md). Sections: the extension (reused from $KVTIER_PY_BUILD_DIR, else build-gpu if
# it has one, else built in build-vllm), pytest python/tests/test_vllm_tier.py (the folder is
# required: a missing one fails), python/bench/vllm_tiers.py (--dir $KVTIER_BENCH_DIR, default
# build-vllm/bench, emptied before and after), then the bench's 64-token rows again beside one
# spinning process per core. Logs, vllm_bench.json, vllm_bench.md and vllm_bench_loaded.md (the
# tables for BENCHMARKS.md) go to $OUT when set, else
# build-vllm/logs. Exit status 0 only when the tests passed and every benched byte matched.
# Needs build-deps/root carried (scripts/gpu_deps.sh: libxxhash is required; hiredis and
# redis-server for the redis:// cases, which skip without them).
# Budget: about 1.5 minutes with a built extension (16-core H100 machine), 3.5 with the build.
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
[[ $# -ge 1 ]] || { echo "usage: scripts/vllm_check.sh <vllm-src-dir> [--skip-bench] [--bench-args \"...\"]" >&2; exit 2; }
SRC=$(cd "$1" && pwd) || { echo "vllm_check: no folder $1" >&2; exit 2; }
shift
SKIP_BENCH=0
BENCH_ARGS=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --skip-bench) SKIP_BENCH=1 ;;
    --bench-args) BENCH_ARGS="$2"; shift ;;
    *) echo "vllm_check: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
PY=$(command -v "${PYTHON:-python3}")
JOBS=${JOBS:-$(nproc)}
LOGS=${OUT:-$ROOT/build-vllm/logs}
mkdir -p "$LOGS"
[[ -f scripts/gpu_env.sh ]] && source scripts/gpu_env.sh  # carried Debian packages, if any
say() { echo "vllm_check: $*"; }
T0=$(date +%s)
status=0

# ---- the extension ------------------------------------------------------------------------------
have_ext() { compgen -G "$1/python/kvtier/_kvtier*.so" >/dev/null; }
BUILD=${KVTIER_PY_BUILD_DIR:-}
if [[ -z "$BUILD" ]]; then
  if have_ext "$ROOT/build-gpu"; then BUILD=$ROOT/build-gpu; else BUILD=$ROOT/build-vllm; fi
fi
if [[ -f "$BUILD/CMakeCache.txt" ]] || ! have_ext "$BUILD"; then
  say "building the extension in $BUILD (-j$JOBS)"
  GEN=(); command -v ninja >/dev/null && [[ ! -f "$BUILD/CMakeCache.txt" ]] && GEN=(-G Ninja)
  CONFIG=(-DKVTIER_BUILD_PYTHON=ON -DPython_EXECUTABLE="$PY" -DPYTHON_EXECUTABLE="$PY")
  # A fresh tree builds without CUDA: the tier moves host memory only, and nvcc would double the
  # build time.
  [[ -f "$BUILD/CMakeCache.txt" ]] || CONFIG+=(-DCMAKE_BUILD_TYPE=Release -DKVTIER_CUDA=OFF
    -DKVTIER_BUILD_TESTS=OFF -DKVTIER_BUILD_BENCH=OFF -DKVTIER_BUILD_TOOLS=OFF)
  PYBIND11_DIR=$("$PY" -m pybind11 --cmakedir 2>/dev/null) && CONFIG+=(-Dpybind11_DIR="$PYBIND11_DIR")
  if ! { cmake -S "$ROOT" -B "$BUILD" "${GEN[@]}" "${CONFIG[@]}" &&
         cmake --build "$BUILD" -j "$JOBS" --target _kvtier; } >"$LOGS/vllm_build.log" 2>&1; then
    tail -30 "$LOGS/vllm_build.log"
    say "FAIL (build; $LOGS/vllm_build.log)"
    exit 1
  fi
fi
export PYTHONPATH="$BUILD/python${PYTHONPATH:+:$PYTHONPATH}"
export KVTIER_VLLM_SRC="$SRC" KVTIER_VLLM_REQUIRED=1
say "vLLM source $SRC ($(head -2 "$SRC/COMMIT" 2>/dev/null | tail -1))"

# ---- vLLM's classes drive kvtier's tier ---------------------------------------------------------
say "pytest python/tests/test_vllm_tier.py"
if "$PY" -m pytest -q -rs -p no:cacheprovider python/tests/test_vllm_tier.py >"$LOGS/vllm_tests.log" 2>&1; then
  RESULT_TESTS=ok
else
  RESULT_TESTS=FAIL; status=1
fi
tail -5 "$LOGS/vllm_tests.log"
# A missing vLLM folder or PageStore is an error here (KVTIER_VLLM_REQUIRED); only the redis://
# cases may skip (no redis-server, or an extension built without hiredis: no build-deps carried)
# and the KV-events cases (their subscriber needs pyzmq, which the GPU machine's Python lacks;
# CI runs them).
grep -E "^SKIPPED" "$LOGS/vllm_tests.log" | grep -v -E "redis|'zmq'" && { RESULT_TESTS=FAIL; status=1; }

# ---- side by side --------------------------------------------------------------------------------
RESULT_BENCH=skipped
if [[ $SKIP_BENCH == 0 ]]; then
  BENCH_DIR=${KVTIER_BENCH_DIR:-$ROOT/build-vllm/bench}
  say "python/bench/vllm_tiers.py --dir $BENCH_DIR $BENCH_ARGS"
  # shellcheck disable=SC2086
  if "$PY" python/bench/vllm_tiers.py --vllm-src "$SRC" --dir "$BENCH_DIR" \
       --json "$LOGS/vllm_bench.json" --markdown "$LOGS/vllm_bench.md" $BENCH_ARGS 2>&1 | tee "$LOGS/vllm_bench.log"; then
    RESULT_BENCH=ok  # pipefail: the bench's own status
  else
    RESULT_BENCH=FAIL; status=1
  fi
  # The same beside one spinning process per core (a busy host, as beside a soak), 64-token
  # blocks: the case where 16-block store calls lost to one call per block (docs/perf-notes/
  # engines.md). Its table goes to vllm_bench_loaded.md, its lines into vllm_bench.log.
  say "python/bench/vllm_tiers.py --cpu-hogs $(nproc) --tokens 64 --total-mib 512 $BENCH_ARGS"
  # shellcheck disable=SC2086
  if ! "$PY" python/bench/vllm_tiers.py --vllm-src "$SRC" --dir "$BENCH_DIR" --cpu-hogs "$(nproc)" \
       --tokens 64 --total-mib 512 --markdown "$LOGS/vllm_bench_loaded.md" $BENCH_ARGS 2>&1 |
       tee -a "$LOGS/vllm_bench.log"; then
    RESULT_BENCH=FAIL; status=1
  fi
  rm -rf "$BENCH_DIR"
fi

say "tests: $RESULT_TESTS  bench: $RESULT_BENCH  ($(( $(date +%s) - T0 ))s)"
[[ $status == 0 ]] && say PASS || say FAIL
exit $status
