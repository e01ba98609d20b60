#!/usr/bin/env bash
# One-off measurements (lead, 2026-11-22): dma lanes submitted from threads, and the copy
# kernel's cooperative chunk resolve under Nsight Compute. Run after a build of build-gpu.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
K="timeout 120 build-gpu/tools/kvtier"
echo "== dma lanes: one thread vs a thread per lane"
for t in 0 1; do
  KVTIER_DMA_SUBMIT_THREADS=$t $K bench --backend dma --shapes mha,mla --ops backup \
    --layouts layer_first,page_first_direct --page-sizes 16 --repeats 5 2>/dev/null |
    grep -E "^(mha|mla) " | sed "s/^/threads=$t /" | cut -c1-130
done
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
echo "== ncu: per-lane vs cooperative resolve"
M=gpu__time_duration.sum,smsp__inst_executed.sum,smsp__issue_active.avg.pct_of_peak_sustained_active
for spec in "mla page_first" "mla page_head" "mha page_head"; do
  set -- $spec
  for v in per-lane registers; do
    KVTIER_COPY_KERNEL=$v timeout 100 "$NCU" --clock-control none --cache-control none \
      --kernel-name regex:CopyChunks --launch-skip 2 --launch-count 3 --metrics "$M" --csv \
      --page raw $K bench --backend kernel --shapes "$1" --ops load --layouts "$2" \
      --page-sizes 16 --repeats 3 --warmup 1 2>/dev/null >/tmp/ncu.csv
    python3 - "$spec $v" /tmp/ncu.csv <<'PY'
import csv, sys
rows = [r for r in csv.reader(open(sys.argv[2])) if r and (r[0] == "ID" or r[0].isdigit())]
if len(rows) < 2:
    print(sys.argv[1], "no data"); sys.exit()
h = rows[0]
pick = [i for i, n in enumerate(h) if n in ("gpu__time_duration.sum", "smsp__inst_executed.sum",
        "smsp__issue_active.avg.pct_of_peak_sustained_active")]
for r in rows[1:]:
    if r[0].isdigit():
        print(sys.argv[1], " ".join(f"{h[i]}={r[i]}" for i in pick))
PY
  done
done
echo "== warp state, MLA page_first load (cooperative)"
timeout 100 "$NCU" --clock-control none --cache-control none --kernel-name regex:CopyChunks \
  --launch-skip 2 --launch-count 1 --section WarpStateStats --section SchedulerStats \
  $K bench --backend kernel --shapes mla --ops load --layouts page_first --page-sizes 16 \
  --repeats 3 --warmup 1 2>/dev/null | grep -E "Stall|Issue|Eligible|Warp Cycles|Active Warps" | head -20
