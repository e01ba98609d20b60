// The report of `kvtier replay --tp N` (see replay_tp_report.h).
#include "replay_tp_report.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>

namespace kvtier::tools {
namespace {

double Mean(const std::vector<double>& v) {
  return v.empty() ? 0.0 : std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size());
}

// Host -> device bytes per second of rank `r` (0 when it loaded nothing).
double LoadBandwidth(const TpPassResult& p, size_t r) {
  return r < p.load_seconds.size() && p.load_seconds[r] > 0
             ? static_cast<double>(p.load_bytes[r]) / p.load_seconds[r]
             : 0.0;
}

nlohmann::json PassJson(const TpPassResult& p) {
  const double tokens = std::max<double>(1, static_cast<double>(p.prompt_tokens));
  const double requests = std::max<double>(1, static_cast<double>(p.requests));
  nlohmann::json load_gbps = nlohmann::json::array();
  for (size_t r = 0; r < p.load_seconds.size(); ++r) load_gbps.push_back(LoadBandwidth(p, r) / 1e9);
  return {{"tp", p.tp},
          {"requests", p.requests},
          {"prompt_tokens", p.prompt_tokens},
          {"device_hit_tokens", p.device_hit},
          {"host_hit_tokens", p.host_hit},
          {"storage_hit_tokens", p.storage_hit},
          {"hit_rate", static_cast<double>(p.device_hit + p.host_hit + p.storage_hit) / tokens},
          {"loaded_tokens", p.loaded},
          {"ttft_ms_p50", TpPercentile(p.ttft_ms, 0.5)},
          {"ttft_ms_p90", TpPercentile(p.ttft_ms, 0.9)},
          {"ttft_ms_mean", Mean(p.ttft_ms)},
          {"bytes_checked_rank0", p.bytes_checked},
          {"wall_s", p.wall_s},
          // The leader's cache: time in its calls less its engine's, per request.
          {"decision_ms_p50", TpPercentile(p.decide_ms, 0.5)},
          {"decision_ms_p90", TpPercentile(p.decide_ms, 0.9)},
          {"decision_ms_mean", Mean(p.decide_ms)},
          {"decision_cpu_ms_p50", TpPercentile(p.decide_cpu_ms, 0.5)},
          {"decision_cpu_ms_p90", TpPercentile(p.decide_cpu_ms, 0.9)},
          {"decision_cpu_ms_mean", Mean(p.decide_cpu_ms)},
          // In its engine: publishing on the ring and waiting for the ranks (TP > 1), own copies.
          {"group_ms_p50", TpPercentile(p.group_ms, 0.5)},
          {"group_ms_mean", Mean(p.group_ms)},
          {"own_copy_ms_p50", TpPercentile(p.copy_ms, 0.5)},
          {"storage_wait_s", p.storage_wait_s},
          {"load_gbps_per_rank", load_gbps},
          {"load_bytes_per_rank", p.load_bytes},
          {"decision_records", p.ring.records},
          {"decision_record_bytes", p.ring.record_bytes},
          {"leader_ack_wait_s", p.ring.ack_wait_seconds},
          {"leader_waits", p.ring.waits},
          {"leader_waits_per_request", static_cast<double>(p.ring.waits) / requests},
          // Calls where every rank waits for every other: the group has none (the leader's waits
          // above are point to point, each for the followers' acknowledgements of one record).
          {"collectives", 0},
          // What can make storage hits differ between passes: none of these should be non-zero.
          {"storage_errors", p.cache.storage_errors},
          {"storage_read_timeouts", p.cache.storage_read_timeouts},
          {"storage_write_timeouts", p.cache.storage_write_timeouts},
          {"storage_queue_drops", p.cache.storage_queue_drops},
          {"storage_backup_failed_tokens", p.cache.storage_backup_failed_tokens},
          {"storage_backup_dropped_tokens", p.cache.storage_backup_dropped_tokens},
          {"backup_failed_tokens", p.cache.backup_failed_tokens},
          {"prefetch_partial", p.cache.prefetch_partial},
          {"prefetch_timed_out", p.cache.prefetch_timed_out}};
}

}  // namespace

double TpPercentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t i = static_cast<size_t>(q * static_cast<double>(v.size() - 1) + 0.5);
  return v[std::min(i, v.size() - 1)];
}

