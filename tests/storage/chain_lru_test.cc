// The chain-aware eviction order on its own: a chain's tail goes before its head, a parent becomes
// evictable with its own recency once its last child is gone, refreshes keep the parent, the page
// just written goes last, a cycle of links still yields a victim, and — over random forests of
// prompts overfilling a capacity — eviction never leaves a page whose parent is gone.
#include "storage/chain_lru.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <set>
#include <unordered_set>
#include <vector>

namespace kvtier::storage {
namespace {

using Lru = ChainLru<int, std::hash<int>>;

// Evicts until `capacity` holds (as FileIndex and MemoryStore do); the victims in order.
std::vector<int> EvictDownTo(Lru& lru, int64_t capacity, const int* keep = nullptr) {
  std::vector<int> victims;
  while (lru.bytes() > capacity) {
    const std::optional<int> v = lru.Victim(keep).key;
    if (!v) break;
    victims.push_back(*v);
    lru.Erase(*v);
  }
  return victims;
}

TEST(ChainLruTest, TheTailGoesBeforeTheHeadEvenWhenTheHeadIsOlder) {
  Lru lru;
  lru.Add(1, 10, std::nullopt, true);  // 1 <- 2 <- 3, then 9 alone
  lru.Add(2, 10, 1, true);
  lru.Add(3, 10, 2, true);
  lru.Add(9, 10, std::nullopt, true);
  // A read of the prefix touches its head first: the head is the least recently used page.
  EXPECT_TRUE(lru.Touch(1));
  EXPECT_TRUE(lru.Touch(2));
  EXPECT_TRUE(lru.Touch(3));
  EXPECT_EQ(lru.Order(), (std::vector<int>{3, 2, 1, 9}));
  EXPECT_EQ(EvictDownTo(lru, 30), std::vector<int>{9});  // the oldest leaf
  EXPECT_EQ(EvictDownTo(lru, 10), (std::vector<int>{3, 2}));
  EXPECT_EQ(lru.Order(), std::vector<int>{1});
  EXPECT_EQ(lru.bytes(), 10);
}

TEST(ChainLruTest, AParentBecomesALeafWithItsOwnRecency) {
  Lru lru;
  lru.Add(1, 1, std::nullopt, true);  // 1 <- 2, and 1 <- 3 (a shared prefix)
  lru.Add(2, 1, 1, true);
  lru.Add(5, 1, std::nullopt, true);
  lru.Add(3, 1, 1, true);
  // Leaves by age: 2, 5, 3. Evicting 2 leaves 1 a parent (of 3); evicting 5 then 3 frees 1,
  // which is older than nothing left but itself.
  EXPECT_EQ(EvictDownTo(lru, 3), std::vector<int>{2});
  EXPECT_EQ(lru.Victim(nullptr).key, 5);
  EXPECT_EQ(EvictDownTo(lru, 1), (std::vector<int>{5, 3}));
  EXPECT_EQ(lru.Victim(nullptr).key, 1);
}

TEST(ChainLruTest, ARefreshKeepsTheParentUnlessANewOneIsGiven) {
  Lru lru;
  lru.Add(1, 1, std::nullopt, true);
  lru.Add(2, 1, 1, true);
  lru.Add(2, 5, std::nullopt, true);  // rewritten without a parent: still 1's child
  EXPECT_EQ(lru.ParentOf(2), 1);
  EXPECT_EQ(lru.bytes(), 6);
  EXPECT_EQ(lru.Victim(nullptr).key, 2);
  lru.Add(7, 1, std::nullopt, true);
  lru.Add(2, 5, 7, true);  // a new parent: 1 is a leaf again, 7 is not
  EXPECT_EQ(lru.ParentOf(2), 7);
  EXPECT_EQ(lru.Victim(nullptr).key, 1);
  lru.Erase(1);
  EXPECT_EQ(lru.Victim(nullptr).key, 2);
  lru.Add(4, 1, 4, true);  // naming itself: a root
  EXPECT_EQ(lru.ParentOf(4), std::nullopt);
}

TEST(ChainLruTest, ThePageJustWrittenGoesLastAndOnlyIfItIsTheOnlyTail) {
  Lru lru;
  lru.Add(1, 1, std::nullopt, true);
  lru.Add(2, 1, 1, true);
  lru.Add(3, 1, 2, true);  // a chain of 3 in a room of 2: its tail goes, its head stays
  const int keep = 3;
  EXPECT_EQ(EvictDownTo(lru, 2, &keep), std::vector<int>{3});
  EXPECT_EQ(lru.Order(), (std::vector<int>{2, 1}));
  lru.Add(8, 1, std::nullopt, true);  // another leaf: the page just written stays
  const int keep8 = 8;
  EXPECT_EQ(EvictDownTo(lru, 2, &keep8), std::vector<int>{2});
  // Nothing but the kept page: no victim, even over the capacity.
  Lru one;
  one.Add(5, 100, std::nullopt, true);
  const int keep5 = 5;
  EXPECT_EQ(one.Victim(&keep5).key, std::nullopt);
  EXPECT_EQ(one.Victim(&keep5).reason, Lru::VictimReason::kNone);
  EXPECT_EQ(Lru().Victim(nullptr).key, std::nullopt);
}

TEST(ChainLruTest, VictimSaysWhy) {
  using R = Lru::VictimReason;
  Lru lru;
  lru.Add(1, 1, std::nullopt, true);  // 1 <- 2 <- 3, 3 just written
  lru.Add(2, 1, 1, true);
  lru.Add(3, 1, 2, true);
  const int keep = 3;
  const auto none = [](int) { return false; };
  EXPECT_EQ(lru.Victim(&keep, none).reason, R::kKeepTail);  // the only leaf: a chain too long
  EXPECT_EQ(lru.Victim(&keep, none).key, 3);
  EXPECT_EQ(lru.Victim(nullptr, none).reason, R::kLeaf);
  lru.Add(7, 1, std::nullopt, false);  // another leaf, pinned
  const auto pinned7 = [](int k) { return k == 7; };
  EXPECT_EQ(lru.Victim(&keep, none).key, 7);
  EXPECT_EQ(lru.Victim(&keep, none).reason, R::kLeaf);
  EXPECT_EQ(lru.Victim(&keep, pinned7).key, 3);
  EXPECT_EQ(lru.Victim(&keep, pinned7).reason, R::kKeepSkipped);  // 7 would go but for its pin
  // Every leaf pinned and no `keep`: a page that is no leaf.
  const auto pinned37 = [](int k) { return k == 3 || k == 7; };
  EXPECT_EQ(lru.Victim(nullptr, pinned37).key, 1);
  EXPECT_EQ(lru.Victim(nullptr, pinned37).reason, R::kNotALeaf);
  // `keep` no leaf (2, the parent of 3) and every other page pinned: `keep`, for the pins.
  const int keep2 = 2;
  const auto all_but_2 = [](int k) { return k != 2; };
  EXPECT_EQ(lru.Victim(&keep2, all_but_2).key, 2);
  EXPECT_EQ(lru.Victim(&keep2, all_but_2).reason, R::kKeepSkipped);
  const auto all = [](int) { return true; };
  EXPECT_EQ(lru.Victim(&keep2, all).reason, R::kNone);
  EXPECT_EQ(lru.Victim(&keep2, all).key, std::nullopt);
}

// kKeepSkipped is exactly what MemoryStore::Insert once found by asking a second time: `keep`
// chosen with the skips, and not without them. Over random forests, keeps and pin sets.
TEST(ChainLruTest, KeepSkippedIsKeepChosenOnlyBecauseOfTheSkips) {
  std::mt19937 rng(11);
  int keep_skipped = 0, keep_tail = 0;
  for (int round = 0; round < 3000; ++round) {
    Lru lru;
    const int n = 1 + static_cast<int>(rng() % 8);
    for (int k = 0; k < n; ++k) {
      const int parent = static_cast<int>(rng() % (k + 2)) - 1;  // -1: none
      lru.Add(k, 1, parent < 0 || parent == k ? std::nullopt : std::optional<int>(parent),
              rng() % 4 != 0);
    }
    const int keep = static_cast<int>(rng() % n);
    const uint32_t pins = rng();
    const auto pinned = [pins](int k) { return (pins >> k) & 1; };
    const auto choice = lru.Victim(&keep, pinned);
    const bool old_rule = choice.key == keep && lru.Victim(&keep).key != choice.key;
    EXPECT_EQ(choice.reason == Lru::VictimReason::kKeepSkipped, old_rule) << round;
    EXPECT_EQ(choice.key.has_value(), choice.reason != Lru::VictimReason::kNone) << round;
    keep_skipped += choice.reason == Lru::VictimReason::kKeepSkipped;
    keep_tail += choice.reason == Lru::VictimReason::kKeepTail;
  }
  EXPECT_GT(keep_skipped, 0);
  EXPECT_GT(keep_tail, 0);
}

TEST(ChainLruTest, ACycleOfLinksStillYieldsVictims) {
  Lru lru;
  lru.Add(1, 1, 2, true);
  lru.Add(2, 1, 1, true);  // no leaf at all
  EXPECT_EQ(EvictDownTo(lru, 0), (std::vector<int>{1, 2}));
  EXPECT_EQ(lru.pages(), 0);
}

TEST(ChainLruTest, FoundPagesAreOldestAndParentsStoredLaterCount) {
  Lru lru;
  lru.Add(2, 1, 1, true);              // its parent is not stored yet
  lru.Add(1, 1, std::nullopt, false);  // found: least recently used, but 2 names it
  lru.Add(3, 1, std::nullopt, true);
  EXPECT_EQ(lru.Order(), (std::vector<int>{3, 2, 1}));
  // 2 goes first (1 is its parent); then 1, a leaf older than 3.
  EXPECT_EQ(EvictDownTo(lru, 1), (std::vector<int>{2, 1}));
}

TEST(ChainLruTest, EvictedRemembersTheRecentVictimsOnly) {
  Lru lru;
  lru.Add(1, 1, std::nullopt, true);
  lru.Add(2, 1, std::nullopt, true);
  EXPECT_EQ(lru.Evict(1), 1);
  EXPECT_EQ(lru.Evict(1), -1);  // unknown now
  lru.Erase(2);                 // a removal, not an eviction
  EXPECT_TRUE(lru.Evicted(1));
  EXPECT_FALSE(lru.Evicted(2));
  // At most max(4096, 2 x pages) victims are remembered: the oldest go first.
  for (int i = 10; i < 10 + 5000; ++i) {
    lru.Add(i, 1, std::nullopt, true);
    lru.Evict(i);
  }
  EXPECT_FALSE(lru.Evicted(1));
  EXPECT_FALSE(lru.Evicted(10 + 5000 - 4097));
  EXPECT_TRUE(lru.Evicted(10 + 5000 - 4096));
  EXPECT_TRUE(lru.Evicted(10 + 4999));
}

// Random prompts (chains branching off each other) written, read and evicted under a capacity:
// after every step, every stored page's parent is stored, and the bytes fit.
TEST(ChainLruTest, RandomForestsNeverStrandAPage) {
  for (uint32_t seed = 1; seed <= 20; ++seed) {
    std::mt19937 rng(seed);
    Lru lru;
    std::vector<std::optional<int>> parent_of;  // by page id
    std::vector<std::vector<int>> prompts;
    const int64_t capacity = 40 + static_cast<int64_t>(rng() % 60);
    int64_t evicted = 0;
    for (int step = 0; step < 3000; ++step) {
      const uint32_t op = rng() % 10;
      std::vector<int> prompt;
      if (op < 5 || prompts.empty()) {  // a new prompt: maybe a shared prefix, then new pages
        if (!prompts.empty() && rng() % 2 == 0) {
          const auto& base = prompts[rng() % prompts.size()];
          prompt.assign(base.begin(), base.begin() + static_cast<long>(rng() % base.size() + 1));
        }
        const int fresh = 1 + static_cast<int>(rng() % 12);
        for (int i = 0; i < fresh; ++i) {
          const int id = static_cast<int>(parent_of.size());
          parent_of.push_back(prompt.empty() ? std::nullopt : std::optional<int>(prompt.back()));
          prompt.push_back(id);
        }
        prompts.push_back(prompt);
      } else {
        prompt = prompts[rng() % prompts.size()];
      }
      // A lookup: the stored prefix is read (touched head first); the rest is written after it,
      // as a cache stores what a request computed.
      size_t hit = 0;
      while (hit < prompt.size() && lru.Contains(prompt[hit])) lru.Touch(prompt[hit++]);
      for (size_t i = hit; i < prompt.size(); ++i) {
        lru.Add(prompt[i], 1 + static_cast<int64_t>(rng() % 3), parent_of[prompt[i]], true);
        const int keep = prompt[i];
        evicted += static_cast<int64_t>(EvictDownTo(lru, capacity, &keep).size());
        if (!lru.Contains(keep)) break;  // the tail went: the rest of the prompt is not stored
      }
      ASSERT_LE(lru.bytes(), capacity) << "seed " << seed << " step " << step;
      for (int id : lru.Order()) {
        const std::optional<int> p = parent_of[id];
        ASSERT_TRUE(!p || lru.Contains(*p)) << "seed " << seed << " step " << step << ": page "
                                            << id << " stored, parent " << *p << " gone";
      }
    }
    EXPECT_GT(evicted, 1000) << "seed " << seed << ": the capacity was not overfilled";
  }
}

}  // namespace
}  // namespace kvtier::storage
