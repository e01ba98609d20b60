// KvEventEmitter over a real RadixTree: random inserts, splits, backups, evictions, stores and
// forgets; after every step the events so far, applied as a router applies them, give exactly the
// tree's block hashes per tier (CachedBlocksOf), no BlockStored names a block its medium already
// has and no BlockRemoved one it lacks, and every BlockStored's hashes are what a router computes
// from its token ids and parent hash alone.
#include "cache/kv_event_emitter.h"

#include <gtest/gtest.h>

#include <map>
#include <random>
#include <set>

#include "cache/radix_tree.h"
#include "kvtier/kv_events.h"
#include "kvtier/page_key.h"

namespace kvtier {
namespace {

class CapturingSink : public KvEventSink {
 public:
  void Publish(std::vector<KvEvent> events) override {
    ASSERT_FALSE(events.empty());
    batches.push_back(std::move(events));
  }
  std::vector<std::vector<KvEvent>> batches;
};

// A router's view: per medium, the blocks it holds.
struct RouterView {
  std::map<std::string, std::set<uint64_t>> media;
  // Full keys of every page the test created, for checking hashes from tokens.
  const std::map<uint64_t, PageKey>* known = nullptr;
  const std::vector<std::string>* namespaces = nullptr;
  int64_t page_size = 0;

  void Apply(const KvEvent& event) {
    if (const auto* s = std::get_if<BlockStored>(&event)) {
      ASSERT_TRUE(s->medium.has_value());
      ASSERT_EQ(s->block_size, page_size);
      ASSERT_EQ(static_cast<int64_t>(s->token_ids.size()),
                static_cast<int64_t>(s->block_hashes.size()) * page_size);
      CheckHashesFromTokens(*s);
      for (uint64_t h : s->block_hashes) {
        ASSERT_TRUE(media[*s->medium].insert(h).second) << "stored twice in " << *s->medium;
      }
    } else if (const auto* r = std::get_if<BlockRemoved>(&event)) {
      ASSERT_TRUE(r->medium.has_value());
      for (uint64_t h : r->block_hashes) {
        ASSERT_EQ(media[*r->medium].erase(h), 1u) << "removed what " << *r->medium << " lacks";
      }
    } else {
      FAIL() << "the cache never clears every medium";
    }
  }

