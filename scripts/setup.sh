#!/usr/bin/env bash
# scripts/setup.sh — install, build and run kvtier on a fresh Debian 12 machine.
#
#   scripts/setup.sh demo   install the packages, build the kvtier CLI, run `kvtier demo`
#   scripts/setup.sh test   install the packages, check the format and (clang -Wthread-safety) the
#                           cache's locking annotations, then build and run every test:
#                             1. the normal build (CUDA code compiled when nvcc is at
#                                /usr/local/cuda; GPU tests skip themselves without a GPU): ctest
#                             2. an address+undefined sanitizer build (CPU only): ctest
#                             3. a thread sanitizer build (CPU only): tests named *Concurren*|*Thread*|*Race*
#                             4. the Python tests (pytest) against the normal build
#                             5. a 3-minute soak under storage faults (scripts/soak.sh)
#                             then the libFuzzer targets (clang, build-fuzz) for a bounded time each
#
# Run it as root (or as a user with sudo) from anywhere; it works in the repository it lives in.
# Build trees go to build-release, build-asan and build-tsan under the repository;
# ccache is used when present, so a second run is quick.
#
# Environment:
#   KVTIER_JOBS=N         parallel build and test jobs (default 2)
#   KVTIER_SKIP_APT=1     do not run apt-get (the packages are known to be installed)
#   KVTIER_CUDA=AUTO|ON|OFF  CUDA in the normal build (default AUTO: on when nvcc is found)
#   KVTIER_FUZZ_SECONDS=N  how long each fuzz target runs (default 30)
#   KVTIER_SOAK_MINUTES=M  how long the soak runs (default 3)
set -euo pipefail

usage() {
  sed -n '3,11p' "$0" | sed 's/^# \{0,1\}//'
  exit 2
}

