#!/usr/bin/env bash
# scripts/gpu_probe.sh — focused GPU measurements behind BENCHMARKS.md's "what limits the misses"
# (run after scripts/gpu_check.sh has built build-gpu). Each section prints a header and keeps
# its raw output under $OUT (or build-gpu/logs/probe).
#
#   1. MLA per-layer loads, kernel backend, twice in a row (spread within one machine), then
#      at 4x the tokens (is it the transfer size?).
#   2. Both directions at once and the all-layer backups next to them, kernel and dma (the dma
#      backend with its default lanes and with KVTIER_DMA_LANES=1).
#   3. Host pages: transparent huge pages on this machine, and the MLA loads with the pinned
#      pool on THP (KVTIER_BENCH_HUGEPAGES=1).
#   4. Nsight Compute counters (sysmem read requests, instructions) on MLA page_first vs page_head
#      loads and MHA layer_first vs page_head loads, each pair in one process (same pinned pool).
#   5. Both directions at once on the kernel backend with different SMs for the loads and the
#      backup (KVTIER_BENCH_BOTH_SMS), next to the copy engines' two-way ceiling.
#   7. MLA per-layer loads, kernel: is a slow row the GPU's state at that moment? Three
#      invocations with the default warm-up and three with KVTIER_BENCH_WARMUP_MS=200, alternating,
#      while nvidia-smi samples the SM clock every 20 ms (rows time-stamped); then
#      scripts/probes/submit_cost.cu (host cost of a call's driver calls after a large copy).
#   8. Host page size, directly: the MLA (and MHA page-1) per-layer loads with the pinned pool on
#      reserved 2 MiB huge pages (KVTIER_BENCH_HUGEPAGES=2; the probe reserves them in
#      /proc/sys/vm/nr_hugepages and puts the old value back) against cudaHostAlloc, alternating;
#      then MLA page-1 loads with 8 SMs against 4.
#   9. scripts/probes/submit_cost.cu alone.
#  11. scripts/probes/host_latency.cu (GPU read latency per 2 MiB of pinned pools) and
#      scripts/probes/dma_rows.cu (host cost of strided copies per operation and per row).
#  12. scripts/probes/tma_loads.cu: 16-byte loads against bulk (TMA) copies reading pinned host
#      memory on 4 SMs.
#  13. scripts/probes/both_ways.cu: both directions at once, each by the copy engines or by SMs,
#      on contiguous bytes (which pairing loses, and which direction).
#  10. Bytes in flight per SM: per-layer loads (MHA, MLA; pages 1 and 16) with the register
#      kernel (64 B per lane) against the cp.async staged kernel (128 B per lane), alternating,
#      twice; then kernel backups with the host time inside the launch call (host_launch_us).
#   6. The platform under the link: NUMA nodes and the GPU's node, IOMMU, huge pages, the PCIe
#      path (lspci -tv), and the GPU's own PCIe counters before and after a bench.
# Everything is packed into $OUT/probe.tgz at the end.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
BUILD=${KVTIER_GPU_BUILD_DIR:-build-gpu}
LOGS=${OUT:-$BUILD/logs}/probe
mkdir -p "$LOGS"
K="timeout 150 $BUILD/tools/kvtier"
T0=$(date +%s)
stamp() { echo "[probe $(( $(date +%s) - T0 ))s] $*"; }
table() { grep -E "^(mha|mla) " "$1" | cut -c1-200; }
[[ -x $BUILD/tools/kvtier ]] || { echo "probe: kvtier missing (run scripts/gpu_check.sh first)"; exit 2; }

