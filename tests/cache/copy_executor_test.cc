// CopyExecutor on a CacheParts rig: a copy moves the bytes, inline copies are reaped by Run and
// their follow-ups (the store after a backup) run in the same call, a load-back is made, copied
// and published, and the eviction listener runs without the cache's mutex.
#include "cache/copy_executor.h"

#include <gtest/gtest.h>

#include <limits>
#include <thread>
#include <vector>

#include "cache/cache_parts_rig.h"
#include "kvtier/testing/kv_pattern.h"

namespace kvtier {
namespace {

using testing::Hashes;
using testing::PartsRig;
using testing::RigMemoryStore;
using testing::Seq;

constexpr int64_t kPage = 4;

HierarchicalCacheConfig Config(int backup_threads) {
  HierarchicalCacheConfig cfg;
  cfg.write_policy = WritePolicy::kWriteThrough;
  cfg.backup_threads = backup_threads;
  return cfg;
}

TEST(CopyExecutorTest, RunCopyMovesEveryLayerOfTheGivenSlots) {
  auto rig = PartsRig::Make(Config(0), kPage, 8, 8);
  const auto tokens = Seq(2 * kPage, 321);
  RadixNode* node = rig->InsertOnDevice(tokens);
  CopyOp op;
  op.kind = CopyOp::Kind::kBackup;
  {
    CacheLock lk(rig->p());
    rig->p().AppendSlots(node->device_pages(), &op.src);
  }
  // Host slots in reverse page order: the copy follows the index lists, not the positions.
  const std::vector<int64_t> host_pages = {5 * kPage, 2 * kPage};
  rig->p().AppendSlots(host_pages, &op.dst);
  ASSERT_TRUE(rig->p().executor.RunCopy(op, nullptr).ok());
  const Status st = VerifyKvPattern(rig->p().host->region(), op.dst, Hashes(tokens, ""));
  EXPECT_TRUE(st.ok()) << st.ToString();
}

TEST(CopyExecutorTest, InlineCopiesAreReapedByRunAndTheirStoresRunInTheSameCall) {
  HierarchicalCacheConfig cfg = Config(0);
  auto store = RigMemoryStore(kPage);
  cfg.storage.backend = store;
  auto rig = PartsRig::Make(cfg, kPage, 8, 8);
  const auto tokens = Seq(3 * kPage, 9);
  RadixNode* node = rig->InsertOnDevice(tokens);
  std::shared_ptr<CopyOp> backup;
  {
    CacheWork work(&rig->p().executor);
    {
      CacheLock lk(rig->p());
      ASSERT_TRUE(rig->p().planner.Backup(node, &work, false));
      backup = work.copies.at(0);
    }
    rig->p().executor.Run(work);
    EXPECT_TRUE(work.empty());
  }
  EXPECT_TRUE(backup->done.load());
  {
    CacheLock lk(rig->p());
    EXPECT_EQ(node->busy(), 0);                      // reaped in Run
    EXPECT_TRUE(node->storing() || node->stored());  // the store was submitted in Run
  }
  rig->Settle();
  EXPECT_TRUE(node->stored());
  auto keys = ComputePromptPageKeys(tokens, kPage, "");
  ASSERT_TRUE(keys.ok());
  EXPECT_EQ(store->Exists(*keys).get().leading, 3);
}

TEST(CopyExecutorTest, PoolCopiesCompleteOnTheirOwnThreads) {
  auto rig = PartsRig::Make(Config(2), kPage, 16, 16);
  std::vector<RadixNode*> nodes;
  for (Token base : {Token{1000}, Token{2000}, Token{3000}}) {
    nodes.push_back(rig->InsertOnDevice(Seq(2 * kPage, base)));
  }
  {
    CacheWork work(&rig->p().executor);
    CacheLock lk(rig->p());
    for (RadixNode* n : nodes) ASSERT_TRUE(rig->p().planner.Backup(n, &work, false));
  }
  rig->Settle();
  for (Token base : {Token{1000}, Token{2000}, Token{3000}}) {
    const auto tokens = Seq(2 * kPage, base);
    std::vector<int64_t> slots;
    {
      CacheLock lk(rig->p());
      for (RadixNode* n : CacheCore::Path(rig->p().tree.Peek("", tokens).last)) {
        rig->p().AppendSlots(n->host_pages(), &slots);
      }
    }
    const Status st = VerifyKvPattern(rig->p().host->region(), slots, Hashes(tokens, ""));
    EXPECT_TRUE(st.ok()) << st.ToString();
  }
  rig->ExpectConsistent();
}

TEST(CopyExecutorTest, ALoadBackIsCopiedAndPublishedToTheNodesStillOffTheDevice) {
  auto rig = PartsRig::Make(Config(0), kPage, 8, 8);
  const auto tokens = Seq(3 * kPage, 55);
  RadixNode* node = rig->InsertOnDevice(tokens);
  {
    CacheWork work(&rig->p().executor);
    CacheLock lk(rig->p());
    ASSERT_TRUE(rig->p().planner.Backup(node, &work, false));
  }
  rig->Settle();
  std::shared_ptr<CopyOp> op;
  std::vector<int64_t> alloc;
  {
    CacheWork work(&rig->p().executor);
    CacheLock lk(rig->p());
    ASSERT_EQ(rig->p().evictor.EvictDevice(3, &work), 3);
    auto got = rig->p().ledger->Allocate(3, DevicePageLedger::kCopy);
    ASSERT_TRUE(got.ok());
    alloc = *got;
    op = rig->p().executor.MakeLoad({node}, alloc, 3 * kPage, CacheClock::now());
    EXPECT_EQ(node->busy(), 1);
  }
  ASSERT_TRUE(rig->p().executor.RunLoad(*op, nullptr, {}).ok());
  {
    CacheWork work(&rig->p().executor);
    CacheLock lk(rig->p());
    EXPECT_EQ(rig->p().executor.PublishLoad(*op, alloc), 3);
    EXPECT_TRUE(op->free_on_completion.empty());
    rig->p().Reap(&work);
    EXPECT_TRUE(node->on_device());
    EXPECT_EQ(node->busy(), 0);
    EXPECT_TRUE(CheckCacheConsistency(rig->p()).ok());
  }
  const Status st = rig->device->Verify(PageSlots(alloc, kPage), Hashes(tokens, ""));
  EXPECT_TRUE(st.ok()) << st.ToString();
}

TEST(CopyExecutorTest, TheEvictionListenerRunsWithoutTheCachesMutex) {
  HierarchicalCacheConfig cfg = Config(0);
  const CacheParts* parts = nullptr;
  int calls = 0, under_lock = 0;
  cfg.eviction_listener = [&](const EvictionEvent& e) {
    ++calls;
    if (parts->owner.load() == std::this_thread::get_id()) ++under_lock;
    EXPECT_EQ(e.tier, CacheTier::kDevice);
    EXPECT_EQ(e.num_tokens, 2 * kPage);  // one victim, taken whole
  };
  auto rig = PartsRig::Make(cfg, kPage, 8, 0);
  parts = rig->parts.get();
  rig->InsertOnDevice(Seq(2 * kPage, 1));
  {
    CacheWork work(&rig->p().executor);
    CacheLock lk(rig->p());
    rig->p().evictor.EvictDevice(2, &work);
    EXPECT_EQ(calls, 0);
  }
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(under_lock, 0);
}

}  // namespace
}  // namespace kvtier
