# scripts/gpu_env.sh — sourced by the GPU scripts (gpu_check.sh, gpu_check_tp.sh): puts the Debian
# packages the GPU machine lacks (hiredis, liburing, xxhash, redis, ZeroMQ, msgpack), unpacked by
# scripts/gpu_deps.sh on the build machine and carried as build-deps/root, on CMake's, the
# compiler's, the linker's, the loader's and PATH's search paths.
KVTIER_DEPS=$PWD/build-deps/root
if [[ -d $KVTIER_DEPS/usr ]]; then
  export CMAKE_PREFIX_PATH=$KVTIER_DEPS/usr${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}
  export LD_LIBRARY_PATH=$KVTIER_DEPS/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  export PATH=$KVTIER_DEPS/usr/bin:$PATH
  # Sources that include a package's header by name (tests including <hiredis/hiredis.h>).
  export CPATH=$KVTIER_DEPS/usr/include${CPATH:+:$CPATH}
  export LIBRARY_PATH=$KVTIER_DEPS/usr/lib/x86_64-linux-gnu${LIBRARY_PATH:+:$LIBRARY_PATH}
else
  echo "note: no build-deps/root (scripts/gpu_deps.sh): hiredis, liburing, redis, ZeroMQ absent"
fi