  void CheckHashesFromTokens(const BlockStored& s) {
    std::vector<std::optional<PageKey>> starts;
    if (s.parent_block_hash) {
      auto it = known->find(*s.parent_block_hash);
      ASSERT_NE(it, known->end()) << "parent hash of no page";
      starts.push_back(it->second);
    } else {
      for (const std::string& ns : *namespaces) starts.push_back(ChainSeed(ns));
    }
    bool matched = false;
    for (const auto& previous : starts) {
      auto keys = ComputePageKeys(std::span<const int32_t>(s.token_ids), page_size, previous);
      ASSERT_TRUE(keys.ok());
      std::vector<uint64_t> hashes;
      for (const PageKey& k : *keys) hashes.push_back(BlockHashOf(k));
      matched = matched || hashes == s.block_hashes;
    }
    ASSERT_TRUE(matched) << "block hashes are not the page keys of the token ids";
  }
};

std::vector<int64_t> Pages(int64_t first_slot, int64_t tokens, int64_t page_size) {
  std::vector<int64_t> out;
  for (int64_t t = 0; t < tokens; t += page_size) out.push_back(first_slot + t);
  return out;
}

class KvEventEmitterTest : public ::testing::TestWithParam<int64_t> {};

TEST_P(KvEventEmitterTest, EventsRebuildTheTreesTiers) {
  const int64_t P = GetParam();
  const std::vector<std::string> namespaces = {"", "tenant"};
  for (uint64_t seed = 1; seed <= 3; ++seed) {
    SCOPED_TRACE(::testing::Message() << "seed " << seed << " page_size " << P);
    std::mt19937_64 rng(seed);
    RadixTree tree(P);
    auto sink = std::make_shared<CapturingSink>();
    KvEventEmitter emitter(sink, P, std::string(kMediumDisk));
    tree.SetTierHook([&](const RadixNode& n, RadixTree::Tier t, bool entered) {
      emitter.OnTierChange(n, t, entered);
    });
    std::map<uint64_t, PageKey> known;
    RouterView view{{}, &known, &namespaces, P};
    std::vector<std::pair<std::string, std::vector<Token>>> seqs;
    int64_t next_slot = 0;
    size_t applied = 0;
    auto random_node = [&]() -> RadixNode* {
      std::vector<RadixNode*> nodes;
      tree.ForEachNode([&](const RadixNode& n) { nodes.push_back(const_cast<RadixNode*>(&n)); });
      return nodes.empty() ? nullptr : nodes[rng() % nodes.size()];
    };
    for (int step = 0; step < 600; ++step) {
      const int op = static_cast<int>(rng() % 9);
      SCOPED_TRACE(::testing::Message() << "step " << step << " op " << op);
      const std::string& ns = namespaces[rng() % namespaces.size()];
      if (op <= 1) {  // insert on the device, with keys, often sharing a prefix
        std::vector<Token> t;
        if (!seqs.empty() && rng() % 2) {
          const auto& base = seqs[rng() % seqs.size()];
          if (base.first == ns) t.assign(base.second.begin(), base.second.end());
          t.resize(t.size() / P * (rng() % 2) * P);
        }
        const int64_t pages = 1 + static_cast<int64_t>(rng() % 4);
        for (int64_t i = 0; i < pages * P; ++i) t.push_back(static_cast<Token>(rng() % 5));
        t.resize(t.size() / P * P);
        auto keys = ComputePromptPageKeys(t, P, ns);
        ASSERT_TRUE(keys.ok());
        for (const PageKey& k : *keys) known[BlockHashOf(k)] = k;
        tree.Insert(ns, t, Pages(next_slot, static_cast<int64_t>(t.size()), P), *keys, nullptr);
        next_slot += static_cast<int64_t>(t.size());
        seqs.push_back({ns, t});
      } else if (op == 2) {  // device eviction of a tail, as the cache does it
        RadixNode* v = tree.DeviceVictim();
        if (v == nullptr) continue;
        const int64_t pages = v->num_tokens() / P;
        v = tree.SplitAfter(v, static_cast<int64_t>(rng() % pages));
        std::vector<int64_t> freed;
        if (!tree.DropDeviceLeaf(v, &freed)) {
          tree.TakeDevicePages(v, &freed);
          if (!v->resident() && v->num_children() == 0) tree.RemoveSubtree(v);
        }
      } else if (op == 3) {  // back up a node's device path to host memory
        RadixNode* n = random_node();
        if (n == nullptr || !n->on_device()) continue;
        for (RadixNode* x = n; !x->is_root() && x->on_device() && !x->on_host(); x = x->parent()) {
          tree.SetHostPages(x, Pages(1 << 30 | next_slot, x->num_tokens(), P));
          next_slot += x->num_tokens();
        }
      } else if (op == 4) {  // host eviction
        RadixNode* v = tree.HostVictim();
        if (v == nullptr) continue;
        (void)tree.TakeHostPages(v);
        if (!v->resident()) tree.RemoveSubtree(v);
      } else if (op == 5) {  // a store completes (or is reported gone)
        RadixNode* n = random_node();
        if (n == nullptr) continue;
        tree.SetStored(n, rng() % 3 != 0);
        if (!n->resident() && n->num_children() == 0 && n->ref_count() == 0) tree.RemoveSubtree(n);
      } else if (op == 6 && !seqs.empty()) {  // storage found pages another process stored
        const auto& [sns, t] = seqs[rng() % seqs.size()];
        std::vector<Token> more = t;
        for (int64_t i = 0; i < P * 2; ++i) more.push_back(static_cast<Token>(rng() % 5));
        auto keys = ComputePromptPageKeys(more, P, sns);
        ASSERT_TRUE(keys.ok());
        for (const PageKey& k : *keys) known[BlockHashOf(k)] = k;
        auto r = tree.Match(sns, more);
        const int64_t from = r.matched_tokens / P;
        RadixNode* deepest = tree.AddStored(
            from > 0 ? r.last : nullptr, sns, std::span<const Token>(more).subspan(from * P),
            std::span<const PageKey>(*keys).subspan(static_cast<size_t>(from)));
        tree.IncRef(deepest);  // QueryStorage pins what it found (which refreshes the path)
        tree.DecRef(deepest);
      } else if (op == 7) {  // forget a storage-only node
        RadixNode* v = tree.StorageVictim();
        if (v != nullptr) tree.RemoveSubtree(v);
      } else {  // a split changes no tier
        RadixNode* n = random_node();
        if (n != nullptr && n->num_tokens() > P) {
          tree.SplitAfter(n, 1 + static_cast<int64_t>(rng() % (n->num_tokens() / P - 1)));
        }
      }
      emitter.Flush();
      for (; applied < sink->batches.size(); ++applied) {
        for (const KvEvent& e : sink->batches[applied]) {
          view.Apply(e);
          if (::testing::Test::HasFatalFailure()) return;
        }
      }
      ASSERT_EQ(emitter.nodes_without_keys(), 0);
      const Status invariants = tree.CheckInvariants();
      ASSERT_TRUE(invariants.ok()) << invariants.ToString();
      auto blocks = CachedBlocksOf(tree);
      ASSERT_TRUE(blocks.ok());
      auto sorted = [](const std::set<uint64_t>& s) {
        return std::vector<uint64_t>(s.begin(), s.end());
      };
      ASSERT_EQ(sorted(view.media[std::string(kMediumGpu)]), blocks->device);
      ASSERT_EQ(sorted(view.media[std::string(kMediumCpuPinned)]), blocks->host);
      ASSERT_EQ(sorted(view.media[std::string(kMediumDisk)]), blocks->storage);
    }
    EXPECT_GT(sink->batches.size(), 100u);
  }
}

INSTANTIATE_TEST_SUITE_P(PageSizes, KvEventEmitterTest, ::testing::Values(1, 4, 16),
                         [](const auto& info) { return "page" + std::to_string(info.param); });

TEST(KvEventEmitterTest, CachedBlocksKeysNodesWithoutKeysFromTheirPrefix) {
  RadixTree tree(2);
  const std::vector<Token> t = {1, 2, 3, 4, 5, 6};
  tree.Insert("ns", t, Pages(0, 6, 2), {}, nullptr);  // no keys (events off)
  auto blocks = CachedBlocksOf(tree);
  ASSERT_TRUE(blocks.ok());
  auto keys = ComputePromptPageKeys(t, 2, "ns");
  ASSERT_TRUE(keys.ok());
  std::vector<uint64_t> expected;
  for (const PageKey& k : *keys) expected.push_back(BlockHashOf(k));
  std::sort(expected.begin(), expected.end());
  EXPECT_EQ(blocks->device, expected);
  EXPECT_TRUE(blocks->host.empty());
  EXPECT_TRUE(blocks->storage.empty());
}

}  // namespace
}  // namespace kvtier
