// The report of `kvtier replay` (see replay_report.h).
#include "replay_report.h"

#include <fmt/format.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "storage_write_profile.h"

namespace kvtier::tools {
namespace {

double Quantile(const std::vector<double>& sorted, double q) {
  if (sorted.empty()) return 0;
  const double pos = q * static_cast<double>(sorted.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(pos));
  const size_t hi = std::min(lo + 1, sorted.size() - 1);
  return sorted[lo] + (sorted[hi] - sorted[lo]) * (pos - static_cast<double>(lo));
}

double QuantileOf(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  return Quantile(v, q);
}

nlohmann::json IntervalJson(const Interval& i) {
  return {{"value", i.value}, {"lo", i.lo}, {"hi", i.hi}, {"requests", i.requests}};
}

}  // namespace

double Gbps(int64_t bytes, double seconds) {
  return seconds > 0 ? static_cast<double>(bytes) / seconds / 1e9 : 0;
}

std::vector<size_t> MostlyCached(const RunSummary& run) {
  std::vector<size_t> out;
  for (size_t i = 0; i < run.records.size(); ++i) {
    const RequestRecord& r = run.records[i];
    if (r.input_tokens > 0 && r.hit_tokens() * 10 >= r.input_tokens * 9) out.push_back(i);
  }
  return out;
}

LoadTotals LoadTotalsOf(const RunSummary& run) {
  LoadTotals t;
  for (const RequestRecord& r : run.records) {
    if (r.loaded_bytes <= 0) continue;
    ++t.requests;
    t.bytes += r.loaded_bytes;
    t.ms += r.load_ms;
  }
  return t;
}

std::vector<double> TtftOf(const RunSummary& run, const std::vector<size_t>& subset) {
  std::vector<double> v;
  for (size_t i : subset) v.push_back(run.records[i].ttft_ms);
  return v;
}

std::vector<double> ServiceOf(const RunSummary& run, const std::vector<size_t>& subset) {
  std::vector<double> v;
  for (size_t i : subset) v.push_back(run.records[i].ttft_ms - run.records[i].queue_ms);
  return v;
}

int64_t IdealAboveMeasured(const RunSummary& run) {
  int64_t n = 0;
  for (size_t i = 0; i < run.ideal_ttft_ms.size() && i < run.records.size(); ++i) {
    if (run.ideal_ttft_ms[i] > run.records[i].ttft_ms * 1.05 + kTimeNoiseFloorMs) ++n;
  }
  return n;
}

Interval QuantileRatio(const std::vector<double>& num, const std::vector<double>& den, double q) {
  Interval out;
  const size_t n = std::min(num.size(), den.size());
  out.requests = static_cast<int64_t>(n);
  if (n == 0) return out;
  auto ratio = [q](const std::vector<double>& a, const std::vector<double>& b) {
    const double d = QuantileOf(b, q);
    return d > 0 ? QuantileOf(a, q) / d : 0.0;
  };
  out.value = ratio(num, den);
  std::mt19937_64 rng(0x6b76746965720001ull);  // fixed: the same report for the same records
  std::uniform_int_distribution<size_t> pick(0, n - 1);
  std::vector<double> ratios, a(n), b(n);
  ratios.reserve(kBootstrapResamples);
  for (int k = 0; k < kBootstrapResamples; ++k) {
    for (size_t i = 0; i < n; ++i) {
      const size_t j = pick(rng);
      a[i] = num[j];
      b[i] = den[j];
    }
    ratios.push_back(ratio(a, b));
  }
  std::sort(ratios.begin(), ratios.end());
  out.lo = Quantile(ratios, 0.025);
  out.hi = Quantile(ratios, 0.975);
  return out;
}

const char* HitClassName(HitClass c) {
  switch (c) {
    case HitClass::kNone:
      return "none";
    case HitClass::kDevice:
      return "device";
    case HitClass::kHost:
      return "host";
    case HitClass::kStorage:
      return "storage";
  }
  return "?";
}

HitClass HitClassOf(const RequestRecord& r) {
  if (r.hit_tokens() == 0) return HitClass::kNone;
  if (r.storage_hit >= r.host_hit && r.storage_hit >= r.device_hit) return HitClass::kStorage;
  if (r.host_hit >= r.device_hit) return HitClass::kHost;
  return HitClass::kDevice;
}

Percentiles PercentilesOf(std::vector<double> values) {
  Percentiles p;
  if (values.empty()) return p;
  std::sort(values.begin(), values.end());
  p.p50 = Quantile(values, 0.50);
  p.p90 = Quantile(values, 0.90);
  p.p99 = Quantile(values, 0.99);
  double sum = 0;
  for (double v : values) sum += v;
  p.mean = sum / static_cast<double>(values.size());
  return p;
}

int64_t RunSummary::input_tokens() const {
  int64_t n = 0;
  for (const RequestRecord& r : records) n += r.input_tokens;
  return n;
}

double RunSummary::HitRate(int64_t begin, int64_t end) const {
  if (end < 0) end = static_cast<int64_t>(records.size());
  int64_t hit = 0, input = 0;
  for (int64_t i = begin; i < end; ++i) {
    hit += records[static_cast<size_t>(i)].hit_tokens();
    input += records[static_cast<size_t>(i)].input_tokens;
  }
  return input > 0 ? static_cast<double>(hit) / static_cast<double>(input) : 0;
}

double RunSummary::TierHitRate(int which) const {
  int64_t hit = 0, input = 0;
  for (const RequestRecord& r : records) {
    hit += which == 0 ? r.device_hit : which == 1 ? r.host_hit : r.storage_hit;
    input += r.input_tokens;
  }
  return input > 0 ? static_cast<double>(hit) / static_cast<double>(input) : 0;
}

Percentiles RunSummary::Ttft() const {
  std::vector<double> v;
  v.reserve(records.size());
  for (const RequestRecord& r : records) v.push_back(r.ttft_ms);
  return PercentilesOf(std::move(v));
}

const RunSummary* ReplayReport::Find(const std::string& name) const {
  for (const RunSummary& r : runs) {
    if (r.name == name) return &r;
  }
  return nullptr;
}

std::vector<ClassComparison> ReplayReport::CompareHitClasses() const {
  std::vector<ClassComparison> out;
  const RunSummary* hier = Find("hierarchy");
  const RunSummary* none = Find("no_cache");
  if (hier == nullptr || none == nullptr || none->records.size() != hier->records.size()) {
    return out;
  }
  for (HitClass c : {HitClass::kNone, HitClass::kDevice, HitClass::kHost, HitClass::kStorage}) {
    std::vector<double> h, n;
    for (size_t i = 0; i < hier->records.size(); ++i) {
      if (HitClassOf(hier->records[i]) != c) continue;
      h.push_back(hier->records[i].ttft_ms);
      n.push_back(none->records[i].ttft_ms);
    }
    if (h.empty()) continue;
    ClassComparison cc;
    cc.hit_class = c;
    cc.requests = static_cast<int64_t>(h.size());
    cc.hierarchy_p50_ms = QuantileOf(h, 0.5);
    cc.no_cache_p50_ms = QuantileOf(n, 0.5);
    cc.ratio = QuantileRatio(h, n, 0.5);
    cc.slower = cc.ratio.lo > 1 + slow_class_margin &&
                cc.hierarchy_p50_ms - cc.no_cache_p50_ms >= kTimeNoiseFloorMs;
    out.push_back(cc);
  }
  return out;
}

Headline HeadlineOf(const ReplayReport& report) {
  Headline out;
  const RunSummary* hier = report.Find("hierarchy");
  if (hier == nullptr) return out;
  out.requests = static_cast<int64_t>(hier->records.size());
  std::vector<double> h;
  for (const RequestRecord& r : hier->records) h.push_back(r.ttft_ms);
  if (hier->ideal_ttft_ms.size() == h.size()) {
    out.over_ideal_p50 = QuantileRatio(h, hier->ideal_ttft_ms, 0.5);
    out.over_ideal_p90 = QuantileRatio(h, hier->ideal_ttft_ms, 0.9);
  }
  if (const RunSummary* none = report.Find("no_cache");
      none != nullptr && none->records.size() == hier->records.size()) {
    const std::vector<size_t> mostly = MostlyCached(*hier);
    if (!mostly.empty()) {
      out.mostly_cached_speedup = QuantileRatio(TtftOf(*none, mostly), TtftOf(*hier, mostly), 0.5);
      out.mostly_cached_service_speedup =
          QuantileRatio(ServiceOf(*none, mostly), ServiceOf(*hier, mostly), 0.5);
    }
  }
  return out;
}

int64_t ReplayReport::wrong_bytes() const {
  int64_t n = 0;
  for (const RunSummary& r : runs) n += r.wrong_bytes;
  for (const SweepPoint& p : sweep) n += p.run.wrong_bytes;
  return n;
}

namespace {

nlohmann::json PercentilesJson(const Percentiles& p) {
  return {{"p50", p.p50}, {"p90", p.p90}, {"p99", p.p99}, {"mean", p.mean}};
}

// The hierarchy run's KV events: what was published, and the blocks of each tier.
void AddKvEventsJson(const RunSummary& r, nlohmann::json* out) {
  nlohmann::json& j = *out;
  const KvEventPublisherStats& e = r.kv_events;
  nlohmann::json blocks = {{std::string(kMediumGpu), r.kv_blocks.device},
                           {std::string(kMediumCpuPinned), r.kv_blocks.host}};
  if (!r.kv_events_storage_medium.empty()) {
    blocks[r.kv_events_storage_medium] = r.kv_blocks.storage;
  }
  // `batches`: the seqs handed out so far (published, dropped or failed to send).
  j["kv_events"] = {{"endpoint", r.kv_events_endpoint},
                    {"replay_endpoint", r.kv_events_replay_endpoint},
                    {"storage_medium", r.kv_events_storage_medium},
                    {"batches", e.published_batches + e.dropped_batches + e.send_errors},
                    {"published_batches", e.published_batches},
                    {"published_events", e.published_events},
                    {"dropped_batches", e.dropped_batches},
                    {"dropped_events", e.dropped_events},
                    {"send_errors", e.send_errors},
                    {"blocks", blocks}};
}

// --pin-system-prompt: the pin and what it covered.
void AddPinJson(const RunSummary& r, nlohmann::json* out) {
  nlohmann::json& j = *out;
  j["pin"] = {{"tiers", r.pin_tiers},
              {"ttl_s", r.pin_ttl_s},
              {"system_prompt_tokens", r.pin_prompt_tokens},
              {"covered_tokens", r.pin_covered_tokens},
              {"store_pinned", r.pin_store_pinned},
              {"pinned_tokens",
               {{"device", r.cache.pinned_device_tokens},
                {"host", r.cache.pinned_host_tokens},
                {"storage", r.cache.pinned_storage_tokens}}},
              {"pins", r.cache.pins},
              {"pins_expired", r.cache.pins_expired}};
}

// The cache's traffic between tiers, its evictions and its storage errors.
void AddCacheJson(const RunSummary& r, int64_t token_bytes, nlohmann::json* out) {
  nlohmann::json& j = *out;
  const CacheStats& c = r.cache;
  j["bytes"] = {{"host_to_device", c.load_back_tokens * token_bytes},
                {"device_to_host", c.backup_bytes},
                {"storage_to_host", c.prefetch_bytes},
                {"host_to_storage", c.storage_backup_bytes}};
  j["gbps"] = {{"host_to_device", Gbps(c.load_back_tokens * token_bytes, c.load_back_seconds)},
               {"device_to_host", Gbps(c.backup_bytes, c.backup_seconds)},
               {"storage_to_host", Gbps(c.prefetch_bytes, c.prefetch_seconds)},
               {"host_to_storage", Gbps(c.storage_backup_bytes, c.storage_backup_seconds)}};
  j["evicted_tokens"] = {{"device", c.device_evicted_tokens},
                         {"host", c.host_evicted_tokens},
                         {"storage_forgotten", c.storage_forgotten_tokens}};
  j["storage_errors"] = {{"errors", c.storage_errors},
                         {"corrupt_pages", c.storage_corrupt_pages},
                         {"read_timeouts", c.storage_read_timeouts},
                         {"write_timeouts", c.storage_write_timeouts},
                         {"queue_drops", c.storage_queue_drops},
                         // Writes the store refused for want of room it may not make
                         // (StorageStats::set_refused_pages: Redis at maxmemory, noeviction).
                         {"refused_writes", r.storage_stats.set_refused_pages}};
}

// The store: its pages reachable from the prompts, its evictions and its I/O.
void AddStorageJson(const RunSummary& r, nlohmann::json* out) {
  nlohmann::json& j = *out;
  const StoredChains& sc = r.stored_chains;
  j["stored_chains"] = {{"checked", sc.checked},
                        {"page_keys", sc.keys},
                        {"stored_pages", sc.stored},
                        {"unreachable_pages", sc.unreachable}};
  if (!sc.checked) j["stored_chains"]["why_unchecked"] = sc.why_unchecked;
  j["storage_evicted_pages"] = r.storage_stats.evicted_pages;
  const StorageStats& st = r.storage_stats;
  j["storage_io"] = {{"get_calls", st.get_calls},
                     {"bytes_read", st.bytes_read},
                     {"get_queue_seconds", st.get_queue_seconds},
                     {"get_held_calls", st.get_held_calls},
                     {"get_held_seconds", st.get_held_seconds},
                     {"get_seconds", st.get_seconds},
                     {"get_page_seconds", st.get_page_seconds},
                     {"get_cached_pages", st.get_cached_pages},
                     {"get_disk_pages", st.get_disk_pages},
                     {"get_profiled_pages", st.get_profiled_pages},
                     {"get_profiled_seconds", st.get_profiled_seconds},
                     {"get_profiled_cpu_seconds", st.get_profiled_cpu_seconds},
                     {"get_profiled_core_wait_seconds", st.get_profiled_core_wait_seconds},
                     {"set_calls", st.set_calls},
                     {"bytes_written", st.bytes_written},
                     {"set_queue_seconds", st.set_queue_seconds},
                     {"set_seconds", st.set_seconds},
                     {"set_page_seconds", st.set_page_seconds},
                     {"set_profiled_pages", st.set_profiled_pages},
                     {"set_phase_seconds", SetPhaseSecondsJson(st)}};
}

// The storage oracle (replay_oracle.h) and the hits lost against it, admit-all's hits, beside the
// writes that did not happen, by reason (tokens).
void AddOracleJson(const RunSummary& r, nlohmann::json* out) {
  nlohmann::json& j = *out;
  const CacheStats& c = r.cache;
  const double input = static_cast<double>(r.input_tokens());
  auto rate = [&](int64_t tokens) { return input > 0 ? static_cast<double>(tokens) / input : 0; };
  int64_t storage_hit = 0;
  for (const RequestRecord& x : r.records) storage_hit += x.storage_hit;
  j["storage_oracle"] = {
      {"capacity_pages", r.oracle_capacity_pages},
      {"storage_hit_rate", rate(storage_hit)},
      {"oracle_storage_hit_rate", rate(r.oracle_storage_tokens)},
      {"storage_hit_pct_of_oracle",
       r.oracle_storage_tokens > 0
           ? 100.0 * static_cast<double>(storage_hit) / static_cast<double>(r.oracle_storage_tokens)
           : 100.0},
      {"storage_tokens", storage_hit},
      {"oracle_storage_tokens", r.oracle_storage_tokens},
      {"oracle_admission", "the run's"},
      {"admit_all_storage_hit_rate", rate(r.admit_all_storage_tokens)},
      {"admit_all_storage_tokens", r.admit_all_storage_tokens},
      {"lost_tokens", r.lost_storage_tokens},
      {"lost_requests", r.lost_storage_requests},
      {"writes_not_done_tokens",
       {{"admission_refused", c.storage_backup_refused_tokens},
        {"backlog_full", c.storage_backup_backlog_tokens},
        {"queue_full", c.storage_backup_dropped_tokens},
        {"timed_out", c.storage_backup_timed_out_tokens},
        {"failed", c.storage_backup_failed_tokens},
        {"store_refused", c.storage_backup_capacity_tokens},
        {"policy", c.storage_backup_policy_tokens}}}};
}

nlohmann::json RunJson(const RunSummary& r, int64_t token_bytes) {
  nlohmann::json j;
  j["name"] = r.name;
  j["device_tokens"] = r.device_tokens;
  j["host_tokens"] = r.host_tokens;
  j["storage"] = r.storage;
  j["hit_rate"] = r.HitRate();
  j["hit_rate_by_tier"] = {
      {"device", r.TierHitRate(0)}, {"host", r.TierHitRate(1)}, {"storage", r.TierHitRate(2)}};
  j["ttft_ms"] = PercentilesJson(r.Ttft());
  if (!r.ideal_ttft_ms.empty())
    j["ideal_ttft_ms"] = PercentilesJson(PercentilesOf(r.ideal_ttft_ms));
  j["integrity"] = {{"bytes_checked", r.bytes_checked}, {"wrong_bytes", r.wrong_bytes}};
  j["wall_s"] = r.wall_s;
  j["load_failures"] = r.load_failures;
  j["prefetch"] = {{"complete", r.prefetch_complete},
                   {"partial", r.prefetch_partial},
                   {"timed_out", r.prefetch_timed_out},
                   {"none", r.prefetch_none},
                   {"streamed", r.streamed_loads}};
  if (!r.storage_load_path.empty()) j["prefetch"]["load_path"] = r.storage_load_path;
  if (r.has_kv_events) AddKvEventsJson(r, &j);
  if (r.has_pin) AddPinJson(r, &j);
  if (r.has_cache && !r.shared_host.empty()) {
    j["shared_host"] = {{"name", r.shared_host},
                        {"hit_tokens", r.cache.shared_host_hit_tokens},
                        {"backup_present_tokens", r.cache.backup_present_tokens}};
  }
  if (r.has_cache) AddCacheJson(r, token_bytes, &j);
  if (r.has_storage) AddStorageJson(r, &j);
  if (r.has_oracle) AddOracleJson(r, &j);
  if (r.fault_index >= 0) {
    j["fault"] = {{"at_s", r.fault_at_s},
                  {"request", r.fault_index},
                  {"hit_rate_before", r.HitRate(0, r.fault_index)},
                  {"hit_rate_after", r.HitRate(r.fault_index)},
                  {"action", r.fault_action}};
  }
  if (r.has_cache) {
    const LoadTotals lt = LoadTotalsOf(r);
    j["load_back"] = {{"requests", lt.requests},
                      {"bytes", lt.bytes},
                      {"ms", lt.ms},
                      {"gbps_end_to_end", Gbps(lt.bytes, lt.ms / 1e3)}};
  }
  double stall = 0;
  for (const RequestRecord& x : r.records) stall += std::max(0.0, x.device_ms - x.compute_ms);
  j["load_stall_ms_total"] = stall;
  return j;
}

// Per-request series for the plots.
nlohmann::json TimelineJson(const RunSummary& r) {
  nlohmann::json t;
  std::vector<double> arrival, ttft, compute, load, wait, queue, lead, device_ms;
  std::vector<int64_t> input, output, device, host, storage, streamed, oracle, lost;
  for (const RequestRecord& x : r.records) {
    arrival.push_back(x.arrival_ms);
    queue.push_back(x.queue_ms);
    lead.push_back(x.prefetch_lead_ms);
    device_ms.push_back(x.device_ms);
    streamed.push_back(x.streamed ? 1 : 0);
    ttft.push_back(x.ttft_ms);
    compute.push_back(x.compute_ms);
    load.push_back(x.load_ms);
    wait.push_back(x.prefetch_wait_ms);
    input.push_back(x.input_tokens);
    output.push_back(x.output_tokens);
    device.push_back(x.device_hit);
    host.push_back(x.host_hit);
    storage.push_back(x.storage_hit);
    oracle.push_back(x.oracle_storage_hit);
    lost.push_back(x.lost_storage_hit);
  }
  t["arrival_ms"] = arrival;
  t["ttft_ms"] = ttft;
  t["compute_ms"] = compute;
  t["load_ms"] = load;
  t["prefetch_wait_ms"] = wait;  // with streamed[i] = 1: inside device_ms (not added to TTFT)
  t["streamed"] = streamed;
  t["prefetch_lead_ms"] = lead;
  t["queue_ms"] = queue;
  t["device_ms"] = device_ms;
  t["input_tokens"] = input;
  t["output_tokens"] = output;
  t["device_hit"] = device;
  t["host_hit"] = host;
  t["storage_hit"] = storage;
  if (r.has_oracle) {
    t["oracle_storage_hit"] = oracle;
    t["lost_storage_hit"] = lost;
  }
  if (!r.ideal_ttft_ms.empty()) t["ideal_ttft_ms"] = r.ideal_ttft_ms;
  return t;
}

}  // namespace

// Each hit class's TTFT against no cache (CompareHitClasses), and the rule that judges them.
nlohmann::json HitClassesJson(const ReplayReport& report) {
  nlohmann::json classes = nlohmann::json::array();
  bool any_slower = false;
  for (const ClassComparison& c : report.CompareHitClasses()) {
    classes.push_back({{"class", HitClassName(c.hit_class)},
                       {"requests", c.requests},
                       {"no_cache_p50_ms", c.no_cache_p50_ms},
                       {"hierarchy_p50_ms", c.hierarchy_p50_ms},
                       {"ratio_p50", IntervalJson(c.ratio)},
                       {"slower", c.slower}});
    any_slower = any_slower || c.slower;
  }
  return {{"classes", classes},
          {"definition",
           "the tier that served most of the matched prefix (ties: the slower tier); "
           "none: nothing matched"},
          {"margin", report.slow_class_margin},
          {"min_difference_ms", kTimeNoiseFloorMs},
          {"on_slower", report.slow_class_warn ? "warn" : "fail"},
          {"any_slower", any_slower}};
}

// The requests whose matched prefix in the hierarchy run is >= 90 % of the prompt: their TTFT and
// service time with no cache, in the hierarchy (and device-only), and the speed-ups.
nlohmann::json MostlyCachedJson(const ReplayReport& report, const RunSummary& hierarchy,
                                const RunSummary& no_cache, const Headline& head) {
  const std::vector<size_t> mostly = MostlyCached(hierarchy);
  const Percentiles a = PercentilesOf(TtftOf(no_cache, mostly));
  const Percentiles b = PercentilesOf(TtftOf(hierarchy, mostly));
  nlohmann::json j = {{"requests", mostly.size()},
                      {"indices", mostly},
                      {"no_cache_ttft_ms", PercentilesJson(a)},
                      {"hierarchy_ttft_ms", PercentilesJson(b)},
                      {"p50_ratio_no_cache_to_hierarchy", b.p50 > 0 ? a.p50 / b.p50 : 0.0},
                      {"speedup_p50", IntervalJson(head.mostly_cached_speedup)}};
  // The same on service time (TTFT less queueing, each run's own): the cache's effect without
  // the wait behind other requests.
  j["no_cache_service_ms"] = PercentilesJson(PercentilesOf(ServiceOf(no_cache, mostly)));
  j["hierarchy_service_ms"] = PercentilesJson(PercentilesOf(ServiceOf(hierarchy, mostly)));
  j["service_speedup_p50"] = IntervalJson(head.mostly_cached_service_speedup);
  if (const RunSummary* dev = report.Find("device_only"); dev != nullptr) {
    j["device_only_ttft_ms"] = PercentilesJson(PercentilesOf(TtftOf(*dev, mostly)));
  }
  return j;
}

Status WriteReplayJson(const std::string& path, const ReplayReport& report) {
  const RunSummary* hier = report.Find("hierarchy");
  if (hier == nullptr) return Status::Internal("no hierarchy run to write");
  nlohmann::json j;
  j["label"] = report.label;
  j["command"] = report.command;
  j["workload"] = report.workload;
  j["model"] = report.model;
  j["engine"] = report.engine;
  j["settings"] = report.settings;
  j["decode"] = {{"ms_per_token", report.decode_ms_per_token}, {"how", report.decode_how}};
  j["exact_mode"] = report.exact_mode;
  j["page_size"] = report.page_size;
  j["kv_bytes_per_token"] = report.kv_bytes_per_token;
  j["load_ceiling_gbps"] = report.ceiling_bytes_per_s / 1e9;
  j["ceilings"] = {{"host_to_device_gbps", report.ceiling_bytes_per_s / 1e9},
                   {"host_to_device_how", report.ceiling_how},
                   {"storage_read_gbps", report.storage_ceiling_bytes_per_s / 1e9},
                   {"storage_read_how", report.storage_ceiling_how},
                   {"storage_cold_read_gbps", report.storage_cold_bytes_per_s / 1e9},
                   {"storage_cold_read_how", report.storage_cold_how}};
  j["load_timing"] = report.gpu ? "cuda_events_to_completion" : "cpu_synchronous_wall_time";
  const Headline head = HeadlineOf(report);
  j["headline"] = {
      {"requests", head.requests},
      {"min_requests", kHeadlineMinRequests},
      {"hierarchy_over_ideal_p50", IntervalJson(head.over_ideal_p50)},
      {"hierarchy_over_ideal_p90", IntervalJson(head.over_ideal_p90)},
      {"mostly_cached_speedup_p50", IntervalJson(head.mostly_cached_speedup)},
      {"mostly_cached_service_speedup_p50", IntervalJson(head.mostly_cached_service_speedup)},
      {"ideal_above_measured", IdealAboveMeasured(*hier)},
      {"spread", fmt::format("paired bootstrap over the measured requests, {} resamples, "
                             "[lo, hi] = 2.5 and 97.5 percentiles",
                             kBootstrapResamples)}};
  j["hit_classes"] = HitClassesJson(report);
  j["requests"] = hier->records.size();
  j["input_tokens"] = hier->input_tokens();
  j["hit_rate"] = hier->HitRate();
  j["hit_rate_by_tier"] = {{"device", hier->TierHitRate(0)},
                           {"host", hier->TierHitRate(1)},
                           {"storage", hier->TierHitRate(2)}};
  nlohmann::json ttft;
  for (const RunSummary& r : report.runs) ttft[r.name] = PercentilesJson(r.Ttft());
  ttft["ideal"] = PercentilesJson(PercentilesOf(hier->ideal_ttft_ms));
  j["ttft_ms"] = ttft;
  int64_t checked = 0, wrong = 0;
  for (const RunSummary& r : report.runs) {
    checked += r.bytes_checked;
    wrong += r.wrong_bytes;
  }
  for (const SweepPoint& p : report.sweep) {
    checked += p.run.bytes_checked;
    wrong += p.run.wrong_bytes;
  }
  j["integrity"] = {{"bytes_checked", checked}, {"wrong_bytes", wrong}};
  if (const RunSummary* none = report.Find("no_cache"); none != nullptr) {
    j["mostly_cached"] = MostlyCachedJson(report, *hier, *none, head);
  }
  nlohmann::json runs = nlohmann::json::array();
  nlohmann::json timeline;
  for (const RunSummary& r : report.runs) {
    runs.push_back(RunJson(r, report.kv_bytes_per_token));
    timeline[r.name] = TimelineJson(r);
  }
  j["runs"] = runs;
  j["timeline"] = timeline;
  nlohmann::json sweep = nlohmann::json::array();
  for (const SweepPoint& p : report.sweep) {
    nlohmann::json s = RunJson(p.run, report.kv_bytes_per_token);
    s["knob"] = p.knob;
    s["value"] = p.value;
    sweep.push_back(std::move(s));
  }
  j["sweep"] = sweep;
  std::ofstream f(path);
  if (!f) return Status::IOError(fmt::format("--json: cannot write {}", path));
  f << j.dump(1) << "\n";
  f.close();  // a full disk shows at the last flush
  if (!f) return Status::IOError(fmt::format("--json: writing {} failed", path));
  return Status::OK();
}

Status CheckOutputPath(const std::string& path, const char* flag) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    return Status::InvalidArgument(fmt::format("{} {}: is a directory", flag, path));
  }
  fs::path dir = fs::path(path).parent_path();
  if (dir.empty()) dir = ".";
  if (!fs::is_directory(dir, ec)) {
    return Status::InvalidArgument(
        fmt::format("{} {}: the directory {} does not exist", flag, path, dir.string()));
  }
  if (access(dir.c_str(), W_OK) != 0 || (fs::exists(path, ec) && access(path.c_str(), W_OK) != 0)) {
    return Status::InvalidArgument(fmt::format("{} {}: not writable", flag, path));
  }
  // Checked now, not found out after the run: a device or a pipe (/dev/full refuses every write)
  // and a full filesystem.
  if (fs::exists(path, ec) && !fs::is_regular_file(path, ec)) {
    return Status::InvalidArgument(
        fmt::format("{} {}: not a regular file (the output is written as a file)", flag, path));
  }
  struct statvfs vfs {};
  if (statvfs(dir.c_str(), &vfs) == 0 && vfs.f_blocks > 0 && vfs.f_bavail == 0) {
    return Status::InvalidArgument(
        fmt::format("{} {}: the filesystem of {} is full", flag, path, dir.string()));
  }
  return Status::OK();
}