SECTIONS=${PROBE_SECTIONS:-1 2 3 4}
for s in $SECTIONS; do
  case $s in
  1)
    stamp "1. MLA loads, kernel"
    for run in ${PROBE_MLA_RUNS:-a b}; do
      $K bench --backend kernel --shapes mla --ops load --repeats 9 \
        --json "$LOGS/mla_load_$run.json" >"$LOGS/mla_load_$run.txt" 2>&1
      table "$LOGS/mla_load_$run.txt"
    done
    stamp "1b. MLA loads at 65,536 tokens"
    $K bench --backend kernel --shapes mla --ops load --tokens 65536 --page-sizes 1,64 \
      --layouts page_first,page_head --repeats 9 >"$LOGS/mla_load_64k.txt" 2>&1
    table "$LOGS/mla_load_64k.txt"
    ;;
  2)
    stamp "2. both directions + backups (kernel, dma)"
    $K bench --backend kernel --shapes mha --ops backup --layouts layer_first,page_first_direct \
      --page-sizes 16,64 --repeats 5 >"$LOGS/both_kernel.txt" 2>&1
    table "$LOGS/both_kernel.txt"
    for lanes in default 1; do
      if [[ $lanes == default ]]; then unset KVTIER_DMA_LANES; else export KVTIER_DMA_LANES=$lanes; fi
      $K bench --backend dma --shapes mha,mla --ops backup --layouts layer_first,page_first_direct \
        --page-sizes 16,64 --repeats 5 >"$LOGS/both_dma_lanes_$lanes.txt" 2>&1
      echo "-- dma lanes: $lanes"
      table "$LOGS/both_dma_lanes_$lanes.txt"
    done
    unset KVTIER_DMA_LANES
    ;;
  3)
    stamp "3. host pages"
    cat /sys/kernel/mm/transparent_hugepage/enabled /sys/kernel/mm/transparent_hugepage/defrag 2>&1
    grep -E "AnonHugePages|HugePages_Total|Hugepagesize" /proc/meminfo
    KVTIER_BENCH_HUGEPAGES=1 $K bench --backend kernel --shapes mla --ops load --repeats 9 \
      >"$LOGS/mla_load_thp.txt" 2>&1 &
    pid=$!
    sleep 25; grep AnonHugePages /proc/meminfo
    wait $pid
    table "$LOGS/mla_load_thp.txt"
    ;;
  7)
    stamp "7. MLA loads: warm-up A/B with SM clock samples"
    nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,pstate \
      --format=csv,noheader -lms 20 >"$LOGS/clocks.csv" 2>&1 &
    smi=$!
    for run in a b c; do
      for w in 0 200; do
        KVTIER_BENCH_WARMUP_MS=$w $K bench --backend kernel --shapes mla --ops load --repeats 9 \
          2>&1 | while IFS= read -r line; do echo "$(date +%H:%M:%S.%3N) $line"; done \
          >"$LOGS/mla_warm${w}_$run.txt"
        echo "-- run $run, KVTIER_BENCH_WARMUP_MS=$w"
        grep -E "^[0-9:.]+ (mla) " "$LOGS/mla_warm${w}_$run.txt" | cut -c1-200
      done
    done
    kill $smi 2>/dev/null
    echo "-- SM clock samples: $(wc -l <"$LOGS/clocks.csv") lines; distribution of clocks.sm:"
    awk -F', ' '{print $2}' "$LOGS/clocks.csv" | sort | uniq -c | sort -rn | head -12
    echo "-- progress lines (time, row, GB/s) of run a"
    grep -E "\] mla load" "$LOGS/mla_warm0_a.txt" | cut -c1-110
    if command -v nvcc >/dev/null; then
      nvcc -O2 -arch=sm_90 -o "$BUILD/submit_cost" scripts/probes/submit_cost.cu && "$BUILD/submit_cost"
    fi
    ;;
  8)
    stamp "8. hugetlb pinned pool"
    before=$(cat /proc/sys/vm/nr_hugepages)
    echo "${PROBE_HUGEPAGES:-2600}" >/proc/sys/vm/nr_hugepages 2>/dev/null || echo "cannot reserve huge pages"
    grep -E "HugePages_Total|HugePages_Free" /proc/meminfo
    for run in a b c; do
      for hp in 0 2; do
        KVTIER_BENCH_HUGEPAGES=$hp $K bench --backend kernel --shapes mla --ops load --page-sizes 1,16 \
          --repeats 9 >"$LOGS/mla_hp${hp}_$run.txt" 2>&1
        echo "-- run $run, KVTIER_BENCH_HUGEPAGES=$hp"
        grep -E "allocating|rror" "$LOGS/mla_hp${hp}_$run.txt" | head -3
        table "$LOGS/mla_hp${hp}_$run.txt"
      done
    done
    for hp in 0 2; do
      KVTIER_BENCH_HUGEPAGES=$hp $K bench --backend kernel --shapes mha --ops load --page-sizes 1 \
        --repeats 9 >"$LOGS/mha_hp${hp}.txt" 2>&1
      echo "-- MHA page 1, KVTIER_BENCH_HUGEPAGES=$hp"
      table "$LOGS/mha_hp${hp}.txt"
    done
    echo "$before" >/proc/sys/vm/nr_hugepages 2>/dev/null
    grep -E "HugePages_Total" /proc/meminfo
    for run in a b; do
      for sms in 4 8; do
        $K bench --backend kernel --shapes mla --ops load --page-sizes 1 --max-sms $sms \
          --repeats 9 >"$LOGS/mla_sms${sms}_$run.txt" 2>&1
        echo "-- run $run, --max-sms $sms"
        table "$LOGS/mla_sms${sms}_$run.txt"
      done
    done
    ;;
  12)
    stamp "12. 16-byte loads against bulk copies"
    nvcc -O2 -arch=sm_90 -o "$BUILD/tma_loads" scripts/probes/tma_loads.cu && timeout 60 "$BUILD/tma_loads"
    ;;
  13)
    stamp "13. both directions at once: copy engines against SMs"
    nvcc -O2 -arch=sm_90 -o "$BUILD/both_ways" scripts/probes/both_ways.cu && timeout 120 "$BUILD/both_ways"
    ;;
  11)
    stamp "11. host read latency per 2 MiB; dma submission per row"
    for p in host_latency dma_rows; do
      nvcc -O2 -arch=sm_90 -o "$BUILD/$p" scripts/probes/$p.cu && timeout 120 "$BUILD/$p"
    done
    ;;
  9)
    stamp "9. host cost of a call's driver calls"
    nvcc -O2 -arch=sm_90 -o "$BUILD/submit_cost" scripts/probes/submit_cost.cu && "$BUILD/submit_cost"
    ;;
  10)
    stamp "10. register vs staged kernel on loads; launch share of backup submit"
    for run in a b; do
      for variant in registers staged; do
        KVTIER_COPY_KERNEL=$variant $K bench --backend kernel --shapes mha,mla --ops load \
          --page-sizes 1,16 --repeats 9 >"$LOGS/load_${variant}_$run.txt" 2>&1
        echo "-- run $run, KVTIER_COPY_KERNEL=$variant"
        table "$LOGS/load_${variant}_$run.txt"
      done
    done
    $K bench --backend kernel --ops backup --page-sizes 16 --layouts layer_first,page_first_direct \
      --repeats 9 --json "$LOGS/backup_submit.json" >"$LOGS/backup_submit.txt" 2>&1
    python3 - "$LOGS/backup_submit.json" <<'PY'
