#!/usr/bin/env bash
# scripts/sglang_kernels_check.sh SGLANG_SRC — kvtier's kernel drop-in (kvtier.compat.sgl_kernel)
# against SGLang's own sgl_kernel.kvcacheio kernels, compiled from SGLANG_SRC in this run and timed
# on the same tensors (issue 37 item 4; docs/sglang.md "Kernels side by side"). Needs a GPU.
#
# SGLANG_SRC holds SGLang's sgl-kernel/csrc/kvcacheio/transfer.cu and
# sgl-kernel/python/sgl_kernel/kvcacheio.py, unmodified, at the commit docs/sglang.md names (e.g.
# .engines/sglang); nothing is fetched. Steps (logs and results in $OUT/sglang_kernels when OUT is
# set, else build-gpu/logs/sglang_kernels):
#   1. build  kvtier's Python extension (_kvtier only) in scripts/gpu_check.sh's CUDA build tree
#             (build-gpu, or $KVTIER_GPU_BUILD_DIR); a fresh tree is configured when there is none.
#   2. bench  python/bench/sglang_kernels.py: compiles transfer.cu with kvtier's binding
#             (torch.utils.cpp_extension, nvcc, this GPU's arch) into a temporary folder under the
#             build tree, then every row: SGLang's function and kvtier's, byte-checked, timed
#             alternately -> bench.log, sglang_kernels.json, sglang_kernels.md.
# Exit status: 0 every row measured and every byte of both sides matched; 1 a byte differed or a
# call raised (the table's last column says which side); 2 nothing measured: kvtier's extension
# did not build, or SGLang's files are missing, or transfer.cu did not compile or load (the
# compiler's output is printed); 3 cut by the time limit (SGLANG_KERNELS_TIMEOUT_S, default 200 s,
# the compile included), the rows measured so far kept and marked PARTIAL.
# Budget: under 3 minutes on a 16-core H100 after gpu_check.sh's build (about 1 minute compiling
# SGLang's file, 1-2 minutes of rows).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 2

SRC=${1:-}
if [[ -z "$SRC" || ! -d "$SRC" ]]; then
  echo "usage: scripts/sglang_kernels_check.sh SGLANG_SRC  (e.g. .engines/sglang)" >&2
  exit 2
fi
SRC=$(cd "$SRC" && pwd)
BUILD=${KVTIER_GPU_BUILD_DIR:-build-gpu}
LOGS=${OUT:-$BUILD/logs}/sglang_kernels
mkdir -p "$LOGS"
PY=$(command -v "${PYTHON:-python3}")
JOBS=${JOBS:-$(nproc)}
source scripts/gpu_env.sh  # the carried Debian libraries _kvtier links (scripts/gpu_deps.sh)
T0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - T0 ))s] $*"; }

echo "== sglang_kernels: build the Python extension ($BUILD)"
source scripts/lib/python_extension.sh
if ! build_python_extension "$PY" "$BUILD" "$LOGS/build.log"; then
  tail -30 "$LOGS/build.log"
  echo "sglang_kernels: kvtier's Python extension did not build ($LOGS/build.log): nothing measured"
  exit 2
fi
stamp "build: ok"

echo "== sglang_kernels: SGLang's kernels (built from $SRC) vs kvtier.compat.sgl_kernel"
[[ -f "$SRC/COMMIT" ]] && echo "SGLang commit: $(head -1 "$SRC/COMMIT")"
# KVTIER_COMMIT (set by the caller) names the tree where a carried copy's .git HEAD is stale.
echo "kvtier commit: ${KVTIER_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}"
# gpu_env.sh's CPATH / LIBRARY_PATH (Debian headers for kvtier's own build) stay out of the
# compile of SGLang's file: it sees only torch's, CUDA's and the system's headers.
read -ra EXTRA <<<"${SGLANG_KERNELS_ARGS:-}"  # more bench arguments, e.g. "--tokens 16384"
env -u CPATH -u LIBRARY_PATH PYTHONPATH="$PWD/$BUILD/python${PYTHONPATH:+:$PYTHONPATH}" \
  timeout -k 10 "${SGLANG_KERNELS_TIMEOUT_S:-200}" "$PY" python/bench/sglang_kernels.py \
  --sglang-src "$SRC" --build-root "$BUILD" --json "$LOGS/sglang_kernels.json" \
  --markdown "$LOGS/sglang_kernels.md" "${EXTRA[@]}" >"$LOGS/bench.log" 2>&1
rc=$?
case $rc in
  0) RESULT=ok ;;
  1) RESULT="FAIL (a byte differed or a call raised: see the check column)" ;;
  2) RESULT="CANNOT RUN (nothing measured)" ;;
  124|137) RESULT="PARTIAL (cut at ${SGLANG_KERNELS_TIMEOUT_S:-200} s)"
           rm -rf "$BUILD"/kvtier-sglang-kernels-*  # the killed run's build folder
           rc=3 ;;
  *) RESULT="FAIL (bench exited $rc)"; rc=1 ;;
esac
if [[ $rc == 2 || ! -f "$LOGS/sglang_kernels.md" ]]; then
  tail -60 "$LOGS/bench.log"
else
  grep -E "^(built|SGLang|ceiling)" "$LOGS/bench.log"
  cat "$LOGS/sglang_kernels.md"
  [[ $rc != 0 ]] && tail -20 "$LOGS/bench.log"  # a traceback, if the bench stopped on one
fi
stamp "sglang_kernels: $RESULT; logs in $LOGS"
exit $rc
