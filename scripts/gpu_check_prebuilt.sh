#!/usr/bin/env bash
# scripts/gpu_check_prebuilt.sh [-- extra commands] — on the GPU machine, run the GPU tests and a
# short GPU replay from binaries built on the build machine (scripts/gpu_prebuilt.sh), building
# nothing: for a device budget too short for scripts/gpu_check.sh. Carry build-deps/root and
# build-deps/prebuilt. Logs go to $OUT (else build-deps/prebuilt/logs); a summary is printed last.
#
# Sections: the GPU test binaries (every case), compute-sanitizer memcheck over the cache's GPU
# tests, the GPU cases of the other test binaries, `kvtier bench --storage-hit` (streamed against
# unstreamed storage hits) and `kvtier replay --device gpu` with a file store (every byte checked).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/gpu_env.sh
pre=$PWD/build-deps/prebuilt
[[ -x $pre/bin/kvtier ]] || { echo "no $pre/bin (run scripts/gpu_prebuilt.sh here first)"; exit 2; }
export LD_LIBRARY_PATH=$pre/root/usr/lib/x86_64-linux-gnu:$LD_LIBRARY_PATH
LOGS=${OUT:-$pre/logs}
mkdir -p "$LOGS"
declare -a SUMMARY
T0=$(date +%s)
note() { SUMMARY+=("$1"); echo "[$(( $(date +%s) - T0 ))s] $1"; }

nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
# The worker the shared host tests exec, at the path they were built with.
if [[ -f $pre/worker_path ]]; then
  worker=$(cat "$pre/worker_path")
  [[ -x $worker ]] || { mkdir -p "$(dirname "$worker")" && cp "$pre/bin/shared_host_pool_worker" "$worker"; }
fi
# The cache's GPU tests whole; of the others, only their GPU cases (their CPU cases ran in CI).
# run_test_each runs each case in a process of its own, as ctest does: a GPU case that forks a
# child before its process initialises CUDA (the shared host tests) cannot follow another GPU case
# in one process.
run_test() {
  local t=$1 filter=$2
  "$pre/bin/$t" --gtest_brief=1 --gtest_filter="$filter" >"$LOGS/$t.log" 2>&1
  local rc=$?
  note "$t: rc=$rc $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$LOGS/$t.log" | tr '\n' ' ')"
}
run_test_each() {
  local t=$1 filter=$2 rc=0 suite="" line cases=() passed=0 failed=() skipped=0
  while IFS= read -r line; do
    if [[ $line != " "* ]]; then suite=${line%%#*}; suite=${suite// /}; continue; fi
    line=${line%%#*}; cases+=("$suite${line// /}")
  done < <("$pre/bin/$t" --gtest_list_tests --gtest_filter="$filter" | grep -v '^Running main')
  : >"$LOGS/$t.log"
  for c in "${cases[@]}"; do
    "$pre/bin/$t" --gtest_brief=1 --gtest_filter="$c" >>"$LOGS/$t.log" 2>&1 || { rc=1; failed+=("$c"); continue; }
    if grep -q "^\[  SKIPPED \] 1 test" <(tail -5 "$LOGS/$t.log"); then skipped=$((skipped + 1)); else passed=$((passed + 1)); fi
  done
  note "$t: rc=$rc ${#cases[@]} cases, $passed passed, $skipped skipped, ${#failed[@]} failed ${failed[*]}"
}
run_test hierarchical_cache_gpu_test '*'
if command -v compute-sanitizer >/dev/null; then
  compute-sanitizer --tool memcheck --error-exitcode 99 "$pre/bin/hierarchical_cache_gpu_test" \
    --gtest_filter='*GpuCacheTest*' >"$LOGS/memcheck_cache.log" 2>&1
  note "memcheck GpuCacheTest: rc=$? $(grep 'ERROR SUMMARY' "$LOGS/memcheck_cache.log" | tail -1)"
fi
run_test cuda_transfer_test '*'
# A storage hit of 8,192 tokens streamed host -> device as pages arrive, against the read alone
# and the unstreamed hit (read, then load), on the copy engines.
hit_store=$(mktemp -d)
"$pre/bin/kvtier" bench --storage-hit "file://$hit_store" --storage-hit-backend dma \
  --storage-hit-tokens 8192 --repeats 5 >"$LOGS/storage_hit.log" 2>&1
note "bench --storage-hit (dma): rc=$?"
cat "$LOGS/storage_hit.log" | tail -8
rm -rf "$hit_store"
for t in cpu_transfer_test host_kv_pool_test hierarchical_cache_shared_host_test \
         shared_host_pool_gpu_test; do
  run_test_each "$t" '*Gpu*:*Cuda*:*gpu*:*cuda*'
done
store=$(mktemp -d)
"$pre/bin/kvtier" replay --workload doc-qa --requests "${KVTIER_PREBUILT_REPLAY_REQUESTS:-60}" --seed 5 \
  --model llama3-8b \
  --device gpu --device-tokens 32768 --host-tokens 65536 --storage "file://$store" \
  --sequential --runs hierarchy --no-progress --json "$LOGS/replay.json" >"$LOGS/replay.log" 2>&1
note "replay --device gpu (file store): rc=$? $(grep -E '^integrity' "$LOGS/replay.log")"
rm -rf "$store"
echo "== summary"
printf '%s\n' "${SUMMARY[@]}"
