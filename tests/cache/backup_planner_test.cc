// BackupPlanner on a CacheParts rig: device -> host backups (bytes, busy marks, the policy's
// backup on use, no room, a failed copy rolled back) and host -> storage stores (stored marks,
// the bounded queue).
#include "cache/backup_planner.h"

#include <gtest/gtest.h>

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

HierarchicalCacheConfig Config(WritePolicy policy) {
  HierarchicalCacheConfig cfg;
  cfg.write_policy = policy;
  cfg.write_through_threshold = 2;
  cfg.backup_threads = 0;  // copies run inline, in CacheWork
  return cfg;
}

// The host slots of the host part of `tokens`' match.
std::vector<int64_t> HostSlots(PartsRig& rig, const std::vector<Token>& tokens) {
  CacheLock lk(rig.p());
  std::vector<int64_t> slots;
  for (RadixNode* n : CacheCore::Path(rig.p().tree.Peek("", tokens).last)) {
    if (n->on_host()) rig.p().AppendSlots(n->host_pages(), &slots);
  }
  return slots;
}

TEST(BackupPlannerTest, BackupCopiesTheUnbackedPathByteForByte) {
  auto rig = PartsRig::Make(Config(WritePolicy::kWriteThrough), kPage, 8, 8);
  const auto a = Seq(2 * kPage, 10);
  const auto ab = [&] {
    auto t = a;
    const auto b = Seq(3 * kPage, 500);
    t.insert(t.end(), b.begin(), b.end());
    return t;
  }();
  rig->InsertOnDevice(a);
  RadixNode* leaf = rig->InsertOnDevice(ab);  // a's node, then b's
  {
    CacheWork work(&rig->p().executor);
    CacheLock lk(rig->p());
    ASSERT_TRUE(rig->p().planner.Backup(leaf, &work, /*write_back=*/false));
    ASSERT_EQ(work.copies.size(), 1u);
    EXPECT_EQ(work.copies[0]->tokens, 5 * kPage);  // the whole unbacked path, a included
    EXPECT_GT(leaf->busy(), 0);
    EXPECT_TRUE(leaf->on_host());  // pages assigned at once
    // Busy: no second backup of the same path.
    EXPECT_FALSE(rig->p().planner.Backup(leaf, &work, false));
  }
  rig->Settle();
  EXPECT_EQ(leaf->busy(), 0);
  EXPECT_EQ(rig->p().counters.backup_tokens, 5 * kPage);
  const Status st = VerifyKvPattern(rig->p().host->region(), HostSlots(*rig, ab), Hashes(ab, ""));
  EXPECT_TRUE(st.ok()) << st.ToString();
  rig->ExpectConsistent();
}

TEST(BackupPlannerTest, SelectivePolicyBacksUpOnceANodeHasEnoughHits) {
  auto rig = PartsRig::Make(Config(WritePolicy::kWriteThroughSelective), kPage, 8, 8);
  const auto tokens = Seq(2 * kPage, 3);
  RadixNode* node = rig->InsertOnDevice(tokens);  // 1 hit
  {
    CacheWork work(&rig->p().executor);
    CacheLock lk(rig->p());
    rig->p().planner.MaybeBackup(CacheCore::Path(node), &work);
    EXPECT_TRUE(work.copies.empty());
    rig->p().tree.Touch(node, 1);
    rig->p().planner.MaybeBackup(CacheCore::Path(node), &work);
    EXPECT_EQ(work.copies.size(), 1u);
  }
  rig->Settle();
  EXPECT_TRUE(node->on_host());
  rig->ExpectConsistent();
}

TEST(BackupPlannerTest, WriteBackNeverBacksUpOnUse) {
  auto rig = PartsRig::Make(Config(WritePolicy::kWriteBack), kPage, 8, 8);
  RadixNode* node = rig->InsertOnDevice(Seq(kPage, 3));
  CacheWork work(&rig->p().executor);
  CacheLock lk(rig->p());
  rig->p().tree.Touch(node, 10);
  rig->p().planner.MaybeBackup(CacheCore::Path(node), &work);
  EXPECT_TRUE(work.copies.empty());
}

