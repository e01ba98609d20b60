// StoreKvEvents (kvtier/kv_events.h, "a page store's events") over a real memory:// store: random
// prompts written with their parents into a store that holds a few of them, each set's outcome
// handed to OnSet and removals to OnRemove, the events replayed by a recording sink — after every
// call the replayed set of block hashes is exactly what the store holds. Also: one event per run
// of chained pages, the page dropped at once, the config's checks.
#include <gtest/gtest.h>

#include <algorithm>
#include <mutex>
#include <random>
#include <set>

#include "kvtier/kv_events.h"
#include "kvtier/storage.h"

namespace kvtier {
namespace {

constexpr int kPageSize = 4;

StorageNamespace SmallNamespace() {
  StorageNamespace ns;
  ns.model_id = "events-model";
  ns.num_layers = 1;
  ns.slot_bytes = 32;
  ns.page_size = kPageSize;
  return ns;  // page_bytes = 256
}

// Keeps every published batch and replays it into the hashes of one medium.
class RecordingSink : public KvEventSink {
 public:
  void Publish(std::vector<KvEvent> events) override {
    std::lock_guard<std::mutex> lock(mu_);
    batches_.push_back(std::move(events));
  }
  std::vector<std::vector<KvEvent>> batches() const {
    std::lock_guard<std::mutex> lock(mu_);
    return batches_;
  }
  std::set<uint64_t> Replay(const std::string& medium) const {
    std::set<uint64_t> held;
    for (const auto& batch : batches()) {
      for (const KvEvent& e : batch) {
        if (const auto* s = std::get_if<BlockStored>(&e)) {
          EXPECT_EQ(s->medium, medium);
          held.insert(s->block_hashes.begin(), s->block_hashes.end());
        } else if (const auto* r = std::get_if<BlockRemoved>(&e)) {
          EXPECT_EQ(r->medium, medium);
          for (uint64_t h : r->block_hashes) held.erase(h);
        } else {
          ADD_FAILURE() << "AllBlocksCleared from a page store";
        }
      }
    }
    return held;
  }

 private:
  mutable std::mutex mu_;
  std::vector<std::vector<KvEvent>> batches_;
};

std::vector<PageKey> Prompt(std::mt19937& rng, int pages) {
  std::vector<Token> tokens(static_cast<size_t>(pages * kPageSize));
  for (Token& t : tokens) t = static_cast<Token>(rng() % 50000);
  return *ComputePromptPageKeys(tokens, kPageSize, "events");
}

std::set<uint64_t> Held(StorageBackend& store, const std::vector<PageKey>& keys) {
  std::set<uint64_t> held;
  for (const PageKey& k : keys) {
    if (store.Exists({k}).get().leading == 1) held.insert(BlockHashOf(k));
  }
  return held;
}

struct Fixture {
  std::unique_ptr<StorageBackend> store;
  std::shared_ptr<RecordingSink> sink = std::make_shared<RecordingSink>();
  std::unique_ptr<StoreKvEvents> events;
  std::vector<std::byte> page = std::vector<std::byte>(256, std::byte{7});