[[ $# -eq 1 ]] || usage
mode=$1
[[ $mode == demo || $mode == test ]] || usage

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo"
jobs=${KVTIER_JOBS:-2}
cuda=${KVTIER_CUDA:-AUTO}
# Debian's interpreter: python3-numpy, -pytest, -zmq, -msgpack and -torch belong to it. Every
# build gets it (-DPython_EXECUTABLE: the Python-driven ctest tests run under it, not under the
# first python3 on PATH), and under CI=true a test skipped for a missing dependency fails.
python=/usr/bin/python3

step() { printf '\n==== %s [%s]\n' "$*" "$(date -u +%H:%M:%S)"; }

# ---- packages --------------------------------------------------------------------------------
if [[ ${KVTIER_SKIP_APT:-0} != 1 ]]; then
  step "installing Debian packages from deps/debian-packages.txt"
  sudo=""
  if [[ $(id -u) -ne 0 ]]; then
    command -v sudo >/dev/null || { echo "setup.sh: run as root (or install sudo)" >&2; exit 1; }
    sudo=sudo
  fi
  packages=$(grep -v '^[[:space:]]*#' deps/debian-packages.txt | grep -v '^[[:space:]]*$')
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -q
  # shellcheck disable=SC2086  # one word per package
  $sudo apt-get install -y -q --no-install-recommends $packages
fi

# ccache: a bounded cache in the usual place; CMake picks ccache up by itself when it is found.
export CCACHE_MAXSIZE=${CCACHE_MAXSIZE:-5G}
# Paths under the repository are hashed relative to it, so a fresh clone elsewhere reuses the cache.
export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$repo}

# configure <build dir> <cmake args...>
configure() {
  local dir=$1
  shift
  cmake -S "$repo" -B "$dir" -G Ninja "$@"
}

# ---- demo ------------------------------------------------------------------------------------
if [[ $mode == demo ]]; then
  step "building the kvtier CLI (build-release)"
  configure build-release -DCMAKE_BUILD_TYPE=Release -DKVTIER_CUDA="$cuda" \
    -DKVTIER_BUILD_TESTS=OFF -DKVTIER_BUILD_BENCH=OFF -DKVTIER_BUILD_PYTHON=OFF
  cmake --build build-release -j "$jobs" --target kvtier_cli
  step "kvtier demo"
  build-release/tools/kvtier demo
  echo
  echo "Next: build-release/tools/kvtier --help, build-release/tools/kvtier bench --backend cpu --tokens 4096"
  exit 0
fi

# ---- test ------------------------------------------------------------------------------------
start=$(date +%s)

# 0. Formatting: every C++ and CUDA file as clang-format (Debian 12: version 14) writes it.
step "0/5 clang-format --dry-run -Werror (.clang-format); long functions have a reason"
git ls-files -z '*.cc' '*.h' '*.cu' '*.cuh' | xargs -0 clang-format --dry-run -Werror
# No function over 100 lines in tools/ or python/src without a reason (issue 39; architecture.md
# "A long function").
"$python" scripts/long_functions.py --check

# The cache's locking contract (src/cache: KVTIER_GUARDED_BY / KVTIER_REQUIRES / KVTIER_EXCLUDES,
# util/thread_annotations.h) checked by Clang's thread-safety analysis: the library only, CPU only.
step "0/5 clang -Wthread-safety build of the library (build-tsa, unoptimised: only the analysis matters)"
CC=clang CXX=clang++ configure build-tsa -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS_DEBUG=-O0 -DKVTIER_CUDA=OFF \
  -DKVTIER_BUILD_TESTS=OFF -DKVTIER_BUILD_BENCH=OFF -DKVTIER_BUILD_PYTHON=OFF \
  -DKVTIER_BUILD_TOOLS=OFF "-DCMAKE_CXX_FLAGS=-Wthread-safety -Werror=thread-safety"
cmake --build build-tsa -j "$jobs" --target kvtier

# ctest over a build dir; extra arguments select tests. Fails the script on any failed test.
run_ctest() {
  local dir=$1
  shift
  (cd "$dir" && ctest --output-on-failure --no-tests=error -j "$jobs" "$@")
}

# 1. The normal build: everything (library, CLI, tests, micro-benchmarks, Python extension).
step "1/5 normal build (build-release; CUDA: $cuda)"
configure build-release -DCMAKE_BUILD_TYPE=Release -DKVTIER_CUDA="$cuda" \
  -DKVTIER_BUILD_TESTS=ON -DKVTIER_BUILD_BENCH=ON -DKVTIER_BUILD_PYTHON=ON \
  -DPython_EXECUTABLE="$python"
cmake --build build-release -j "$jobs"
step "1/5 ctest (build-release)"
# pytest runs in step 4, where "no tests collected" is told apart from a failure.
run_ctest build-release -E '^python_tests$'

# 2. Address + undefined-behaviour sanitizers, CPU only: every test.
step "2/5 address+undefined sanitizer build (build-asan)"
configure build-asan -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS_DEBUG="-O1 -g1" \
  -DKVTIER_SANITIZE=address,undefined -DKVTIER_CUDA=OFF \
  -DKVTIER_BUILD_TESTS=ON -DKVTIER_BUILD_BENCH=OFF -DKVTIER_BUILD_PYTHON=OFF \
  -DPython_EXECUTABLE="$python"
cmake --build build-asan -j "$jobs"
step "2/5 ctest (build-asan)"
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:strict_string_checks=1 \
UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  run_ctest build-asan

# 3. Thread sanitizer, CPU only: the tests whose names say they exercise concurrency. Only the
#    test executables that define such tests are built.
concurrency_regex='Concurren|Thread|Race'
step "3/5 thread sanitizer build (build-tsan): tests matching '$concurrency_regex'"
mapfile -t tsan_files < <(grep -rlE "TEST(_F|_P)?\([^)]*(${concurrency_regex})" tests \
  --include='*_test.cc' | sort)
if [[ ${#tsan_files[@]} -eq 0 ]]; then
  echo "no test names match '$concurrency_regex'; skipping the thread sanitizer run"
else
  tsan_targets=()
  for f in "${tsan_files[@]}"; do tsan_targets+=("$(basename "$f" .cc)"); done
  echo "test executables with concurrency tests: ${tsan_targets[*]}"
  configure build-tsan -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS_DEBUG="-O1 -g1" \
    -DKVTIER_SANITIZE=thread -DKVTIER_CUDA=OFF \
    -DKVTIER_BUILD_TESTS=ON -DKVTIER_BUILD_BENCH=OFF -DKVTIER_BUILD_PYTHON=OFF \
    -DKVTIER_BUILD_TOOLS=OFF -DPython_EXECUTABLE="$python"
  cmake --build build-tsan -j "$jobs" --target "${tsan_targets[@]}"
  step "3/5 ctest (build-tsan)"
  # ThreadSanitizer wants a low-entropy address space: setarch -R runs ctest without ASLR where
  # the kernel allows it. Executables that were not built show up as <name>_NOT_BUILT: excluded.
  norandom=()
  if setarch "$(uname -m)" -R true 2>/dev/null; then norandom=(setarch "$(uname -m)" -R); fi
  (cd build-tsan && TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 \
    "${norandom[@]}" ctest --output-on-failure --no-tests=error -j "$jobs" \
      -R "$concurrency_regex" -E '_NOT_BUILT$')
fi

# 4. Python tests against the normal build.
step "4/5 Python tests (pytest, $python)"
shopt -s nullglob
python_test_files=(python/tests/test_*.py python/tests/*_test.py)
shopt -u nullglob
if [[ ${#python_test_files[@]} -eq 0 ]]; then
  echo "python/tests has no test files yet; skipping the Python tests"
else
  set +e
  KVTIER_CLI="$repo/build-release/tools/kvtier" PYTHONPATH="$repo/build-release/python" \
    "$python" -m pytest -q python/tests
  rc=$?
  set -e
  if [[ $rc -eq 5 ]]; then
    echo "pytest collected no tests; skipping the Python tests"
  elif [[ $rc -ne 0 ]]; then
    echo "setup.sh: the Python tests failed (pytest exit code $rc)" >&2
    exit "$rc"
  fi
fi

# 5. The soak: the normal build's caches under storage faults, resources sampled (scripts/soak.sh).
soak_minutes=${KVTIER_SOAK_MINUTES:-3}
step "5/5 soak: ${soak_minutes} min under storage faults (scripts/soak.sh)"
KVTIER_BUILD_DIR="$repo/build-release" scripts/soak.sh "$soak_minutes" \
  --json build-release/soak.json

# The libFuzzer targets (tests/fuzz), built with clang: each runs for a bounded time from an empty
# corpus; any finding (crash, sanitizer report, leak, timeout) fails the script.
fuzz_seconds=${KVTIER_FUZZ_SECONDS:-30}
step "fuzz: libFuzzer targets, ${fuzz_seconds} s each (build-fuzz, clang)"
CC=clang CXX=clang++ configure build-fuzz -DCMAKE_BUILD_TYPE=Release -DKVTIER_CUDA=OFF \
  -DKVTIER_BUILD_FUZZ=ON -DKVTIER_BUILD_TESTS=OFF -DKVTIER_BUILD_BENCH=OFF \
  -DKVTIER_BUILD_PYTHON=OFF -DKVTIER_BUILD_TOOLS=OFF
cmake --build build-fuzz -j "$jobs" --target kvtier_fuzz_all
# Every target: the page value, the trace line, the storage URLs, the Redis reply reader (with
# hiredis) and the shared segment's index.
for target in build-fuzz/tests/fuzz/kvtier_fuzz_*; do
  [[ -x $target && -f $target ]] || continue
  corpus=build-fuzz/corpus/$(basename "$target")
  rm -rf "$corpus" && mkdir -p "$corpus"
  "$target" -max_total_time="$fuzz_seconds" -timeout=10 -print_final_stats=1 \
    -artifact_prefix=build-fuzz/ "$corpus"
done

step "all tests passed in $(( ($(date +%s) - start) / 60 )) min $(( ($(date +%s) - start) % 60 )) s"