TEST(BackupPlannerTest, NoHostRoomSkipsTheBackupAndCountsIt) {
  auto rig = PartsRig::Make(Config(WritePolicy::kWriteThrough), kPage, 8, 2);
  RadixNode* node = rig->InsertOnDevice(Seq(3 * kPage, 3));
  CacheWork work(&rig->p().executor);
  CacheLock lk(rig->p());
  EXPECT_FALSE(rig->p().planner.Backup(node, &work, false));
  EXPECT_TRUE(work.copies.empty());
  EXPECT_FALSE(node->on_host());
  EXPECT_EQ(rig->p().counters.backup_skipped_tokens, 3 * kPage);
  EXPECT_EQ(rig->p().host->held_pages(), 0);
}

TEST(BackupPlannerTest, AFailedCopyGivesTheHostPagesBack) {
  auto rig = PartsRig::Make(Config(WritePolicy::kWriteThrough), kPage, 8, 8);
  RadixNode* node = rig->InsertOnDevice(Seq(2 * kPage, 3));
  std::shared_ptr<CopyOp> op;
  {
    CacheWork unrun;  // no executor: the copy is never submitted; the test completes it
    CacheLock lk(rig->p());
    ASSERT_TRUE(rig->p().planner.Backup(node, &unrun, false));
    op = unrun.copies.at(0);
    EXPECT_EQ(rig->p().host->held_pages(), 2);
  }
  rig->p().tracker.Complete(*op, Status::IOError("the copy failed"));
  {
    CacheWork work(&rig->p().executor);
    CacheLock lk(rig->p());
    rig->p().Reap(&work);
    EXPECT_FALSE(node->on_host());
    EXPECT_TRUE(node->on_device());
    EXPECT_EQ(node->busy(), 0);
    EXPECT_EQ(rig->p().host->held_pages(), 0);
    EXPECT_EQ(rig->p().counters.backup_failed_tokens, 2 * kPage);
    EXPECT_EQ(rig->p().backup_failure.code(), StatusCode::kIOError);
    EXPECT_TRUE(CheckCacheConsistency(rig->p()).ok());
  }
}

TEST(BackupPlannerTest, ALandedBackupIsStoredAndMarkedStored) {
  HierarchicalCacheConfig cfg = Config(WritePolicy::kWriteThrough);
  auto store = RigMemoryStore(kPage);
  cfg.storage.backend = store;
  auto rig = PartsRig::Make(cfg, kPage, 8, 8);
  const auto tokens = Seq(3 * kPage, 77);
  RadixNode* node = rig->InsertOnDevice(tokens);
  {
    CacheWork work(&rig->p().executor);
    CacheLock lk(rig->p());
    ASSERT_TRUE(rig->p().planner.Backup(node, &work, false));
  }
  rig->Settle();  // the backup lands, its store starts and completes
  EXPECT_TRUE(node->stored());
  EXPECT_FALSE(node->storing());
  EXPECT_EQ(rig->p().counters.storage_backup_tokens, 3 * kPage);
  auto keys = ComputePromptPageKeys(tokens, kPage, "");
  ASSERT_TRUE(keys.ok());
  ExistsResult e = store->Exists(*keys).get();
  ASSERT_TRUE(e.status.ok());
  EXPECT_EQ(e.leading, 3);
  {
    CacheWork work(&rig->p().executor);
    CacheLock lk(rig->p());
    EXPECT_FALSE(rig->p().planner.Store(node, &work));  // stored already: nothing to do
  }
  rig->ExpectConsistent();
}

