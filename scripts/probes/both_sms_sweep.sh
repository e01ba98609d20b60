#!/usr/bin/env bash
# scripts/probes/both_sms_sweep.sh OUTDIR — the bench's "both directions at once" rows (MHA,
# layer_first p16 and page_first_direct p64) for every backend's default, then the kernel backend
# with loads on L SMs and the backup on B SMs (KVTIER_BENCH_BOTH_SMS), L in 4..24, B in 2..4.
# It chose TransferEngineConfig::max_sms_beside_backup = 8 (BENCHMARKS.md). Read the GB/s column:
# each invocation measures its own ceiling, and on a busy host that moves by 10-40 %.
# Runs about 9 minutes on an H100 machine (each invocation also checks its 2 GiB backups).
set -uo pipefail
O=${1:?usage: both_sms_sweep.sh OUTDIR}
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVTIER_CUDA=ON -DKVTIER_CUDA_ARCHITECTURES=90 -DKVTIER_BUILD_PYTHON=OFF > $O/build.log 2>&1 && cmake --build build-gpu -j16 >> $O/build.log 2>&1 || { tail -30 $O/build.log; exit 1; }
T=$(find build-gpu -name 'cuda_transfer_test' -type f | head -1)
$T --gtest_filter='*LoadsBesideABackup*:*BackupsDefaultToFewer*:*PerCallMaxSms*' 2>&1 | tail -5
K=build-gpu/tools/kvtier
A="--ops backup --shapes mha --layouts layer_first,page_first_direct --page-sizes 16,64"
for b in kernel dma auto; do
  $K bench --backend $b $A 2>&1 | grep -E "ceiling both|\] mha both" | sed "s/^/$b default: /"
done
for ls in 4 8 12 16 24; do for bs in 2 3 4; do
  KVTIER_BENCH_BOTH_SMS=$ls,$bs $K bench --backend kernel $A 2>&1 | grep -E "\] mha both" | sed "s/^/L=$ls B=$bs: /"
done; done