import json, sys
for r in json.load(open(sys.argv[1]))["rows"]:
    if r["op"] == "backup":
        print(f'{r["shape"]} backup {r["layout"]} p{r["page_size"]}: submit {r["host_submit_us"]:.1f} us '
              f'(launch {r["host_launch_us"]:.1f} us; timed calls {r["host_submit_timed_us"]:.1f} us)')
PY
    ;;
  6)
    stamp "6. platform"
    nproc; lscpu | grep -E "Model name|NUMA|Socket|Thread|Hypervisor" 
    command -v numactl >/dev/null && numactl -H | head -20
    for d in /sys/bus/pci/devices/*; do
      if [[ $(cat "$d/vendor" 2>/dev/null) == 0x10de ]]; then
        echo "gpu $d numa_node=$(cat $d/numa_node) link=$(cat $d/current_link_speed 2>/dev/null) x$(cat $d/current_link_width 2>/dev/null) max_read_req=$(cat $d/max_read_request_size 2>/dev/null || echo ?) iommu_group=$(basename "$(readlink -f $d/iommu_group 2>/dev/null)")"
      fi
    done
    ls /sys/class/iommu 2>&1 | head; cat /proc/cmdline
    grep -E "HugePages_|Hugepagesize|AnonHugePages" /proc/meminfo
    ls /sys/kernel/mm/hugepages 2>&1
    command -v lspci >/dev/null && lspci -tv 2>/dev/null | head -30
    command -v lspci >/dev/null && lspci -vv -d 10de: 2>/dev/null | grep -E "LnkSta|DevCtl|MaxReadReq|MaxPayload" | head
    nvidia-smi -q 2>/dev/null | grep -iE -A3 "PCIe Generation|Link Width|Replays|Tx Throughput|Rx Throughput|Addressing" | head -30
    nvidia-smi topo -m 2>&1 | head
    ;;
  4)
    stamp "4. Nsight Compute"
    NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
    if [[ -z "$NCU" ]]; then echo "no ncu"; continue; fi
    "$NCU" --version | tail -1
    "$NCU" --query-metrics >"$LOGS/ncu_metrics.txt" 2>&1
    grep -iE "^(pcie|lts__t_(sectors|requests)_aperture_sysmem|sm__throughput|gpu__time)" \
      "$LOGS/ncu_metrics.txt" | cut -c1-120 | head -30
    grep -iE "tlb|mmu|pcie|hub|sysmem_op_read" "$LOGS/ncu_metrics.txt" | awk '{print $1}' | sort -u | head -60 | tr '\n' ' '; echo
    METRICS=gpu__time_duration.sum,lts__t_requests_aperture_sysmem_op_read.sum,lts__t_sectors_aperture_sysmem_op_read.sum,smsp__inst_executed.sum,sm__warps_active.avg.per_cycle_active
    for spec in "mla page_first,page_head 16" "mha layer_first,page_head 16"; do
      set -- $spec
      # Rows run in order with 1 warm-up + 3 timed calls each: launches 3-4 of the first row and
      # 1-3 of the second, all on the same pinned pool and the same random pages per row.
      timeout 150 "$NCU" --clock-control none --cache-control none --kernel-name regex:CopyChunks \
        --launch-skip 2 --launch-count 5 --metrics "$METRICS" --csv --page raw \
        $K bench --backend kernel --shapes "$1" --ops load --layouts "$2" --page-sizes "$3" \
        --repeats 3 --warmup 1 >"$LOGS/ncu_$1_$3.csv" 2>&1
      echo "-- ncu $spec (rc=$?)"
      grep -E "CopyChunks|Metric Name|ID" "$LOGS/ncu_$1_$3.csv" | cut -c1-400 | head -8
    done
    ;;
  5)
    stamp "5. both directions, kernel, SMs for loads,backup (KVTIER_BENCH_BOTH_SMS)"
    for sms in ${PROBE_BOTH_SMS:-4,4 4,2 4,1 8,2 8,4}; do
      KVTIER_BENCH_BOTH_SMS=$sms $K bench --backend kernel --shapes mha --ops backup \
        --layouts layer_first --page-sizes 16 --max-sms 8 --repeats 5 \
        >"$LOGS/both_kernel_sms$sms.txt" 2>&1
      echo "-- loads,backup SMs $sms"
      grep -E "ceiling both|^mha +both" "$LOGS/both_kernel_sms$sms.txt"
    done
    ;;
  esac
done
stamp "done"
tar czf "${OUT:-$BUILD/logs}/probe.tgz" -C "$LOGS" . && rm -rf "$LOGS"
