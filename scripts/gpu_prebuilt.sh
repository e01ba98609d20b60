#!/usr/bin/env bash
# scripts/gpu_prebuilt.sh [BUILD_DIR] — gather this machine's CUDA build of the GPU tests and the CLI
# for a GPU check that builds nothing (scripts/gpu_check_prebuilt.sh), when the device time left is
# too short for a build there (gpu_check.sh builds for 2-3 minutes first).
#
# Runs on the build machine (Debian 12, nvcc 13 as on the GPU machine). BUILD_DIR (default
# build-release) must be a CUDA build for sm_90 (KVTIER_CUDA=AUTO finds nvcc here). The binaries go
# to build-deps/prebuilt/bin; the Debian runtime libraries the GPU machine (Ubuntu) lacks besides
# those of scripts/gpu_deps.sh (libfmt9) are unpacked into build-deps/prebuilt/root. Carry
# build-deps/root and build-deps/prebuilt. Both are ignored by git.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
build=${1:-build-release}
grep -q '^CUDA_CUDART:FILEPATH=/' "$build/CMakeCache.txt" ||
  { echo "gpu_prebuilt: $build is not a CUDA build" >&2; exit 2; }
out=build-deps/prebuilt
rm -rf "$out" && mkdir -p "$out/bin" "$out/debs" "$out/root"
# Every test binary with GPU cases (they skip themselves without a GPU) and the CLI.
tests=(hierarchical_cache_gpu_test cuda_transfer_test cpu_transfer_test host_kv_pool_test
       hierarchical_cache_shared_host_test shared_host_pool_gpu_test)
for t in "${tests[@]}"; do cp "$build/tests/$t" "$out/bin/"; done
cp "$build/tools/kvtier" "$out/bin/"
# The shared host tests exec this worker by the absolute path CMake compiled into them
# (KVTIER_SHM_WORKER); gpu_check_prebuilt.sh puts it back there.
cp "$build/tests/shared_host_pool_worker" "$out/bin/"
echo "$PWD/$build/tests/shared_host_pool_worker" >"$out/worker_path"
(cd "$out/debs" && apt-get download libfmt9)
for deb in "$out"/debs/*.deb; do dpkg -x "$deb" "$out/root"; done
rm -rf "$out/debs" "$out/root/usr/share"
strip --strip-debug "$out"/bin/*
du -sh "$out"