TEST(BackupPlannerTest, AStoreLongerThanTheQueueGoesInPartsAndInBatches) {
  HierarchicalCacheConfig cfg = Config(WritePolicy::kWriteThrough);
  auto store = RigMemoryStore(kPage);
  cfg.storage.backend = store;
  cfg.storage.max_backup_queue_pages = 2;
  cfg.storage.max_backup_batch_pages = 1;
  auto rig = PartsRig::Make(cfg, kPage, 8, 8);
  const auto tokens = Seq(5 * kPage, 5);
  RadixNode* node = rig->InsertOnDevice(tokens);
  {
    CacheWork work(&rig->p().executor);
    CacheLock lk(rig->p());
    ASSERT_TRUE(rig->p().planner.Backup(node, &work, false));
  }
  rig->Settle();  // 2 + 2 + 1 pages, each part queued when the one before it is stored
  EXPECT_TRUE(node->stored());
  EXPECT_EQ(rig->p().counters.storage_backup_tokens, 5 * kPage);
  EXPECT_EQ(rig->p().counters.storage_queue_drops, 0);
  EXPECT_EQ(rig->p().counters.storage_backup_dropped_tokens, 0);
  EXPECT_EQ(store->Stats().set_calls, 5);  // one page per batch
  auto keys = ComputePromptPageKeys(tokens, kPage, "");
  ASSERT_TRUE(keys.ok());
  EXPECT_EQ(store->Exists(*keys).get().leading, 5);
  rig->ExpectConsistent();
}

// A store's batches are sized to be written within the backend's per-call timeout at 128 MB/s:
// 256 pages of 8 MiB (2 GiB) could not make the default 2 s; 8 MiB pages go 30 at a time.
TEST(BackupPlannerTest, StoreBatchesFitTheBackendsTimeout) {
  using std::chrono::milliseconds;
  constexpr int64_t kMiB = int64_t{1} << 20;
  EXPECT_EQ(StoreBatchPages(8 * kMiB, milliseconds(2000), 256, 4096), 30);     // 256e6 / 8 MiB
  EXPECT_EQ(StoreBatchPages(768 * 1024, milliseconds(2000), 256, 4096), 256);  // 325 fit
  EXPECT_EQ(StoreBatchPages(8 * kMiB, milliseconds(60000), 256, 4096), 256);
  EXPECT_EQ(StoreBatchPages(4096, milliseconds(2000), 256, 16), 16);    // the backend's bound
  EXPECT_EQ(StoreBatchPages(8 * kMiB, milliseconds(1), 256, 4096), 1);  // at least one page
  EXPECT_EQ(StoreBatchPages(0, milliseconds(600000), int64_t{1} << 40, int64_t{1} << 20),
            int64_t{1} << 20);
}

TEST(BackupPlannerTest, AFullStoreQueueDropsTheStoreAndCountsItAsQueueFull) {
  HierarchicalCacheConfig cfg = Config(WritePolicy::kWriteBack);
  cfg.storage.backend = RigMemoryStore(kPage);
  cfg.storage.max_backup_queue_pages = 2;
  cfg.storage.admission.policy = StorageAdmission::kAll;
  cfg.storage.admission.backlog_bytes = 0;  // no backlog: a store the queue cannot take is dropped
  auto rig = PartsRig::Make(cfg, kPage, 8, 8);
  RadixNode* a = rig->InsertOnDevice(Seq(2 * kPage, 5));
  RadixNode* b = rig->InsertOnDevice(Seq(kPage, 500));
  {
    CacheWork work(&rig->p().executor);
    CacheLock lk(rig->p());
    ASSERT_TRUE(rig->p().planner.Backup(a, &work, true));
    ASSERT_TRUE(rig->p().planner.Backup(b, &work, true));
  }
  rig->Settle();
  CacheWork later;  // submitted by hand below, after the lock
  {
    CacheLock lk(rig->p());
    EXPECT_FALSE(a->stored());                       // write_back: no store on backup
    EXPECT_TRUE(rig->p().planner.Store(a, &later));  // fills the queue
    EXPECT_FALSE(rig->p().planner.Store(b, &later));
    EXPECT_EQ(later.storage.size(), 1u);
    EXPECT_EQ(rig->p().counters.storage_queue_drops, 1);
    EXPECT_EQ(rig->p().counters.storage_backup_dropped_tokens, kPage);
  }
  rig->p().executor.Run(later);
  rig->Settle();
  EXPECT_TRUE(a->stored());
  EXPECT_FALSE(b->stored());
  EXPECT_EQ(rig->p().counters.storage_backup_tokens, 2 * kPage);
}

