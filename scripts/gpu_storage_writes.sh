#!/usr/bin/env bash
# scripts/gpu_storage_writes.sh — issue 40 on the GPU machine: the file store's writes against
# the disk's write ceiling, and the replay's storage hits against the storage oracle per write
# policy.
#
#   bench    kvtier bench --storage file://… (512 KiB / 2 MiB / 8 MiB pages, 1 GiB each, 2
#            rounds): write and read ceilings (16 threads writing / reading page files laid out
#            as the store's, no fsync, published as the store does: a page's older file swapped
#            out, its unlink after the clock), the store's Set / Get and both under each other,
#            the ratios, and where a Set's and a Get's time goes. --json bench.json. Then
#            512 KiB pages alone, 2 GiB, 3 rounds (reads under writes). --json bench-mha4-2g.json.
#   sweep    the writers' share while reads run (--storage-writers-while-reading: SHARES, default
#            "1 2 4" of 16 I/O threads; 4 is the default share): 512 KiB pages (2 GiB, 3 rounds)
#            and 2 MiB pages (1 GiB, 2 rounds) per share, one summary line each: Set alone, Get
#            under writes and Set under reads against the ceilings (and in GB/s), and the Set-alone
#            open phase with its directory part. --json sweep-<kind>-t<threads>-w<share>.json.
#            THREADS (default "16") also varies the I/O threads, the writers' share alone and the
#            ceilings' thread count with them: at 512 KiB on the H100 (e4884d9) 4 writers beside
#            reads wrote faster (3.18 GB/s) than 16 alone (2.32) and than the 16-thread ceiling
#            (3.01), so THREADS="16 8 4" says whether fewer file creators write more. ~4 min on the
#            H100 for the defaults; each more THREADS value adds ~2 min.
#   replay   Llama-3-8B GEMM on the conversation trace (engine 3 of 8, 100 warm-up + 300
#            requests, hierarchy only: the ideal is its own), a 48 GiB file store, the cache's
#            default store queue (512 pages) and admission (frequency, 2), for each mode
#            (sequential; 2 in flight with measured decode) and each write policy
#            (write_through; write_through_selective, threshold 2): hit rates, storage hits
#            against the oracle, hits lost, write time-outs, hierarchy / ideal. --json per run.
#            Then sequential write_through again with 16 I/O threads (twice the writers).
#   admission  the same replay under write_through, once per storage admission policy
#            (ADMISSION, default "all frequency": --admission-policy, threshold 2, the cache's
#            default backlog; "all" with --admission-backlog-bytes 0 is the old queue-order
#            drop: ADMISSION_FLAGS) and mode (MODES, default "seq conc2"); REPLAY_SIZE defaults
#            to "--warmup 10 --requests 25" here: 4 runs of 35 requests, ~3-4 min on the H100 at
#            the issue's 1-1.6 s a request (300 requests took 5-8 min). The issue's >= 300
#            requests is one call per run: ADMISSION=frequency MODES=seq
#            REPLAY_SIZE="--warmup 100 --requests 300" (~6-9 min). The summary line per run: hit
#            rate, storage hit rate against the oracle (the run's admissions done at once) and
#            admit-all's, drops by reason.
#
# Usage: scripts/gpu_storage_writes.sh [bench|sweep|replay|admission|all]   (default all: bench and
# replay)
# KVTIER: the CLI (default build-gpu/tools/kvtier, else build-deps/prebuilt/bin/kvtier).
# STORE_DIR: where the stores go (default /tmp; needs ~55 GB free for the replay).
# Logs and JSON to $OUT (else ./storage-writes-out). Exit 0 when every command exited 0 and no
# run reported wrong bytes. Budget on a 16-core H100 box: bench ~3 min, replay ~6 min (5 runs).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
what=${1:-all}
OUT=${OUT:-$PWD/storage-writes-out}
mkdir -p "$OUT"
[[ -f scripts/gpu_env.sh ]] && source scripts/gpu_env.sh
[[ -d build-deps/prebuilt/root ]] &&
  export LD_LIBRARY_PATH="$PWD/build-deps/prebuilt/root/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}"
KVTIER=${KVTIER:-}
if [[ -z "$KVTIER" ]]; then
  for k in build-gpu/tools/kvtier build-deps/prebuilt/bin/kvtier build-release/tools/kvtier; do
    [[ -x "$k" ]] && { KVTIER=$k; break; }
  done
fi
[[ -x "$KVTIER" ]] || { echo "gpu_storage_writes: no kvtier CLI (set KVTIER)" >&2; exit 2; }
STORE_DIR=${STORE_DIR:-/tmp}
rc=0
T0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
export KVTIER_LOG_LEVEL=info

