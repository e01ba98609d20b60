// TierEvictor on a CacheParts rig: page-granular device and host eviction, write_back's backup
// before eviction and its store (as admission decides) before host eviction, pins, the storage-only
// bound, device allocation's refusals.
#include "cache/tier_evictor.h"

#include <gtest/gtest.h>

#include <limits>
#include <vector>

#include "cache/cache_parts_rig.h"

namespace kvtier {
namespace {

using testing::PartsRig;
using testing::Seq;

constexpr int64_t kPage = 4;

HierarchicalCacheConfig Config(WritePolicy policy) {
  HierarchicalCacheConfig cfg;
  cfg.write_policy = policy;
  cfg.backup_threads = 0;  // copies run inline, in CacheWork
  return cfg;
}

// Backs up the path ending at `node` to host memory and waits for the copy.
void BackUp(PartsRig& rig, RadixNode* node) {
  {
    CacheWork work(&rig.p().executor);
    CacheLock lk(rig.p());
    ASSERT_TRUE(rig.p().planner.Backup(node, &work, /*write_back=*/false));
  }
  rig.Settle();
}

TEST(TierEvictorTest, DeviceEvictionWithoutAHostTierDropsTheDeepestPagesFirst) {
  auto rig = PartsRig::Make(Config(WritePolicy::kWriteThrough), kPage, 8, 0);
  const auto tokens = Seq(4 * kPage, 100);
  rig->InsertOnDevice(tokens);
  CacheWork work(&rig->p().executor);
  CacheLock lk(rig->p());
  const int64_t free_before = rig->p().ledger->free_pages();
  EXPECT_EQ(rig->p().evictor.EvictDevice(1, &work), 1);
  EXPECT_EQ(rig->p().ledger->free_pages(), free_before + 1);
  // The first three pages are still matched on the device: eviction split the node.
  EXPECT_EQ(rig->p().tree.Peek("", tokens).device_tokens, 3 * kPage);
  EXPECT_EQ(rig->p().counters.dropped_tokens, kPage);
  EXPECT_EQ(rig->p().counters.device_evictions, 1);
  EXPECT_EQ(rig->p().evictor.EvictDevice(100, &work), 3);  // all that is left
  EXPECT_EQ(rig->p().tree.num_nodes(), 0);
  EXPECT_TRUE(CheckCacheConsistency(rig->p()).ok());
}

TEST(TierEvictorTest, DeviceEvictionKeepsBackedUpPagesInHostMemory) {
  auto rig = PartsRig::Make(Config(WritePolicy::kWriteThrough), kPage, 8, 8);
  const auto tokens = Seq(3 * kPage, 7);
  RadixNode* node = rig->InsertOnDevice(tokens);
  BackUp(*rig, node);
  {
    CacheWork work(&rig->p().executor);
    CacheLock lk(rig->p());
    EXPECT_EQ(rig->p().evictor.EvictDevice(3, &work), 3);
    const RadixTree::MatchResult m = rig->p().tree.Peek("", tokens);
    EXPECT_EQ(m.device_tokens, 0);
    EXPECT_EQ(m.host_tokens, 3 * kPage);
    EXPECT_EQ(rig->p().counters.dropped_tokens, 0);
  }
  rig->ExpectConsistent();
}

TEST(TierEvictorTest, WriteBackBacksAVictimUpBeforeEvictingIt) {
  auto rig = PartsRig::Make(Config(WritePolicy::kWriteBack), kPage, 8, 8);
  const auto tokens = Seq(2 * kPage, 1);
  rig->InsertOnDevice(tokens);
  {
    CacheWork work(&rig->p().executor);
    CacheLock lk(rig->p());
    // The victim is copied first: nothing is freed now, the node is busy until the copy lands.
    EXPECT_EQ(rig->p().evictor.EvictDevice(2, &work), 0);
    EXPECT_EQ(work.copies.size(), 1u);
    EXPECT_EQ(rig->p().counters.dropped_tokens, 0);
  }
  rig->Settle();
  {
    CacheWork work(&rig->p().executor);
    CacheLock lk(rig->p());
    EXPECT_EQ(rig->p().counters.write_back_tokens, 2 * kPage);
    EXPECT_EQ(rig->p().evictor.EvictDevice(2, &work), 2);
    EXPECT_EQ(rig->p().tree.Peek("", tokens).host_tokens, 2 * kPage);
    EXPECT_EQ(rig->p().counters.dropped_tokens, 0);
  }
  rig->ExpectConsistent();
}

// write_back with a storage tier (the rule in docs/architecture.md): host eviction offers a
// victim to storage first, and the admission policy decides, as under the other write policies.
// An admitted victim is stored and then evicted, staying known in storage; a refused one is
// dropped with the eviction, counted as refused, and never written (admission saw its whole
// life in the cache by then: there is no later use that could admit it).
TEST(TierEvictorTest, WriteBackHostEvictionStoresAnAdmittedVictimAndDropsARefusedOne) {
  HierarchicalCacheConfig cfg = Config(WritePolicy::kWriteBack);
  cfg.storage.backend = testing::RigMemoryStore(kPage);
  cfg.storage.admission.policy = StorageAdmission::kHits;
  cfg.storage.admission.threshold = 2;
  auto rig = PartsRig::Make(cfg, kPage, 8, 8);
  const auto read_twice = Seq(2 * kPage, 1000);
  const auto read_once = Seq(2 * kPage, 2000);
  RadixNode* a = rig->InsertOnDevice(read_twice);
  RadixNode* b = rig->InsertOnDevice(read_once);
  BackUp(*rig, a);
  BackUp(*rig, b);
  {
    CacheWork work(&rig->p().executor);
    CacheLock lk(rig->p());
    rig->p().tree.Touch(a, 2 - a->hit_count());
    ASSERT_EQ(a->hit_count(), 2);
    ASSERT_EQ(b->hit_count(), 1);
    EXPECT_EQ(rig->p().evictor.EvictDevice(4, &work), 4);  // both host-only now
    // a's store starts (a busy until it lands); b is refused and goes.
    EXPECT_EQ(rig->p().evictor.EvictHost(4, &work), 2);
    EXPECT_EQ(rig->p().tree.Peek("", read_once).matched_tokens, 0);
  }
  rig->Settle();
  {
    CacheWork work(&rig->p().executor);
    CacheLock lk(rig->p());
    EXPECT_EQ(rig->p().evictor.EvictHost(4, &work), 2);  // a, stored now
    const RadixTree::MatchResult m = rig->p().tree.Peek("", read_twice);
    EXPECT_EQ(m.host_tokens, 0);
    EXPECT_EQ(m.storage_tokens, 2 * kPage);
    EXPECT_EQ(rig->p().counters.storage_backup_tokens, 2 * kPage);
    EXPECT_EQ(rig->p().counters.storage_backup_refused_tokens, 2 * kPage);
    EXPECT_EQ(rig->p().counters.host_evicted_tokens, 4 * kPage);
  }
  rig->ExpectConsistent();
}

// A refused path of three nodes evicted a page at a time: each pass offers the unstored path
// ending at its victim again, and admission refuses it again; each page is counted as refused
// once, as it leaves, not once per pass (the whole path was counted at every pass: 1 + 2 + ... + 6
// pages here).
TEST(TierEvictorTest, WriteBackCountsARefusedPageOnceHoweverManyPassesOfferIt) {
  HierarchicalCacheConfig cfg = Config(WritePolicy::kWriteBack);
  cfg.storage.backend = testing::RigMemoryStore(kPage);
  cfg.storage.admission.policy = StorageAdmission::kHits;
  cfg.storage.admission.threshold = 15;  // the most: refuses every page here (hits <= 3)
  auto rig = PartsRig::Make(cfg, kPage, 16, 16);
  const auto tokens = Seq(6 * kPage, 3000);
  rig->InsertOnDevice(std::span<const Token>(tokens).first(2 * kPage));
  rig->InsertOnDevice(std::span<const Token>(tokens).first(4 * kPage));
  RadixNode* leaf = rig->InsertOnDevice(tokens);  // a chain of three nodes of two pages
  BackUp(*rig, leaf);
  {
    CacheWork work(&rig->p().executor);
    CacheLock lk(rig->p());
    EXPECT_EQ(rig->p().evictor.EvictDevice(6, &work), 6);  // host-only now
    for (int pass = 0; pass < 6; ++pass) EXPECT_EQ(rig->p().evictor.EvictHost(1, &work), 1);
    EXPECT_EQ(rig->p().tree.Peek("", tokens).matched_tokens, 0);
    EXPECT_EQ(rig->p().counters.storage_backup_refused_tokens, 6 * kPage);
    EXPECT_EQ(rig->p().counters.host_evicted_tokens, 6 * kPage);
    EXPECT_EQ(rig->p().counters.storage_backup_tokens, 0);
  }
  rig->ExpectConsistent();
}

TEST(TierEvictorTest, PinnedPagesStayAndAllocationSaysWhy) {
  auto rig = PartsRig::Make(Config(WritePolicy::kWriteThrough), kPage, 4, 0);
  RadixNode* node = rig->InsertOnDevice(Seq(3 * kPage, 1));
  CacheWork work(&rig->p().executor);
  CacheLock lk(rig->p());
  rig->p().tree.IncRef(node);
  EXPECT_EQ(rig->p().evictor.DeviceReclaimable(), 1);
  EXPECT_EQ(rig->p().evictor.EvictDevice(3, &work), 0);
  std::vector<std::shared_ptr<CopyOp>> waits;
  auto r = rig->p().evictor.TryAllocateDevice(2, false, DevicePageLedger::kEngine, "the test",
                                              &work, &waits);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kOutOfMemory);
  EXPECT_NE(r.status().message().find("the test"), std::string::npos);
  EXPECT_NE(r.status().message().find("3 pinned by live handles"), std::string::npos)
      << r.status().ToString();
  // allow_fewer takes what there is.
  auto some = rig->p().evictor.TryAllocateDevice(2, true, DevicePageLedger::kEngine, "the test",
                                                 &work, &waits);
  ASSERT_TRUE(some.ok()) << some.status().ToString();
  EXPECT_EQ(some->size(), 1u);
  rig->p().tree.DecRef(node);
  // Unpinned: allocation evicts what it needs.
  auto more = rig->p().evictor.TryAllocateDevice(2, false, DevicePageLedger::kEngine, "the test",
                                                 &work, &waits);
  ASSERT_TRUE(more.ok()) << more.status().ToString();
  EXPECT_EQ(rig->p().tree.Peek("", Seq(3 * kPage, 1)).device_tokens, kPage);
}

TEST(TierEvictorTest, HostEvictionForgetsWhatNoTierHoldsAndEnsureHostPagesMakesRoom) {
  auto rig = PartsRig::Make(Config(WritePolicy::kWriteThrough), kPage, 8, 4);
  const auto a = Seq(2 * kPage, 1000);
  const auto b = Seq(2 * kPage, 2000);
  BackUp(*rig, rig->InsertOnDevice(a));
  BackUp(*rig, rig->InsertOnDevice(b));
  {
    CacheWork work(&rig->p().executor);
    CacheLock lk(rig->p());
    EXPECT_EQ(rig->p().host->free_pages(), 0);
    EXPECT_EQ(rig->p().evictor.EvictDevice(4, &work), 4);      // both now host-only
    rig->p().tree.IncRef(rig->p().tree.Peek("", b).last);      // b is pinned
    EXPECT_FALSE(rig->p().evictor.EnsureHostPages(3, &work));  // only a's 2 pages could go
    EXPECT_EQ(rig->p().host->free_pages(), 0);                 // and nothing went
    EXPECT_TRUE(rig->p().evictor.EnsureHostPages(1, &work));
    EXPECT_EQ(rig->p().host->free_pages(), 1);  // page-granular: a's last page only
    EXPECT_EQ(rig->p().tree.Peek("", a).host_tokens, kPage);
    EXPECT_EQ(rig->p().evictor.EvictHost(10, &work), 1);
    EXPECT_EQ(rig->p().tree.Peek("", a).matched_tokens, 0);  // forgotten: in no tier
    EXPECT_EQ(rig->p().counters.host_evictions, 2);
    rig->p().tree.DecRef(rig->p().tree.Peek("", b).last);
  }
  rig->ExpectConsistent();
}

TEST(TierEvictorTest, TrimStorageKeepsTheStorageOnlyTreeWithinItsBoundAndTellsTheListener) {
  HierarchicalCacheConfig cfg = Config(WritePolicy::kWriteThrough);
  cfg.storage.max_storage_only_pages = 3;
  std::vector<EvictionEvent> events;
  cfg.eviction_listener = [&](const EvictionEvent& e) { events.push_back(e); };
  auto rig = PartsRig::Make(cfg, kPage, 8, 0);
  for (Token base : {Token{100}, Token{200}}) {
    const auto tokens = Seq(2 * kPage, base);
    auto keys = ComputePromptPageKeys(tokens, kPage, "");
    ASSERT_TRUE(keys.ok());
    CacheLock lk(rig->p());
    rig->p().tree.AddStored(nullptr, "", tokens, *keys);
  }
  {
    CacheWork work(&rig->p().executor);
    CacheLock lk(rig->p());
    EXPECT_EQ(rig->p().tree.storage_only_tokens(), 4 * kPage);
    rig->p().evictor.TrimStorage(&work);
    EXPECT_LE(rig->p().tree.storage_only_tokens(), 3 * kPage);
    EXPECT_EQ(rig->p().counters.storage_forgotten_tokens, 2 * kPage);
    EXPECT_TRUE(events.empty());  // the listener runs after the lock
  }
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].tier, CacheTier::kStorage);
  EXPECT_EQ(events[0].num_tokens, 2 * kPage);
}

}  // namespace
}  // namespace kvtier
