// The report of `kvtier replay --tp N` (see replay_tp_report.h).
#include "replay_tp_report.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>

#include "kvtier/storage.h"

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

// Mean bytes of one load of rank `r` (0 when it loaded nothing).
double BytesPerLoad(const TpPassResult& p, size_t r) {
  return r < p.loads.size() && p.loads[r] > 0
             ? static_cast<double>(p.load_bytes[r]) / static_cast<double>(p.loads[r])
             : 0.0;
}

nlohmann::json PassJson(const TpPassResult& p) {
  const double tokens = std::max<double>(1, static_cast<double>(p.prompt_tokens));
  const double requests = std::max<double>(1, static_cast<double>(p.requests));
  nlohmann::json load_gbps = nlohmann::json::array();
  nlohmann::json load_mb = nlohmann::json::array();
  for (size_t r = 0; r < p.load_seconds.size(); ++r) {
    load_gbps.push_back(LoadBandwidth(p, r) / 1e9);
    load_mb.push_back(BytesPerLoad(p, r) / 1e6);
  }
  nlohmann::json placement = nlohmann::json::array();
  for (const TpPlacement& pl : p.placement) {
    placement.push_back({{"gpu", pl.gpu},
                         {"pci_bus_id", pl.pci_bus_id},
                         {"gpu_numa_node", pl.gpu_numa_node},
                         {"host_pool_numa_node", pl.host_numa_node},
                         {"cpu_numa_node", pl.cpu_numa_node},
                         {"h2d_ceiling_gbps", pl.ceiling_gbps}});
  }
  nlohmann::json by_call = nlohmann::json::object();
  for (int c = 0; c < kTpCalls; ++c) by_call[kTpCallNames[c]] = p.call_cpu_ms[c] / requests;
  nlohmann::json settings = nlohmann::json::object();
  for (const auto& [name, value] : p.cache_settings) settings[name] = value;
  return {{"tp", p.tp},
          {"cache_config", settings},
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
          {"decision_cpu_ms_mean_by_call", by_call},
          // In its engine: publishing on the ring and waiting for the ranks (TP > 1), own copies.
          {"group_ms_p50", TpPercentile(p.group_ms, 0.5)},
          {"group_ms_mean", Mean(p.group_ms)},
          {"own_copy_ms_p50", TpPercentile(p.copy_ms, 0.5)},
          {"storage_wait_s", p.storage_wait_s},
          {"load_gbps_per_rank", load_gbps},
          {"load_bytes_per_rank", p.load_bytes},
          {"load_seconds_per_rank", p.load_seconds},
          {"loads_per_rank", p.loads},
          {"load_mb_per_copy_per_rank", load_mb},
          {"load_gbps_median_per_rank", p.load_gbps_median},
          {"placement", placement},
          {"decision_records", p.ring.records},
          {"decision_record_bytes", p.ring.record_bytes},
          {"leader_ack_wait_s", p.ring.ack_wait_seconds},
          {"leader_waits", p.ring.waits},
          // Of them: acknowledged before the leader's wait began; slept on the futex (the
          // leader's poll, TpGroupConfig::leader_poll_s, ran out). The rest ended while polling.
          {"leader_waits_ready", p.ring.waits_ready},
          {"leader_waits_slept", p.ring.waits_slept},
          {"leader_waits_per_request", static_cast<double>(p.ring.waits) / requests},
          // Publishes that found a follower asleep and made a futex wake call (the rest found
          // every follower polling or dozing: TpGroupConfig::follower_poll_s, follower_doze_s).
          {"leader_wakes_per_request", static_cast<double>(p.ring.wakes) / requests},
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

// "name value, ..." of the settings that are not the cache's defaults.
std::string NonDefaultSettings(const TpPassResult& p) {
  const std::vector<std::pair<std::string, std::string>> defaults =
      TpCacheSettingsOf(HierarchicalCacheConfig{});
  std::string text;
  for (size_t i = 0; i < p.cache_settings.size() && i < defaults.size(); ++i) {
    if (p.cache_settings[i] == defaults[i]) continue;
    text += fmt::format("{}{} {}", text.empty() ? "" : ", ", p.cache_settings[i].first,
                        p.cache_settings[i].second);
  }
  return text.empty() ? "the defaults" : text;
}

}  // namespace

std::vector<std::pair<std::string, std::string>> TpCacheSettingsOf(
    const HierarchicalCacheConfig& c) {
  std::vector<std::pair<std::string, std::string>> settings;
  for (const ConfigField<HierarchicalCacheConfig>& f : HierarchicalCacheConfigSchema()) {
    // The store's URL is printed and written to JSON: never its credentials.
    std::string value = f.ValueText(c);
    if (f.name == "storage") value = RedactUrl(value);
    settings.emplace_back(f.name, std::move(value));
  }
  return settings;
}

double TpPercentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t i = static_cast<size_t>(q * static_cast<double>(v.size() - 1) + 0.5);
  return v[std::min(i, v.size() - 1)];
}