if [[ $what == bench || $what == all ]]; then
  stamp "== storage write bench"
  dir=$STORE_DIR/kvtier-storage-writes-bench
  "$KVTIER" bench --storage "file://$dir" --storage-kinds mha4,mha16,mha64 \
    --storage-bytes 1GiB --repeats 2 --json "$OUT/bench.json" 2>&1 | tee "$OUT/bench.log"
  [[ ${PIPESTATUS[0]} == 0 ]] || rc=1
  rm -rf "$dir"
  # Reads under writes at 512 KiB, the kind that missed 80 % (75 % at 4fb4d2c): above, its Get
  # pass under writes lasts ~30 ms and the median of 2 rounds mixes a round without the
  # reclaimer's unlinks (the first Sets of new keys) and one with; here 2 GiB (a ~0.07 s pass)
  # and 3 rounds. Its "a Get:" line says where a read page's time went alone and under writes
  # (on a core / waiting for a core / blocked) and which threads had the cores (kvtier: the I/O
  # threads; kvtier-reclaim: the unlinks): docs/perf-notes/storage-writes.md, "Reads under
  # writes: what decides the next step".
  stamp "== storage reads under writes, 512 KiB pages, 2 GiB, 3 rounds"
  "$KVTIER" bench --storage "file://$dir" --storage-kinds mha4 --storage-bytes 2GiB --repeats 3 \
    --storage-exists-keys 0 --json "$OUT/bench-mha4-2g.json" 2>&1 | tee "$OUT/bench-mha4-2g.log"
  [[ ${PIPESTATUS[0]} == 0 ]] || rc=1
  rm -rf "$dir"
fi

if [[ $what == sweep ]]; then
  dir=$STORE_DIR/kvtier-storage-writes-sweep
  for threads in ${THREADS:-16}; do
    for share in ${SHARES:-1 2 4}; do
      for kr in "mha4 2GiB 3" "mha16 1GiB 2"; do
        read -r kind bytes rounds <<<"$kr"
        stamp "== sweep $kind, $threads I/O threads, writers while reading $share"
        name="sweep-$kind-t$threads-w$share"
        "$KVTIER" bench --storage "file://$dir" --storage-kinds "$kind" --storage-bytes "$bytes" \
          --repeats "$rounds" --storage-exists-keys 0 --storage-threads "$threads" \
          --storage-writers-while-reading "$share" --json "$OUT/$name.json" > "$OUT/$name.log" 2>&1 ||
          rc=1
        rm -rf "$dir"
      done
    done
  done
  python3 - "$OUT" <<'PY' | tee "$OUT/sweep-summary.txt"
import glob, json, os, sys
for path in sorted(glob.glob(os.path.join(sys.argv[1], "sweep-*.json"))):
    s = json.load(open(path))["summary"][0]
    a = s.get("set_alone", {})
    pages = max(a.get("pages", 0), 1)
    print("%-32s Set %3.0f %% (%.2f of %.2f GB/s)  Get under writes %3.0f %% (%.2f of %.2f)  "
          "Set under reads %3.0f %% (%.2f)  open %.2f ms (directory %.2f)" % (
              os.path.basename(path), s["set_pct_of_write_ceiling"], s["set_gbps"],
              s["write_ceiling_gbps"], s["get_under_writes_pct_of_read_ceiling"],
              s["get_under_writes_gbps"], s["read_ceiling_gbps"],
              100 * s["set_under_reads_gbps"] / max(s["write_ceiling_gbps"], 1e-9),
              s["set_under_reads_gbps"], 1e3 * a.get("open", 0) / pages,
              1e3 * a.get("open_dir", 0) / pages))
PY
fi

