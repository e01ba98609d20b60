# scripts/lib/python_extension.sh — sourced (not run) by the GPU-machine scripts that need kvtier's
# Python extension (_kvtier) in a CMake build tree: one way to configure and build it.
#
# build_python_extension PY BUILD LOG
#   Configures BUILD for the interpreter PY (its pybind11 when pip installed one, else Debian's)
#   and builds the _kvtier target, -j${JOBS:-$(nproc)}; cmake's output goes to LOG. An existing
#   tree (e.g. scripts/gpu_check.sh's build-gpu) keeps its options: only the extension is switched
#   on, so the library it already built is reused. A fresh tree is configured Release with CUDA
#   when nvcc is found (KVTIER_CUDA=AUTO), without tests or bench. Returns cmake's failure status;
#   the caller says what it means for its own run.
build_python_extension() {
  local py=$1 build=$2 log=$3 pybind11_dir
  local config=(-DKVTIER_BUILD_PYTHON=ON -DPython_EXECUTABLE="$py" -DPYTHON_EXECUTABLE="$py")
  pybind11_dir=$("$py" -m pybind11 --cmakedir 2>/dev/null) && config+=(-Dpybind11_DIR="$pybind11_dir")
  if [[ ! -f "$build/CMakeCache.txt" ]]; then
    command -v ninja >/dev/null && config+=(-G Ninja)
    config+=(-DCMAKE_BUILD_TYPE=Release -DKVTIER_CUDA=AUTO -DKVTIER_BUILD_TESTS=OFF
             -DKVTIER_BUILD_BENCH=OFF)
  fi
  cmake -S . -B "$build" "${config[@]}" >"$log" 2>&1 &&
    cmake --build "$build" -j "${JOBS:-$(nproc)}" --target _kvtier >>"$log" 2>&1
}
