// HierarchicalCache's KV events (config.kv_event_sink): several engine threads at once (shared and
// private prefixes, two namespaces, async backups, a memory:// storage tier with QueryStorage,
// prefetches and load-backs, forced evictions, a storage-only bound small enough to forget pages).
// At the end the events, applied in the order the sink received them, must give exactly the
// cache's own per-tier block sets (CachedBlocks) — which fails if an event is missing, duplicated
// or delivered out of order. CI runs this binary under thread sanitizer too.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <atomic>
#include <filesystem>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <thread>

#include "cache/cache_test_util.h"
#include "kvtier/hierarchical_cache.h"
#include "kvtier/kv_events.h"
#include "kvtier/storage.h"

namespace kvtier {
namespace {

using testing::DeviceTier;

// The sink: every batch, in arrival order, and whether Publish ever ran without the cache's lock
// (it must run under it, which is what orders the batches).
class RecordingSink : public KvEventSink {
 public:
  void Publish(std::vector<KvEvent> events) override {
    if (cache != nullptr && !cache->MutexHeldByCurrentThread()) ++outside_lock;
    std::lock_guard<std::mutex> lock(mu);
    batches.push_back(std::move(events));
  }
  const HierarchicalCache* cache = nullptr;
  std::atomic<int> outside_lock{0};
  std::mutex mu;
  std::vector<std::vector<KvEvent>> batches;
};

std::map<std::string, std::set<uint64_t>> Rebuild(const RecordingSink& sink, int64_t P) {
  std::map<std::string, std::set<uint64_t>> media;
  for (const auto& batch : sink.batches) {
    for (const KvEvent& event : batch) {
      if (const auto* s = std::get_if<BlockStored>(&event)) {
        EXPECT_EQ(s->block_size, P);
        EXPECT_EQ(s->token_ids.size(), s->block_hashes.size() * static_cast<size_t>(P));
        for (uint64_t h : s->block_hashes) {
          EXPECT_TRUE(media[*s->medium].insert(h).second) << "stored twice in " << *s->medium;
        }
      } else if (const auto* r = std::get_if<BlockRemoved>(&event)) {
        for (uint64_t h : r->block_hashes) {
          EXPECT_EQ(media[*r->medium].erase(h), 1u) << "removed what " << *r->medium << " lacks";
        }
      } else {
        ADD_FAILURE() << "AllBlocksCleared from the cache";
      }
    }
  }
  return media;
}

std::vector<uint64_t> Sorted(const std::set<uint64_t>& s) { return {s.begin(), s.end()}; }

class CacheKvEventsTest : public ::testing::TestWithParam<WritePolicy> {};

TEST_P(CacheKvEventsTest, EventsRebuildEveryTierUnderConcurrency) {
  constexpr int64_t P = 4;
  constexpr int kThreads = 4;
  const int64_t iterations = testing::EnvInt("KVTIER_TEST_STEPS", 600);
  KvGeometry g{KvLayout::kLayerFirst, 2, 64 * P, 16, P, 1};
  auto dev_r = DeviceTier::Create(TransferBackend::kCpu, g, false);
  ASSERT_TRUE(dev_r.ok());
  DeviceTier& dev = **dev_r;
  HierarchicalCacheConfig cfg;
  cfg.write_policy = GetParam();
  cfg.write_through_threshold = 2;
  cfg.backup_threads = 2;
  cfg.host_ratio = 2.0;
  cfg.transfer.cpu_threads = 1;
  cfg.storage.url = "memory://?capacity=64MiB";
  cfg.storage.model_id = "kv-events-test";
  cfg.storage.prefetch_threshold_tokens = 0;
  cfg.storage.max_storage_only_pages = 24;  // small: TrimStorage forgets pages
  // Thread 2 pins and unpins families in random tiers: what pins keep never leaves, and the
  // events must still rebuild every tier.
  cfg.pin_device_budget_tokens = 6 * P;
  cfg.pin_host_budget_tokens = 6 * P;
  cfg.pin_storage_budget_tokens = 6 * P;
  auto sink = std::make_shared<RecordingSink>();
  cfg.kv_event_sink = sink;
  auto cache_r = HierarchicalCache::Create(cfg, dev.region());
  ASSERT_TRUE(cache_r.ok()) << cache_r.status().ToString();
  HierarchicalCache& cache = **cache_r;
  sink->cache = &cache;

  std::vector<std::vector<Token>> families;
  for (int f = 0; f < 6; ++f) {
    std::vector<Token> t;
    for (int i = 0; i < 2 * P; ++i) t.push_back(1000 * (f + 1) + i);
    families.push_back(t);
  }
  std::atomic<int> failures{0};
  std::atomic<int64_t> pins_made{0};
  auto worker = [&](int id) {
    std::mt19937_64 rng(99 + id);
    std::vector<PinHandle> pins;
    for (int64_t it = 0; it < iterations && failures == 0; ++it) {
      if (id == 2 && it % 5 == 0) {
        Status pst;
        if (!pins.empty() && rng() % 2 == 0) {
          pst = cache.Unpin(pins.back());
          pins.pop_back();
        } else {
          std::vector<CacheTier> tiers;
          for (CacheTier tier : {CacheTier::kDevice, CacheTier::kHost, CacheTier::kStorage}) {
            if (rng() % 2 == 0) tiers.push_back(tier);
          }
          if (tiers.empty()) tiers.push_back(CacheTier::kStorage);
          auto pin = cache.Pin(families[rng() % families.size()], tiers);
          if (pin.ok() && pin->pin.id != 0) {
            pins.push_back(pin->pin);
            ++pins_made;
          } else if (!pin.ok() && !pin.status().IsInvalidArgument()) {  // a budget: fine
            pst = pin.status();
          }
        }
        if (!pst.ok()) {
          ADD_FAILURE() << pst.ToString();
          ++failures;
          return;
        }
      }
      const std::string ns = rng() % 4 == 0 ? fmt::format("t{}", id % 2) : "";
      std::vector<Token> t = families[rng() % families.size()];
      const int64_t extra = static_cast<int64_t>(rng() % (4 * P + 2));
      for (int64_t i = 0; i < extra; ++i) t.push_back(static_cast<Token>(rng() % 3));
      const auto h = KvPatternHashes(t, KvPatternSalt(ns));
      const std::span<const uint64_t> hs(h);
      auto m = cache.Match(t, ns);
      if (!m.ok()) {
        ADD_FAILURE() << m.status().ToString();
        ++failures;
        return;
      }
      Status st;
      std::vector<int64_t> prefix = m->device_slots;
      if (rng() % 2 == 0) {
        st = cache.QueryStorage(m->handle).status();
        if (st.ok()) st = cache.Prefetch(m->handle, PrefetchPolicy::kWaitComplete).status();
      }
      if (st.ok() && rng() % 2 == 0) {
        auto lb = cache.LoadBack(m->handle);
        if (lb.ok()) {
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
          if (st.ok())
            st = cache.Insert(std::span<const Token>(t).first(aligned), prefix, ns).status();
        } else if (!fresh.status().IsOutOfMemory()) {
          st = fresh.status();
        }
      }
      Status rel = cache.Release(m->handle);
      if (st.ok()) st = rel;
      if (st.ok() && id == 0 && it % 20 == 0) {
        st = cache.EvictHost(static_cast<int64_t>(rng() % 32) * P).status();
        if (st.ok()) st = cache.EvictDevice(static_cast<int64_t>(rng() % 32) * P).status();
        if (st.ok()) st = cache.CheckConsistency();
      }
      if (st.ok() && id == 1 && it % 30 == 0) st = cache.WaitForBackups();
      if (!st.ok()) {
        ADD_FAILURE() << fmt::format("thread {} iteration {}: {}", id, it, st.ToString());
        ++failures;
        return;
      }
    }
    for (PinHandle pin : pins) EXPECT_TRUE(cache.Unpin(pin).ok());
  };
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i) threads.emplace_back(worker, i);
  for (auto& th : threads) th.join();
  ASSERT_EQ(failures.load(), 0);
  ASSERT_TRUE(cache.WaitForBackups().ok());
  ASSERT_TRUE(cache.CheckConsistency().ok()) << cache.CheckConsistency().ToString();
  auto blocks = cache.CachedBlocks();
  ASSERT_TRUE(blocks.ok()) << blocks.status().ToString();
  EXPECT_EQ(sink->outside_lock.load(), 0);
  const CacheStats s = cache.stats();
  std::map<std::string, std::set<uint64_t>> media;
  {
    std::lock_guard<std::mutex> lock(sink->mu);  // never held while calling the cache
    media = Rebuild(*sink, P);
  }
  EXPECT_EQ(Sorted(media[std::string(kMediumGpu)]), blocks->device);
  EXPECT_EQ(Sorted(media[std::string(kMediumCpuPinned)]), blocks->host);
  EXPECT_EQ(Sorted(media[std::string(kMediumMemory)]), blocks->storage);
  EXPECT_EQ(media.size(), 3u) << "a medium other than GPU, CPU_PINNED and MEMORY";
  // The run exercised every tier both ways.
  EXPECT_GT(s.device_evicted_tokens, 0);
  EXPECT_GT(s.host_evicted_tokens, 0);
  EXPECT_FALSE(blocks->host.empty());
  EXPECT_FALSE(blocks->storage.empty());
  EXPECT_GT(pins_made.load(), 0);
  EXPECT_EQ(s.live_pins, 0);
}

INSTANTIATE_TEST_SUITE_P(WritePolicies, CacheKvEventsTest,
                         ::testing::Values(WritePolicy::kWriteThrough,
                                           WritePolicy::kWriteThroughSelective,
                                           WritePolicy::kWriteBack),
                         [](const auto& info) { return WritePolicyName(info.param); });

// Pages the store evicts by itself (its capacity: memory:// and file://) are published as
// removals (issue 36 item 7.8: a file store's events announced 66 blocks while 11 files were on
// disk): after many prompts through a store of 8 pages, the events' storage medium holds exactly
// what the store holds (each prompt's pages checked with Exists) and what the cache says
// (CachedBlocks).
class StoreEvictionEventsTest : public ::testing::TestWithParam<std::string> {};

TEST_P(StoreEvictionEventsTest, TheEventsOfTheStorageMediumMatchTheStore) {
  constexpr int64_t P = 4;
  KvGeometry g{KvLayout::kLayerFirst, 2, 64 * P, 8, P, 1};
  auto dev_r = DeviceTier::Create(TransferBackend::kCpu, g, false);
  ASSERT_TRUE(dev_r.ok());
  DeviceTier& dev = **dev_r;
  StorageNamespace ns;
  ns.model_id = "store-evictions";
  ns.layout = KvLayout::kPageFirst;
  ns.num_layers = 2;
  ns.slot_bytes = 8;
  ns.page_size = P;
  std::string dir;
  std::string url = GetParam();
  if (url == "file") {
    dir = "/tmp/kvtier_store_evictions_XXXXXX";
    ASSERT_NE(::mkdtemp(dir.data()), nullptr);
    url = fmt::format("file://{}?capacity={}", dir, 8 * (4096 + ns.page_bytes()));
  } else {
    url = fmt::format("memory://?capacity={}", 8 * (kStoredPageHeaderBytes + ns.page_bytes()));
  }
  auto store_r = OpenStorage(url, ns);
  ASSERT_TRUE(store_r.ok()) << store_r.status().ToString();
  std::shared_ptr<StorageBackend> store(std::move(*store_r));
  HierarchicalCacheConfig cfg;
  cfg.write_policy = WritePolicy::kWriteThrough;
  cfg.backup_threads = 1;
  cfg.transfer.cpu_threads = 1;
  cfg.storage.backend = store;
  cfg.storage.prefetch_threshold_tokens = 0;
  auto sink = std::make_shared<RecordingSink>();
  cfg.kv_event_sink = sink;
  auto cache_r = HierarchicalCache::Create(cfg, dev.region());
  ASSERT_TRUE(cache_r.ok()) << cache_r.status().ToString();
  HierarchicalCache& cache = **cache_r;
  sink->cache = &cache;

  std::vector<std::vector<Token>> prompts;
  for (int f = 0; f < 20; ++f) {
    std::vector<Token> t;
    for (int i = 0; i < 3 * P; ++i) t.push_back(1000 * (f + 1) + i);
    prompts.push_back(t);
    auto m = cache.Match(t);
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    auto slots = cache.AllocateDeviceSlots(3 * P - m->device_tokens);
    ASSERT_TRUE(slots.ok()) << slots.status().ToString();
    std::vector<int64_t> all = m->device_slots;
    all.insert(all.end(), slots->begin(), slots->end());
    ASSERT_TRUE(cache.Insert(t, all).ok());
    ASSERT_TRUE(cache.Release(m->handle).ok());
    ASSERT_TRUE(cache.WaitForBackups().ok());
  }
  ASSERT_TRUE(cache.WaitForBackups().ok());
  ASSERT_TRUE(cache.CheckConsistency().ok()) << cache.CheckConsistency().ToString();
  EXPECT_GT(store->Stats().evicted_pages, 0) << "the store never evicted: no test";
  auto blocks = cache.CachedBlocks();
  ASSERT_TRUE(blocks.ok()) << blocks.status().ToString();
  const std::string medium = StorageMediumOf(store->url());
  std::map<std::string, std::set<uint64_t>> media;
  {
    std::lock_guard<std::mutex> lock(sink->mu);
    media = Rebuild(*sink, P);
  }
  EXPECT_EQ(Sorted(media[medium]), blocks->storage);
  // What the store holds, prompt by prompt, is what the events say it holds.
  std::set<uint64_t> held;
  for (const auto& t : prompts) {
    auto keys = ComputePromptPageKeys(t, P, "");
    ASSERT_TRUE(keys.ok());
    const int64_t leading = store->Exists(*keys).get().leading;
    for (int64_t i = 0; i < leading; ++i) held.insert(BlockHashOf((*keys)[size_t(i)]));
  }
  EXPECT_EQ(Sorted(media[medium]), Sorted(held))
      << "announced " << media[medium].size() << " storage blocks, the store holds " << held.size();
  EXPECT_EQ(static_cast<int64_t>(held.size()), store->Stats().stored_pages);
  EXPECT_GT(cache.stats().storage_evicted_by_store_tokens, 0);
  cache_r->reset();
  if (!dir.empty()) {
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }
}

INSTANTIATE_TEST_SUITE_P(Stores, StoreEvictionEventsTest, ::testing::Values("memory", "file"));

// Without a sink the dump still works (pages keyed from their tokens) and equals the keys a
// router computes with page_keys.
TEST(CacheKvEventsTest, CachedBlocksWithoutASinkAreThePageKeysOfTheTokens) {
  constexpr int64_t P = 4;
  KvGeometry g{KvLayout::kLayerFirst, 2, 16 * P, 16, P, 1};
  auto dev_r = DeviceTier::Create(TransferBackend::kCpu, g, false);
  ASSERT_TRUE(dev_r.ok());
  HierarchicalCacheConfig cfg;
  cfg.host_ratio = 0;
  auto cache_r = HierarchicalCache::Create(cfg, (*dev_r)->region());
  ASSERT_TRUE(cache_r.ok()) << cache_r.status().ToString();
  HierarchicalCache& cache = **cache_r;
  std::vector<Token> t;
  for (int i = 0; i < 3 * P; ++i) t.push_back(7 * i);
  auto slots = cache.AllocateDeviceSlots(3 * P);
  ASSERT_TRUE(slots.ok());
  ASSERT_TRUE(cache.Insert(t, *slots, "tenant").ok());
  auto blocks = cache.CachedBlocks();
  ASSERT_TRUE(blocks.ok());
  auto keys = ComputePromptPageKeys(t, P, "tenant");
  ASSERT_TRUE(keys.ok());
  std::vector<uint64_t> expected;
  for (const PageKey& k : *keys) expected.push_back(BlockHashOf(k));
  std::sort(expected.begin(), expected.end());
  EXPECT_EQ(blocks->device, expected);
  EXPECT_TRUE(blocks->host.empty());
  EXPECT_TRUE(blocks->storage.empty());
}

}  // namespace
}  // namespace kvtier
