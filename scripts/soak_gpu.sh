#!/usr/bin/env bash
# scripts/soak_gpu.sh [MINUTES] [soak.py options...] — the soak (scripts/soak.py) on a GPU machine:
# every worker's device pool on CUDA device 0, copied by the kernel backend (--io-backend dma|auto
# to change it), with the same storage faults, byte checks and resource bounds as the CPU soak.
#
# Sources scripts/gpu_env.sh (the carried Debian packages: redis-server, hiredis, ... from
# scripts/gpu_deps.sh, as build-deps/root), then builds the kvtier CLI and the Python extension with
# CUDA for the interpreter that has torch (PYTHON, default python3) in KVTIER_GPU_BUILD_DIR (default
# build-gpu, or build-python-gpu when only that exists), then runs
#   scripts/soak.sh MINUTES --device gpu --io-backend kernel [options]
# MINUTES 0 only builds (for a first call that must stay within a time limit). Exit status: the
# soak's (0 only when it passed).
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo"
minutes=${1:-8}
shift || true
source scripts/gpu_env.sh
# A CUDA tree already there (gpu_check.sh's build-gpu, run_gpu_tests.sh's build-python-gpu) is
# reused: only the extension and the CLI are switched on and built.
BUILD=${KVTIER_GPU_BUILD_DIR:-}
if [[ -z $BUILD ]]; then
  BUILD=build-gpu
  [[ ! -f build-gpu/CMakeCache.txt && -f build-python-gpu/CMakeCache.txt ]] && BUILD=build-python-gpu
fi
case $BUILD in /*) ;; *) BUILD=$repo/$BUILD ;; esac
PY=$(command -v "${PYTHON:-python3}") || { echo "soak_gpu: no ${PYTHON:-python3}" >&2; exit 2; }
"$PY" -c "import numpy, torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" ||
  { echo "soak_gpu: $PY lacks numpy or torch, or sees no GPU" >&2; exit 2; }

CONFIG=(-DKVTIER_BUILD_PYTHON=ON -DKVTIER_BUILD_TOOLS=ON -DPython_EXECUTABLE="$PY"
        -DPYTHON_EXECUTABLE="$PY")
if [[ ! -f "$BUILD/CMakeCache.txt" ]]; then
  CONFIG+=(-G Ninja -DCMAKE_BUILD_TYPE=Release -DKVTIER_CUDA=ON -DKVTIER_CUDA_ARCHITECTURES=90
           -DKVTIER_BUILD_TESTS=OFF -DKVTIER_BUILD_BENCH=OFF)
fi
PYBIND11_DIR=$("$PY" -m pybind11 --cmakedir 2>/dev/null) || PYBIND11_DIR=""
[[ -n "$PYBIND11_DIR" ]] && CONFIG+=(-Dpybind11_DIR="$PYBIND11_DIR")
mkdir -p "$BUILD"
echo "soak_gpu: building kvtier_cli and _kvtier in $BUILD"
cmake -S . -B "$BUILD" "${CONFIG[@]}" >"$BUILD/soak_configure.log" 2>&1 ||
  { tail -30 "$BUILD/soak_configure.log" >&2; exit 2; }
cmake --build "$BUILD" -j "${JOBS:-16}" --target kvtier_cli _kvtier >"$BUILD/soak_build.log" 2>&1 ||
  { tail -30 "$BUILD/soak_build.log" >&2; exit 2; }
[[ $minutes == 0 ]] && { echo "soak_gpu: built"; exit 0; }
PYTHON="$PY" KVTIER_BUILD_DIR="$BUILD" exec scripts/soak.sh "$minutes" --device gpu \
  --io-backend kernel "$@"