  explicit Fixture(std::string_view url) {
    auto opened = OpenStorage(url, SmallNamespace());
    EXPECT_TRUE(opened.ok()) << opened.status().ToString();
    store = std::move(*opened);
    store->TrackEvictions(true);
    events = std::make_unique<StoreKvEvents>(sink, "STORAGE", kPageSize);
  }
  std::vector<PageStatus> Set(const std::vector<PageKey>& keys,
                              const std::vector<std::optional<PageKey>>& parents) {
    std::vector<PageBuffer> buffers(keys.size(), PageBuffer::Of(page));
    const BatchResult r = parents.empty() ? store->Set(keys, buffers).get()
                                          : store->Set(keys, buffers, parents).get();
    events->OnSet(*store, keys, parents, r.pages);
    return r.pages;
  }
};

TEST(StoreKvEventsTest, ReplayingTheEventsGivesWhatTheStoreHolds) {
  // 328-byte values (256 + header): the store holds 10 pages; prompts of 1-6 pages, sets of a
  // whole prompt or of its pages one by one, removals now and then.
  Fixture f("memory://?capacity=3280");
  std::mt19937 rng(7);
  std::vector<PageKey> seen;
  for (int step = 0; step < 300; ++step) {
    const std::vector<PageKey> keys = Prompt(rng, 1 + static_cast<int>(rng() % 6));
    std::vector<std::optional<PageKey>> parents(keys.size());
    for (size_t i = 1; i < keys.size(); ++i) parents[i] = keys[i - 1];
    if (rng() % 2 == 0) {
      f.Set(keys, parents);
    } else {
      for (size_t i = 0; i < keys.size(); ++i) f.Set({keys[i]}, {parents[i]});
    }
    seen.insert(seen.end(), keys.begin(), keys.end());
    if (rng() % 5 == 0) {
      std::vector<PageKey> victims;
      for (int i = 0; i < 3; ++i) victims.push_back(seen[rng() % seen.size()]);
      const BatchResult r = f.store->Remove(victims).get();
      f.events->OnRemove(*f.store, victims, r.pages);
    }
    ASSERT_EQ(f.sink->Replay("STORAGE"), Held(*f.store, seen)) << "step " << step;
  }
  EXPECT_GT(f.store->Stats().evicted_pages, 100);
}

TEST(StoreKvEventsTest, ChainedPagesAreOneEventUnknownParentsOneEachFailuresNone) {
  Fixture f("memory://");
  std::mt19937 rng(8);
  const std::vector<PageKey> chain = Prompt(rng, 4);
  std::vector<std::optional<PageKey>> parents = {std::nullopt, chain[0], chain[1], chain[2]};
  f.Set(chain, parents);
  const std::vector<PageKey> loose = Prompt(rng, 2);
  f.Set(loose, {});
  const auto batches = f.sink->batches();
  ASSERT_EQ(batches.size(), 2u);
  ASSERT_EQ(batches[0].size(), 1u);
  const auto& one = std::get<BlockStored>(batches[0][0]);
  EXPECT_EQ(one.block_hashes.size(), 4u);
  EXPECT_EQ(one.block_hashes[3], BlockHashOf(chain[3]));
  EXPECT_EQ(one.parent_block_hash, std::nullopt);
  EXPECT_TRUE(one.token_ids.empty());
  EXPECT_EQ(one.block_size, kPageSize);
  ASSERT_EQ(batches[1].size(), 2u);  // nothing says the two are one chain
  EXPECT_EQ(std::get<BlockStored>(batches[1][1]).block_hashes,
            std::vector<uint64_t>{BlockHashOf(loose[1])});
  // A set whose pages all failed publishes nothing.
  f.events->OnSet(*f.store, loose, {}, std::vector<PageStatus>(2, PageStatus::kFailed));
  EXPECT_EQ(f.sink->batches().size(), 2u);
}

TEST(StoreKvEventsTest, APageDroppedAtOnceIsRemovedAfterItIsStored) {
  Fixture f("memory://?capacity=328");  // one page
  std::mt19937 rng(9);
  const std::vector<PageKey> chain = Prompt(rng, 2);
  f.Set({chain[0]}, {std::nullopt});
  // The chain's tail goes first, and the chain is the store's only one: chain[1] is written and
  // evicted by the same call.
  EXPECT_EQ(f.Set({chain[1]}, {chain[0]}), std::vector<PageStatus>{PageStatus::kOk});
  const auto last = f.sink->batches().back();
  ASSERT_EQ(last.size(), 2u);
  EXPECT_TRUE(std::holds_alternative<BlockStored>(last[0]));
  EXPECT_EQ(std::get<BlockRemoved>(last[1]).block_hashes,
            std::vector<uint64_t>{BlockHashOf(chain[1])});
  EXPECT_EQ(f.sink->Replay("STORAGE"), Held(*f.store, chain));
}

TEST(StoreKvEventsTest, ConfigChecksNameTheField) {
  StoreKvEventsConfig c;
  EXPECT_TRUE(c.Validate().ok());
  c.kv_events_topic = "t";
  Status s = c.Validate();
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("kv_events_topic"), std::string::npos) << s.ToString();
  c.kv_events_endpoint = "tcp://127.0.0.1:*";
  EXPECT_TRUE(c.Validate().ok());
  c.kv_events_medium = "TWO WORDS";
  s = c.Validate([](std::string_view f) { return "PageStore: " + std::string(f); });
  EXPECT_NE(s.message().find("PageStore: kv_events_medium"), std::string::npos) << s.ToString();
  EXPECT_EQ(c.PublisherConfig().endpoint, "tcp://127.0.0.1:*");
  EXPECT_EQ(StoreKvEventsConfigSchema().size(), 4u);
}

}  // namespace
}  // namespace kvtier
