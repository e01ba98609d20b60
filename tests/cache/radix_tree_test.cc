// RadixTree: matching, splitting, namespaces, residency, references, eviction order, and a
// randomised model-based test against a map of cached page prefixes.
#include "cache/radix_tree.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <set>

namespace kvtier {
namespace {

// Page starts of `n_tokens` tokens in consecutive pages from slot `first` (a multiple of P).
std::vector<int64_t> Pages(int64_t first, int64_t n_tokens, int64_t P = 1) {
  std::vector<int64_t> s(static_cast<size_t>(n_tokens / P));
  for (size_t i = 0; i < s.size(); ++i) s[i] = first + static_cast<int64_t>(i) * P;
  return s;
}

TEST(RadixTreeTest, EmptyTreeMatchesNothing) {
  RadixTree tree(4);
  std::vector<Token> t = {1, 2, 3, 4, 5, 6, 7, 8};
  auto r = tree.Match("", t);
  EXPECT_EQ(r.matched_tokens, 0);
  EXPECT_TRUE(r.last->is_root());
  EXPECT_EQ(tree.Peek("other", t).last, nullptr);
  ASSERT_TRUE(tree.CheckInvariants().ok());
}

TEST(RadixTreeTest, InsertThenMatchIsPageGranular) {
  RadixTree tree(4);
  std::vector<Token> t = {1, 2, 3, 4, 5, 6, 7, 8};
  std::vector<RadixTree::InsertSegment> seg;
  tree.Insert("", t, Pages(16, 8, 4), {}, &seg);
  ASSERT_EQ(seg.size(), 1u);
  EXPECT_EQ(seg[0].kind, RadixTree::SegmentKind::kNew);
  // A longer query with a partial last page matches the whole node.
  std::vector<Token> q = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
  auto r = tree.Match("", q);
  EXPECT_EQ(r.matched_tokens, 8);
  EXPECT_EQ(r.device_tokens, 8);
  EXPECT_EQ(r.host_tokens, 0);
  EXPECT_EQ(std::vector<int64_t>(r.last->device_pages().begin(), r.last->device_pages().end()),
            Pages(16, 8, 4));
  // A mismatch inside the second page matches only the first page, and splits the node.
  std::vector<Token> q2 = {1, 2, 3, 4, 5, 6, 0, 8};
  auto r2 = tree.Match("", q2);
  EXPECT_EQ(r2.matched_tokens, 4);
  EXPECT_EQ(r2.last->num_tokens(), 4);
  EXPECT_EQ(tree.num_nodes(), 2);
  EXPECT_EQ(r.last->parent(), r2.last);  // the old node kept its identity as the lower half
  EXPECT_EQ(r.last->device_pages()[0], 20);
  // Fewer tokens than one page match nothing.
  EXPECT_EQ(tree.Match("", std::vector<Token>{1, 2, 3}).matched_tokens, 0);
  ASSERT_TRUE(tree.CheckInvariants().ok()) << tree.CheckInvariants().ToString();
}

TEST(RadixTreeTest, InsertReportsExistingRevivedAndNewParts) {
  RadixTree tree(2);
  std::vector<Token> a = {1, 2, 3, 4};
  tree.Insert("", a, Pages(0, 4, 2), {}, nullptr);
  // Move the node to host only.
  auto r = tree.Match("", a);
  tree.SetHostPages(r.last, Pages(100, 4, 2));
  tree.TakeDevicePages(r.last);
  std::vector<Token> b = {1, 2, 3, 4, 5, 6};
  std::vector<RadixTree::InsertSegment> seg;
  tree.Insert("", b, Pages(10, 6, 2), {}, &seg);
  ASSERT_EQ(seg.size(), 2u);
  EXPECT_EQ(seg[0].kind, RadixTree::SegmentKind::kRevived);
  EXPECT_EQ(seg[0].node->device_pages()[0], 10);
  EXPECT_EQ(seg[0].node->host_pages()[0], 100);
  EXPECT_EQ(seg[1].kind, RadixTree::SegmentKind::kNew);
  EXPECT_EQ(seg[1].begin, 4);
  seg.clear();
  tree.Insert("", b, Pages(30, 6, 2), {}, &seg);
  ASSERT_EQ(seg.size(), 2u);
  EXPECT_EQ(seg[0].kind, RadixTree::SegmentKind::kOnDevice);
  EXPECT_EQ(seg[1].kind, RadixTree::SegmentKind::kOnDevice);
  EXPECT_EQ(tree.device_tokens(), 6);
  ASSERT_TRUE(tree.CheckInvariants().ok()) << tree.CheckInvariants().ToString();
}

TEST(RadixTreeTest, NamespacesNeverShareAPrefix) {
  RadixTree tree(1);
  std::vector<Token> t = {7, 8, 9};
  tree.Insert("tenant-a", t, Pages(0, 3), {}, nullptr);
  EXPECT_EQ(tree.Match("tenant-b", t).matched_tokens, 0);
  EXPECT_EQ(tree.Match("", t).matched_tokens, 0);
  EXPECT_EQ(tree.Match("tenant-a", t).matched_tokens, 3);
  tree.Insert("tenant-b", t, Pages(3, 3), {}, nullptr);
  EXPECT_EQ(tree.Match("tenant-b", t).last->device_pages()[0], 3);
  EXPECT_EQ(tree.Match("tenant-a", t).last->device_pages()[0], 0);
  EXPECT_EQ(tree.Match("tenant-a", t).last->name_space(), "tenant-a");
  ASSERT_TRUE(tree.CheckInvariants().ok());
}

// Matching a namespace nothing was inserted into creates nothing: a server probed with
// arbitrary namespace names keeps a tree of the namespaces it holds KV for.
TEST(RadixTreeTest, MatchingUnknownNamespacesCreatesNothing) {
  RadixTree tree(2);
  std::vector<Token> t = {1, 2, 3, 4};
  for (int i = 0; i < 1000; ++i) {
    auto r = tree.Match("probe-" + std::to_string(i), t);
    EXPECT_EQ(r.matched_tokens, 0);
    ASSERT_NE(r.last, nullptr);
    EXPECT_TRUE(r.last->is_root());
    EXPECT_EQ(r.last->prefix_tokens(), 0);
    tree.IncRef(r.last);  // a pin on a root pins nothing
    tree.DecRef(r.last);
  }
  EXPECT_EQ(tree.num_namespaces(), 0);
  EXPECT_EQ(tree.num_nodes(), 0);
  tree.Insert("tenant", t, Pages(0, 4, 2), {}, nullptr);
  EXPECT_EQ(tree.num_namespaces(), 1);
  EXPECT_EQ(tree.Match("tenant", t).matched_tokens, 4);
  EXPECT_EQ(tree.Match("probe-1", t).matched_tokens, 0);
  EXPECT_EQ(tree.num_namespaces(), 1);
  ASSERT_TRUE(tree.CheckInvariants().ok()) << tree.CheckInvariants().ToString();
}

TEST(RadixTreeTest, ReferencedNodesAndAncestorsAreNotEvictable) {
  RadixTree tree(1);
  tree.Insert("", std::vector<Token>{1, 2}, Pages(0, 2), {}, nullptr);
  tree.Insert("", std::vector<Token>{1, 2, 3, 4}, Pages(10, 4), {}, nullptr);  // leaf {3,4}
  tree.Insert("", std::vector<Token>{1, 2, 5}, Pages(20, 3), {}, nullptr);     // leaf {5}
  auto leaf = tree.Match("", std::vector<Token>{1, 2, 3, 4}).last;
  tree.IncRef(leaf);
  EXPECT_EQ(leaf->parent()->ref_count(), 1);
  // Only {5} is evictable: {3,4} is pinned and {1,2} has device children.
  ASSERT_NE(tree.DeviceVictim(), nullptr);
  EXPECT_EQ(tree.DeviceVictim()->tokens()[0], 5);
  EXPECT_EQ(tree.device_evictable_nodes(), 1);
  auto v = tree.DeviceVictim();
  tree.TakeDevicePages(v);
  tree.RemoveSubtree(v);
  EXPECT_EQ(tree.DeviceVictim(), nullptr);
  tree.DecRef(leaf);
  EXPECT_EQ(tree.DeviceVictim(), leaf);
  ASSERT_TRUE(tree.CheckInvariants().ok()) << tree.CheckInvariants().ToString();
}

TEST(RadixTreeTest, PoliciesOrderVictims) {
  for (auto kind : {EvictionPolicyKind::kLru, EvictionPolicyKind::kLfu, EvictionPolicyKind::kFifo,
                    EvictionPolicyKind::kPriority}) {
    SCOPED_TRACE(EvictionPolicyName(kind));
    RadixTree tree(1, MakeEvictionPolicy(kind));
    tree.Insert("", std::vector<Token>{1}, Pages(0, 1), {}, nullptr);  // oldest
    tree.Insert("", std::vector<Token>{2}, Pages(1, 1), {}, nullptr);
    tree.Insert("", std::vector<Token>{3}, Pages(2, 1), {}, nullptr);  // newest
    auto n1 = tree.Match("", std::vector<Token>{1}).last;
    auto n2 = tree.Match("", std::vector<Token>{2}).last;
    auto n3 = tree.Match("", std::vector<Token>{3}).last;
    tree.Touch(n1, 5);  // most recently used and most hit
    tree.Touch(n3, 1);
    tree.RaisePriority(n2, 9);
    tree.RaisePriority(n3, 4);
    const RadixNode* want = nullptr;
    switch (kind) {
      case EvictionPolicyKind::kLru:
        want = n2;
        break;  // n2 untouched since creation
      case EvictionPolicyKind::kLfu:
        want = n2;
        break;  // hits: 6, 1, 2
      case EvictionPolicyKind::kFifo:
        want = n1;
        break;  // created first
      case EvictionPolicyKind::kPriority:
        want = n1;
        break;  // priority 0
    }
    EXPECT_EQ(tree.DeviceVictim(), want);
    ASSERT_TRUE(tree.CheckInvariants().ok()) << tree.CheckInvariants().ToString();
  }
}

TEST(RadixTreeTest, HostEvictionOnlyTakesHostOnlyLeaves) {
  RadixTree tree(1);
  tree.Insert("", std::vector<Token>{1, 2}, Pages(0, 2), {}, nullptr);
  tree.Insert("", std::vector<Token>{1, 2, 3}, Pages(10, 3), {}, nullptr);
  auto top = tree.Match("", std::vector<Token>{1, 2}).last;
  auto leaf = tree.Match("", std::vector<Token>{1, 2, 3}).last;
  tree.SetHostPages(top, Pages(50, 2));
  tree.SetHostPages(leaf, Pages(52, 1));
  EXPECT_EQ(tree.HostVictim(), nullptr);  // both still on the device
  tree.TakeDevicePages(leaf);
  EXPECT_EQ(tree.HostVictim(), leaf);
  EXPECT_EQ(tree.DeviceVictim(), top);
  auto r = tree.Match("", std::vector<Token>{1, 2, 3});
  EXPECT_EQ(r.device_tokens, 2);
  EXPECT_EQ(r.host_tokens, 1);
  ASSERT_TRUE(tree.CheckInvariants().ok()) << tree.CheckInvariants().ToString();
}

TEST(RadixTreeTest, SplitCarriesPinsAndStats) {
  RadixTree tree(2);
  tree.Insert("", std::vector<Token>{1, 2, 3, 4, 5, 6}, Pages(0, 6, 2), {}, nullptr);
  auto whole = tree.Match("", std::vector<Token>{1, 2, 3, 4, 5, 6}).last;
  tree.IncRef(whole);
  tree.Touch(whole, 3);
  int hooks = 0;
  tree.SetSplitHook([&](RadixNode* upper, RadixNode* lower) {
    ++hooks;
    EXPECT_EQ(lower, whole);
    EXPECT_EQ(upper->ref_count(), 1);
    EXPECT_EQ(upper->hit_count(), 4);
  });
  auto r = tree.Match("", std::vector<Token>{1, 2, 3, 4, 9, 9});
  EXPECT_EQ(hooks, 1);
  EXPECT_EQ(r.matched_tokens, 4);
  EXPECT_EQ(whole->num_tokens(), 2);
  EXPECT_EQ(whole->prefix_tokens(), 6);
  tree.DecRef(whole);
  EXPECT_EQ(r.last->ref_count(), 0);
  ASSERT_TRUE(tree.CheckInvariants().ok()) << tree.CheckInvariants().ToString();
}

// The child map against a multimap, with many shared keys (hash collisions) and churn. Nodes are
// stand-in pointers: the map compares them and never dereferences them.
TEST(RadixTreeTest, RetainedNodesLeaveNoNamedTierAndStayInTheTree) {
  RadixTree tree(1);
  using Tier = RadixTree::Tier;
  std::vector<Token> a = {1, 2, 3, 4};
  tree.Insert("", a, Pages(0, 4), {}, nullptr);
  RadixNode* node = tree.Match("", a).last;
  tree.Retain(node, RadixTree::TierBit(Tier::kDevice), +1);
  EXPECT_EQ(tree.DeviceVictim(), nullptr);
  EXPECT_EQ(tree.retained_tokens(Tier::kDevice), 4);
  EXPECT_EQ(tree.held_device_tokens(), 4);
  EXPECT_EQ(tree.RetainCost(node, Tier::kDevice), 0);
  EXPECT_EQ(tree.RetainCost(node, Tier::kHost), 4);
  // A split hands the retention to both halves; a child below is not retained.
  RadixNode* upper = tree.Match("", std::vector<Token>{1, 2, 9}).last;
  EXPECT_EQ(upper->retained(0), 1);
  EXPECT_EQ(node->retained(0), 1);
  tree.Insert("", std::vector<Token>{1, 2, 3, 4, 5}, Pages(0, 5), {}, nullptr);
  RadixNode* child = tree.DeviceVictim();
  ASSERT_NE(child, nullptr);
  EXPECT_EQ(child->retained(0), 0);
  EXPECT_EQ(child->num_tokens(), 1);
  ASSERT_TRUE(tree.CheckInvariants().ok()) << tree.CheckInvariants().ToString();
  // Retained in host memory only: the device copy goes, the node stays (resident nowhere here,
  // not stored: an orphan kept for the pin) and is not filed for removal.
  tree.Retain(node, RadixTree::TierBit(Tier::kDevice), -1);
  tree.Retain(node, RadixTree::TierBit(Tier::kHost), +1);
  std::vector<int64_t> freed;
  tree.TakeDevicePages(child, &freed);
  tree.RemoveSubtree(child);
  tree.TakeDevicePages(node, &freed);
  tree.TakeDevicePages(upper, &freed);
  EXPECT_EQ(freed.size(), 5u);
  EXPECT_FALSE(node->resident());
  EXPECT_EQ(tree.StorageVictim(), nullptr);
  EXPECT_FALSE(tree.DropDeviceLeaf(node, &freed));
  ASSERT_TRUE(tree.CheckInvariants().ok()) << tree.CheckInvariants().ToString();
  tree.Retain(node, RadixTree::TierBit(Tier::kHost), -1);
  EXPECT_EQ(tree.StorageVictim(), node) << "released: waits for removal";
  EXPECT_EQ(tree.retained_tokens(Tier::kHost), 0);
  ASSERT_TRUE(tree.CheckInvariants().ok()) << tree.CheckInvariants().ToString();
}

TEST(ChildMapTest, AgreesWithMultimapUnderChurnAndCollisions) {
  std::mt19937_64 rng(11);
  detail::ChildMap map;
  std::multimap<uint64_t, RadixNode*> model;
  auto fake = [](uint64_t i) { return reinterpret_cast<RadixNode*>(uintptr_t{16} * (i + 1)); };
  uint64_t next = 0;
  for (int step = 0; step < 20000; ++step) {
    const uint64_t key = rng() % 64;  // few keys: many collisions
    if (rng() % 3 != 0 || model.empty()) {
      RadixNode* n = fake(next++);
      map.Insert(key, n);
      model.emplace(key, n);
    } else {
      auto it = model.begin();
      std::advance(it, static_cast<std::ptrdiff_t>(rng() % model.size()));
      map.Erase(it->first, it->second);
      model.erase(it);
    }
    ASSERT_EQ(map.size(), model.size());
    const uint64_t probe = rng() % 64;
    auto [lo, hi] = model.equal_range(probe);
    for (auto it = lo; it != hi; ++it) {
      RadixNode* want = it->second;
      ASSERT_EQ(map.Find(probe, [&](const RadixNode* x) { return x == want; }), want);
    }
    ASSERT_EQ(map.Find(probe, [](const RadixNode*) { return false; }), nullptr);
  }
  size_t seen = 0;
  map.ForEach([&](uint64_t key, RadixNode* n) {
    ++seen;
    auto [lo, hi] = model.equal_range(key);
    EXPECT_TRUE(std::any_of(lo, hi, [&](const auto& kv) { return kv.second == n; }));
  });
  EXPECT_EQ(seen, model.size());
  // Replace keeps the slot.
  if (!model.empty()) {
    auto it = model.begin();
    map.Replace(it->first, it->second, fake(1'000'000));
    EXPECT_EQ(map.Find(it->first, [&](const RadixNode* x) { return x == fake(1'000'000); }),
              fake(1'000'000));
  }
}

// ---- randomised model-based test ------------------------------------------------------------

// Model: for each (namespace, page-prefix) the tiers it is cached in.
struct PageState {
  bool device = false;
  bool host = false;
};
using Key = std::pair<std::string, std::vector<Token>>;

class TreeModelTest : public ::testing::TestWithParam<int64_t> {};

TEST_P(TreeModelTest, RandomOperationsAgreeWithModel) {
  const int64_t P = GetParam();
  for (uint64_t seed = 1; seed <= 4; ++seed) {
    SCOPED_TRACE(fmt::format("seed {} page_size {}", seed, P));
    std::mt19937_64 rng(seed);
    RadixTree tree(P, MakeEvictionPolicy(static_cast<EvictionPolicyKind>(seed % 4)));
    std::map<Key, PageState> model;
    std::vector<std::pair<std::string, std::vector<Token>>> seqs;
    std::multiset<Key> pinned_prefixes;  // page prefixes covered by a pin
    std::vector<std::pair<RadixNode*, std::vector<Key>>> pins;
    int64_t next_slot = 0;
    const std::vector<std::string> namespaces = {"", "a", "b"};
    auto page_keys = [&](const std::string& ns, const std::vector<Token>& t, int64_t pages) {
      std::vector<Key> keys;
      for (int64_t p = 1; p <= pages; ++p) keys.push_back({ns, {t.begin(), t.begin() + p * P}});
      return keys;
    };
    auto random_seq = [&]() {
      std::vector<Token> t;
      if (!seqs.empty() && rng() % 3 != 0) {
        const auto& base = seqs[rng() % seqs.size()].second;
        t.assign(base.begin(), base.begin() + (rng() % (base.size() + 1)));
      }
      const int64_t extra = static_cast<int64_t>(rng() % 5) * P + static_cast<int64_t>(rng() % P);
      for (int64_t i = 0; i < extra; ++i) t.push_back(static_cast<Token>(rng() % 3));
      return t;
    };
    for (int step = 0; step < 1500; ++step) {
      SCOPED_TRACE(fmt::format("step {}", step));
      const int op = static_cast<int>(rng() % 7);
      const std::string& ns = namespaces[rng() % namespaces.size()];
      if (op <= 1) {  // insert
        auto t = random_seq();
        t.resize(t.size() / P * P);
        if (t.empty()) continue;
        tree.Insert(ns, t, Pages(next_slot, static_cast<int64_t>(t.size()), P), {}, nullptr);
        next_slot += static_cast<int64_t>(t.size());
        for (auto& k : page_keys(ns, t, static_cast<int64_t>(t.size()) / P)) model[k].device = true;
        seqs.push_back({ns, t});
      } else if (op == 2) {  // match and compare
        auto t = random_seq();
        auto r = tree.Match(ns, t);
        int64_t dev = 0, host = 0;
        bool dev_run = true;
        for (auto& k : page_keys(ns, t, static_cast<int64_t>(t.size()) / P)) {
          auto it = model.find(k);
          if (it == model.end() || (!it->second.device && !it->second.host)) break;
          if (dev_run && it->second.device) {
            dev += P;
          } else {
            dev_run = false;
            if (it->second.device) FAIL() << "device page below a host-only page";
            host += P;
          }
        }
        ASSERT_EQ(r.device_tokens, dev);
        ASSERT_EQ(r.host_tokens, host);
        ASSERT_EQ(r.matched_tokens, dev + host);
        ASSERT_EQ(r.last->prefix_tokens(), dev + host);
        if (r.matched_tokens > 0 && rng() % 2 == 0) {  // pin it
          tree.IncRef(r.last);
          auto keys = page_keys(ns, t, r.matched_tokens / P);
          for (auto& k : keys) pinned_prefixes.insert(k);
          pins.push_back({r.last, keys});
        }
      } else if (op == 3 && !pins.empty()) {  // unpin
        const size_t i = rng() % pins.size();
        tree.DecRef(pins[i].first);
        for (auto& k : pins[i].second) pinned_prefixes.erase(pinned_prefixes.find(k));
        pins.erase(pins.begin() + static_cast<std::ptrdiff_t>(i));
      } else if (op == 4) {  // evict a device victim
        RadixNode* v = tree.DeviceVictim();
        if (v == nullptr) continue;
        ASSERT_EQ(v->ref_count(), 0);
        const auto prefix = tree.PrefixTokens(v);
        const std::string vns = v->name_space();
        const bool keep = v->on_host();
        const int64_t first_page = (v->prefix_tokens() - v->num_tokens()) / P;
        auto keys = page_keys(vns, prefix, v->prefix_tokens() / P);
        tree.TakeDevicePages(v);
        if (!keep) tree.RemoveSubtree(v);
        for (size_t p = static_cast<size_t>(first_page); p < keys.size(); ++p) {
          ASSERT_EQ(pinned_prefixes.count(keys[p]), 0u) << "evicted a pinned page";
          ASSERT_TRUE(model[keys[p]].device);
          model[keys[p]].device = false;
          if (!keep) model.erase(keys[p]);
        }
      } else if (op == 5) {  // evict a host victim
        RadixNode* v = tree.HostVictim();
        if (v == nullptr) continue;
        ASSERT_FALSE(v->on_device());
        ASSERT_EQ(v->num_children(), 0u);
        const auto prefix = tree.PrefixTokens(v);
        const std::string vns = v->name_space();
        const int64_t first_page = (v->prefix_tokens() - v->num_tokens()) / P;
        auto keys = page_keys(vns, prefix, v->prefix_tokens() / P);
        tree.TakeHostPages(v);
        tree.RemoveSubtree(v);
        for (size_t p = static_cast<size_t>(first_page); p < keys.size(); ++p) {
          ASSERT_EQ(pinned_prefixes.count(keys[p]), 0u) << "evicted a pinned page";
          model.erase(keys[p]);
        }
      } else if (op == 6 && !seqs.empty()) {  // back up the device prefix of a sequence
        const auto& [sns, t] = seqs[rng() % seqs.size()];
        auto r = tree.Match(sns, t);
        std::vector<RadixNode*> path;
        for (RadixNode* n = r.last; !n->is_root(); n = n->parent()) path.push_back(n);
        std::reverse(path.begin(), path.end());
        int64_t pos = 0;
        for (RadixNode* n : path) {
          if (!n->on_device()) break;
          if (!n->on_host()) {
            tree.SetHostPages(n, Pages(1000 * 1000 * P + next_slot, n->num_tokens(), P));
            next_slot += n->num_tokens();
          }
          pos += n->num_tokens();
        }
        for (auto& k : page_keys(sns, t, pos / P)) model[k].host = true;
      }
      const Status st = tree.CheckInvariants();
      ASSERT_TRUE(st.ok()) << st.ToString();
      int64_t dev_tokens = 0, host_tokens = 0;
      for (auto& [k, s] : model) {
        dev_tokens += s.device ? P : 0;
        host_tokens += s.host ? P : 0;
      }
      ASSERT_EQ(tree.device_tokens(), dev_tokens);
      ASSERT_EQ(tree.host_tokens(), host_tokens);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(PageSizes, TreeModelTest, ::testing::Values(1, 2, 16),
                         [](const auto& info) { return fmt::format("page{}", info.param); });

}  // namespace
}  // namespace kvtier

namespace kvtier {
namespace {

// Setting an empty page list takes a node off that tier: its parent's count of children on the
// tier follows (CheckInvariants recounts them).
TEST(RadixTreeTest, SettingEmptyPagesTakesTheNodeOffTheTier) {
  RadixTree tree(2);
  std::vector<Token> a = {1, 2, 3, 4};
  std::vector<Token> b = {1, 2, 5, 6};
  tree.Insert("", a, Pages(0, 4, 2), {}, nullptr);
  tree.Insert("", b, Pages(8, 4, 2), {}, nullptr);  // splits: {1,2} -> {3,4}, {5,6}
  auto r = tree.Match("", a);
  ASSERT_EQ(r.matched_tokens, 4);
  RadixNode* parent = r.last->parent();
  ASSERT_EQ(parent->device_children(), 2);
  // Back the path up first: a node must stay resident somewhere, and host copies form a prefix.
  tree.SetHostPages(parent, Pages(200, 2, 2));
  tree.SetHostPages(r.last, Pages(100, 2, 2));
  tree.SetDevicePages(r.last, {});
  EXPECT_EQ(parent->device_children(), 1);
  EXPECT_TRUE(tree.CheckInvariants().ok()) << tree.CheckInvariants().ToString();
  tree.SetDevicePages(r.last, Pages(2, 2, 2));
  EXPECT_EQ(parent->device_children(), 2);
  EXPECT_TRUE(tree.CheckInvariants().ok()) << tree.CheckInvariants().ToString();
}

}  // namespace
}  // namespace kvtier
