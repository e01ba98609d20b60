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

// One counter or gauge family labelled by `label`: a sample per (label value, value).
void WriteByLabel(PrometheusTextWriter& w, std::string_view name, MetricType type,
                  std::string_view help, std::string_view label,
                  std::initializer_list<std::pair<std::string_view, int64_t>> samples) {
  w.BeginFamily(name, type, help);
  for (const auto& [value, n] : samples) w.AddSample({{label, value}}, n);
}

// One histogram family with a single unlabelled histogram.
template <typename Bounds>
void WriteHistogram(PrometheusTextWriter& w, std::string_view name, std::string_view help,
                    const Histogram<Bounds>& h) {
  w.BeginFamily(name, MetricType::kHistogram, help);
  w.AddHistogram({}, SnapshotOf(h));
}

// The three families of one kind of storage transfer: `<prefix>_bytes_total`,
// `<prefix>_seconds_total` (rate(bytes) / rate(seconds) is the bandwidth over a window) and
// `<prefix>_bandwidth`, the GB/s of each transfer.
struct TransferFamilies {
  std::string_view prefix;
  std::string_view bytes_help;
  std::string_view seconds_help;
  std::string_view bandwidth_help;
};

void WriteTransfers(PrometheusTextWriter& w, const TransferFamilies& f, int64_t bytes,
                    double seconds, const BandwidthHistogram& bandwidth) {
  w.Counter(fmt::format("{}_bytes_total", f.prefix), f.bytes_help, bytes);
  w.Counter(fmt::format("{}_seconds_total", f.prefix), f.seconds_help, seconds);
  WriteHistogram(w, fmt::format("{}_bandwidth", f.prefix), f.bandwidth_help, bandwidth);
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
  WriteByLabel(w, "kvtier:pinned_tokens", MetricType::kGauge,
               "Tokens covered by live pins (Pin), by the tier they are pinned in.", "tier",
               {{"device", s.pinned_device_tokens},
                {"host", s.pinned_host_tokens},
                {"storage", s.pinned_storage_tokens}});
  w.Gauge("kvtier:live_pins", "Pins not yet ended (Unpin or their TTL).", s.live_pins);
  WriteByLabel(w, "kvtier:inflight_tokens", MetricType::kGauge,
               "Tokens of copies running, by direction.", "direction",
               {{"device_to_host", s.backup_inflight_tokens},
                {"host_to_storage", s.storage_backup_inflight_tokens},
                {"storage_to_host", s.prefetch_inflight_tokens}});
  w.Gauge("kvtier:storage_backlog_bytes",
          "Bytes of writes to storage waiting in the write backlog for the store's queue.",
          s.storage_backlog_bytes);
}

void WriteMatchAndLoadBack(PrometheusTextWriter& w, const CacheStats& s) {
  w.Counter("kvtier:match_total", "Match calls.", s.match_calls);
  w.Counter("kvtier:match_query_tokens_total", "Tokens given to Match.", s.match_query_tokens);
  WriteByLabel(w, "kvtier:cached_tokens_total", MetricType::kCounter,
               "Matched tokens, by the tier that held them.", "cache_source",
               {{"device", s.device_hit_tokens},
                {"host", s.host_hit_tokens},
                {"storage", s.storage_hit_tokens}});
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
  WriteHistogram(w, "kvtier:load_back_duration_seconds",
                 "LoadBack copies to completion (GPU: device time between CUDA events).",
                 s.load_back_duration);
}

