// StoreAdmission: what each storage admission policy estimates and admits.
#include "cache/store_admission.h"

#include <gtest/gtest.h>

#include <vector>

#include "cache/radix_tree.h"
#include "kvtier/page_key.h"

namespace kvtier {
namespace {

constexpr int64_t kPage = 4;

// One node of two pages (hit count 1) with its page keys.
struct OneNode {
  RadixTree tree{kPage};
  std::vector<Token> tokens = {1, 2, 3, 4, 5, 6, 7, 8};
  std::vector<PageKey> keys;
  RadixNode* node = nullptr;
  OneNode() {
    keys = *ComputePageKeys(tokens, kPage, std::nullopt);
    std::vector<int64_t> pages = {0, kPage};
    std::vector<RadixTree::InsertSegment> seg;
    tree.Insert("", tokens, pages, keys, &seg);
    node = seg.at(0).node;
  }
};

StorageAdmissionConfig Config(StorageAdmission policy, int64_t threshold = 2) {
  StorageAdmissionConfig c;
  c.policy = policy;
  c.threshold = threshold;
  c.sketch_counters = 1024;
  return c;
}

TEST(StoreAdmissionTest, AllAdmitsEveryPageAndEstimatesByHits) {
  OneNode t;
  auto a = MakeStoreAdmission(Config(StorageAdmission::kAll, 5));
  EXPECT_EQ(a->kind(), StorageAdmission::kAll);
  EXPECT_EQ(a->Estimate(*t.node, 0), 1);
  EXPECT_TRUE(a->Admits(0, /*room=*/false));
  EXPECT_TRUE(a->Admits(1, true));
  t.tree.Touch(t.node, 2);
  EXPECT_EQ(a->Estimate(*t.node, 1), 3);
}

TEST(StoreAdmissionTest, HitsAdmitsFromItsThresholdWhateverTheRoom) {
  OneNode t;
  auto a = MakeStoreAdmission(Config(StorageAdmission::kHits, 2));
  EXPECT_EQ(a->kind(), StorageAdmission::kHits);
  const int64_t once = a->Estimate(*t.node, 0);
  EXPECT_EQ(once, 1);
  EXPECT_FALSE(a->Admits(once, /*room=*/true));
  EXPECT_FALSE(a->Admits(once, false));
  t.tree.Touch(t.node, 1);
  const int64_t twice = a->Estimate(*t.node, 0);
  EXPECT_EQ(twice, 2);
  EXPECT_TRUE(a->Admits(twice, false));
}

TEST(StoreAdmissionTest, FrequencyCountsRecordedAccessesPerPageAndAdmitsWhenRoomOrFrequent) {
  OneNode t;
  auto a = MakeStoreAdmission(Config(StorageAdmission::kFrequency, 2));
  EXPECT_EQ(a->kind(), StorageAdmission::kFrequency);
  EXPECT_EQ(a->Estimate(*t.node, 0), 0);
  a->Record(t.keys);                                     // both pages once
  a->Record(std::span<const PageKey>(t.keys).first(1));  // the first again
  const int64_t first = a->Estimate(*t.node, 0), second = a->Estimate(*t.node, 1);
  EXPECT_EQ(first, 2);
  EXPECT_EQ(second, 1);
  EXPECT_TRUE(a->Admits(first, /*room=*/false));
  EXPECT_FALSE(a->Admits(second, false));
  EXPECT_TRUE(a->Admits(second, true));  // the backlog has room: anything goes
  // The node's hit count plays no part.
  t.tree.Touch(t.node, 10);
  EXPECT_EQ(a->Estimate(*t.node, 1), 1);
}

TEST(StoreAdmissionTest, NamesAndParse) {
  for (auto p : {StorageAdmission::kAll, StorageAdmission::kHits, StorageAdmission::kFrequency}) {
    auto parsed = ParseStorageAdmission(StorageAdmissionName(p));
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(*parsed, p);
  }
  auto bad = ParseStorageAdmission("lru");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("all, hits, frequency"), std::string::npos);
}

}  // namespace
}  // namespace kvtier
