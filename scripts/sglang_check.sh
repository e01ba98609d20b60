#!/usr/bin/env bash
# scripts/sglang_check.sh SGLANG_SRC — kvtier as SGLang HiCache's storage tier, checked with
# SGLang's own code (issue 37; docs/sglang.md), on a GPU machine (or any machine: the GPU parts
# skip without one).
#
# SGLANG_SRC is a SGLang checkout (or its python/ folder) at the commit docs/sglang.md names,
# e.g. .engines/sglang; nothing is fetched. Steps (logs and results in $OUT when set, else
# build-gpu/logs/sglang):
#   1. build   kvtier's Python extension into the existing CUDA build tree (scripts/gpu_check.sh's
#              build-gpu, or $KVTIER_GPU_BUILD_DIR), only the _kvtier target; a fresh tree is
#              configured when there is none (slower: the library is built too).
#   2. import  SGLang's modules under test, saying which stand-ins were needed (sglang_harness).
#   3. tests   pytest python/tests/test_sglang_*.py (SGLang's factory, MHA/MLA host pools, cache
#              controller incl. the GPU device -> storage -> device round trip, the import hook).
#   4. bench   python/bench/sglang_storage.py: SGLang's file backend vs kvtier file:// and redis://
#              through SGLang's controller, with the pread ceiling -> sglang_bench.{json,md}.
# Exit status 0 when the import, the tests and the bench passed (a bench cut by its time limit
# counts, its rows are marked PARTIAL).
# Budget: about 3-4 minutes on a 16-core H100 machine after gpu_check.sh's build (the bench is
# cut at 240 s, SGLANG_BENCH_TIMEOUT_S, keeping the rows it measured).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

SRC=${1:-}
if [[ -z "$SRC" || ! -d "$SRC" ]]; then
  echo "usage: scripts/sglang_check.sh SGLANG_SRC  (a SGLang checkout, e.g. .engines/sglang)" >&2
  exit 2
fi
SRC=$(cd "$SRC" && pwd)
BUILD=${KVTIER_GPU_BUILD_DIR:-build-gpu}
LOGS=${OUT:-$BUILD/logs}/sglang
mkdir -p "$LOGS"
PY=$(command -v "${PYTHON:-python3}")
JOBS=${JOBS:-$(nproc)}
# redis-server, hiredis: the carried Debian packages (scripts/gpu_deps.sh), when there are any.
source scripts/gpu_env.sh
T0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
declare -A RESULT=([build]=FAIL [import]=skipped [tests]=skipped [bench]=skipped)

echo "== sglang: build the Python extension ($BUILD)"
source scripts/lib/python_extension.sh
if build_python_extension "$PY" "$BUILD" "$LOGS/build.log"; then
  RESULT[build]=ok
else
  tail -30 "$LOGS/build.log"
fi
stamp "build: ${RESULT[build]}"

export PYTHONPATH="$PWD/$BUILD/python${PYTHONPATH:+:$PYTHONPATH}"
export KVTIER_SGLANG_SRC="$SRC"

if [[ ${RESULT[build]} == ok ]]; then
  echo "== sglang: import SGLang's modules"
  if "$PY" - >"$LOGS/import.log" 2>&1 <<'EOF'
import importlib, sys
sys.path.insert(0, "python/tests")
import torch, kvtier, sglang_harness as h
env = h.load()
print(f"SGLang {env.commit} from {env.src}; torch {env.torch_version}, CUDA "
      f"{torch.cuda.is_available()}; kvtier CUDA {kvtier.built_with_cuda()}")
print(f"device pools: {'SGLang' if env.real_device_pools else 'stand-ins: ' + env.stand_in_reason}")
for m in ["sglang.srt.mem_cache.hicache_storage", "sglang.srt.mem_cache.storage.backend_factory",
          "sglang.srt.mem_cache.memory_pool", "sglang.srt.mem_cache.memory_pool_host",
          "sglang.srt.managers.cache_controller", "kvtier.integrations.sglang.storage"]:
    mod = importlib.import_module(m)
    print(f"  {m}: {getattr(mod, '__file__', None) or 'stand-in'}")
import sgl_kernel.kvcacheio as k
print(f"sgl_kernel.kvcacheio: {'kvtier' if getattr(k, '__kvtier__', False) else k.__file__}")
print(f"absent third-party packages stood in for: {env.placeholders or 'none'}")
EOF
  then RESULT[import]=ok; else RESULT[import]=FAIL; fi
  cat "$LOGS/import.log" | tail -15
  stamp "import: ${RESULT[import]}"

  echo "== sglang: tests"
  if timeout 600 "$PY" -m pytest -q -rs -p no:cacheprovider python/tests/test_sglang_kernel_hook.py \
       python/tests/test_sglang_storage.py python/tests/test_sglang_controller.py \
       python/tests/test_sglang_config.py >"$LOGS/pytest.log" 2>&1; then
    RESULT[tests]=ok
  else
    RESULT[tests]=FAIL
  fi
  grep -E "passed|failed|SKIPPED|Error|error" "$LOGS/pytest.log" | tail -15
  stamp "tests: ${RESULT[tests]}"

  echo "== sglang: side-by-side bench"
  # Bounded: the table is rewritten after each row, so a cut run keeps the rows it measured
  # (marked PARTIAL; not a failure: the rows it has are checked byte for byte).
  timeout "${SGLANG_BENCH_TIMEOUT_S:-240}" "$PY" python/bench/sglang_storage.py --dir "$BUILD" \
    --repeats 1 --json "$LOGS/sglang_bench.json" --markdown "$LOGS/sglang_bench.md" \
    >"$LOGS/bench.log" 2>&1
  rc=$?
  if [[ $rc == 0 ]]; then
    RESULT[bench]=ok
  elif [[ $rc == 124 ]]; then
    RESULT[bench]=partial
    rm -rf "$BUILD"/kvtier-sglang-bench-*  # the killed bench's folder
  else
    RESULT[bench]=FAIL
    tail -20 "$LOGS/bench.log"
  fi
  [[ -f "$LOGS/sglang_bench.md" ]] && cat "$LOGS/sglang_bench.md"
  stamp "bench: ${RESULT[bench]}"
fi

echo "sglang: build ${RESULT[build]}  import ${RESULT[import]}  tests ${RESULT[tests]}  bench ${RESULT[bench]}  ($(( $(date +%s) - T0 ))s)"
for k in build import tests bench; do
  [[ ${RESULT[$k]} == ok || ${RESULT[$k]} == partial ]] || exit 1
done
exit 0