void WritePrefetch(PrometheusTextWriter& w, const CacheStats& s) {
  w.Counter("kvtier:prefetch_total", "Prefetch calls.", s.prefetch_calls);
  w.Counter("kvtier:prefetch_requested_tokens_total", "Storage tokens prefetches asked for.",
            s.prefetch_requested_tokens);
  w.Counter("kvtier:prefetched_tokens_total",
            "Tokens prefetched from storage that became host hits.", s.prefetched_tokens);
  WriteByLabel(w, "kvtier:prefetch_skipped_tokens_total", MetricType::kCounter,
               "Storage tokens not prefetched, by reason.", "reason",
               {{"below_threshold", s.prefetch_below_threshold_tokens},
                {"no_host_room", s.prefetch_no_room_tokens}});
  WriteByLabel(w, "kvtier:prefetch_finished_total", MetricType::kCounter,
               "Prefetches that ended, by how they ended.", "result",
               {{"complete", s.prefetch_complete},
                {"partial", s.prefetch_partial},
                {"timed_out", s.prefetch_timed_out},
                {"cancelled", s.prefetch_cancelled}});
  WriteTransfers(w,
                 {"kvtier:prefetch", "Bytes prefetched from storage.",
                  "Seconds from start to end of each prefetch, summed (rate(bytes) / "
                  "rate(seconds) is the bandwidth over a window).",
                  "GB/s of each prefetch that brought pages (bytes that became host hits over "
                  "its start-to-end time)."},
                 s.prefetch_bytes, s.prefetch_seconds, s.prefetch_bandwidth);
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
  WriteByLabel(w, "kvtier:storage_backup_skipped_tokens_total", MetricType::kCounter,
               "Tokens not written to storage, by reason.", "reason",
               {{"failed", s.storage_backup_failed_tokens},
                {"already_stored", s.storage_backup_present_tokens},
                {"timed_out", s.storage_backup_timed_out_tokens},
                {"admission", s.storage_backup_refused_tokens},
                {"backlog_full", s.storage_backup_backlog_tokens},
                {"queue_full", s.storage_backup_dropped_tokens},
                {"capacity", s.storage_backup_capacity_tokens},
                {"policy", s.storage_backup_policy_tokens}});
  w.Counter("kvtier:storage_stranded_removed_pages_total",
            "Pages a store wrote past one of its pages that failed (no lookup reaches them), "
            "removed from storage again.",
            s.storage_stranded_removed_pages);
  w.Counter("kvtier:storage_stores_held_total",
            "Stores held back until a removal of one of their pages from storage completed.",
            s.storage_stores_held);
  WriteTransfers(w,
                 {"kvtier:backup", "Bytes written from host memory to storage.",
                  "Seconds of host -> storage writes, summed (rate(bytes) / rate(seconds) is "
                  "the bandwidth over a window).",
                  "GB/s of each host -> storage backup that wrote pages (bytes written over its "
                  "queue-to-completion time)."},
                 s.storage_backup_bytes, s.storage_backup_seconds, s.storage_backup_bandwidth);
}

void WriteEvictionAndFaults(PrometheusTextWriter& w, const CacheStats& s) {
  WriteByLabel(w, "kvtier:evicted_tokens_total", MetricType::kCounter,
               "Tokens that left a tier (storage: storage-only pages the tree forgot).", "tier",
               {{"device", s.device_evicted_tokens},
                {"host", s.host_evicted_tokens},
                {"storage", s.storage_forgotten_tokens}});
  w.Counter("kvtier:storage_evicted_by_store_tokens_total",
            "Stored tokens the store evicted by itself (its capacity or free-space floor), "
            "published as removed (with KV events on).",
            s.storage_evicted_by_store_tokens);
  WriteByLabel(w, "kvtier:evictions_total", MetricType::kCounter, "Runs of pages evicted, by tier.",
               "tier", {{"device", s.device_evictions}, {"host", s.host_evictions}});
  w.Counter("kvtier:dropped_tokens_total",
            "Tokens evicted from the device with no copy in host memory.", s.dropped_tokens);
  WriteHistogram(w, "kvtier:eviction_duration_seconds",
                 "Seconds of each eviction that evicted pages (choosing and evicting; any tier).",
                 s.eviction_duration);

  w.Counter("kvtier:storage_errors_total",
            "Storage calls that failed or were rejected, and pages that failed.", s.storage_errors);
  w.Counter("kvtier:storage_corrupt_pages_total",
            "Pages read from storage that were corrupt or of another namespace (misses).",
            s.storage_corrupt_pages);
  WriteByLabel(w, "kvtier:storage_timeouts_total", MetricType::kCounter,
               "Storage time-outs, by operation: read (pages read, lookups, and prefetches ended "
               "by their deadline) or write (pages written).",
               "op", {{"read", s.storage_read_timeouts}, {"write", s.storage_write_timeouts}});
  w.Counter("kvtier:storage_queue_drops_total",
            "Storage calls rejected by the backend's full queue, and backups skipped.",
            s.storage_queue_drops);
  w.Counter("kvtier:pins_total", "Pins made.", s.pins);
  w.Counter("kvtier:pins_refused_total", "Pins refused by a tier's pin budget.", s.pins_refused);
  w.Counter("kvtier:pins_expired_total", "Pins ended by their TTL.", s.pins_expired);
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
