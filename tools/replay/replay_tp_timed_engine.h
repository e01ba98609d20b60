// tools/replay/replay_tp_timed_engine.h — the transfer engine every rank of `kvtier replay --tp N`
// copies through (replay_tp.h): it times every copy and measures the loads (host -> device
// copies), which the report gives per rank (replay_tp_report.h).
//
// Thread safety: one engine is called from one thread at a time (the leader's cache runs with
// backup_threads = 0, a sequential replay; a follower's Serve is one thread).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "kvtier/device.h"
#include "kvtier/status.h"
#include "kvtier/transfer.h"

namespace kvtier::tools {

// This thread's CPU time in seconds: a decision's cost without the time the thread waited or was
// preempted (the machine's other threads: storage I/O, other ranks).
double ThreadCpuSeconds();

// An engine that times every copy (synchronised on a GPU) and measures the host -> device copies
// (into `device`), the loads: rank 0's own (inside the leader's engine: without publishing and
// waiting for the ranks) and each follower's.
//
// A load's time is the device's: CUDA events recorded on the copy's stream right before and
// right after this rank's own copy, read once it finished (so neither host-side waits, the
// cache's decisions, the ring nor the other ranks count; work queued on the stream before the
// copy does not either: the first event completes after it). cpu: the copy is synchronous, its
// wall time. A load on the legacy default stream (a follower's ring applies its copies there)
// runs on `load_stream` instead when it is set (a follower's: its engine's load stream, as rank
// 0's LoadBack uses); it is synchronised here, before the call returns. Bytes: what
// this rank moved (its heads' part of each page for MHA at TP > 1, the whole latent for MLA).
class TpTimedEngine final : public TransferEngine {
 public:
  // `cuda_device` >= 0: a GPU engine on that device (load times from CUDA events).
  // `cpu`: measure the thread's CPU time of each copy too (two clock reads a copy, which the
  // group's wrapper around rank 0's own copies does without: its cost counts as decisions).
  static Result<std::unique_ptr<TpTimedEngine>> Create(std::unique_ptr<TransferEngine> inner,
                                                       const KvRegion& device, int cuda_device,
                                                       CudaStream load_stream, bool cpu = true);
  TransferBackend backend() const override { return inner_->backend(); }
  Status Synchronize(CudaStream stream) override { return inner_->Synchronize(stream); }
  double seconds() const { return seconds_; }
  double cpu_seconds() const { return cpu_seconds_; }
  double load_seconds() const { return load_seconds_; }
  int64_t load_bytes() const { return load_bytes_; }
  int64_t loads() const { return loads_; }
  // The median of the loads' bytes per second, each copy's own; 0 without loads.
  double median_load_bytes_per_s() const;
  // Starts the load counters afresh (the warm-up's loads are not measured).
  void ResetLoads();

 protected:
  Status DoTransfer(const TransferRequest& request, const TransferOptions& given) override;

 private:
  TpTimedEngine(std::unique_ptr<TransferEngine> inner, const KvRegion& device,
                CudaStream load_stream)
      : inner_(std::move(inner)), device_(device), load_stream_(load_stream) {}
  std::unique_ptr<TransferEngine> inner_;
  KvRegion device_;
  CudaStream load_stream_;
  bool events_ = false;
  bool cpu_ = true;
  CudaEventHandle start_, stop_;
  double seconds_ = 0, cpu_seconds_ = 0, load_seconds_ = 0;
  int64_t load_bytes_ = 0, loads_ = 0;
  std::vector<double> per_load_;  // bytes per second of each load
};

}  // namespace kvtier::tools
