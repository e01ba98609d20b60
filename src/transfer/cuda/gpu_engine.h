// Internal: what the CUDA transfer engines (kernel, dma, auto) share — the device they run on,
// statistics of the last call for `kvtier bench`, and helpers for region residency checks.
//
// Thread safety: `last_stats()` is written by Transfer under the engine's lock and read without
// it; read it only from the thread that made the call it describes (the benchmark does).
#pragma once

#include <cstdint>
#include <memory>

#include "kvtier/engine_stats.h"
#include "kvtier/transfer.h"

namespace kvtier::transfer::cuda {

// The statistics are transfer's (kvtier/engine_stats.h, in namespace testing: bench and tests
// read them), which also declares LastTransferStats (defined in gpu_engine.cc).
using ::kvtier::testing::GpuTransferStats;

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
