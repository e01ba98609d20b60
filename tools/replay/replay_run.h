// tools/replay/replay_run.h — one run of `kvtier replay` (replay.h): the state the runs of one
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
#include "replay_timeline.h"
#include "workload.h"

namespace kvtier::tools {

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
