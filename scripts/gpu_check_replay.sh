#!/usr/bin/env bash
# scripts/gpu_check_replay.sh — the replay library (tools/replay) on a GPU: its unit tests
# (tests/replay) and `kvtier replay --device gpu` with real bf16 GEMMs (--compute gemm), every
# loaded byte checked (--verify full) and one page in eight (--verify sample), through device,
# host and a file store. Exit code 0 = every run exited 0 with bytes checked and 0 wrong bytes.
#
# Builds kvtier_cli and the replay tests in $KVTIER_GPU_BUILD_DIR (default build-gpu, configured
# as scripts/gpu_check.sh does when it is not there yet). Logs and JSON go to $OUT when set, else
# build-gpu/logs_replay. Before the device call, on the build machine: scripts/gpu_deps.sh.
# Budget: under 2 minutes after scripts/gpu_check.sh's build (about 4 from a bare tree, -j16).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

BUILD=${KVTIER_GPU_BUILD_DIR:-build-gpu}
LOGS=${OUT:-$BUILD/logs_replay}
JOBS=${JOBS:-16}
mkdir -p "$LOGS"
source scripts/gpu_env.sh
T0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
fail=0

echo "== build ($BUILD)"
if [[ ! -f $BUILD/build.ninja ]]; then
  cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVTIER_CUDA=ON \
    -DKVTIER_CUDA_ARCHITECTURES=90 -DKVTIER_BUILD_PYTHON=OFF >"$LOGS/build.log" 2>&1 ||
    { tail -40 "$LOGS/build.log"; exit 1; }
fi
tests=(replay_timeline_test replay_ideal_test replay_statistics_test replay_verify_sample_test)
if ! cmake --build "$BUILD" -j"$JOBS" --target kvtier_cli "${tests[@]}" \
     >>"$LOGS/build.log" 2>&1; then
  tail -40 "$LOGS/build.log"
  exit 1
fi
stamp "built"

echo "== tests/replay"
if ! ctest --test-dir "$BUILD" -R '^replay\.' --output-on-failure \
     >"$LOGS/ctest_replay.log" 2>&1; then
  fail=1
fi
tail -3 "$LOGS/ctest_replay.log"

# A chat workload whose prefixes return across turns: capacities small against its distinct
# prompt tokens, so device, host and storage tiers are all hit and loads move real bytes.
KVTIER="$BUILD/tools/kvtier"
STORE=$(mktemp -d "${TMPDIR:-/tmp}/kvtier-replay-gpu.XXXXXX")
trap 'rm -rf "$STORE"' EXIT
for verify in full sample; do
  echo "== replay --device gpu --compute gemm --verify $verify"
  rm -rf "${STORE:?}"/*
  json="$LOGS/replay_gpu_$verify.json"
  timeout 240 "$KVTIER" replay --device gpu --compute gemm --model llama3-8b \
    --workload chat --requests 200 --warmup 20 --concurrency 2 --page-size 16 \
    --device-tokens 4096 --host-tokens 8192 --storage "file://$STORE" --verify "$verify" \
    --slow-class-warn --no-progress --json "$json" >"$LOGS/replay_gpu_$verify.log" 2>&1
  rc=$?
  if [[ $rc != 0 ]]; then
    echo "replay --verify $verify: exit code $rc (log: $LOGS/replay_gpu_$verify.log)"
    tail -30 "$LOGS/replay_gpu_$verify.log"
    fail=1
    continue
  fi
  tail -40 "$LOGS/replay_gpu_$verify.log"
  # Bytes were checked, none wrong, and every tier served hits. A hit class slower than no cache
  # is only reported (--slow-class-warn): this checks the GPU engine, not its speed.
  if ! python3 - "$json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
i = r["integrity"]
tiers = r["hit_rate_by_tier"]
print(f"bytes_checked {i['bytes_checked']}, wrong_bytes {i['wrong_bytes']}, hits by tier {tiers}")
ok = i["bytes_checked"] > 0 and i["wrong_bytes"] == 0 and all(v > 0 for v in tiers.values())
sys.exit(0 if ok else 1)
PY
  then
    fail=1
  fi
done
stamp "done: $([[ $fail == 0 ]] && echo ok || echo FAIL)"
exit $fail
