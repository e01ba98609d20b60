// HierarchicalCache with several engine threads at once (shared and private prefixes, two
// namespaces, async backups on two worker threads, evictions under pressure). Every slot a Match
// or LoadBack returns is checked with the KV pattern while pinned, and the cache's consistency
// check runs while the others keep going. CI runs this binary under thread sanitizer too.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <atomic>
#include <random>
#include <thread>

#include "cache/cache_test_util.h"
#include "kvtier/hierarchical_cache.h"

namespace kvtier {
namespace {

using testing::DeviceTier;

class CacheConcurrencyTest : public ::testing::TestWithParam<WritePolicy> {};

TEST_P(CacheConcurrencyTest, ThreadsShareTheCache) {
  constexpr int64_t P = 4;
  constexpr int kThreads = 4;
  const int64_t iterations = testing::EnvInt("KVTIER_TEST_STEPS", 1500);
  KvGeometry g{KvLayout::kLayerFirst, 2, 64 * P, 16, P, 1};
  auto dev_r = DeviceTier::Create(TransferBackend::kCpu, g, false);
  ASSERT_TRUE(dev_r.ok());
  DeviceTier& dev = **dev_r;
  HierarchicalCacheConfig cfg;
  cfg.write_policy = GetParam();
  cfg.backup_threads = 2;
  cfg.host_ratio = 2.0;
  cfg.transfer.cpu_threads = 1;
  auto cache_r = HierarchicalCache::Create(cfg, dev.region());
  ASSERT_TRUE(cache_r.ok()) << cache_r.status().ToString();
  HierarchicalCache& cache = **cache_r;

  std::vector<std::vector<Token>> families;
  for (int f = 0; f < 6; ++f) {
    std::vector<Token> t;
    for (int i = 0; i < 2 * P; ++i) t.push_back(1000 * (f + 1) + i);
    families.push_back(t);
  }
  std::atomic<int> failures{0};
  std::atomic<int64_t> inserts{0}, loads{0}, ooms{0};
  auto worker = [&](int id) {
    std::mt19937_64 rng(1234 + id);
    for (int64_t it = 0; it < iterations && failures == 0; ++it) {
      const std::string ns = rng() % 4 == 0 ? fmt::format("t{}", id % 2) : "";
      std::vector<Token> t = families[rng() % families.size()];
      const int64_t extra = static_cast<int64_t>(rng() % (3 * P + 2));
      for (int64_t i = 0; i < extra; ++i) t.push_back(static_cast<Token>(rng() % 3));
      const auto h = KvPatternHashes(t, KvPatternSalt(ns));
      const std::span<const uint64_t> hs(h);
      auto m = cache.Match(t, ns);
      if (!m.ok()) {
        ADD_FAILURE() << m.status().ToString();
        ++failures;
        return;
      }
      Status st = dev.Verify(m->device_slots, hs.first(m->device_slots.size()));
      if (st.ok()) {
        st = VerifyKvPattern(cache.host_region(), m->host_slots,
                             hs.subspan(m->device_slots.size(), m->host_slots.size()));
      }
      std::vector<int64_t> prefix = m->device_slots;
      if (st.ok() && m->host_tokens > 0 && rng() % 2 == 0) {
        auto lb = cache.LoadBack(m->handle);
        if (lb.ok()) {
          ++loads;
          prefix = lb->device_slots;
          st = dev.Verify(prefix, hs.first(prefix.size()));
        } else if (!lb.status().IsOutOfMemory()) {
          st = lb.status();
        }
      }
      const int64_t aligned = static_cast<int64_t>(t.size()) / P * P;
      const int64_t have = static_cast<int64_t>(prefix.size());
      if (st.ok() && aligned > have) {
        auto fresh = cache.AllocateDeviceSlots(aligned - have);
        if (fresh.ok()) {
          st = dev.Fill(*fresh, hs.subspan(have, aligned - have));
          prefix.insert(prefix.end(), fresh->begin(), fresh->end());
          if (st.ok()) {
            auto ins = cache.Insert(std::span<const Token>(t).first(aligned), prefix, ns);
            st = ins.status();
            ++inserts;
          }
        } else if (fresh.status().IsOutOfMemory()) {
          ++ooms;
        } else {
          st = fresh.status();
        }
      }
      Status rel = cache.Release(m->handle);
      if (st.ok()) st = rel;
      if (st.ok() && id == 0 && it % 25 == 0) {
        auto e = cache.EvictHost(static_cast<int64_t>(rng() % 32) * P);
        st = e.status();
        if (st.ok()) st = cache.CheckConsistency();
        (void)cache.stats();
      }
      if (st.ok() && id == 1 && it % 40 == 0) st = cache.WaitForBackups();
      if (!st.ok()) {
        ADD_FAILURE() << fmt::format("thread {} iteration {}: {}", id, it, st.ToString());
        ++failures;
        return;
      }
    }
  };
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i) threads.emplace_back(worker, i);
  for (auto& th : threads) th.join();
  ASSERT_EQ(failures.load(), 0);
  ASSERT_TRUE(cache.WaitForBackups().ok());
  ASSERT_TRUE(cache.CheckConsistency().ok()) << cache.CheckConsistency().ToString();
  const CacheStats s = cache.stats();
  EXPECT_EQ(s.live_handles, 0);
  EXPECT_EQ(s.device_engine_tokens, 0);
  EXPECT_GT(inserts.load(), 0);
  EXPECT_GT(s.device_hit_tokens, 0);
  EXPECT_GT(s.device_evicted_tokens, 0);
}

INSTANTIATE_TEST_SUITE_P(WritePolicies, CacheConcurrencyTest,
                         ::testing::Values(WritePolicy::kWriteThrough,
                                           WritePolicy::kWriteThroughSelective,
                                           WritePolicy::kWriteBack),
                         [](const auto& info) { return WritePolicyName(info.param); });

}  // namespace
}  // namespace kvtier
