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
#include <utility>
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
// loop (request i arrives when request i - N is done) or sequential (N = 1). The device serves one
// prefill at a time, in arrival order.
//
// A closed loop's request is done at its first token, or, with `decode_ms_per_token` > 0, once
// the rest of its output (the workload's output_length - 1 tokens) is decoded at that many ms a
// token, as an engine that puts prefills first does it: a prefill pauses every decode while it
// runs, and a prefill that arrives while decodes run waits for the step in progress (steps run
// back to back from the end of the last prefill).
class Timeline {
 public:
  Timeline(const Workload& w, const ReplayOptions& o, double decode_ms_per_token = 0);
  // An open loop with these arrivals (another run's, replayed).
  explicit Timeline(std::vector<double> arrivals_ms)
      : closed_(0),
        decode_ms_(0),
        open_(std::move(arrivals_ms)),
        start_(open_.size(), 0),
        end_(open_.size(), 0) {}
  // True once request i's arrival time is known (closed loop: request i - N has finished; with
  // decode, every request before i has been served, as their prefills pause its decode).
  bool Known(int64_t i, int64_t served) const;
  double Arrival(int64_t i) const;
  // When the device can start request i. REQUIRES: requests before i served.
  double StartOf(int64_t i) const;
  // Serves request i for `service_ms`; returns its end.
  double Serve(int64_t i, double service_ms);

 private:
  // When request k's output is decoded (its first token with no decode). REQUIRES: every request
  // whose prefill may pause it, up to the last one served, served.
  double DoneAt(int64_t k) const;

  int64_t closed_;  // 0: open loop
  double decode_ms_;
  std::vector<double> open_;
  std::vector<int64_t> decode_steps_;  // per request: output tokens after the first
  std::vector<double> start_;
  std::vector<double> end_;
  int64_t served_ = 0;  // requests [0, served_) served
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
  // --decode-ms-per-token resolved (0: none), and where it came from.
  double decode_ms_per_token = 0;
  std::string decode_how;
};

// Serves the workload (after its warm-up requests) through a cache of `kind` with a host tier of
// `host_tokens` (hierarchy runs), every loaded byte checked; the run's summary, named `name`.
Result<RunSummary> RunOne(ReplaySetup& setup, RunKind kind, int64_t host_tokens, std::string name);

}  // namespace kvtier::tools
