// Internal: what the CUDA transfer engines (kernel, dma, auto) share — the device they run on,
// statistics of the last call for `kvtier bench`, and helpers for region residency checks.
//
// Thread safety: `last_stats()` is written by Transfer under the engine's lock and read without
// it; read it only from the thread that made the call it describes (the benchmark does).
#pragma once

#include <cstdint>
#include <memory>

#include "kvtier/transfer.h"

namespace kvtier::transfer::cuda {

struct GpuTransferStats {
  TransferBackend backend = TransferBackend::kKernel;  // kernel or dma (auto: the one it chose)
  int blocks = 0;        // kernel: blocks of the widest launch = SMs occupied (one 1024-thread
                         // block fits an SM at a time, see copy_kernels.cuh)
  int64_t launches = 0;  // kernel: kernel launches
  double launch_us = 0;  // kernel: host wall time inside the launch calls (the driver's part of
                         // the call's host time; bench reports it next to the whole call)
  int64_t copy_ops =
      0;  // dma: copy operations submitted (batch entries + 2D copies + single copies)
  int64_t batch_calls = 0;  // dma: cudaMemcpyBatchAsync calls
  int64_t copies_2d = 0;    // dma: cudaMemcpy2DAsync calls
  int lanes = 1;            // dma: streams the operations were spread over (dma_engine.cc)
  int64_t kv_merged = 0;    // dma: strided copies that carried K and V of a page at once
};

class GpuTransferEngine : public TransferEngine {
 public:
  const GpuTransferStats& last_stats() const { return stats_; }
  // DoTransfer without validating again (the auto engine validates once and delegates).
  // REQUIRES: ValidateTransfer(request).ok().
  Status TransferValidated(const TransferRequest& request, const TransferOptions& options) {
    return DoTransfer(request, options);
  }

 protected:
  GpuTransferStats stats_;
};

// The engines, as GpuTransferEngine (the public factories in backends.h wrap these).
Result<std::unique_ptr<GpuTransferEngine>> CreateKernelEngine(const TransferEngineConfig& config);
Result<std::unique_ptr<GpuTransferEngine>> CreateDmaEngine(const TransferEngineConfig& config);

// The engine `auto` picks for a request (auto_engine.cc documents the measured table).
// REQUIRES: ValidateTransfer(request).ok().
TransferBackend AutoChoice(const TransferRequest& request, const TransferOptions& options);

// The last call's statistics when `engine` is a CUDA engine, else nullptr.
const GpuTransferStats* LastTransferStats(const TransferEngine& engine);

// OK when CUDA device `device` exists; else Unavailable naming `backend` ("kernel", "dma") and
// how many devices are present. The engines' factories call it first.
Status RequireDevice(const char* backend, int device);

// Checks that `r`'s memory is where `r.memory` says and usable by `backend`: host regions must
// be pinned/registered for the kernel backend (pageable memory cannot be read by kernels), device
// regions must be device memory. The message names the region, the pointer and the fix.
// `pageable` (optional): set to whether a host region is pageable (not pinned/registered).
Status CheckResidency(const KvRegion& r, const char* name, bool need_pinned_host,
                      bool* pageable = nullptr);

}  // namespace kvtier::transfer::cuda
