// kvtier/engine_stats.h — what the CUDA transfer engines (kernel, dma, auto) did in their
// last call, for `kvtier bench` and the GPU tests: blocks and launches of a kernel copy, copy
// operations and lanes of a DMA copy.
//
// Thread safety: an engine writes its statistics in Transfer, under its lock, and they are read
// without it: read them only from the thread that made the call they describe.
#pragma once

#include <cstdint>

#include "kvtier/transfer.h"

namespace kvtier::testing {

struct GpuTransferStats {
  TransferBackend backend = TransferBackend::kKernel;  // kernel or dma (auto: the one it chose)
  int blocks = 0;        // kernel: blocks of the widest launch = SMs occupied (one 1024-thread
                         // block fits an SM at a time, see copy_kernels.cuh)
  int64_t launches = 0;  // kernel: kernel launches
  double launch_us = 0;  // kernel: host wall time inside the launch calls (the driver's part of
                         // the call's host time; bench reports it next to the whole call)
  int64_t copy_ops =
      0;  // dma: copy operations submitted (batch entries + 2D copies + single copies)
  int64_t batch_calls = 0;   // dma: cudaMemcpyBatchAsync calls
  int64_t copies_2d = 0;     // dma: cudaMemcpy2DAsync calls
  int lanes = 1;             // dma: streams the operations were spread over (dma_engine.cc)
  int64_t kv_merged = 0;     // dma: strided copies that carried K and V of a page at once
  bool whole_batch = false;  // dma: the single copies went in one batch call per lane, not in
                             // growing pieces (TransferEngineConfig::dma_batch_split; with
                             // layer_events: for some layer)
};

// The last call's statistics when `engine` is a CUDA engine, else nullptr (always nullptr in a
// build without CUDA). The pointer lives as long as the engine.
const GpuTransferStats* LastTransferStats(const TransferEngine& engine);

}  // namespace kvtier::testing
