// Prefetcher on a CacheParts rig with a memory:// store: a storage part read into host memory byte
// for byte, pages storage lost, the threshold, progress, and a cancelled prefetch whose batches
// complete afterwards.
#include "cache/prefetcher.h"

#include <gtest/gtest.h>

#include <limits>
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

struct Rig {
  std::shared_ptr<StorageBackend> store;
  std::unique_ptr<PartsRig> parts;
  CacheParts& p() { return parts->p(); }
};

Rig Make(int64_t threshold_tokens = 0, int64_t batch_pages = 2) {
  Rig r;
  HierarchicalCacheConfig cfg;
  cfg.write_policy = WritePolicy::kWriteThrough;
  cfg.backup_threads = 0;
  r.store = RigMemoryStore(kPage);
  cfg.storage.backend = r.store;
  cfg.storage.prefetch_threshold_tokens = threshold_tokens;
  cfg.storage.max_prefetch_batch_pages = batch_pages;
  r.parts = PartsRig::Make(cfg, kPage, 16, 16);
  return r;
}

// Puts `tokens` in storage only: inserted, backed up, stored, then evicted from device and host.
void StoreOnly(Rig& r, const std::vector<Token>& tokens) {
  RadixNode* node = r.parts->InsertOnDevice(tokens);
  {
    CacheWork work(&r.p().executor);
    CacheLock lk(r.p());
    ASSERT_TRUE(r.p().planner.Backup(node, &work, false));
  }
  r.parts->Settle();
  CacheWork work(&r.p().executor);
  CacheLock lk(r.p());
  ASSERT_TRUE(node->stored());
  r.p().evictor.EvictDevice(std::numeric_limits<int32_t>::max(), &work);
  r.p().evictor.EvictHost(std::numeric_limits<int32_t>::max(), &work);
  ASSERT_EQ(r.p().tree.Peek("", tokens).storage_tokens, static_cast<int64_t>(tokens.size()));
}

// A handle pinning the match of `tokens` (as Match makes it).
MatchHandle Pin(Rig& r, const std::vector<Token>& tokens) {
  CacheLock lk(r.p());
  HandleState h;
  h.last = r.p().tree.Match("", tokens).last;
  r.p().tree.IncRef(h.last);
  return r.p().NewHandle(std::move(h));
}

HandleState& HandleOf(Rig& r, MatchHandle m) { return **r.p().FindHandle(m); }

void Unpin(Rig& r, MatchHandle m) {
  CacheWork work(&r.p().executor);
  CacheLock lk(r.p());
  HandleState& h = HandleOf(r, m);
  if (h.prefetch) r.p().prefetcher.Conclude(h, true, &work);
  r.p().tree.DecRef(h.last);
  r.p().handles.erase(m.id);
}

TEST(PrefetcherTest, AStoragePartArrivesInHostMemoryByteForByte) {
  Rig r = Make();
  const auto tokens = Seq(5 * kPage, 40);  // 3 batches of at most 2 pages
  StoreOnly(r, tokens);
  const MatchHandle m = Pin(r, tokens);
  std::shared_ptr<CopyOp> op;
  {
    CacheWork work(&r.p().executor);
    CacheLock lk(r.p());
    auto started = r.p().prefetcher.Start(HandleOf(r, m), PrefetchPolicy::kWaitComplete, &work);
    ASSERT_TRUE(started.ok()) << started.status().ToString();
    EXPECT_EQ(started->state, PrefetchState::kRunning);
    EXPECT_EQ(started->requested_tokens, 5 * kPage);
    EXPECT_EQ(r.p().prefetcher.filling_pages(), 5);
    op = HandleOf(r, m).prefetch;
    EXPECT_EQ(op->num_batches(), 3);
  }
  r.p().tracker.Wait(*op);  // outside the lock
  {
    CacheWork work(&r.p().executor);
    CacheLock lk(r.p());
    const PrefetchResult progress = r.p().prefetcher.Progress(HandleOf(r, m));
    EXPECT_EQ(progress.state, PrefetchState::kRunning);  // until concluded
    EXPECT_EQ(progress.arrived_tokens, 5 * kPage);
    const PrefetchResult done = r.p().prefetcher.Conclude(HandleOf(r, m), false, &work);
    EXPECT_EQ(done.state, PrefetchState::kComplete);
    EXPECT_EQ(done.arrived_tokens, 5 * kPage);
    EXPECT_EQ(done.host_tokens, 5 * kPage);
    EXPECT_EQ(r.p().prefetcher.filling_pages(), 0);
    std::vector<int64_t> slots;
    for (RadixNode* n : CacheCore::Path(HandleOf(r, m).last)) {
      ASSERT_TRUE(n->on_host());
      r.p().AppendSlots(n->host_pages(), &slots);
    }
    const Status st = VerifyKvPattern(r.p().host->region(), slots, Hashes(tokens, ""));
    EXPECT_TRUE(st.ok()) << st.ToString();
    EXPECT_TRUE(CheckCacheConsistency(r.p()).ok());
  }
  Unpin(r, m);
}