// The table of the two passes side by side: the run's line, the leader's settings, the hit,
// TTFT, ring and decision rows, and each rank's loads (TP=1: one rank).
void PrintPassTable(const TpRunInfo& info, const TpPassResult& tp1, const TpPassResult& tpn,
                    const nlohmann::json& j1, const nlohmann::json& jn) {
  std::printf(
      "kvtier replay --tp %d: %s, %lld requests (after %lld warm-up), model %s (%s), "
      "%s device pools, io %s, storage %s\n",
      info.tp, info.workload.c_str(), static_cast<long long>(tp1.requests),
      static_cast<long long>(info.warmup), info.model.c_str(), info.mla ? "MLA" : "MHA",
      info.gpu ? "GPU" : "cpu", info.io.c_str(),
      info.storage ? "a file store of per-head objects per pass (page_head)" : "none");
  std::printf("leader cache at TP=%d (beyond the library's defaults): %s\n", info.tp,
              NonDefaultSettings(tpn).c_str());
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
  row("  of them acknowledged already", "leader_waits_ready", "{:.0f}");
  row("  of them slept (poll ran out)", "leader_waits_slept", "{:.0f}");
  row("leader wake calls per request", "leader_wakes_per_request", "{:.2f}");
  row("collectives on the cache path", "collectives", "{:.0f}");
  row("cache decisions ms/request p50", "decision_ms_p50", "{:.4f}");
  row("cache decisions ms/request p90", "decision_ms_p90", "{:.4f}");
  row("cache decisions CPU ms/request p50", "decision_cpu_ms_p50", "{:.4f}");
  row("cache decisions CPU ms/request p90", "decision_cpu_ms_p90", "{:.4f}");
  for (int c = 0; c < kTpCalls; ++c) {
    const char* name = kTpCallNames[c];
    std::printf(
        "%-34s %14s %14s\n", fmt::format("  CPU ms mean, {}", name).c_str(),
        fmt::format("{:.4f}", j1["decision_cpu_ms_mean_by_call"][name].get<double>()).c_str(),
        fmt::format("{:.4f}", jn["decision_cpu_ms_mean_by_call"][name].get<double>()).c_str());
  }
  row("ring + rank waits ms/request p50", "group_ms_p50", "{:.4f}");
  row("rank 0 own copies ms/request p50", "own_copy_ms_p50", "{:.4f}");
  row("storage read wait s (all requests)", "storage_wait_s", "{:.3f}");
  // Each rank's loads of the measured requests (TP=1: one rank).
  auto rank_row = [&](const std::string& name, size_t r, auto format) {
    std::printf("%-34s %14s %14s\n", name.c_str(), r == 0 ? format(tp1, r).c_str() : "",
                format(tpn, r).c_str());
  };
  const double bw1 = LoadBandwidth(tp1, 0);
  for (size_t r = 0; r < tpn.load_seconds.size(); ++r) {
    rank_row(fmt::format("loads (copies), rank {}", r), r,
             [](const TpPassResult& p, size_t i) { return fmt::format("{}", p.loads[i]); });
    rank_row(fmt::format("load GB moved, rank {}", r), r, [](const TpPassResult& p, size_t i) {
      return fmt::format("{:.3f}", static_cast<double>(p.load_bytes[i]) / 1e9);
    });
    rank_row(fmt::format("load MB per copy, rank {}", r), r, [](const TpPassResult& p, size_t i) {
      return fmt::format("{:.2f}", BytesPerLoad(p, i) / 1e6);
    });
    rank_row(fmt::format("load GB/s, rank {}", r), r, [&](const TpPassResult& p, size_t i) {
      const double bw = LoadBandwidth(p, i);
      return p.tp == 1 || bw1 <= 0 ? fmt::format("{:.2f}", bw / 1e9)
                                   : fmt::format("{:.2f} ({:.0f}%)", bw / 1e9, 100 * bw / bw1);
    });
  }
}

