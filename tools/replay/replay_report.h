// tools/replay/replay_report.h — what `kvtier replay` measured, and how it is shown: the table on
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
  // Waiting for the storage read at service: FinishPrefetch's wall time before the device work
  // (added to the TTFT), or with `streamed` the wall time the streamed LoadBack spent waiting on
  // the read (overlapping the load, inside device_ms: not added again).
  double prefetch_wait_ms = 0;
  bool streamed = false;
  // Wall time from the request's Prefetch call to its service (0: no prefetch ran).
  double prefetch_lead_ms = 0;
  double load_ms = 0;     // the load alone, as measured (GPU, streamed: with its wait on the read)
  double compute_ms = 0;  // the prefill's compute alone
  double device_ms = 0;   // load and compute overlapped (what the device spent)
  int64_t input_tokens = 0;
  int64_t output_tokens = 0;  // the workload's output_length (what a closed loop's decode holds)
  int64_t device_hit = 0, host_hit = 0, storage_hit = 0;  // tokens of the matched prefix
  int64_t loaded_bytes = 0;                               // host -> device for this request
  // The storage oracle's hit of this request and the hit it lost against it (replay_oracle.h;
  // 0 without a storage tier).
  int64_t oracle_storage_hit = 0, lost_storage_hit = 0;
  int64_t hit_tokens() const { return device_hit + host_hit + storage_hit; }
};

struct Percentiles {
  double p50 = 0, p90 = 0, p99 = 0, mean = 0;
};
Percentiles PercentilesOf(std::vector<double> values);

// A ratio of two quantiles over the same requests, with its spread: a paired bootstrap over the
// requests (kBootstrapResamples resamples with replacement, a fixed seed, so a report is
// reproducible); [lo, hi] holds the middle 95 % of the resampled ratios. It shows how much the
// ratio depends on which requests the slice happens to hold (the 60-request runs gave 1.05x and
// 1.77x); it does not see run-to-run timing noise, which the slow-class margin covers.
struct Interval {
  double value = 0, lo = 0, hi = 0;
  int64_t requests = 0;
};
inline constexpr int kBootstrapResamples = 1000;
// quantile(num[I]) / quantile(den[I]) over resamples I of the indices; num and den are per
// request (same length). A zero denominator gives 0.
Interval QuantileRatio(const std::vector<double>& num, const std::vector<double>& den, double q);

// What the store holds at the end of a run, by the page chains of the run's requests (replay.cc's
// CheckStoredChains): `stored` of the `keys` distinct page keys are stored, and `unreachable` of
// those follow a page of their prompt that is not (a chain cut by eviction: bytes no lookup
// reaches). Not checked when an Exists failed (`why_unchecked`).
struct StoredChains {
  bool checked = false;
  std::string why_unchecked;
  int64_t keys = 0, stored = 0, unreachable = 0;
};

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
  StoredChains stored_chains;  // with has_storage
  // The storage oracle (replay_oracle.h), with has_storage: the same capacity in pages (-1:
  // unbounded), every write the run's admission admitted done at once. Its storage hits, and the
  // hits this run lost against it (tokens, and the requests that lost any); and the storage hits
  // of admit-all (every write admitted and done at once, the same capacity: not a bound).
  bool has_oracle = false;
  int64_t oracle_capacity_pages = -1, oracle_storage_tokens = 0, lost_storage_tokens = 0,
          lost_storage_requests = 0, admit_all_storage_tokens = 0;
  // --kv-events (the hierarchy run): the publisher's counts once every batch was sent, and the
  // cache's blocks per tier when they were counted (what a subscriber rebuilds from the events).
  bool has_kv_events = false;
  KvEventPublisherStats kv_events;
  std::string kv_events_endpoint, kv_events_replay_endpoint;
  std::string kv_events_storage_medium;  // empty without a storage tier
  TierBlockHashes kv_blocks;
  // --pin-system-prompt (the hierarchy run): the shared prefix, the tokens the pin covered at the
  // end, and whether the store kept its pages too.
  bool has_pin = false;
  std::string pin_tiers;
  double pin_ttl_s = 0;
  int64_t pin_prompt_tokens = 0, pin_covered_tokens = 0;
  bool pin_store_pinned = false;
  int64_t bytes_checked = 0, wrong_bytes = 0;
  std::string first_wrong;
  int64_t load_failures = 0;  // LoadBack could not make room: the host part was recomputed
  int64_t prefetch_none = 0, prefetch_complete = 0, prefetch_partial = 0, prefetch_timed_out = 0;
  // Storage hits whose pages LoadBack streamed to the device as they arrived (stream_load_back
  // with a wait_complete or timeout prefetch); the other prefetches ended before their load.
  int64_t streamed_loads = 0;
  // With a storage tier: how a storage hit's load runs, "streamed" (LoadBack ends a wait_complete
  // or timeout prefetch, copying its pages as they arrive) or "after_read" (FinishPrefetch, then
  // LoadBack: best_effort, or --no-stream-load-back).
  std::string storage_load_path;
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

// A request's hit class in the hierarchy: the tier that served most of its matched prefix (ties go
// to the slower tier: storage, then host), or none when nothing matched.
enum class HitClass : uint8_t { kNone = 0, kDevice = 1, kHost = 2, kStorage = 3 };
const char* HitClassName(HitClass c);
HitClass HitClassOf(const RequestRecord& r);

