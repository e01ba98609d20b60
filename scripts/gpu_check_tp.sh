#!/usr/bin/env bash
# scripts/gpu_check_tp.sh — the tensor-parallel check on a two-GPU machine (nvidia-h100-x2):
# builds kvtier with CUDA (only the TP targets), runs the TP tests, then `kvtier replay --tp 2`
# on the GPUs (rank r on GPU r; each run serves the same trace slice at TP=1 first, in the same
# process, and compares), MHA (llama3-8b) and MLA (deepseek-v2-lite), and prints a short table.
#
# Sections ("== name"; logs in $OUT when set, else build-gpu-tp/logs):
#   1. environment   GPUs, driver, toolchain
#   2. build         Release, KVTIER_CUDA=ON, sm_90; targets: the TP tests and the kvtier CLI
#   3. tests         decision_ring_test, shard_pattern_test, tp_group_test (two processes, kill,
#                    rebuild) and tests/tools/replay_tp_test.py (cpu device pools)
#   4. replay        replay --tp 2 --device gpu: MHA and MLA, JSON per run
#   5. summary       hit rates TP=1 vs TP=2 (must be equal), TTFT p50/p90 (slowest rank), the
#                    leader's waits, wrong bytes (0: a wrong byte fails the run)
# Before the device call, on the build machine: scripts/gpu_deps.sh (then carry build-deps/root).
# Usage: scripts/gpu_check_tp.sh [--requests N]     Budget: about 5 minutes on nvidia-h100-x2.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

BUILD=${KVTIER_GPU_BUILD_DIR:-build-gpu-tp}
LOGS=${OUT:-$BUILD/logs}
mkdir -p "$LOGS"
REQUESTS=150
while [[ $# -gt 0 ]]; do
  case "$1" in
    --requests) REQUESTS="$2"; shift ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
JOBS=${JOBS:-16}
# The carried Debian packages (scripts/gpu_deps.sh) on the search paths.
source scripts/gpu_env.sh
declare -A RESULT
T0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - T0 ))s] $*"; }

echo "== environment"
nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader 2>&1 |
  tee "$LOGS/env.log"
GPUS=$(nvidia-smi -L 2>/dev/null | wc -l)
echo "GPUs: $GPUS" | tee -a "$LOGS/env.log"
[[ $GPUS -ge 2 ]] || echo "WARNING: fewer than 2 GPUs: both ranks share GPU 0"

echo "== build"
stamp "configure + build ($BUILD, -j$JOBS)"
if cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVTIER_CUDA=ON \
     -DKVTIER_CUDA_ARCHITECTURES=90 -DKVTIER_BUILD_PYTHON=OFF -DKVTIER_BUILD_BENCH=OFF \
     >"$LOGS/build.log" 2>&1 &&
   cmake --build "$BUILD" -j"$JOBS" --target decision_ring_test shard_pattern_test tp_group_test \
     kvtier_cli >>"$LOGS/build.log" 2>&1; then
  RESULT[build]=ok
else
  RESULT[build]=FAIL
  tail -40 "$LOGS/build.log"
fi
stamp "build: ${RESULT[build]}"

echo "== tests"
RESULT[tests]=skipped
if [[ ${RESULT[build]} == ok ]]; then
  RESULT[tests]=ok
  for t in decision_ring_test shard_pattern_test tp_group_test; do
    if ! timeout 120 "$BUILD/tests/$t" >"$LOGS/$t.log" 2>&1; then
      RESULT[tests]=FAIL; tail -30 "$LOGS/$t.log"
    fi
    tail -1 "$LOGS/$t.log"
  done
  if ! timeout 180 python3 tests/tools/replay_tp_test.py "$BUILD/tools/kvtier" \
       >"$LOGS/replay_tp_test.log" 2>&1; then
    RESULT[tests]=FAIL
  fi
  tail -5 "$LOGS/replay_tp_test.log"
fi
stamp "tests: ${RESULT[tests]}"

echo "== replay --tp 2 (GPU)"
KVTIER="$BUILD/tools/kvtier"
RESULT[replay]=skipped
if [[ ${RESULT[build]} == ok ]]; then
  RESULT[replay]=ok
  # The same slice of the shipped trace for both models; capacities per rank in tokens, so TP=1
  # and TP=2 have the same pages per rank. Compute: the cost model (GEMMs of 150 long prompts
  # would take the budget); the copies, byte checks and KV writes are real, on every GPU.
  for run in "mha llama3-8b" "mla deepseek-v2-lite"; do
    set -- $run
    if ! timeout 240 "$KVTIER" replay --tp 2 --device gpu --model "$2" --compute model \
         --workload mooncake --requests "$REQUESTS" --warmup 20 --page-size 64 \
         --device-tokens 32768 --host-tokens 131072 --storage none --no-progress \
         --json "$LOGS/replay_tp_$1.json" >"$LOGS/replay_tp_$1.log" 2>&1; then
      RESULT[replay]=FAIL
    fi
    cat "$LOGS/replay_tp_$1.log" | tail -20
  done
fi
stamp "replay: ${RESULT[replay]}"

echo "== summary"
python3 - "$LOGS" <<'PY'
import json, os, sys
logs = sys.argv[1]
print("%-6s %-18s %10s %10s %10s %10s %10s %12s" % ("kind", "model", "hit TP=1", "hit TP=2",
      "p50 TP=1", "p50 TP=2", "p90 TP=2", "waits/req"))
for kind in ("mha", "mla"):
    path = os.path.join(logs, "replay_tp_%s.json" % kind)
    if not os.path.exists(path):
        print("%-6s (no report)" % kind)
        continue
    r = json.load(open(path))
    a, b = r["passes"]
    print("%-6s %-18s %10.4f %10.4f %10.2f %10.2f %10.2f %12.2f%s" % (
        kind, r["model"], a["hit_rate"], b["hit_rate"], a["ttft_ms_p50"], b["ttft_ms_p50"],
        b["ttft_ms_p90"], b["leader_waits_per_request"],
        "" if r["hit_rates_equal"] else "  HIT RATES DIFFER"))
PY
for k in build tests replay; do printf '%-8s %s\n' "$k" "${RESULT[$k]}"; done
stamp "done"
[[ ${RESULT[build]} == ok && ${RESULT[tests]} == ok && ${RESULT[replay]} == ok ]]