// --tp-equal-bytes, MHA: the baseline at equal bytes per copy (TP=1 with one rank's share of the
// heads), printed with each rank's load bandwidth against it; those ratios (empty without it).
nlohmann::json PrintShardBaseline(const TpRunInfo& info, const TpPassResult& tpn,
                                  const TpPassResult* tp1_shard) {
  const double bw1s = tp1_shard != nullptr ? LoadBandwidth(*tp1_shard, 0) : 0;
  nlohmann::json shard_ratios = nlohmann::json::array();
  if (tp1_shard != nullptr) {
    std::printf("%-34s %14s %14s\n", fmt::format("TP=1 at 1/{} of the heads:", info.tp).c_str(), "",
                "");
    std::printf("%-34s %14s\n", "  loads (copies)", fmt::format("{}", tp1_shard->loads[0]).c_str());
    std::printf("%-34s %14s\n", "  load MB per copy",
                fmt::format("{:.2f}", BytesPerLoad(*tp1_shard, 0) / 1e6).c_str());
    std::printf("%-34s %14s\n", "  load GB/s", fmt::format("{:.2f}", bw1s / 1e9).c_str());
    for (size_t r = 0; r < tpn.load_seconds.size(); ++r) {
      const double ratio = bw1s > 0 ? LoadBandwidth(tpn, r) / bw1s : 0.0;
      shard_ratios.push_back(ratio);
      std::printf("%-34s %14s %14s\n", fmt::format("load GB/s, rank {} vs it", r).c_str(), "",
                  fmt::format("{:.0f}%", 100 * ratio).c_str());
    }
  }
  return shard_ratios;
}

// What the own-GPU baselines put in the JSON: each rank's aggregate and median ratio, the passes.
struct OwnGpuJson {
  nlohmann::json ratios = nlohmann::json::array(), median_ratios = nlohmann::json::array();
  nlohmann::json passes = nlohmann::json::array();
};

