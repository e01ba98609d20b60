#!/usr/bin/env bash
# scripts/bench_cluster.sh — the storage tier against Redis Clusters of 1, 3 and 6 masters on
# loopback: `kvtier bench --storage redis+cluster://…` with many client threads for each size, then
# one table of aggregate Set / Get GB/s per node count.
#
# Usage: scripts/bench_cluster.sh [KVTIER]        (KVTIER: the kvtier binary, default build/tools/kvtier)
# Environment (all optional):
#   NODES="1 3 6"     cluster sizes (masters, no replicas)
#   THREADS=N         kvtier's storage I/O threads (the client threads; default: cores, at most 64)
#   INFLIGHT=N        Set / Get batches in flight (default 2 x THREADS)
#   KINDS=mha16       page kinds (--storage-kinds)
#   BYTES=256MiB      bytes of pages per kind (--storage-bytes): each node holds BYTES / nodes
#   BENCH_TIMEOUT=60  seconds one bench may run before it is stopped (a failure)
#   STORAGE_TIMEOUT_MS=N  the store's per-call timeout (--storage-timeout-ms; default: the
#                     store's own, 2 s). The ctest run sets it high: on a loaded machine a call
#                     that outlives 2 s is a miss, and a functional test must not fail for time.
#   KEEP=1            keep the temporary directory (the servers' logs, the JSON rows)
#
# Exit status: 0 when every bench ran and checked every byte; 77 without redis-server or
# redis-cli; 1 when a cluster did not come up or a bench failed; 2 for a missing tool or binary.
# redis-server and redis-cli come from PATH (on the GPU machine, scripts/gpu_env.sh puts the
# carried Debian packages there). Every wait is bounded; the servers are always stopped (EXIT
# trap). The nodes are plain processes on one host: they share its cores with the client, so the
# figures measure kvtier's cluster client and Redis on loopback, not a network (BENCHMARKS.md).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
[[ -f scripts/gpu_env.sh && -d build-deps/root ]] && source scripts/gpu_env.sh

KVTIER=${1:-build/tools/kvtier}
NODES=${NODES:-"1 3 6"}
CORES=$(nproc)
THREADS=${THREADS:-$((CORES < 64 ? CORES : 64))}
INFLIGHT=${INFLIGHT:-$((2 * THREADS))}
KINDS=${KINDS:-mha16}
BYTES=${BYTES:-256MiB}
BENCH_TIMEOUT=${BENCH_TIMEOUT:-60}
STORAGE_TIMEOUT_MS=${STORAGE_TIMEOUT_MS:-}

# Exit 77 (a test's "skipped") without the Redis tools; 1 under CI=true, where they must be there
# (deps/debian-packages.txt; tests/tools/missing_dep.py is the same rule).
for tool in redis-server redis-cli; do
  command -v "$tool" >/dev/null && continue
  case ${CI:-} in
    true | TRUE | True | 1 | yes)
      echo "bench_cluster: $tool not on PATH (CI=true: a required dependency must be present)" >&2
      exit 1
      ;;
  esac
  echo "bench_cluster: $tool not on PATH: skipped" >&2
  exit 77
done
for tool in python3 timeout; do
  command -v "$tool" >/dev/null || { echo "bench_cluster: $tool not on PATH" >&2; exit 2; }
done
[[ -x $KVTIER ]] || { echo "bench_cluster: no kvtier binary at $KVTIER" >&2; exit 2; }

