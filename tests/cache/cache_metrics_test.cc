// Tests of the cache's Prometheus text (cache/cache_metrics): every CacheStats field lands in the
// metric operators look for, under SGLang's names, and a real cache's counters move with its
// operations.
#include "cache/cache_metrics.h"

#include <gtest/gtest.h>

#include <map>
#include <numeric>
#include <sstream>
#include <string>
#include <vector>

#include "kvtier/hierarchical_cache.h"

namespace kvtier {
namespace {

// "name{labels}" -> value text, for every sample line; also checks the lines are well formed.
std::map<std::string, std::string> Samples(const std::string& text) {
  std::map<std::string, std::string> samples;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    EXPECT_FALSE(line.empty());
    if (line.starts_with("# HELP ") || line.starts_with("# TYPE ")) continue;
    EXPECT_NE(line[0], '#') << line;
    const size_t space = line.rfind(' ');
    EXPECT_NE(space, std::string::npos) << line;
    const std::string series = line.substr(0, space);
    EXPECT_TRUE(samples.emplace(series, line.substr(space + 1)).second) << "twice: " << series;
  }
  return samples;
}

TEST(CacheMetricsText, EveryStatLandsInItsMetric) {
  CacheStats s;
  s.page_size = 16;
  s.device_total_tokens = 1000;
  s.host_used_tokens = 300;
  s.host_total_tokens = 2000;
  s.device_hit_tokens = 11;
  s.host_hit_tokens = 12;
  s.storage_hit_tokens = 13;
  s.prefetched_tokens = 14;
  s.storage_backup_tokens = 15;
  s.load_back_tokens = 16;
  s.device_evicted_tokens = 17;
  s.host_evicted_tokens = 18;
  s.storage_forgotten_tokens = 19;
  s.storage_errors = 21;
  s.storage_corrupt_pages = 22;
  s.storage_read_timeouts = 23;
  s.storage_write_timeouts = 25;
  s.storage_queue_drops = 24;
  s.storage_backup_failed_tokens = 31;
  s.storage_backup_present_tokens = 32;
  s.storage_backup_dropped_tokens = 33;
  s.storage_backup_capacity_tokens = 34;
  s.storage_backup_policy_tokens = 35;
  s.storage_stranded_removed_pages = 36;
  s.storage_stores_held = 37;
  s.prefetch_bytes = 4'000'000'000;
  s.prefetch_seconds = 2.0;
  s.storage_backup_bytes = 1'000'000'000;
  s.storage_backup_seconds = 0.5;
  s.eviction_seconds = 0.125;
  s.eviction_duration.Observe(0.00003);
  s.eviction_duration.Observe(0.125);
  s.prefetch_bandwidth.Observe(2.0);
  s.prefetch_bandwidth.Observe(0.05);
  s.storage_backup_bandwidth.Observe(200.0);
  s.load_back_duration.Observe(0.0002);
  s.load_back_duration.Observe(0.003);
  s.load_back_duration.Observe(100);
  const std::string text = CacheMetricsText(s);
  ASSERT_FALSE(text.starts_with("# kvtier: metrics failed")) << text;
  const auto m = Samples(text);
  const std::map<std::string, std::string> expected = {
      {"kvtier:page_size", "16"},
      {"kvtier:device_total_tokens", "1000"},
      {"kvtier:hicache_host_used_tokens", "300"},
      {"kvtier:hicache_host_total_tokens", "2000"},
      {"kvtier:cached_tokens_total{cache_source=\"device\"}", "11"},
      {"kvtier:cached_tokens_total{cache_source=\"host\"}", "12"},
      {"kvtier:cached_tokens_total{cache_source=\"storage\"}", "13"},
      {"kvtier:prefetched_tokens_total", "14"},
      {"kvtier:backuped_tokens_total", "15"},
      {"kvtier:load_back_tokens_total", "16"},
      {"kvtier:evicted_tokens_total{tier=\"device\"}", "17"},
      {"kvtier:evicted_tokens_total{tier=\"host\"}", "18"},
      {"kvtier:evicted_tokens_total{tier=\"storage\"}", "19"},
      {"kvtier:storage_errors_total", "21"},
      {"kvtier:storage_corrupt_pages_total", "22"},
      {"kvtier:storage_timeouts_total{op=\"read\"}", "23"},
      {"kvtier:storage_timeouts_total{op=\"write\"}", "25"},
      {"kvtier:storage_queue_drops_total", "24"},
      {"kvtier:storage_backup_skipped_tokens_total{reason=\"failed\"}", "31"},
      {"kvtier:storage_backup_skipped_tokens_total{reason=\"already_stored\"}", "32"},
      {"kvtier:storage_backup_skipped_tokens_total{reason=\"queue_full\"}", "33"},
      {"kvtier:storage_backup_skipped_tokens_total{reason=\"capacity\"}", "34"},
      {"kvtier:storage_backup_skipped_tokens_total{reason=\"policy\"}", "35"},
      {"kvtier:storage_stranded_removed_pages_total", "36"},
      {"kvtier:storage_stores_held_total", "37"},
      {"kvtier:prefetch_bandwidth_bucket{le=\"0.1\"}", "1"},
      {"kvtier:prefetch_bandwidth_bucket{le=\"1\"}", "1"},
      {"kvtier:prefetch_bandwidth_bucket{le=\"5\"}", "2"},
      {"kvtier:prefetch_bandwidth_bucket{le=\"+Inf\"}", "2"},
      {"kvtier:prefetch_bandwidth_count", "2"},
      {"kvtier:prefetch_bandwidth_sum", "2.05"},
      {"kvtier:backup_bandwidth_bucket{le=\"100\"}", "0"},
      {"kvtier:backup_bandwidth_bucket{le=\"+Inf\"}", "1"},
      {"kvtier:backup_bandwidth_sum", "200"},
      {"kvtier:eviction_duration_seconds_bucket{le=\"2e-05\"}", "0"},
      {"kvtier:eviction_duration_seconds_bucket{le=\"5e-05\"}", "1"},
      {"kvtier:eviction_duration_seconds_bucket{le=\"0.1\"}", "1"},
      {"kvtier:eviction_duration_seconds_bucket{le=\"0.2\"}", "2"},
      {"kvtier:eviction_duration_seconds_count", "2"},
      {"kvtier:eviction_duration_seconds_sum", "0.12503"},
      {"kvtier:load_back_duration_seconds_bucket{le=\"0.0001\"}", "0"},
      {"kvtier:load_back_duration_seconds_bucket{le=\"0.0005\"}", "1"},
      {"kvtier:load_back_duration_seconds_bucket{le=\"0.005\"}", "2"},
      {"kvtier:load_back_duration_seconds_bucket{le=\"5\"}", "2"},
      {"kvtier:load_back_duration_seconds_bucket{le=\"+Inf\"}", "3"},
      {"kvtier:load_back_duration_seconds_count", "3"},
      {"kvtier:load_back_duration_seconds_sum", "100.0032"},
  };
  for (const auto& [series, value] : expected) {
    auto it = m.find(series);
    ASSERT_NE(it, m.end()) << series << " missing from\n" << text;
    EXPECT_EQ(it->second, value) << series;
  }
  // The SGLang names every dashboard of HiCache uses carry their TYPE lines.
  for (const char* type_line :
       {"# TYPE kvtier:cached_tokens_total counter", "# TYPE kvtier:hicache_host_used_tokens gauge",
        "# TYPE kvtier:load_back_duration_seconds histogram",
        "# TYPE kvtier:eviction_duration_seconds histogram",
        "# TYPE kvtier:prefetch_bandwidth histogram", "# TYPE kvtier:backup_bandwidth histogram",
        "# TYPE kvtier:evicted_tokens_total counter",
        "# TYPE kvtier:prefetched_tokens_total counter"}) {
    EXPECT_NE(text.find(std::string(type_line) + "\n"), std::string::npos) << type_line;
  }
}

TEST(CacheMetricsText, ANegativeCounterIsReportedNotWritten) {
  CacheStats s;
  s.match_calls = -1;  // a bug in the counting; the text says so instead of lying
  const std::string text = CacheMetricsText(s);
  EXPECT_TRUE(text.starts_with("# kvtier: metrics failed: counter 'kvtier:match_total'")) << text;
}

// A cache over a host-memory "device" pool (cpu backend): Metrics() follows its operations.
TEST(HierarchicalCacheMetrics, CountersMoveWithOperations) {
  constexpr int64_t kPage = 4, kSlots = 64;
  std::vector<std::byte> k(static_cast<size_t>(2 * kSlots * 8)), v(k.size());
  KvRegion region;
  region.geometry = {KvLayout::kLayerFirst, 2, kSlots, 8, kPage, 1};
  region.k = k.data();
  region.v = v.data();
  HierarchicalCacheConfig config;
  config.write_policy = WritePolicy::kWriteThrough;
  config.backup_threads = 0;
  auto cache = HierarchicalCache::Create(config, region);
  ASSERT_TRUE(cache.ok()) << cache.status().ToString();
  HierarchicalCache& c = **cache;

  auto before = Samples(c.Metrics());
  EXPECT_EQ(before["kvtier:cached_tokens_total{cache_source=\"device\"}"], "0");
  EXPECT_EQ(before["kvtier:hicache_host_used_tokens"], "0");
  EXPECT_EQ(before["kvtier:hicache_host_total_tokens"], std::to_string(2 * kSlots));

  std::vector<Token> tokens(16);
  std::iota(tokens.begin(), tokens.end(), 100);
  auto slots = c.AllocateDeviceSlots(16);
  ASSERT_TRUE(slots.ok());
  ASSERT_TRUE(c.Insert(tokens, *slots).ok());
  ASSERT_TRUE(c.WaitForBackups().ok());
  auto m = c.Match(tokens);
  ASSERT_TRUE(m.ok());
  ASSERT_TRUE(c.Release(m->handle).ok());
  ASSERT_EQ(*c.EvictDevice(kSlots), 16);
  m = c.Match(tokens);
  ASSERT_TRUE(m.ok());
  ASSERT_EQ(m->host_tokens, 16);
  ASSERT_TRUE(c.LoadBack(m->handle).ok());
  ASSERT_TRUE(c.Release(m->handle).ok());

  auto after = Samples(c.Metrics());
  EXPECT_EQ(after["kvtier:cached_tokens_total{cache_source=\"device\"}"], "16");
  EXPECT_EQ(after["kvtier:cached_tokens_total{cache_source=\"host\"}"], "16");
  EXPECT_EQ(after["kvtier:match_total"], "2");
  EXPECT_EQ(after["kvtier:host_backup_tokens_total"], "16");
  EXPECT_EQ(after["kvtier:hicache_host_used_tokens"], "16");
  EXPECT_EQ(after["kvtier:load_back_tokens_total"], "16");
  EXPECT_EQ(after["kvtier:load_back_duration_seconds_count"], "1");
  EXPECT_EQ(after["kvtier:load_back_duration_seconds_bucket{le=\"+Inf\"}"], "1");
  EXPECT_EQ(after["kvtier:evicted_tokens_total{tier=\"device\"}"], "16");
  EXPECT_EQ(after["kvtier:eviction_duration_seconds_count"], "1");  // the one EvictDevice
  EXPECT_EQ(after["kvtier:eviction_duration_seconds_bucket{le=\"+Inf\"}"], "1");
}

}  // namespace
}  // namespace kvtier