TEST(PrefetcherTest, PagesStorageLostEndTheArrivedPrefixAndLoseTheirStorageMark) {
  Rig r = Make();
  const auto tokens = Seq(4 * kPage, 900);
  StoreOnly(r, tokens);
  auto keys = ComputePromptPageKeys(tokens, kPage, "");
  ASSERT_TRUE(keys.ok());
  ASSERT_TRUE(r.store->Remove({(*keys)[2]}).get().status.ok());  // the third page is gone
  const MatchHandle m = Pin(r, tokens);
  std::shared_ptr<CopyOp> op;
  {
    CacheWork work(&r.p().executor);
    CacheLock lk(r.p());
    ASSERT_TRUE(r.p().prefetcher.Start(HandleOf(r, m), PrefetchPolicy::kWaitComplete, &work).ok());
    op = HandleOf(r, m).prefetch;
  }
  r.p().tracker.Wait(*op);
  {
    CacheWork work(&r.p().executor);
    CacheLock lk(r.p());
    const PrefetchResult done = r.p().prefetcher.Conclude(HandleOf(r, m), false, &work);
    EXPECT_EQ(done.state, PrefetchState::kPartial);
    EXPECT_EQ(done.arrived_tokens, 2 * kPage);
    const RadixTree::MatchResult peek = r.p().tree.Peek("", tokens);
    EXPECT_EQ(peek.host_tokens, 2 * kPage);
    EXPECT_EQ(peek.storage_tokens, 0);  // pages 2 and 3 are no longer known to storage
    EXPECT_EQ(r.p().prefetcher.filling_pages(), 0);
    EXPECT_EQ(r.p().host->held_pages(), 2);
  }
  Unpin(r, m);
  r.parts->ExpectConsistent();
}

TEST(PrefetcherTest, AStoragePartBelowTheThresholdIsCountedNotRead) {
  Rig r = Make(/*threshold_tokens=*/3 * kPage);
  const auto tokens = Seq(2 * kPage, 5);
  StoreOnly(r, tokens);
  const MatchHandle m = Pin(r, tokens);
  {
    CacheWork work(&r.p().executor);
    CacheLock lk(r.p());
    auto started = r.p().prefetcher.Start(HandleOf(r, m), PrefetchPolicy::kBestEffort, &work);
    ASSERT_TRUE(started.ok());
    EXPECT_EQ(started->state, PrefetchState::kNone);
    EXPECT_EQ(r.p().counters.prefetch_below_threshold_tokens, 2 * kPage);
    EXPECT_TRUE(work.storage.empty());
    EXPECT_EQ(HandleOf(r, m).prefetch, nullptr);
  }
  Unpin(r, m);
}

TEST(PrefetcherTest, ACancelledPrefetchFreesItsPagesWhenItsBatchesComplete) {
  Rig r = Make();
  const auto tokens = Seq(3 * kPage, 60);
  StoreOnly(r, tokens);
  const MatchHandle m = Pin(r, tokens);
  std::shared_ptr<CopyOp> op;
  {
    CacheWork unrun;  // no executor: the reads are never submitted; the test completes them
    CacheWork work(&r.p().executor);
    CacheLock lk(r.p());
    ASSERT_TRUE(r.p().prefetcher.Start(HandleOf(r, m), PrefetchPolicy::kBestEffort, &unrun).ok());
    op = HandleOf(r, m).prefetch;
    // Batch 0 completes before the prefetch is cancelled, batch 1 after.
    r.p().tracker.CompleteBatch(*op, 0, Status::OK(), {PageStatus::kOk, PageStatus::kOk});
    const PrefetchResult done = r.p().prefetcher.Conclude(HandleOf(r, m), true, &work);
    EXPECT_EQ(done.state, PrefetchState::kPartial);
    EXPECT_EQ(done.arrived_tokens, 2 * kPage);
    EXPECT_EQ(op->free_on_completion.size(), 1u);  // the page of the running batch
    EXPECT_EQ(r.p().prefetcher.filling_pages(), 1);
    EXPECT_EQ(r.p().counters.prefetch_cancelled, 1);
    EXPECT_TRUE(CheckCacheConsistency(r.p()).ok());
  }
  r.p().tracker.CompleteBatch(*op, 1, Status::OK(), {PageStatus::kOk});
  {
    CacheWork work(&r.p().executor);
    CacheLock lk(r.p());
    r.p().Reap(&work);
    EXPECT_EQ(r.p().prefetcher.filling_pages(), 0);
    EXPECT_EQ(r.p().host->held_pages(), 2);  // the two pages handed to the tree
    EXPECT_TRUE(CheckCacheConsistency(r.p()).ok());
  }
  Unpin(r, m);
}

}  // namespace
}  // namespace kvtier
