// BackupPolicy: what each write policy answers the backup and eviction mechanism.
#include "cache/backup_policy.h"

#include <gtest/gtest.h>

#include <vector>

#include "cache/radix_tree.h"

namespace kvtier {
namespace {

TEST(BackupPolicyTest, WriteThroughBacksUpOnFirstUseAndStoresOnBackup) {
  auto p = MakeBackupPolicy(WritePolicy::kWriteThrough, /*threshold=*/5);  // threshold unused
  EXPECT_EQ(p->kind(), WritePolicy::kWriteThrough);
  EXPECT_TRUE(p->backs_up_on_use());
  EXPECT_FALSE(p->back_up_on_eviction());
  EXPECT_TRUE(p->store_on_backup());
  RadixTree tree(4);
  std::vector<Token> tokens = {1, 2, 3, 4};
  std::vector<int64_t> pages = {0};
  std::vector<RadixTree::InsertSegment> seg;
  tree.Insert("", tokens, pages, {}, &seg);
  ASSERT_EQ(seg.size(), 1u);
  ASSERT_EQ(seg[0].node->hit_count(), 1);
  EXPECT_TRUE(p->BackUpOnUse(*seg[0].node));
}

TEST(BackupPolicyTest, SelectiveWaitsForItsHitCount) {
  auto p = MakeBackupPolicy(WritePolicy::kWriteThroughSelective, 3);
  EXPECT_EQ(p->kind(), WritePolicy::kWriteThroughSelective);
  EXPECT_TRUE(p->backs_up_on_use());
  EXPECT_FALSE(p->back_up_on_eviction());
  EXPECT_TRUE(p->store_on_backup());
  RadixTree tree(4);
  std::vector<Token> tokens = {1, 2, 3, 4};
  std::vector<int64_t> pages = {0};
  std::vector<RadixTree::InsertSegment> seg;
  tree.Insert("", tokens, pages, {}, &seg);
  RadixNode* n = seg[0].node;
  EXPECT_FALSE(p->BackUpOnUse(*n));  // 1 hit
  tree.Touch(n, 1);
  EXPECT_FALSE(p->BackUpOnUse(*n));  // 2 hits
  tree.Touch(n, 1);
  EXPECT_TRUE(p->BackUpOnUse(*n));  // 3 hits
}

TEST(BackupPolicyTest, WriteBackCopiesOnlyWhatEvictionWouldDrop) {
  auto p = MakeBackupPolicy(WritePolicy::kWriteBack, 1);
  EXPECT_EQ(p->kind(), WritePolicy::kWriteBack);
  EXPECT_FALSE(p->backs_up_on_use());
  EXPECT_TRUE(p->back_up_on_eviction());
  EXPECT_FALSE(p->store_on_backup());
  RadixTree tree(4);
  std::vector<Token> tokens = {1, 2, 3, 4};
  std::vector<int64_t> pages = {0};
  std::vector<RadixTree::InsertSegment> seg;
  tree.Insert("", tokens, pages, {}, &seg);
  tree.Touch(seg[0].node, 100);
  EXPECT_FALSE(p->BackUpOnUse(*seg[0].node));
}

}  // namespace
}  // namespace kvtier
