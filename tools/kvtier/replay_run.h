// tools/kvtier/replay_run.h — one run of `kvtier replay` (replay.h): the state the runs of one
// invocation share, the scheduler's timeline, and RunOne, which serves the workload through one
// cache (none, device-only or the hierarchy) and summarizes it.
//
// Thread safety: a run is driven by one thread; the runs of an invocation are made one after
// another.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kvtier/kv_events.h"
#include "kvtier/status.h"
#include "kvtier/token.h"
#include "kvtier/transfer.h"
#include "replay.h"
#include "replay_ceiling.h"
#include "replay_engine.h"
#include "replay_model.h"
#include "replay_report.h"
#include "workload.h"

namespace kvtier::tools {

// When each request arrives and when the device serves it: open loop (timestamps / speed), closed
// loop (request i arrives when request i - N finished) or sequential (N = 1). The device serves one
// request at a time, in arrival order.
class Timeline {
 public:
  Timeline(const Workload& w, const ReplayOptions& o)
      : n_(static_cast<int64_t>(w.requests.size())),
        closed_(o.sequential ? 1 : o.concurrency),
        end_(static_cast<size_t>(n_), 0) {
    if (closed_ == 0) {
      open_.reserve(static_cast<size_t>(n_));
      const double t0 = n_ > 0 ? w.requests[0].arrival_ms : 0;
      for (const WorkloadRequest& r : w.requests) open_.push_back((r.arrival_ms - t0) / o.speed);
    }
  }
  // True once request i's arrival time is known (closed loop: request i - N has finished).
  bool Known(int64_t i, int64_t served) const {
    return closed_ == 0 || i < closed_ || i - closed_ < served;
  }
  double Arrival(int64_t i) const {
    if (closed_ == 0) return open_[static_cast<size_t>(i)];
    return i < closed_ ? 0 : end_[static_cast<size_t>(i - closed_)];
  }
  // When the device can start request i (all earlier ones served).
  double StartOf(int64_t i) const { return std::max(device_free_, Arrival(i)); }
  // Serves request i for `service_ms`; returns its end.
  double Serve(int64_t i, double service_ms) {
    const double end = StartOf(i) + service_ms;
    end_[static_cast<size_t>(i)] = end;
    device_free_ = end;
    return end;
  }

 private:
  int64_t n_;
  int64_t closed_;  // 0: open loop
  std::vector<double> open_;
  std::vector<double> end_;
  double device_free_ = 0;
};

enum class RunKind { kNoCache, kDeviceOnly, kHierarchy };
inline const char* RunName(RunKind k) {
  switch (k) {
    case RunKind::kNoCache:
      return "no_cache";
    case RunKind::kDeviceOnly:
      return "device_only";
    case RunKind::kHierarchy:
      return "hierarchy";
  }
  return "?";
}

// Everything the runs of one invocation share.
struct ReplaySetup {
  ReplayOptions options;
  Workload workload;  // the measured requests
  Workload warmup;    // --warmup: served first, not measured
  ReplayModel model;
  std::unique_ptr<PrefillEngine> engine;
  TransferBackend io_backend = TransferBackend::kCpu;
  bool gpu = false;
  double fault_at_s = -1;
  int64_t fault_delay_ms = 0;  // --fault storage-delay@MS
  // The storage read ceiling (replay_ceiling.h), measured when the first store opens; 0 when
  // there is no baseline for the store (then `storage_ceiling.how` says why).
  bool storage_ceiling_measured = false;
  StorageCeiling storage_ceiling;
  std::shared_ptr<KvEventPublisher> kv_events;  // --kv-events: the hierarchy run's sink
  std::vector<Token> pin_prompt;                // --pin-system-prompt: the shared prefix
};

// Serves the workload (after its warm-up requests) through a cache of `kind` with a host tier of
// `host_tokens` (hierarchy runs), every loaded byte checked; the run's summary, named `name`.
Result<RunSummary> RunOne(ReplaySetup& setup, RunKind kind, int64_t host_tokens, std::string name);

}  // namespace kvtier::tools
