#!/usr/bin/env bash
# scripts/gpu_deps.sh — gather the Debian 12 packages the GPU machine lacks, for the device tool.
#
# The GPU machine (Ubuntu, CUDA, PyTorch) has no hiredis, liburing, xxhash, redis, ZeroMQ or
# msgpack-cxx and cannot reach a package registry. Run this on the build machine (Debian 12)
# before a device call: it downloads the .deb files with `apt-get download` and unpacks them
# with `dpkg -x` into build-deps/root (ignored by git; carry `build-deps/root`). On the GPU machine
# scripts/gpu_check.sh puts build-deps/root on the compiler's, linker's and loader's paths, so
# CMake finds the libraries there and the tests find redis-server.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

packages=(libxxhash-dev libxxhash0 libhiredis-dev libhiredis0.14 liburing-dev liburing2
          redis-server redis-tools libjemalloc2 liblzf1
          libzmq3-dev libzmq5 libsodium23 libpgm-5.3-0 libnorm1 cppzmq-dev libmsgpack-cxx-dev)
rm -rf build-deps/debs build-deps/root
mkdir -p build-deps/debs build-deps/root
(cd build-deps/debs && apt-get download "${packages[@]}")
for deb in build-deps/debs/*.deb; do dpkg -x "$deb" build-deps/root; done
# Absolute symlinks inside the packages (e.g. a .so pointing at /usr/lib/...) would leave the
# tree: make them relative to where they sit.
find build-deps/root -type l -lname '/*' | while read -r link; do
  target=$(readlink "$link")
  ln -sfn "$(realpath -m --relative-to="$(dirname "$link")" "build-deps/root$target")" "$link"
done
# Static archives and documentation are not needed and only add to what travels.
find build-deps/root -name '*.a' -delete
rm -rf build-deps/root/usr/share/doc build-deps/root/usr/share/man
du -sh build-deps/root
