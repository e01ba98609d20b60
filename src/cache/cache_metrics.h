// Internal: the Prometheus text of a HierarchicalCache (HierarchicalCache::Metrics()).
//
// Names are SGLang HiCache's where SGLang has the metric, prefixed "kvtier:" instead of
// "sglang:": cached_tokens_total{cache_source}, hicache_host_used_tokens,
// hicache_host_total_tokens, prefetched_tokens_total, backuped_tokens_total (host -> storage, as
// in SGLang), load_back_tokens_total, load_back_duration_seconds, evicted_tokens_total{tier}.
// The rest (device gauges, device -> host backups, prefetch outcomes, storage faults, bytes and
// seconds behind the bandwidths) use the same prefix and Prometheus' naming rules. Every counter
// comes from a monotonic CacheStats counter; gauges from CacheStats gauges.
//
// Thread safety: a pure function of its argument.
#pragma once

#include <string>

#include "kvtier/hierarchical_cache.h"

namespace kvtier {

// The exposition text of `stats`. Never fails: a writer error (a bug) becomes a comment line
// naming it, which Prometheus parsers skip.
std::string CacheMetricsText(const CacheStats& stats);

}  // namespace kvtier