Status WriteReplayPlot(const std::string& png_path, const std::string& json_path) {
  // The script goes to a temporary file and runs under Debian's interpreter.
  char script_path[] = "/tmp/kvtier-replay-plot-XXXXXX";
  const int fd = mkstemp(script_path);
  if (fd < 0) return Status::IOError("cannot create a temporary file for the plot script");
  const std::string text = kReplayPlotScript;
  const bool written = write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  close(fd);
  if (!written) {
    unlink(script_path);
    return Status::IOError("cannot write the plot script");
  }
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) {
    unlink(script_path);
    return Status::IOError("fork failed");
  }
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);  // dies with the replay
    if (getppid() != parent) _exit(126);
    // Debian's interpreter (python3-matplotlib belongs to it), else whatever python3 is on PATH.
    execl("/usr/bin/python3", "python3", script_path, json_path.c_str(), png_path.c_str(),
          static_cast<char*>(nullptr));
    execlp("python3", "python3", script_path, json_path.c_str(), png_path.c_str(),
           static_cast<char*>(nullptr));
    _exit(127);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  unlink(script_path);
  if (!WIFEXITED(status)) return Status::IOError("the plot script was killed");
  const int code = WEXITSTATUS(status);
  if (code == 0) return Status::OK();
  if (code == 127) {
    return Status::Unavailable("python3 was not found; install Debian's python3-matplotlib");
  }
  if (code == 3) {
    return Status::Unavailable(
        "python3 has no matplotlib; install Debian's python3-matplotlib (apt-get install "
        "python3-matplotlib)");
  }
  return Status::IOError(fmt::format("the plot script failed (exit code {})", code));
}

}  // namespace kvtier::tools
