// tools/kvtier/replay_report.h — what `kvtier replay` measured, and how it is shown: the table on
// stdout, the JSON file (--json), the plots (--plot, through Debian's python3-matplotlib) and the
// progress line.
//
// Thread safety: plain values; the printers are called from the one replay thread.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "kvtier/hierarchical_cache.h"
#include "kvtier/kv_events.h"
#include "kvtier/status.h"
#include "kvtier/storage.h"

namespace kvtier::tools {

// One request as served in one run (times in ms on the run's timeline).
struct RequestRecord {
  double arrival_ms = 0;
  double start_ms = 0;  // the device began serving it
  double ttft_ms = 0;
  double queue_ms = 0;
  double prefetch_wait_ms = 0;
  double load_ms = 0;     // the load alone, as measured
  double compute_ms = 0;  // the prefill's compute alone
  double device_ms = 0;   // load and compute overlapped (what the device spent)
  int64_t input_tokens = 0;
  int64_t device_hit = 0, host_hit = 0, storage_hit = 0;  // tokens of the matched prefix
  int64_t loaded_bytes = 0;                               // host -> device for this request
  int64_t hit_tokens() const { return device_hit + host_hit + storage_hit; }
};

struct Percentiles {
  double p50 = 0, p90 = 0, p99 = 0, mean = 0;
};
Percentiles PercentilesOf(std::vector<double> values);

struct RunSummary {
  std::string name;  // no_cache, device_only, hierarchy
  std::vector<RequestRecord> records;
  int64_t device_tokens = 0, host_tokens = 0;  // capacities (host 0: no host tier)
  std::string storage;                         // URL or "none"
  std::string shared_host;                     // --shared-host NAME, or empty
  bool has_cache = false;
  CacheStats cache;
  bool has_storage = false;
  StorageStats storage_stats;
  // --kv-events (the hierarchy run): the publisher's counts once every batch was sent, and the
  // cache's blocks per tier when they were counted (what a subscriber rebuilds from the events).
  bool has_kv_events = false;
  KvEventPublisherStats kv_events;
  std::string kv_events_endpoint, kv_events_replay_endpoint;
  std::string kv_events_storage_medium;  // empty without a storage tier
  TierBlockHashes kv_blocks;
  int64_t bytes_checked = 0, wrong_bytes = 0;
  std::string first_wrong;
  int64_t load_failures = 0;  // LoadBack could not make room: the host part was recomputed
  int64_t prefetch_none = 0, prefetch_complete = 0, prefetch_partial = 0, prefetch_timed_out = 0;
  int64_t fault_index = -1;  // first request served after the storage went down
  double fault_at_s = 0;
  std::string fault_action;  // what taking the store down did
  double wall_s = 0;
  std::string metrics;                // Prometheus text at the end (with --metrics)
  std::vector<double> ideal_ttft_ms;  // hierarchy: the ideal's TTFT per request

  int64_t input_tokens() const;
  // Hit tokens / input tokens over [begin, end) of the records (all by default).
  double HitRate(int64_t begin = 0, int64_t end = -1) const;
  double TierHitRate(int which) const;  // 0 device, 1 host, 2 storage
  Percentiles Ttft() const;
};

struct SweepPoint {
  std::string knob;  // "host-tokens"
  int64_t value = 0;
  RunSummary run;  // the hierarchy at that value (records kept for the plot)
};

struct ReplayReport {
  std::string label;
  std::string command;
  std::string workload;
  std::string model;
  std::string engine;    // PrefillEngine::Describe()
  std::string settings;  // one line of the knobs
  int64_t page_size = 0;
  int64_t kv_bytes_per_token = 0;
  double ceiling_bytes_per_s = 0;
  bool exact_mode = false;
  std::vector<RunSummary> runs;
  std::vector<SweepPoint> sweep;

  const RunSummary* Find(const std::string& name) const;
  // Wrong bytes over every run.
  int64_t wrong_bytes() const;
};

// The table a person reads.
void PrintReport(std::FILE* out, const ReplayReport& report);
// --json: the same numbers. Keys: requests, input_tokens, hit_rate, hit_rate_by_tier {device,
// host, storage}, ttft_ms {<run>: {p50, p90, p99}}, integrity {bytes_checked, wrong_bytes}, then
// runs (details per run), sweep, timeline (per request, for the plots).
Status WriteReplayJson(const std::string& path, const ReplayReport& report);
// --plot: runs the plotting script over the JSON file. Unavailable (with the reason) when
// python3 or matplotlib is missing.
Status WriteReplayPlot(const std::string& png_path, const std::string& json_path);
// Checks that `path` can be created (its directory exists and is writable) before a long run.
Status CheckOutputPath(const std::string& path, const char* flag);

// The plotting script's text (replay_plot.py, embedded at build time).
extern const char* const kReplayPlotScript;

}  // namespace kvtier::tools
