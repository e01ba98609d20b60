// StoreBacklog: the writes waiting for the store's queue, bounded in bytes; when full, the
// lowest estimates are given up (equal: the newest), never one at or above the newcomer's; the
// next to go is the highest estimate (equal: the oldest) that fits the queue's room.
#include "cache/store_backlog.h"

#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "cache/copy_tracker.h"

namespace kvtier {
namespace {

std::shared_ptr<CopyOp> Op(int64_t tag) {
  auto op = std::make_shared<CopyOp>();
  op->kind = CopyOp::Kind::kStore;
  op->tokens = tag;  // identifies the op in the test
  return op;
}

std::vector<int64_t> Tags(const std::vector<std::shared_ptr<CopyOp>>& ops) {
  std::vector<int64_t> tags;
  for (const auto& op : ops) tags.push_back(op->tokens);
  return tags;
}

TEST(StoreBacklogTest, CountsBytesAndTokens) {
  StoreBacklog b(100);
  EXPECT_TRUE(b.empty());
  b.Add(Op(1), 3, 40, 4, 64);
  b.Add(Op(2), 1, 30, 3, 48);
  EXPECT_EQ(b.bytes(), 70);
  EXPECT_EQ(b.free_bytes(), 30);
  EXPECT_EQ(b.tokens(), 112);
  EXPECT_EQ(b.size(), 2u);
  ASSERT_NE(b.Next(10), nullptr);
  EXPECT_EQ(b.bytes(), 30);
  EXPECT_EQ(b.tokens(), 48);
}

TEST(StoreBacklogTest, MakeRoomGivesUpTheLowestEstimatesFirstNewestAmongEquals) {
  StoreBacklog b(100);
  b.Add(Op(1), 5, 20, 1, 1);
  b.Add(Op(2), 2, 20, 1, 1);
  b.Add(Op(3), 2, 20, 1, 1);  // equal to 2, newer: goes first
  b.Add(Op(4), 1, 20, 1, 1);
  b.Add(Op(5), 9, 20, 1, 1);
  std::vector<std::shared_ptr<CopyOp>> victims;
  // Fits without giving anything up.
  StoreBacklog roomy(100);
  EXPECT_TRUE(roomy.MakeRoom(100, 0, &victims));
  EXPECT_TRUE(victims.empty());
  // 50 bytes for estimate 3: 4 (1), then 3 (2, newer), then 2 (2) — 60 bytes freed.
  ASSERT_TRUE(b.MakeRoom(50, 3, &victims));
  std::vector<int64_t> tags = Tags(victims);
  std::sort(tags.begin(), tags.end());
  EXPECT_EQ(tags, (std::vector<int64_t>{2, 3, 4}));
  EXPECT_EQ(b.bytes(), 40);
  // 61 bytes (60 free) for estimate 3: nothing left below 3 (1 has 5, 5 has 9): nothing given up.
  victims.clear();
  EXPECT_FALSE(b.MakeRoom(61, 3, &victims));
  EXPECT_TRUE(victims.empty());
  EXPECT_EQ(b.bytes(), 40);
}

TEST(StoreBacklogTest, MakeRoomPicksTheNewestOfEqualEstimates) {
  StoreBacklog b(60);
  b.Add(Op(1), 2, 20, 1, 1);
  b.Add(Op(2), 2, 20, 1, 1);
  b.Add(Op(3), 2, 20, 1, 1);
  std::vector<std::shared_ptr<CopyOp>> victims;
  ASSERT_TRUE(b.MakeRoom(20, 3, &victims));
  EXPECT_EQ(Tags(victims), (std::vector<int64_t>{3}));
}

TEST(StoreBacklogTest, ANewcomerNeverDisplacesAnEqualOrHigherEstimate) {
  StoreBacklog b(40);
  b.Add(Op(1), 2, 20, 1, 1);
  b.Add(Op(2), 4, 20, 1, 1);
  std::vector<std::shared_ptr<CopyOp>> victims;
  EXPECT_FALSE(b.MakeRoom(20, 2, &victims));  // equal to the lowest: the newcomer is dropped
  EXPECT_TRUE(victims.empty());
  EXPECT_FALSE(b.MakeRoom(41, 100, &victims));  // larger than the whole backlog
  EXPECT_TRUE(victims.empty());
  EXPECT_EQ(b.size(), 2u);
}

TEST(StoreBacklogTest, NextTakesTheHighestEstimateOldestAmongEqualsWhenItFits) {
  StoreBacklog b(1000);
  b.Add(Op(1), 1, 10, 1, 1);
  b.Add(Op(2), 7, 10, 5, 1);
  b.Add(Op(3), 7, 10, 2, 1);
  b.Add(Op(4), 3, 10, 1, 1);
  EXPECT_EQ(b.Next(4), nullptr);  // 2 is next and needs 5 pages: the smaller ones wait
  EXPECT_EQ(b.size(), 4u);
  std::vector<int64_t> order;
  while (auto op = b.Next(5)) order.push_back(op->tokens);
  EXPECT_EQ(order, (std::vector<int64_t>{2, 3, 4, 1}));
  EXPECT_TRUE(b.empty());
  EXPECT_EQ(b.bytes(), 0);
}

}  // namespace
}  // namespace kvtier