// One hit class: its requests' TTFT in the hierarchy against the same requests with no cache.
struct ClassComparison {
  HitClass hit_class = HitClass::kNone;
  int64_t requests = 0;
  double no_cache_p50_ms = 0, hierarchy_p50_ms = 0;
  Interval ratio;  // hierarchy p50 / no-cache p50, with its bootstrap interval
  // Slower than no cache beyond noise: ratio.lo > 1 + margin and the p50s at least
  // kTimeNoiseFloorMs apart.
  bool slower = false;
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
  // Closed loops: ms a decoded output token holds its request's client (0: none), and its source.
  double decode_ms_per_token = 0;
  std::string decode_how;
  int64_t page_size = 0;
  int64_t kv_bytes_per_token = 0;
  // The ideal's rates, measured at start: host hits move at `ceiling_bytes_per_s` (host -> device:
  // one pinned copy on a GPU, memcpy on cpu), storage hits at `storage_ceiling_bytes_per_s` (0:
  // no storage tier); each with how it was measured.
  double ceiling_bytes_per_s = 0;
  std::string ceiling_how;
  double storage_ceiling_bytes_per_s = 0;
  std::string storage_ceiling_how;
  // file://: the same reads from the disk (replay_ceiling.h), shown beside the ceiling and never
  // charged (0: not measured; the how says why, or is empty for other stores).
  double storage_cold_bytes_per_s = 0;
  std::string storage_cold_how;
  // Loads are timed with CUDA events to completion (GPU), or are synchronous copies timed by the
  // wall clock (cpu).
  bool gpu = false;
  // A hit class fails the run when its ratio's interval lies above 1 + this (timing noise the
  // bootstrap over requests does not see); with slow_class_warn it is only reported.
  double slow_class_margin = 0.05;
  bool slow_class_warn = false;
  bool exact_mode = false;
  std::vector<RunSummary> runs;
  std::vector<SweepPoint> sweep;

  const RunSummary* Find(const std::string& name) const;
  // Wrong bytes over every run.
  int64_t wrong_bytes() const;
  // Per hit class (none, device, host, storage; classes with requests only), the hierarchy
  // against no cache; empty without both runs.
  std::vector<ClassComparison> CompareHitClasses() const;
};

// The headline ratios over the measured requests (hierarchy run): hierarchy / ideal at p50 and
// p90, and no cache / hierarchy at p50 over the requests with >= 90 % of the prompt cached.
struct Headline {
  Interval over_ideal_p50, over_ideal_p90;
  Interval mostly_cached_speedup;  // requests = 0: none (or no no-cache run)
  // The same over service time (TTFT less queueing, each run's own): with requests in flight the
  // TTFT of a cached request is mostly its wait behind others; this is the cache's own effect.
  Interval mostly_cached_service_speedup;
  int64_t requests = 0;
};
Headline HeadlineOf(const ReplayReport& report);
// Requests whose ideal TTFT is above their measured one by more than 5 % and 1 ms (beyond timer
// noise): the ideal is meant to be a lower bound per request, so this should be 0.
int64_t IdealAboveMeasured(const RunSummary& run);
// The fewest measured requests the headline ratios are meant to come from.
inline constexpr int64_t kHeadlineMinRequests = 300;
// The absolute part of every pass/fail on times (with a ratio): two TTFTs closer than this are
// the same (timer and scheduling noise; a near-zero compute's 0.02 ms against 0.01 ms is not "2x
// slower"). The ideal's lower-bound count (> 5 % and this much above) and the slow-class verdict
// (interval above 1 + margin and p50s this far apart) both use it.
inline constexpr double kTimeNoiseFloorMs = 1.0;

// The arithmetic the text report (replay_report_text.cc) and the JSON share.
// `bytes` over `seconds` in GB/s; 0 without time.
double Gbps(int64_t bytes, double seconds);
// The requests whose matched prefix is >= 90 % of the prompt (the headline's subset).
std::vector<size_t> MostlyCached(const RunSummary& run);
// Requests that loaded bytes back, their bytes and their load time (ms).
struct LoadTotals {
  int64_t requests = 0, bytes = 0;
  double ms = 0;
};
LoadTotals LoadTotalsOf(const RunSummary& run);
// The TTFT (ms) of the requests `subset` of `run`.
std::vector<double> TtftOf(const RunSummary& run, const std::vector<size_t>& subset);
// Their service time (ms): TTFT less queueing.
std::vector<double> ServiceOf(const RunSummary& run, const std::vector<size_t>& subset);

// The table a person reads.
void PrintReport(std::FILE* out, const ReplayReport& report);
// --json: the same numbers. Keys: requests, input_tokens, hit_rate, hit_rate_by_tier {device,
// host, storage}, ttft_ms {<run>: {p50, p90, p99}}, integrity {bytes_checked, wrong_bytes},
// ceilings {host_to_device_gbps, host_to_device_how, storage_read_gbps, storage_read_how},
// load_timing, headline {requests, hierarchy_over_ideal_p50/_p90, mostly_cached_speedup_p50,
// mostly_cached_service_speedup_p50: {value, lo, hi, requests}, ideal_above_measured}, hit_classes
// {classes: [{class, requests, no_cache_p50_ms, hierarchy_p50_ms, ratio_p50, slower}], margin,
// on_slower, any_slower}, mostly_cached, then runs (details per run), sweep, timeline (per request,
// for the plots).
Status WriteReplayJson(const std::string& path, const ReplayReport& report);
// --plot: runs the plotting script over the JSON file. Unavailable (with the reason) when
// python3 or matplotlib is missing.
Status WriteReplayPlot(const std::string& png_path, const std::string& json_path);
// Checks that `path` can be created (its directory exists and is writable) before a long run, and
// is a regular file (or none yet) on a filesystem with free space (not a device such as /dev/full).
Status CheckOutputPath(const std::string& path, const char* flag);

// The plotting script's text (replay_plot.py, embedded at build time).
extern const char* const kReplayPlotScript;

}  // namespace kvtier::tools