// With the queue full, stores wait in the backlog (bounded in bytes); a full backlog gives up its
// lowest estimate (here: the hit count, admission all) for a likelier newcomer and drops a
// newcomer no likelier than what it holds; as the queue makes room the likeliest goes first.
TEST(BackupPlannerTest, AFullBacklogDropsTheLeastLikelyToBeReusedAndSubmitsTheLikeliestFirst) {
  HierarchicalCacheConfig cfg = Config(WritePolicy::kWriteBack);
  auto store = RigMemoryStore(kPage);
  cfg.storage.backend = store;
  cfg.storage.max_backup_queue_pages = 1;
  cfg.storage.admission.policy = StorageAdmission::kAll;
  const int64_t page_bytes = kPage * testing::kRigLayers * testing::kRigSlotBytes * 2;
  cfg.storage.admission.backlog_bytes = 2 * page_bytes;  // within an eighth of 16 host pages
  auto rig = PartsRig::Make(cfg, kPage, 8, 16);
  ASSERT_EQ(rig->p().PageBytes(), page_bytes);
  std::vector<RadixNode*> n;  // a, b, c, d, e: one page each, hit counts 1, 1, 3, 2, 1
  for (int i = 0; i < 5; ++i) n.push_back(rig->InsertOnDevice(Seq(kPage, 100 * (i + 1))));
  RadixNode *a = n[0], *b = n[1], *c = n[2], *d = n[3], *e = n[4];
  {
    CacheWork work(&rig->p().executor);
    CacheLock lk(rig->p());
    for (RadixNode* x : n) ASSERT_TRUE(rig->p().planner.Backup(x, &work, true));
    rig->p().tree.Touch(c, 2);
    rig->p().tree.Touch(d, 1);
  }
  rig->Settle();
  CacheWork later;  // a's store, submitted by hand below
  {
    CacheLock lk(rig->p());
    auto& planner = rig->p().planner;
    EXPECT_TRUE(planner.Store(a, &later));   // the queue's one page
    EXPECT_TRUE(planner.Store(b, &later));   // backlog: b
    EXPECT_TRUE(planner.Store(c, &later));   // backlog: b, c (full)
    EXPECT_TRUE(planner.Store(d, &later));   // 2 > b's 1: b is given up
    EXPECT_FALSE(planner.Store(e, &later));  // 1: below everything held: dropped
    EXPECT_EQ(later.storage.size(), 1u);
    EXPECT_EQ(planner.backlog().capacity_bytes(), 2 * page_bytes);
    EXPECT_EQ(planner.backlog().size(), 2u);
    EXPECT_EQ(planner.backlog().bytes(), 2 * page_bytes);
    EXPECT_TRUE(c->storing());
    EXPECT_TRUE(d->storing());
    EXPECT_EQ(rig->p().counters.storage_backup_backlog_tokens, kPage);  // e; b's when reaped
    EXPECT_EQ(rig->p().counters.storage_queue_drops, 0);
    EXPECT_TRUE(CheckCacheConsistency(rig->p()).ok());
  }
  // a lands: its room in the queue goes to c (estimate 3) before d (2).
  const std::shared_ptr<CopyOp> a_store = later.storage.at(0);
  rig->p().executor.Run(later);
  rig->p().tracker.Wait(*a_store);
  CacheWork next;  // not run yet: what the reaping queued
  {
    CacheLock lk(rig->p());
    rig->p().Reap(&next);
    EXPECT_TRUE(a->stored());
    EXPECT_FALSE(b->storing());  // given up, reaped
    EXPECT_EQ(rig->p().counters.storage_backup_backlog_tokens, 2 * kPage);
    ASSERT_EQ(next.storage.size(), 1u);
    EXPECT_EQ(next.storage[0]->keys, std::vector<PageKey>(c->keys().begin(), c->keys().end()));
    EXPECT_EQ(rig->p().planner.backlog().size(), 1u);  // d waits for c
    EXPECT_TRUE(CheckCacheConsistency(rig->p()).ok());
  }
  rig->p().executor.Run(next);
  rig->Settle();
  EXPECT_TRUE(c->stored());
  EXPECT_TRUE(d->stored());
  EXPECT_FALSE(b->stored());
  EXPECT_FALSE(e->stored());
  EXPECT_EQ(rig->p().counters.storage_backup_tokens, 3 * kPage);
  EXPECT_TRUE(rig->p().planner.backlog().empty());
  rig->ExpectConsistent();
}