if [[ $what == replay || $what == all || $what == admission ]]; then
  # REPLAY_ENGINE / REPLAY_SIZE: for a smoke run on a machine without a GPU, e.g.
  # REPLAY_ENGINE="--device cpu --compute model --model tiny --compute-model llama3-8b"
  # REPLAY_SIZE="--warmup 5 --requests 20" REPLAY_DECODE=20 (ms a token; the GPU measures it).
  E=${REPLAY_ENGINE:-"--device gpu --compute gemm --model llama3-8b"}
  if [[ $what == admission ]]; then
    Z=${REPLAY_SIZE:-"--warmup 10 --requests 25"}
  else
    Z=${REPLAY_SIZE:-"--warmup 100 --requests 300"}
  fi
  C="$E $Z --storage file://$STORE_DIR/kvtier-storage-writes-replay?capacity=48GiB
     --shard 3/8 --device-tokens 131072 --host-tokens 393216
     --no-progress --runs hierarchy --slow-class-warn"
  L="--storage-io-threads 8"
  if [[ $what == admission ]]; then
    for mode in ${MODES:-seq conc2}; do
      if [[ $mode == seq ]]; then M="--sequential"; else M="--concurrency 2 --decode-ms-per-token ${REPLAY_DECODE:-measure}"; fi
      for adm in ${ADMISSION:-all frequency}; do
        stamp "== replay $mode write_through, admission $adm"
        rm -rf "$STORE_DIR/kvtier-storage-writes-replay"
        # shellcheck disable=SC2086
        "$KVTIER" replay $C $L $M --hicache-write-policy write_through --admission-policy $adm \
          --admission-threshold 2 ${ADMISSION_FLAGS:-} --json "$OUT/replay-$mode-admission-$adm.json" 2>&1 |
          tee "$OUT/replay-$mode-admission-$adm.log"
        [[ ${PIPESTATUS[0]} == 0 ]] || rc=1
      done
    done
  fi
  for mode in seq conc2; do
    [[ $what == admission ]] && break
    if [[ $mode == seq ]]; then M="--sequential"; else M="--concurrency 2 --decode-ms-per-token ${REPLAY_DECODE:-measure}"; fi
    for policy in write_through write_through_selective; do
      stamp "== replay $mode $policy"
      rm -rf "$STORE_DIR/kvtier-storage-writes-replay"
      # shellcheck disable=SC2086
      "$KVTIER" replay $C $L $M --hicache-write-policy $policy --write-through-threshold 2 \
        --json "$OUT/replay-$mode-$policy.json" 2>&1 | tee "$OUT/replay-$mode-$policy.log"
      [[ ${PIPESTATUS[0]} == 0 ]] || rc=1
    done
  done
  # The writers' share while reads run is io_threads / 4 (storage_backend.cc): 2 threads at the
  # 8 above, 4 at 16. The same sequential write_through run with 16 I/O threads says whether the
  # writes' rate follows the writer threads (docs/perf-notes/storage-writes.md).
  if [[ $what != admission ]]; then
    stamp "== replay seq write_through, 16 I/O threads"
    rm -rf "$STORE_DIR/kvtier-storage-writes-replay"
    # shellcheck disable=SC2086
    "$KVTIER" replay $C --sequential --hicache-write-policy write_through --storage-io-threads 16 \
      --json "$OUT/replay-seq-write_through-io16.json" 2>&1 | tee "$OUT/replay-seq-write_through-io16.log"
    [[ ${PIPESTATUS[0]} == 0 ]] || rc=1
  fi
  rm -rf "$STORE_DIR/kvtier-storage-writes-replay"
  # One line per run: hit rates, storage against the oracle, lost hits, write time-outs, ideal.
  python3 - "$OUT" <<'PY' | tee "$OUT/summary.txt"
import glob, json, os, sys
for path in sorted(glob.glob(os.path.join(sys.argv[1], "replay-*.json"))):
    r = json.load(open(path))
    run = r["runs"][-1]
    o = run.get("storage_oracle", {})
    e = run.get("storage_errors", {})
    h = r.get("headline", {})
    p50 = h.get("hierarchy_over_ideal_p50", {}).get("value", 0)
    # The oracle: the run's admissions done at once (the bound, target >= 90 %); admit-all:
    # every write admitted and done at once (not a bound: it thrashes below the working set).
    print("%-40s hit %.2f %%; storage hit %.2f %% / oracle %.2f %% = %.0f %% (admit-all %.2f %%); "
          "lost %d tokens in %d requests; write timeouts %d, queue drops %d; hierarchy/ideal p50 "
          "%.2fx; wrong bytes %d; not written: %s" % (
              os.path.basename(path), 100 * run.get("hit_rate", 0),
              100 * o.get("storage_hit_rate", 0),
              100 * o.get("oracle_storage_hit_rate", 0), o.get("storage_hit_pct_of_oracle", 0),
              100 * o.get("admit_all_storage_hit_rate", 0),
              o.get("lost_tokens", 0), o.get("lost_requests", 0), e.get("write_timeouts", -1),
              e.get("queue_drops", -1), p50, r["integrity"]["wrong_bytes"],
              o.get("writes_not_done_tokens")))
    if r["integrity"]["wrong_bytes"] != 0:
        sys.exit(1)
PY
  [[ ${PIPESTATUS[0]} == 0 ]] || rc=1
fi
stamp "done, rc=$rc"
exit $rc