WORK=$(mktemp -d /tmp/kvtier-cluster-XXXXXX)
PIDS=()
stop_nodes() {
  local pid
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${PIDS[@]}"; do
    # Bounded: SIGKILL after 5 s.
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
  PIDS=()
}
cleanup() {
  stop_nodes
  if [[ ${KEEP:-0} == 1 ]]; then echo "bench_cluster: kept $WORK"; else rm -rf "$WORK"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# A base port whose node ports and cluster-bus ports (+10000) are free, for `n` nodes.
free_base() {
  python3 - "$1" <<'EOF'
import random, socket, sys
n = int(sys.argv[1])
for _ in range(200):
    base = random.randrange(20000, 40000)
    ports = [base + i for i in range(n)] + [base + 10000 + i for i in range(n)]
    try:
        socks = []
        for p in ports:
            s = socket.socket()
            s.bind(("127.0.0.1", p))
            socks.append(s)
        for s in socks:
            s.close()
        print(base)
        sys.exit(0)
    except OSError:
        for s in socks:
            s.close()
sys.exit("no free ports")
EOF
}

# Waits (at most `secs`) until `cmd...` prints a line matching `pattern`.
wait_for() {
  local secs=$1 pattern=$2
  shift 2
  local deadline=$((SECONDS + secs))
  while ((SECONDS < deadline)); do
    if "$@" 2>/dev/null | grep -q "$pattern"; then return 0; fi
    sleep 0.1
  done
  return 1
}

start_cluster() {  # n base
  local n=$1 base=$2 i port dir
  for ((i = 0; i < n; i++)); do
    port=$((base + i))
    dir=$WORK/n$n/node$i
    mkdir -p "$dir"
    redis-server --port "$port" --bind 127.0.0.1 --dir "$dir" --save '' --appendonly no \
      --daemonize no --logfile "$dir/redis.log" --cluster-enabled yes \
      --cluster-config-file "$dir/nodes.conf" --cluster-node-timeout 5000 \
      --cluster-require-full-coverage no >"$dir/stdout.log" 2>&1 &
    PIDS+=($!)
  done
  for ((i = 0; i < n; i++)); do
    port=$((base + i))
    if ! wait_for 10 PONG timeout 2 redis-cli -p "$port" PING; then
      echo "bench_cluster: node $port did not answer within 10 s:" >&2
      cat "$WORK/n$n/node$i/redis.log" >&2 || true
      return 1
    fi
  done
  if ((n == 1)); then
    # `redis-cli --cluster create` wants 3 masters: one node takes every slot itself.
    timeout 10 redis-cli -p "$base" CLUSTER ADDSLOTSRANGE 0 16383 >/dev/null
  else
    local addrs=()
    for ((i = 0; i < n; i++)); do addrs+=("127.0.0.1:$((base + i))"); done
    if ! timeout 60 redis-cli --cluster create "${addrs[@]}" --cluster-replicas 0 \
      --cluster-yes >"$WORK/n$n/create.log" 2>&1; then
      echo "bench_cluster: redis-cli --cluster create failed:" >&2
      cat "$WORK/n$n/create.log" >&2
      return 1
    fi
  fi
  for ((i = 0; i < n; i++)); do
    if ! wait_for 20 'cluster_state:ok' timeout 2 redis-cli -p "$((base + i))" CLUSTER INFO; then
      echo "bench_cluster: node $((base + i)) not cluster_state:ok within 20 s" >&2
      return 1
    fi
  done
}

RESULTS=()
for n in $NODES; do
  base=$(free_base "$n")
  echo "== $n master(s) on 127.0.0.1:$base..$((base + n - 1)): kvtier bench, $THREADS threads, $INFLIGHT batches in flight"
  start_cluster "$n" "$base"
  url="redis+cluster://127.0.0.1:$base"
  json=$WORK/n$n/bench.json
  set +e
  timeout "$BENCH_TIMEOUT" "$KVTIER" bench --storage "$url" --storage-kinds "$KINDS" \
    --storage-bytes "$BYTES" --storage-threads "$THREADS" --storage-inflight "$INFLIGHT" \
    ${STORAGE_TIMEOUT_MS:+--storage-timeout-ms "$STORAGE_TIMEOUT_MS"} \
    --no-baseline --json "$json" 2>&1 | tee "$WORK/n$n/bench.log"
  rc=${PIPESTATUS[0]}
  set -e
  stop_nodes
  if ((rc != 0)); then
    echo "bench_cluster: kvtier bench against $n master(s) failed (exit $rc$( ((rc == 124)) && echo ": over ${BENCH_TIMEOUT} s"))" >&2
    exit 1
  fi
  RESULTS+=("$n=$json")
done

python3 - "$THREADS" "$INFLIGHT" "${RESULTS[@]}" <<'EOF'
import json, sys
threads, inflight = sys.argv[1], sys.argv[2]
print()
print("Redis Cluster on loopback, kvtier bench --storage redis+cluster:// (%s I/O threads, %s "
      "batches in flight; every byte checked)" % (threads, inflight))
print("%-8s %-7s %7s %9s %9s %11s %9s %11s %11s" % (
    "masters", "kind", "pages", "MiB/page", "Set GB/s", "Set p99 ms", "Get GB/s", "Get p99 ms",
    "Exists k/s"))
ok = True
for arg in sys.argv[3:]:
    n, path = arg.split("=", 1)
    rows = [r for r in json.load(open(path))["rows"] if r["who"] == "kvtier"]
    ok = ok and all(r["check_ok"] for r in rows)
    # The Exists rate of the many-keys row (e.g. "1000keys"), else of the page kind's.
    many = [r for r in rows if r["op"] == "exists" and r["kind"].endswith("keys")]
    kinds = []
    for r in rows:
        if r["op"] == "set" and r["kind"] not in kinds:
            kinds.append(r["kind"])
    for kind in kinds:
        by = {r["op"]: r for r in rows if r["kind"] == kind}
        s, g = by["set"], by["get"]
        e = many[0] if many else by.get("exists")
        print("%-8s %-7s %7d %9.2f %9.2f %11.2f %9.2f %11.2f %11.1f" % (
            n, kind, g["pages"], g["page_bytes"] / 2**20, s["gbps"], s["p99_ms"], g["gbps"],
            g["p99_ms"], e["pages_per_s"] / 1e3 if e else float("nan")))
sys.exit(0 if ok else 1)
EOF