Result<bool> ReportTpPasses(const TpRunInfo& info, const TpPassResult& tp1,
                            const TpPassResult& tpn) {
  const bool equal = tp1.device_hit == tpn.device_hit && tp1.host_hit == tpn.host_hit &&
                     tp1.storage_hit == tpn.storage_hit && tp1.loaded == tpn.loaded;
  const nlohmann::json j1 = PassJson(tp1), jn = PassJson(tpn);
  std::printf(
      "kvtier replay --tp %d: %s, %lld requests (after %lld warm-up), model %s (%s), "
      "%s device pools, io %s, storage %s\n",
      info.tp, info.workload.c_str(), static_cast<long long>(tp1.requests),
      static_cast<long long>(info.warmup), info.model.c_str(), info.mla ? "MLA" : "MHA",
      info.gpu ? "GPU" : "cpu", info.io.c_str(),
      info.storage ? "a file store of per-head objects per pass (page_head)" : "none");
  std::printf("%-34s %14s %14s\n", "", "TP=1", fmt::format("TP={}", info.tp).c_str());
  auto row = [&](const char* name, const char* key, const char* f) {
    std::printf("%-34s %14s %14s\n", name,
                fmt::format(fmt::runtime(f), j1[key].get<double>()).c_str(),
                fmt::format(fmt::runtime(f), jn[key].get<double>()).c_str());
  };
  row("hit rate (device + host + storage)", "hit_rate", "{:.4f}");
  row("device hit tokens", "device_hit_tokens", "{:.0f}");
  row("host hit tokens", "host_hit_tokens", "{:.0f}");
  row("storage hit tokens", "storage_hit_tokens", "{:.0f}");
  row("TTFT p50 ms (slowest rank)", "ttft_ms_p50", "{:.2f}");
  row("TTFT p90 ms (slowest rank)", "ttft_ms_p90", "{:.2f}");
  row("TTFT mean ms (slowest rank)", "ttft_ms_mean", "{:.2f}");
  row("bytes checked (rank 0)", "bytes_checked_rank0", "{:.0f}");
  row("decision records", "decision_records", "{:.0f}");
  row("decision record bytes", "decision_record_bytes", "{:.0f}");
  row("leader wait for ranks (s)", "leader_ack_wait_s", "{:.3f}");
  row("leader waits for ranks per request", "leader_waits_per_request", "{:.2f}");
  row("collectives on the cache path", "collectives", "{:.0f}");
  row("cache decisions ms/request p50", "decision_ms_p50", "{:.4f}");
  row("cache decisions ms/request p90", "decision_ms_p90", "{:.4f}");
  row("cache decisions CPU ms/request p50", "decision_cpu_ms_p50", "{:.4f}");
  row("cache decisions CPU ms/request p90", "decision_cpu_ms_p90", "{:.4f}");
  row("ring + rank waits ms/request p50", "group_ms_p50", "{:.4f}");
  row("rank 0 own copies ms/request p50", "own_copy_ms_p50", "{:.4f}");
  row("storage read wait s (all requests)", "storage_wait_s", "{:.3f}");
  const double bw1 = LoadBandwidth(tp1, 0);
  for (size_t r = 0; r < tpn.load_seconds.size(); ++r) {
    const double bw = LoadBandwidth(tpn, r);
    std::printf(
        "%-34s %14s %14s\n", fmt::format("load GB/s, rank {}", r).c_str(),
        r == 0 ? fmt::format("{:.2f}", bw1 / 1e9).c_str() : "",
        fmt::format("{:.2f}{}", bw / 1e9, bw1 > 0 ? fmt::format(" ({:.0f}%)", 100 * bw / bw1) : "")
            .c_str());
  }
  const double d1 = TpPercentile(tp1.decide_ms, 0.5), dn = TpPercentile(tpn.decide_ms, 0.5);
  const double c1 = TpPercentile(tp1.decide_cpu_ms, 0.5), cn = TpPercentile(tpn.decide_cpu_ms, 0.5);
  std::printf(
      "cache decision overhead on the leader, TP=%d / TP=1 (p50 per request): %.2fx wall, "
      "%.2fx CPU\n",
      info.tp, d1 > 0 ? dn / d1 : 0.0, c1 > 0 ? cn / c1 : 0.0);
  std::printf(
      "wrong bytes: 0 on every rank (each rank checks its heads' KV; a wrong byte stops "
      "the run)\nhit rates TP=%d vs TP=1: %s\n",
      info.tp, equal ? "equal" : "DIFFERENT");
  if (!info.json_path.empty()) {
    std::ofstream out(info.json_path);
    out << nlohmann::json{{"command", info.command_line},
                          {"tp", info.tp},
                          {"model", info.model},
                          {"gpu", info.gpu},
                          {"storage", info.storage},
                          {"hit_rates_equal", equal},
                          {"decision_overhead_ratio_p50", d1 > 0 ? dn / d1 : 0.0},
                          {"decision_cpu_overhead_ratio_p50", c1 > 0 ? cn / c1 : 0.0},
                          {"passes", {j1, jn}}}
               .dump(2)
        << "\n";
    if (!out) return Status::IOError("--json: cannot write " + info.json_path);
  }
  return equal;
}

}  // namespace kvtier::tools
