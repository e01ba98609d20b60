// ChildMap: inserts, erases (tombstones) and replacements against a multimap model, with keys
// chosen to collide, across rehashes.
#include "cache/child_map.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <set>
#include <utility>
#include <vector>

namespace kvtier::detail {
namespace {

// Distinct fake node pointers (never dereferenced by the map).
RadixNode* Node(uintptr_t i) { return reinterpret_cast<RadixNode*>((i + 1) * 16); }

using Entries = std::set<std::pair<uint64_t, RadixNode*>>;

Entries Contents(const ChildMap& m) {
  Entries out;
  m.ForEach([&](uint64_t key, RadixNode* node) { EXPECT_TRUE(out.emplace(key, node).second); });
  return out;
}

Entries Contents(const std::multimap<uint64_t, RadixNode*>& model) {
  return Entries(model.begin(), model.end());
}

TEST(ChildMapTest, EmptyMapFindsNothing) {
  ChildMap m;
  EXPECT_TRUE(m.empty());
  EXPECT_EQ(m.Find(7, [](RadixNode*) { return true; }), nullptr);
}

TEST(ChildMapTest, CollidingKeysAreToldApartByThePredicate) {
  ChildMap m;
  m.Insert(42, Node(1));
  m.Insert(42, Node(2));
  m.Insert(43, Node(3));
  EXPECT_EQ(m.size(), 3u);
  EXPECT_EQ(m.Find(42, [](RadixNode* n) { return n == Node(2); }), Node(2));
  EXPECT_EQ(m.Find(42, [](RadixNode* n) { return n == Node(3); }), nullptr);
  m.Erase(42, Node(1));
  EXPECT_EQ(m.Find(42, [](RadixNode*) { return true; }), Node(2));  // past the tombstone
  m.Replace(42, Node(2), Node(4));
  EXPECT_EQ(m.Find(42, [](RadixNode*) { return true; }), Node(4));
  EXPECT_EQ(m.size(), 2u);
  m.Clear();
  EXPECT_TRUE(m.empty());
  EXPECT_EQ(m.Find(43, [](RadixNode*) { return true; }), nullptr);
}

TEST(ChildMapTest, RandomOperationsMatchAMultimap) {
  ChildMap m;
  std::multimap<uint64_t, RadixNode*> model;
  std::mt19937_64 rng(99);
  uintptr_t next = 0;
  for (int step = 0; step < 20000; ++step) {
    const uint64_t key = rng() % 37;  // few keys: many collisions
    const int op = static_cast<int>(rng() % 10);
    if (op < 5 || model.empty()) {
      RadixNode* n = Node(next++);
      m.Insert(key, n);
      model.emplace(key, n);
    } else {
      auto it = model.begin();
      std::advance(it, static_cast<long>(rng() % model.size()));
      if (op < 8) {
        m.Erase(it->first, it->second);
        model.erase(it);
      } else {
        RadixNode* n = Node(next++);
        m.Replace(it->first, it->second, n);
        it->second = n;
      }
    }
    ASSERT_EQ(m.size(), model.size());
    if (step % 97 == 0) {
      ASSERT_EQ(Contents(m), Contents(model)) << "step " << step;
    }
    const auto [lo, hi] = model.equal_range(key);
    for (auto it = lo; it != hi; ++it) {
      RadixNode* want = it->second;
      ASSERT_EQ(m.Find(key, [&](RadixNode* n) { return n == want; }), want);
    }
  }
  ASSERT_EQ(Contents(m), Contents(model));
}

}  // namespace
}  // namespace kvtier::detail
