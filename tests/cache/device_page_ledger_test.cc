// DevicePageLedger: creation checks, allocation and ownership against a model over random
// operations, the all-or-nothing Free and its refusals, and the engine-page checks.
#include "cache/device_page_ledger.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <vector>

namespace kvtier {
namespace {

constexpr int64_t kPage = 4;

std::unique_ptr<DevicePageLedger> Make(int64_t pages) {
  auto l = DevicePageLedger::Create(pages * kPage, kPage);
  EXPECT_TRUE(l.ok()) << l.status().ToString();
  return std::move(*l);
}

TEST(DevicePageLedgerTest, CreateRefusesBadShapes) {
  EXPECT_EQ(DevicePageLedger::Create(64, 3).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(DevicePageLedger::Create(10, 4).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(DevicePageLedger::Create(0, 4).status().code(), StatusCode::kInvalidArgument);
  auto l = Make(8);
  EXPECT_EQ(l->num_pages(), 8);
  EXPECT_EQ(l->num_slots(), 32);
  EXPECT_EQ(l->free_pages(), 8);
}

TEST(DevicePageLedgerTest, AFreshLedgerAllocatesAscendingAndRefusesTooMany) {
  auto l = Make(4);
  auto a = l->Allocate(3, DevicePageLedger::kEngine);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(*a, (std::vector<int64_t>{0, 4, 8}));
  EXPECT_EQ(l->pages_of(DevicePageLedger::kEngine), 3);
  auto b = l->Allocate(2, DevicePageLedger::kEngine);
  EXPECT_EQ(b.status().code(), StatusCode::kOutOfMemory);
  EXPECT_EQ(l->free_pages(), 1);  // nothing changed
}

// The free list is a stack; pages freed in any order come back ascending (a load between the
// host tier and the device then pairs pages in the same order on both sides: dma_plan.h).
TEST(DevicePageLedgerTest, PagesFreedInAnyOrderComeBackAscending) {
  auto l = Make(8);
  auto a = l->Allocate(6, DevicePageLedger::kEngine);
  ASSERT_TRUE(a.ok());
  for (const std::vector<int64_t>& freed :
       {std::vector<int64_t>{0, 4, 8, 12}, std::vector<int64_t>{12, 8, 4, 0},
        std::vector<int64_t>{8, 0, 12, 4}}) {
    ASSERT_TRUE(l->Free(freed).ok());
    auto again = l->Allocate(4, DevicePageLedger::kTree);
    ASSERT_TRUE(again.ok());
    EXPECT_EQ(*again, (std::vector<int64_t>{0, 4, 8, 12}));
    l->Transfer(*again, DevicePageLedger::kEngine);
  }
}

TEST(DevicePageLedgerTest, FreeIsAllOrNothingAndNamesTheBadPage) {
  auto l = Make(4);
  auto a = l->Allocate(2, DevicePageLedger::kTree);
  ASSERT_TRUE(a.ok());
  for (const std::vector<int64_t>& bad : std::vector<std::vector<int64_t>>{
           {0, 8},    // 8 is free
           {0, 0},    // repeated
           {0, 5},    // not a page start
           {0, 400},  // out of range
       }) {
    const Status st = l->Free(bad);
    EXPECT_EQ(st.code(), StatusCode::kInternal) << bad[1];
    EXPECT_EQ(l->free_pages(), 2) << "all or nothing: " << bad[1];
  }
  EXPECT_TRUE(l->Free(*a).ok());
  EXPECT_EQ(l->free_pages(), 4);
  EXPECT_EQ(l->pages_of(DevicePageLedger::kTree), 0);
}

TEST(DevicePageLedgerTest, CheckPagesAndCheckEngineHeld) {
  auto l = Make(4);
  std::vector<int64_t> pages;
  EXPECT_TRUE(l->CheckPages(std::vector<int64_t>{4, 5, 6, 7}, "slots", &pages).ok());
  EXPECT_EQ(pages, (std::vector<int64_t>{4}));
  const Status partial = l->CheckPages(std::vector<int64_t>{4, 5, 6}, "slots", &pages);
  EXPECT_EQ(partial.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(partial.message().find("slots"), std::string::npos) << partial.ToString();
  EXPECT_FALSE(l->CheckPages(std::vector<int64_t>{5, 6, 7, 8}, "slots", &pages).ok());
  EXPECT_FALSE(l->CheckPages(std::vector<int64_t>{16, 17, 18, 19}, "slots", &pages).ok());
  auto held = l->Allocate(2, DevicePageLedger::kEngine);
  ASSERT_TRUE(held.ok());
  EXPECT_TRUE(l->CheckEngineHeld(*held, "Insert", nullptr).ok());
  const std::vector<int64_t> twice = {(*held)[0], (*held)[0]};
  EXPECT_FALSE(l->CheckEngineHeld(twice, "Insert", nullptr).ok());
  l->Transfer(std::vector<int64_t>{(*held)[1]}, DevicePageLedger::kTree);
  const std::vector<int64_t> tree_page = {(*held)[1]};
  EXPECT_FALSE(l->CheckEngineHeld(tree_page, "Insert", nullptr).ok());
  const std::vector<bool> skip = {true};
  EXPECT_TRUE(l->CheckEngineHeld(tree_page, "Insert", &skip).ok());
}

TEST(DevicePageLedgerTest, RandomOperationsMatchAModel) {
  constexpr int64_t kPages = 64;
  auto l = Make(kPages);
  std::map<int64_t, DevicePageLedger::Owner> model;  // allocated page start -> owner
  std::mt19937_64 rng(1234);
  const DevicePageLedger::Owner owners[] = {DevicePageLedger::kEngine, DevicePageLedger::kTree,
                                            DevicePageLedger::kCopy};
  for (int step = 0; step < 5000; ++step) {
    const int op = static_cast<int>(rng() % 3);
    if (op == 0) {
      const int64_t n = static_cast<int64_t>(rng() % 9);
      const auto owner = owners[rng() % 3];
      auto got = l->Allocate(n, owner);
      if (n > kPages - static_cast<int64_t>(model.size())) {
        ASSERT_FALSE(got.ok());
      } else {
        ASSERT_TRUE(got.ok());
        ASSERT_EQ(static_cast<int64_t>(got->size()), n);
        for (int64_t p : *got) ASSERT_TRUE(model.emplace(p, owner).second) << "page " << p;
      }
    } else if (!model.empty()) {
      std::vector<int64_t> pick;
      for (const auto& [p, o] : model) {
        if (rng() % 3 == 0) pick.push_back(p);
      }
      if (op == 1) {
        ASSERT_TRUE(l->Free(pick).ok());
        for (int64_t p : pick) model.erase(p);
      } else {
        const auto to = owners[rng() % 3];
        l->Transfer(pick, to);
        for (int64_t p : pick) model[p] = to;
      }
    }
    ASSERT_EQ(l->free_pages(), kPages - static_cast<int64_t>(model.size()));
    int64_t counts[4] = {0, 0, 0, 0};
    for (const auto& [p, o] : model) {
      ASSERT_EQ(l->owner(p), o);
      ASSERT_TRUE(l->IsAllocated(p));
      ++counts[o];
    }
    for (auto o : owners) ASSERT_EQ(l->pages_of(o), counts[o]);
  }
}

}  // namespace
}  // namespace kvtier
