// HierarchicalCache::Metrics(): CacheStats as Prometheus text (see cache_metrics.h).
// Thread safety: Metrics() reads stats(), which takes the cache's mutex only for bookkeeping
// (never held across a copy or a storage call); the text is built after it is released.
#include "cache/cache_metrics.h"

#include <fmt/format.h>

#include "util/prometheus_text.h"

namespace kvtier {
namespace {

using util::HistogramSnapshot;
using util::MetricType;
using util::PrometheusTextWriter;

template <typename Bounds>
HistogramSnapshot SnapshotOf(const Histogram<Bounds>& h) {
  HistogramSnapshot s;
  s.upper_bounds.assign(h.kBounds.begin(), h.kBounds.end());
  s.cumulative_counts.reserve(h.counts.size());
  uint64_t running = 0;
  for (int64_t c : h.counts) {
    running += static_cast<uint64_t>(c > 0 ? c : 0);
    s.cumulative_counts.push_back(running);
  }
  s.sum = h.sum;
  return s;
}

void WriteGauges(PrometheusTextWriter& w, const CacheStats& s) {
  w.Gauge("kvtier:page_size", "Tokens per page in every tier.", s.page_size);
  w.Gauge("kvtier:device_total_tokens", "Tokens the device KV pool holds.", s.device_total_tokens);
  w.Gauge("kvtier:device_used_tokens",
          "Device tokens allocated: cached in the tree plus held by the engine.",
          s.device_used_tokens);
  w.Gauge("kvtier:device_cached_tokens", "Device tokens cached in the tree.",
          s.device_cached_tokens);
  w.Gauge("kvtier:device_engine_tokens",
          "Device tokens handed to the engine and not yet inserted or freed.",
          s.device_engine_tokens);
  w.Gauge("kvtier:hicache_host_used_tokens",
          "Host tokens in use: cached plus being filled by prefetches.", s.host_used_tokens);
  w.Gauge("kvtier:hicache_host_total_tokens", "Tokens the host KV pool holds.",
          s.host_total_tokens);
  w.Gauge("kvtier:host_filling_tokens", "Host tokens allocated to prefetches still running.",
          s.host_filling_tokens);
  w.Gauge("kvtier:host_total_bytes", "Bytes of the host KV pool.", s.host_total_bytes);
  w.Gauge("kvtier:storage_known_tokens", "Tokens the tree knows to be in storage.",
          s.storage_known_tokens);
  w.Gauge("kvtier:storage_only_tokens", "Tokens the tree knows in storage and no other tier.",
          s.storage_only_tokens);
  w.Gauge("kvtier:tree_nodes", "Nodes of the radix tree.", s.nodes);
  w.Gauge("kvtier:namespaces", "Namespaces (tenants) holding nodes.", s.namespaces);
  w.Gauge("kvtier:live_handles", "Match handles not yet released.", s.live_handles);
  w.BeginFamily("kvtier:inflight_tokens", MetricType::kGauge,
                "Tokens of copies running, by direction.");
  w.AddSample({{"direction", "device_to_host"}}, s.backup_inflight_tokens);
  w.AddSample({{"direction", "host_to_storage"}}, s.storage_backup_inflight_tokens);
  w.AddSample({{"direction", "storage_to_host"}}, s.prefetch_inflight_tokens);
}

void WriteMatchAndLoadBack(PrometheusTextWriter& w, const CacheStats& s) {
  w.Counter("kvtier:match_total", "Match calls.", s.match_calls);
  w.Counter("kvtier:match_query_tokens_total", "Tokens given to Match.", s.match_query_tokens);
  w.BeginFamily("kvtier:cached_tokens_total", MetricType::kCounter,
                "Matched tokens, by the tier that held them.");
  w.AddSample({{"cache_source", "device"}}, s.device_hit_tokens);
  w.AddSample({{"cache_source", "host"}}, s.host_hit_tokens);
  w.AddSample({{"cache_source", "storage"}}, s.storage_hit_tokens);
  w.Counter("kvtier:query_storage_total", "QueryStorage calls.", s.query_storage_calls);
  w.Counter("kvtier:query_storage_tokens_total",
            "Tokens QueryStorage found in storage beyond what the tree knew.",
            s.query_storage_tokens);

  w.Counter("kvtier:load_back_total", "LoadBack calls.", s.load_back_calls);
  w.Counter("kvtier:load_back_tokens_total", "Tokens loaded from host memory to the device.",
            s.load_back_tokens);
  w.Counter("kvtier:load_back_skipped_tokens_total",
            "Host hits LoadBack left in place (below load_back_min_tokens).",
            s.load_back_skipped_tokens);
  w.BeginFamily("kvtier:load_back_duration_seconds", MetricType::kHistogram,
                "LoadBack copies to completion (GPU: device time between CUDA events).");
  w.AddHistogram({}, SnapshotOf(s.load_back_duration));
}

void WritePrefetch(PrometheusTextWriter& w, const CacheStats& s) {
  w.Counter("kvtier:prefetch_total", "Prefetch calls.", s.prefetch_calls);
  w.Counter("kvtier:prefetch_requested_tokens_total", "Storage tokens prefetches asked for.",
            s.prefetch_requested_tokens);
  w.Counter("kvtier:prefetched_tokens_total",
            "Tokens prefetched from storage that became host hits.", s.prefetched_tokens);
  w.BeginFamily("kvtier:prefetch_skipped_tokens_total", MetricType::kCounter,
                "Storage tokens not prefetched, by reason.");
  w.AddSample({{"reason", "below_threshold"}}, s.prefetch_below_threshold_tokens);
  w.AddSample({{"reason", "no_host_room"}}, s.prefetch_no_room_tokens);
  w.BeginFamily("kvtier:prefetch_finished_total", MetricType::kCounter,
                "Prefetches that ended, by how they ended.");
  w.AddSample({{"result", "complete"}}, s.prefetch_complete);
  w.AddSample({{"result", "partial"}}, s.prefetch_partial);
  w.AddSample({{"result", "timed_out"}}, s.prefetch_timed_out);
  w.AddSample({{"result", "cancelled"}}, s.prefetch_cancelled);
  w.Counter("kvtier:prefetch_bytes_total", "Bytes prefetched from storage.", s.prefetch_bytes);
  w.Counter("kvtier:prefetch_seconds_total",
            "Seconds from start to end of each prefetch, summed (rate(bytes) / rate(seconds) "
            "is the bandwidth over a window).",
            s.prefetch_seconds);
  w.BeginFamily("kvtier:prefetch_bandwidth", MetricType::kHistogram,
                "GB/s of each prefetch that brought pages (bytes that became host hits over its "
                "start-to-end time).");
  w.AddHistogram({}, SnapshotOf(s.prefetch_bandwidth));
}

void WriteInsertAndBackup(PrometheusTextWriter& w, const CacheStats& s) {
  w.Counter("kvtier:inserted_tokens_total", "Tokens Insert added to the device tier.",
            s.inserted_tokens);
  w.Counter("kvtier:duplicate_tokens_total",
            "Engine slots Insert freed because the tree already held their page.",
            s.duplicate_tokens);

  // Device -> host.
  w.Counter("kvtier:host_backup_tokens_total", "Tokens copied from device to host memory.",
            s.backup_tokens);
  w.Counter("kvtier:host_backup_failed_tokens_total", "Tokens whose device -> host copy failed.",
            s.backup_failed_tokens);
  w.Counter("kvtier:host_backup_skipped_tokens_total",
            "Tokens not backed up to host memory for lack of host space.", s.backup_skipped_tokens);
  w.Counter("kvtier:write_back_tokens_total",
            "Tokens copied to host memory when they left the device (write_back).",
            s.write_back_tokens);
  w.Counter("kvtier:host_backup_bytes_total", "Bytes copied from device to host memory.",
            s.backup_bytes);
  w.Counter("kvtier:host_backup_seconds_total",
            "Seconds from submission to completion of device -> host copies, summed.",
            s.backup_seconds);

  // Host -> storage (SGLang's backuped_tokens_total and backup_bandwidth).
  w.Counter("kvtier:backuped_tokens_total", "Tokens written from host memory to storage.",
            s.storage_backup_tokens);
  w.BeginFamily("kvtier:storage_backup_skipped_tokens_total", MetricType::kCounter,
                "Tokens not written to storage, by reason.");
  w.AddSample({{"reason", "failed"}}, s.storage_backup_failed_tokens);
  w.AddSample({{"reason", "already_stored"}}, s.storage_backup_present_tokens);
  w.AddSample({{"reason", "queue_full"}}, s.storage_backup_dropped_tokens);
  w.AddSample({{"reason", "capacity"}}, s.storage_backup_capacity_tokens);
  w.AddSample({{"reason", "policy"}}, s.storage_backup_policy_tokens);
  w.Counter("kvtier:backup_bytes_total", "Bytes written from host memory to storage.",
            s.storage_backup_bytes);
  w.Counter("kvtier:backup_seconds_total",
            "Seconds of host -> storage writes, summed (rate(bytes) / rate(seconds) is the "
            "bandwidth over a window).",
            s.storage_backup_seconds);
  w.BeginFamily("kvtier:backup_bandwidth", MetricType::kHistogram,
                "GB/s of each host -> storage backup that wrote pages (bytes written over its "
                "queue-to-completion time).");
  w.AddHistogram({}, SnapshotOf(s.storage_backup_bandwidth));
}

void WriteEvictionAndFaults(PrometheusTextWriter& w, const CacheStats& s) {
  w.BeginFamily("kvtier:evicted_tokens_total", MetricType::kCounter,
                "Tokens that left a tier (storage: storage-only pages the tree forgot).");
  w.AddSample({{"tier", "device"}}, s.device_evicted_tokens);
  w.AddSample({{"tier", "host"}}, s.host_evicted_tokens);
  w.AddSample({{"tier", "storage"}}, s.storage_forgotten_tokens);
  w.BeginFamily("kvtier:evictions_total", MetricType::kCounter, "Runs of pages evicted, by tier.");
  w.AddSample({{"tier", "device"}}, s.device_evictions);
  w.AddSample({{"tier", "host"}}, s.host_evictions);
  w.Counter("kvtier:dropped_tokens_total",
            "Tokens evicted from the device with no copy in host memory.", s.dropped_tokens);
  w.BeginFamily("kvtier:eviction_duration_seconds", MetricType::kHistogram,
                "Seconds of each eviction that evicted pages (choosing and evicting; any tier).");
  w.AddHistogram({}, SnapshotOf(s.eviction_duration));

  w.Counter("kvtier:storage_errors_total",
            "Storage calls that failed or were rejected, and pages that failed.", s.storage_errors);
  w.Counter("kvtier:storage_corrupt_pages_total",
            "Pages read from storage that were corrupt or of another namespace (misses).",
            s.storage_corrupt_pages);
  w.Counter("kvtier:storage_timeouts_total",
            "Storage pages that timed out, and prefetches ended by their deadline.",
            s.storage_timeouts);
  w.Counter("kvtier:storage_queue_drops_total",
            "Storage calls rejected by the backend's full queue, and backups skipped.",
            s.storage_queue_drops);
}

}  // namespace

std::string CacheMetricsText(const CacheStats& stats) {
  PrometheusTextWriter w;
  WriteGauges(w, stats);
  WriteMatchAndLoadBack(w, stats);
  WritePrefetch(w, stats);
  WriteInsertAndBackup(w, stats);
  WriteEvictionAndFaults(w, stats);
  Result<std::string> text = std::move(w).Finish();
  if (!text.ok()) return fmt::format("# kvtier: metrics failed: {}\n", text.status().message());
  return std::move(*text);
}

std::string HierarchicalCache::Metrics() const { return CacheMetricsText(stats()); }

}  // namespace kvtier
