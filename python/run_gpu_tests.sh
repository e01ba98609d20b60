#!/usr/bin/env bash
# python/run_gpu_tests.sh — build kvtier's Python extension with CUDA, then run the whole Python
# test suite (CPU and GPU tests; test_tp_gpu.py runs examples/tp_torch_distributed.py on 2 GPUs
# and skips saying so with fewer), examples/torch_offload.py and, where transformers is installed,
# examples/transformers_prefix_cache.py (device, host, storage and restart hits of a Llama with
# random weights, logits checked against the no-cache path; then a second process over the same
# file store; then two processes on one shared host segment). For a machine with a CUDA GPU,
# nvcc, PyTorch, numpy, pytest and pybind11 (pip) installed; nothing is downloaded.
#
#   python/run_gpu_tests.sh            # exit status 0 only when everything passed
#
# Environment: PYTHON (default python3), KVTIER_PY_BUILD_DIR (default <repo>/build-python-gpu;
# an existing CUDA build tree such as build-gpu is reused: only the extension is added to it),
# JOBS (default nproc), KVTIER_CUDA_ARCHITECTURES (default: the project's, sm_90),
# PYTEST_SELECT (default python/tests: the test files or node ids to run).
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PY=$(command -v "${PYTHON:-python3}") || { echo "run_gpu_tests: no ${PYTHON:-python3}" >&2; exit 2; }
BUILD=${KVTIER_PY_BUILD_DIR:-$ROOT/build-python-gpu}
JOBS=${JOBS:-$(nproc)}

say() { echo "run_gpu_tests: $*"; }
die() { echo "run_gpu_tests: $*" >&2; exit 2; }

"$PY" - <<'PYEOF' || die "the interpreter above lacks torch, numpy or pytest, or sees no GPU"
import sys
import numpy, pytest, torch
print(f"run_gpu_tests: python {sys.version.split()[0]}, torch {torch.__version__}, "
      f"numpy {numpy.__version__}, pytest {pytest.__version__}, "
      f"cuda available: {torch.cuda.is_available()}")
sys.exit(0 if torch.cuda.is_available() else 1)
PYEOF

PYBIND11_DIR=$("$PY" -m pybind11 --cmakedir 2>/dev/null) || PYBIND11_DIR=""
[[ -n "$PYBIND11_DIR" ]] || [[ -d /usr/lib/cmake/pybind11 ]] ||
  die "pybind11 not found: pip install pybind11, or install pybind11-dev"

GEN=()
if [[ -f "$BUILD/CMakeCache.txt" ]]; then
  # An existing build tree (e.g. gpu_check.sh's build-gpu): only switch the extension on, so the
  # library it already built is reused and its other options stay as they are.
  CONFIG=(-DKVTIER_BUILD_PYTHON=ON -DPython_EXECUTABLE="$PY" -DPYTHON_EXECUTABLE="$PY")
else
  command -v ninja >/dev/null && GEN=(-G Ninja)
  CONFIG=(-DKVTIER_CUDA=ON -DKVTIER_BUILD_PYTHON=ON -DKVTIER_BUILD_TESTS=OFF
          -DKVTIER_BUILD_BENCH=OFF -DKVTIER_BUILD_TOOLS=OFF -DCMAKE_BUILD_TYPE=Release
          -DPython_EXECUTABLE="$PY" -DPYTHON_EXECUTABLE="$PY")
fi
[[ -n "$PYBIND11_DIR" ]] && CONFIG+=(-Dpybind11_DIR="$PYBIND11_DIR")
[[ -n "${KVTIER_CUDA_ARCHITECTURES:-}" ]] &&
  CONFIG+=(-DKVTIER_CUDA_ARCHITECTURES="$KVTIER_CUDA_ARCHITECTURES")

say "configuring $BUILD"
mkdir -p "$BUILD"
cmake -S "$ROOT" -B "$BUILD" "${GEN[@]}" "${CONFIG[@]}" >"$BUILD/configure.log" 2>&1 ||
  { cat "$BUILD/configure.log" >&2; die "cmake configure failed"; }
say "building the extension (-j$JOBS)"
cmake --build "$BUILD" -j "$JOBS" --target _kvtier || die "build failed"

export PYTHONPATH="$BUILD/python${PYTHONPATH:+:$PYTHONPATH}"
"$PY" -c "import kvtier, sys; sys.exit(0 if kvtier.built_with_cuda() and kvtier.cuda_device_count() > 0 else 1)" ||
  die "the extension in $BUILD/python was not built with CUDA or sees no GPU"

status=0
say "pytest python/tests"
start=$(date +%s)
# shellcheck disable=SC2086
"$PY" -m pytest -q -rs -p no:cacheprovider ${PYTEST_SELECT:-"$ROOT/python/tests"} || status=1
say "pytest took $(( $(date +%s) - start )) s"
for backend in kernel dma auto; do
  say "examples/torch_offload.py --backend $backend"
  "$PY" "$ROOT/examples/torch_offload.py" --backend "$backend" || status=1
done
if "$PY" -c "import transformers" 2>/dev/null; then
  store=$(mktemp -d)
  say "examples/transformers_prefix_cache.py --bench (device, host, storage and restart hits)"
  "$PY" "$ROOT/examples/transformers_prefix_cache.py" --bench --storage "$store" || status=1
  say "examples/transformers_prefix_cache.py --expect-restart (a new process, the same store)"
  "$PY" "$ROOT/examples/transformers_prefix_cache.py" --turns 2 --expect-restart \
    --storage "$store" || status=1
  rm -rf "$store"
  # A shared host tier: one process computes and saves, a second one loads its prefix from the
  # segment (a host hit it never computed). The second removes the segment; so does the line after
  # it when a run failed before that.
  segment="kvtier-example-$$"
  say "examples/transformers_prefix_cache.py --shared-host (miss, device, host, a new cache on the segment)"
  "$PY" "$ROOT/examples/transformers_prefix_cache.py" --turns 4 --shared-host "$segment" ||
    status=1
  say "examples/transformers_prefix_cache.py --shared-host --expect-restart (a second process)"
  "$PY" "$ROOT/examples/transformers_prefix_cache.py" --turns 2 --expect-restart \
    --shared-host "$segment" --remove-shared-host || status=1
  "$PY" -c "import sys, kvtier
try:
    kvtier.HierarchicalCache.destroy_shared_host(sys.argv[1])
except kvtier.NotFoundError:
    pass" "$segment"
else
  say "SKIPPED examples/transformers_prefix_cache.py: transformers is not installed for $PY"
fi
if [[ $status -eq 0 ]]; then say "PASS"; else say "FAIL"; fi
exit $status
