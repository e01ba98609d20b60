#!/usr/bin/env bash
# scripts/soak.sh [MINUTES] [soak.py options...] — kvtier under storage faults for MINUTES
# (default 3): caches on Redis (killed, restarted, paused), on a file store (pages corrupted, the
# disk "full" through RLIMIT_FSIZE) and on a shared host segment (one of its two processes
# SIGKILLed every 15 s), every loaded byte checked, RSS / fds / threads / segments / store bytes
# sampled; exit 1 on a wrong byte, a stalled request or unbounded growth. See scripts/soak.py.
#
# Uses the normal build (KVTIER_BUILD_DIR, default build-release: its tools/kvtier and python/)
# and Debian's python3 (numpy; PYTHON overrides it: --device gpu needs the interpreter with torch
# that the extension was built for — scripts/soak_gpu.sh). No root needed.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${KVTIER_BUILD_DIR:-$repo/build-release}
minutes=${1:-3}
shift || true
PYTHONPATH="$build/python" exec "${PYTHON:-/usr/bin/python3}" "$repo/scripts/soak.py" --minutes "$minutes" \
  --cli "$build/tools/kvtier" "$@"