// Admission refuses pages below its threshold (hits: the node's hit count), counted as refused;
// the first refused page ends the store.
TEST(BackupPlannerTest, AdmissionByHitsStoresOnlyTheAdmittedHeadOfAPath) {
  HierarchicalCacheConfig cfg = Config(WritePolicy::kWriteBack);
  cfg.storage.backend = RigMemoryStore(kPage);
  cfg.storage.admission.policy = StorageAdmission::kHits;
  cfg.storage.admission.threshold = 2;
  auto rig = PartsRig::Make(cfg, kPage, 8, 8);
  const auto head = Seq(2 * kPage, 7);
  auto whole = head;
  const auto tail = Seq(kPage, 900);
  whole.insert(whole.end(), tail.begin(), tail.end());
  RadixNode* h = rig->InsertOnDevice(head);
  RadixNode* leaf = rig->InsertOnDevice(whole);
  {
    CacheWork work(&rig->p().executor);
    CacheLock lk(rig->p());
    rig->p().tree.Touch(h, 2 - h->hit_count());  // read twice; the leaf once
    ASSERT_EQ(h->hit_count(), 2);
    ASSERT_EQ(leaf->hit_count(), 1);
    ASSERT_TRUE(rig->p().planner.Backup(leaf, &work, true));
  }
  rig->Settle();
  {
    CacheWork work(&rig->p().executor);
    CacheLock lk(rig->p());
    EXPECT_TRUE(rig->p().planner.Store(leaf, &work));
    EXPECT_EQ(rig->p().counters.storage_backup_refused_tokens, kPage);
  }
  rig->Settle();
  EXPECT_TRUE(h->stored());
  EXPECT_FALSE(leaf->stored());
  EXPECT_EQ(rig->p().counters.storage_backup_tokens, 2 * kPage);
  rig->ExpectConsistent();
}

// The backlog holds at most an eighth of the host tier (its stores keep their host pages), and
// nothing without a store queue (it would never drain).
TEST(BackupPlannerTest, TheBacklogIsAtMostAnEighthOfTheHostTier) {
  HierarchicalCacheConfig cfg = Config(WritePolicy::kWriteThrough);
  cfg.storage.backend = RigMemoryStore(kPage);
  cfg.storage.admission.backlog_bytes = int64_t{1} << 30;
  auto rig = PartsRig::Make(cfg, kPage, 8, 64);
  {
    CacheLock lk(rig->p());
    EXPECT_EQ(rig->p().planner.backlog().capacity_bytes(), 64 * rig->p().PageBytes() / 8);
  }
  cfg.storage.max_backup_queue_pages = 0;
  auto no_queue = PartsRig::Make(cfg, kPage, 8, 64);
  CacheLock lk(no_queue->p());
  EXPECT_EQ(no_queue->p().planner.backlog().capacity_bytes(), 0);
}

}  // namespace
}  // namespace kvtier