// --tp-equal-bytes: each rank against TP=1 on its own GPU at its bytes per copy, printed (the
// aggregate, bytes / summed copy time, and the median of the copies' own GB/s).
OwnGpuJson PrintOwnGpuBaselines(const TpRunInfo& info, const TpPassResult& tpn,
                                const std::vector<const TpPassResult*>& own_gpu) {
  OwnGpuJson out;
  if (!own_gpu.empty()) {
    std::printf("per rank, against TP=1 on the rank's own %s at the rank's bytes per copy:\n",
                info.gpu ? "GPU" : "device");
    for (size_t r = 0; r < tpn.load_seconds.size() && r < own_gpu.size(); ++r) {
      const TpPassResult& b = *own_gpu[r];
      const TpPlacement pl = r < tpn.placement.size() ? tpn.placement[r] : TpPlacement{};
      const TpPlacement bp = b.placement.empty() ? TpPlacement{} : b.placement[0];
      auto node = [](int n) { return n < 0 ? std::string("?") : std::to_string(n); };
      std::printf(
          "  rank %zu: %s, host pool node %s (TP=1 pass: %s), cpu node %s, h2d ceiling %.1f "
          "GB/s\n",
          r,
          pl.gpu < 0
              ? "cpu device"
              : fmt::format("GPU {} (PCI {}, NUMA node {})", pl.gpu,
                            pl.pci_bus_id.empty() ? "?" : pl.pci_bus_id, node(pl.gpu_numa_node))
                    .c_str(),
          node(pl.host_numa_node).c_str(), node(bp.host_numa_node).c_str(),
          node(pl.cpu_numa_node).c_str(), pl.ceiling_gbps);
      const double agg = LoadBandwidth(tpn, r), agg1 = LoadBandwidth(b, 0);
      const double med = r < tpn.load_gbps_median.size() ? tpn.load_gbps_median[r] : 0;
      const double med1 = b.load_gbps_median.empty() ? 0 : b.load_gbps_median[0];
      std::printf(
          "    TP=1 on it:  %lld copies of %.2f MB, %.2f GB/s aggregate, %.2f GB/s median per "
          "copy\n",
          static_cast<long long>(b.loads.empty() ? 0 : b.loads[0]), BytesPerLoad(b, 0) / 1e6,
          agg1 / 1e9, med1);
      std::printf(
          "    TP=%d rank %zu: %lld copies of %.2f MB, %.2f GB/s aggregate, %.2f GB/s median per "
          "copy\n",
          info.tp, r, static_cast<long long>(tpn.loads[r]), BytesPerLoad(tpn, r) / 1e6, agg / 1e9,
          med);
      const double ra = agg1 > 0 ? agg / agg1 : 0, rm = med1 > 0 ? med / med1 : 0;
      std::printf("    ratio:       %.1f%% aggregate, %.1f%% median (target: within 5%%)\n",
                  100 * ra, 100 * rm);
      out.ratios.push_back(ra);
      out.median_ratios.push_back(rm);
      nlohmann::json pj = PassJson(b);
      pj["rank"] = r;
      out.passes.push_back(std::move(pj));
    }
  }
  return out;
}

Result<bool> ReportTpPasses(const TpRunInfo& info, const TpPassResult& tp1, const TpPassResult& tpn,
                            const TpPassResult* tp1_shard,
                            const std::vector<const TpPassResult*>& own_gpu) {
  auto same_hits = [](const TpPassResult& a, const TpPassResult& b) {
    return a.device_hit == b.device_hit && a.host_hit == b.host_hit &&
           a.storage_hit == b.storage_hit && a.loaded == b.loaded;
  };
  bool equal = same_hits(tp1, tpn) && (tp1_shard == nullptr || same_hits(tp1, *tp1_shard));
  for (const TpPassResult* b : own_gpu) equal = equal && same_hits(tp1, *b);
  const nlohmann::json j1 = PassJson(tp1), jn = PassJson(tpn);
  PrintPassTable(info, tp1, tpn, j1, jn);
  const nlohmann::json shard_ratios = PrintShardBaseline(info, tpn, tp1_shard);
  const OwnGpuJson own = PrintOwnGpuBaselines(info, tpn, own_gpu);
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
  nlohmann::json ratios = nlohmann::json::array();  // each rank's load bandwidth / TP=1's
  const double bw1 = LoadBandwidth(tp1, 0);
  for (size_t r = 0; r < tpn.load_seconds.size(); ++r) {
    ratios.push_back(bw1 > 0 ? LoadBandwidth(tpn, r) / bw1 : 0.0);
  }
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
                          {"load_gbps_vs_tp1_per_rank", ratios},
                          // --tp-equal-bytes: TP=1 at one rank's share of the heads (else null).
                          {"tp1_shard_pass",
                           tp1_shard != nullptr ? PassJson(*tp1_shard) : nlohmann::json(nullptr)},
                          {"load_gbps_vs_tp1_shard_per_rank", shard_ratios},
                          // --tp-equal-bytes: rank r against TP=1 on rank r's GPU at its bytes
                          // per copy (aggregate, and median of per-copy GB/s); the passes.
                          {"load_gbps_vs_own_gpu_per_rank", own.ratios},
                          {"load_gbps_median_vs_own_gpu_per_rank", own.median_ratios},
                          {"own_gpu_passes", own.passes},
                          {"passes", {j1, jn}}}
               .dump(2)
        << "\n";
    if (!out) return Status::IOError("--json: cannot write " + info.json_path);
  }
  return equal;
}

}  // namespace kvtier::tools
