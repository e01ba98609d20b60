// No stranded pages, end to end through the public API of the stores that evict by themselves
// (memory://, file://): random prompts sharing prefixes are written with their parents and read
// back prefix first, overfilling the capacity many times; after every 5th prompt, no stored page
// follows a page of its prompt that is gone, and every byte read back is the byte written. The
// same run with the plain Set (no parents: the old LRU) strands pages, so the check can fail.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <unordered_map>
#include <vector>

#include "kvtier/storage.h"

namespace kvtier {
namespace {

constexpr int64_t kPageBytes = 512;

StorageNamespace SmallNamespace() {
  StorageNamespace ns;
  ns.model_id = "chain-eviction-test";
  ns.num_layers = 2;
  ns.slot_bytes = 32;
  ns.page_size = 4;
  return ns;  // page_bytes = 512
}

// A page's bytes, from its key (so a read is checked without keeping what was written).
std::vector<std::byte> BytesOf(const PageKey& key) {
  std::vector<std::byte> bytes(kPageBytes);
  std::mt19937 rng(static_cast<uint32_t>(key.bytes[0] | key.bytes[1] << 8 | key.bytes[2] << 16));
  for (auto& b : bytes) b = static_cast<std::byte>(rng());
  return bytes;
}

struct Outcome {
  int64_t stranded_max = 0;  // most stranded pages seen after any prompt
  int64_t evicted = 0;
  int64_t hits = 0;
};

// Random prompts over a small token alphabet (so they share prefixes), each looked up (Exists,
// then Get of the stored prefix: read head first, as a cache does) and its missing pages written
// after it. With `parents`, the Set names each page's parent.
Outcome RunPrompts(StorageBackend& store, bool parents, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<std::vector<PageKey>> prompts;
  std::unordered_map<PageKey, std::optional<PageKey>, PageKeyHash> parent_of;
  Outcome o;
  for (int p = 0; p < 150; ++p) {
    // 1 to 4 "documents" of 1-10 pages from a pool of 12: prompts share prefixes of any length.
    std::vector<int32_t> tokens;
    const int docs = 1 + static_cast<int>(rng() % 4);
    for (int d = 0; d < docs; ++d) {
      const int doc = static_cast<int>(rng() % 12);
      const int pages = 1 + (doc * 7) % 10;
      for (int t = 0; t < pages * 4; ++t) tokens.push_back(doc * 1000 + t);
    }
    std::vector<PageKey> keys = *ComputePromptPageKeys(tokens, 4);
    for (size_t i = 0; i < keys.size(); ++i) {
      parent_of.emplace(keys[i], i == 0 ? std::nullopt : std::optional<PageKey>(keys[i - 1]));
    }
    const int64_t leading = store.Exists(keys).get().leading;
    if (leading > 0) {
      std::vector<std::vector<std::byte>> out(static_cast<size_t>(leading),
                                              std::vector<std::byte>(kPageBytes));
      std::vector<PageBuffer> bufs;
      for (auto& b : out) bufs.push_back(PageBuffer::Of(b));
      const BatchResult r =
          store.Get(std::vector<PageKey>(keys.begin(), keys.begin() + leading), bufs).get();
      EXPECT_TRUE(r.status.ok()) << r.status.ToString();
      for (int64_t i = 0; i < r.leading_ok(); ++i) {
        EXPECT_EQ(out[static_cast<size_t>(i)], BytesOf(keys[static_cast<size_t>(i)]));
      }
      o.hits += r.leading_ok();
    }
    std::vector<PageKey> rest(keys.begin() + leading, keys.end());
    std::vector<std::vector<std::byte>> in;
    std::vector<PageBuffer> bufs;
    std::vector<std::optional<PageKey>> rest_parents;
    for (const PageKey& k : rest) {
      in.push_back(BytesOf(k));
      rest_parents.push_back(parent_of.at(k));
    }
    for (auto& b : in) bufs.push_back(PageBuffer::Of(b));
    if (!rest.empty()) {
      const BatchResult r =
          parents ? store.Set(rest, bufs, rest_parents).get() : store.Set(rest, bufs).get();
      EXPECT_TRUE(r.status.ok()) << r.status.ToString();
    }
    prompts.push_back(std::move(keys));
    if (p % 5 != 4) continue;
    // Stranded: stored, but a page before it in a prompt is not.
    std::unordered_map<PageKey, bool, PageKeyHash> stored;
    for (const auto& [k, parent] : parent_of) stored[k] = store.Exists({k}).get().leading == 1;
    int64_t stranded = 0;
    for (const auto& [k, parent] : parent_of) {
      if (stored[k] && parent && !stored[*parent]) ++stranded;
    }
    o.stranded_max = std::max(o.stranded_max, stranded);
  }
  o.evicted = store.Stats().evicted_pages;
  return o;
}

class ChainEvictionTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    std::string tmpl = (std::filesystem::temp_directory_path() / "kvtier-chain-XXXXXX").string();
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // Room for 40 pages (a value is its header and payload: 72 + 512 bytes in memory; a file puts
  // the payload at 4 KiB).
  std::unique_ptr<StorageBackend> Open() {
    const std::string url =
        GetParam() == "memory"
            ? "memory://?capacity=" + std::to_string(40 * (72 + 512))
            : "file://" + dir_ + "?capacity=" + std::to_string(40 * (4096 + 512));
    auto r = OpenStorage(url, SmallNamespace());
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? std::move(*r) : nullptr;
  }
  std::string dir_;
};

TEST_P(ChainEvictionTest, EvictionNeverStrandsAPageWrittenWithItsParent) {
  for (uint32_t seed = 1; seed <= 2; ++seed) {
    auto store = Open();
    ASSERT_NE(store, nullptr);
    const Outcome o = RunPrompts(*store, /*parents=*/true, seed);
    EXPECT_EQ(o.stranded_max, 0) << "seed " << seed;
    EXPECT_GT(o.evicted, 500) << "seed " << seed << ": the store was not overfilled";
    EXPECT_GT(o.hits, 0) << "seed " << seed;
    store->Close();
    std::filesystem::remove_all(dir_);
  }
}

TEST_P(ChainEvictionTest, ThePlainLruStrandsPages) {
  auto store = Open();
  ASSERT_NE(store, nullptr);
  const Outcome o = RunPrompts(*store, /*parents=*/false, 1);
  EXPECT_GT(o.stranded_max, 0) << "the check above could not fail";
}

TEST_P(ChainEvictionTest, ParentsMustBeOnePerKey) {
  auto store = Open();
  ASSERT_NE(store, nullptr);
  const std::vector<PageKey> keys = *ComputePromptPageKeys(std::vector<int32_t>(8, 1), 4);
  std::vector<std::vector<std::byte>> in(2, std::vector<std::byte>(kPageBytes));
  std::vector<PageBuffer> bufs{PageBuffer::Of(in[0]), PageBuffer::Of(in[1])};
  for (size_t n : {size_t{0}, size_t{1}, size_t{3}}) {
    const BatchResult r = store->Set(keys, bufs, std::vector<std::optional<PageKey>>(n)).get();
    EXPECT_TRUE(r.status.IsInvalidArgument()) << n << ": " << r.status.ToString();
    EXPECT_NE(r.status.message().find("parents"), std::string::npos) << r.status.ToString();
  }
  EXPECT_EQ(store->Exists(keys).get().leading, 0);
  EXPECT_EQ(store->Set(keys, bufs, {std::nullopt, keys[0]}).get().leading_ok(), 2);
  EXPECT_EQ(store->Exists(keys).get().leading, 2);
}

// A page written after its parent went would be stranded from birth: not written when the store
// evicted the parent (nor the pages after it in the batch); a parent the store never saw may be in
// a batch not yet run, so its child is written.
TEST_P(ChainEvictionTest, OrphansOfEvictedParentsGoOrphansOfUnseenOnesStay) {
  auto store = Open();
  ASSERT_NE(store, nullptr);
  std::vector<int32_t> tokens(4 * 3);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>(i);
  const std::vector<PageKey> k = *ComputePromptPageKeys(tokens, 4);
  auto set = [&](const PageKey& key, std::optional<PageKey> parent) {
    std::vector<std::byte> bytes = BytesOf(key);
    return store->Set({key}, {PageBuffer::Of(bytes)}, {parent}).get().leading_ok();
  };
  auto stored = [&](const PageKey& key) { return store->Exists({key}).get().leading == 1; };
  ASSERT_EQ(set(k[1], k[0]), 1);  // k[0] never seen: k[1] stays
  EXPECT_TRUE(stored(k[1]));
  ASSERT_EQ(set(k[0], std::nullopt), 1);
  // 80 other pages through a room of 40: k[1] (a leaf) goes, then k[0].
  std::vector<int32_t> other(4 * 80);
  for (size_t i = 0; i < other.size(); ++i) other[i] = static_cast<int32_t>(100000 + i);
  const std::vector<PageKey> others = *ComputePromptPageKeys(other, 4);
  for (const PageKey& o : others) {
    // Each its own first page (no parent): plain LRU among them.
    ASSERT_EQ(set(o, std::nullopt), 1);
  }
  EXPECT_FALSE(stored(k[0]));
  EXPECT_FALSE(stored(k[1]));
  EXPECT_EQ(store->Stats().evicted_pages, 82 - 40);
  // k[1] was evicted: k[2] is not written (kSkipped), and evicts nothing to make room.
  const int64_t evicted = store->Stats().evicted_pages;
  const int64_t written = store->Stats().set_ok_pages;
  std::vector<std::byte> b1 = BytesOf(k[1]), b2 = BytesOf(k[2]);
  BatchResult r = store->Set({k[2]}, {PageBuffer::Of(b2)}, {k[1]}).get();
  ASSERT_TRUE(r.status.ok());
  EXPECT_EQ(r.pages, std::vector<PageStatus>{PageStatus::kSkipped});
  EXPECT_FALSE(stored(k[2]));
  EXPECT_EQ(store->Stats().evicted_pages, evicted);
  EXPECT_EQ(store->Stats().set_ok_pages, written);
  // In one Set, the pages after a skipped one are skipped too (listed in any order).
  r = store->Set({k[2], k[1]}, {PageBuffer::Of(b2), PageBuffer::Of(b1)}, {k[1], k[0]}).get();
  EXPECT_EQ(r.pages, (std::vector<PageStatus>{PageStatus::kSkipped, PageStatus::kSkipped}));
  EXPECT_FALSE(stored(k[1]));
  EXPECT_FALSE(stored(k[2]));
  // Once the head is back, the chain is written whole.
  EXPECT_EQ(set(k[0], std::nullopt), 1);
  EXPECT_EQ(set(k[1], k[0]), 1);
  EXPECT_EQ(store->Exists({k[0], k[1]}).get().leading, 2);
}

// One Set of a chain longer than the room: what stays is a prefix of it (its tail went first, and
// the pages written after their parent went were dropped), whatever order the pages landed in.
TEST_P(ChainEvictionTest, AChainLongerThanTheRoomKeepsAPrefix) {
  auto store = Open();
  ASSERT_NE(store, nullptr);
  std::vector<int32_t> tokens(4 * 60);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>(7 * i);
  const std::vector<PageKey> keys = *ComputePromptPageKeys(tokens, 4);
  std::vector<std::vector<std::byte>> in;
  std::vector<PageBuffer> bufs;
  std::vector<std::optional<PageKey>> parents;
  for (size_t i = 0; i < keys.size(); ++i) {
    in.push_back(BytesOf(keys[i]));
    parents.push_back(i == 0 ? std::nullopt : std::optional<PageKey>(keys[i - 1]));
  }
  for (auto& b : in) bufs.push_back(PageBuffer::Of(b));
  const BatchResult r = store->Set(keys, bufs, parents).get();
  ASSERT_TRUE(r.status.ok()) << r.status.ToString();
  const int64_t leading = store->Exists(keys).get().leading;
  int64_t stored = 0;
  for (const PageKey& k : keys) stored += store->Exists({k}).get().leading;
  // The memory store writes in order and keeps the head; the file store's parallel writes land
  // in any order, and a head that lands before its child is a leaf that may go (then nothing of
  // the chain stays). Either way nothing stays after a missing page.
  if (GetParam() == "memory") {
    EXPECT_GT(leading, 0);
  }
  EXPECT_LE(leading, 40);
  EXPECT_EQ(stored, leading) << "a stored page after a missing one";
}

// A file store reopened over its directory (a restart: a new backend whose index comes from the
// scan) finds each page's parent in its header, so overfilling it afterwards still takes the
// chains written before the restart tail first. Eight chains of five pages fill the room; each is
// read page by page, head first (so every head is older than its tail: a plain LRU takes heads
// first); after the reopen, chains of three pages evict them three at a time, and after each, no
// stored page's parent is missing and every stored chain reads back byte for byte.
TEST_P(ChainEvictionTest, AReopenedFileStoreKeepsItsChains) {
  if (GetParam() != "file") GTEST_SKIP() << "only a file store outlives its backend";
  std::unordered_map<PageKey, std::optional<PageKey>, PageKeyHash> parent_of;
  std::vector<std::vector<PageKey>> chains;
  auto set_chain = [&](StorageBackend& store, int c, int pages) {
    std::vector<int32_t> tokens;
    for (int t = 0; t < pages * 4; ++t) tokens.push_back(c * 1000 + t);
    const std::vector<PageKey> keys = *ComputePromptPageKeys(tokens, 4);
    std::vector<std::vector<std::byte>> in;
    std::vector<PageBuffer> bufs;
    std::vector<std::optional<PageKey>> parents;
    for (size_t i = 0; i < keys.size(); ++i) {
      in.push_back(BytesOf(keys[i]));
      parents.push_back(i == 0 ? std::nullopt : std::optional<PageKey>(keys[i - 1]));
      parent_of[keys[i]] = parents.back();
    }
    for (auto& b : in) bufs.push_back(PageBuffer::Of(b));
    const BatchResult r = store.Set(keys, bufs, parents).get();
    EXPECT_EQ(r.leading_ok(), pages) << r.status.ToString();
    chains.push_back(keys);
  };
  {
    auto store = Open();
    ASSERT_NE(store, nullptr);
    for (int c = 0; c < 8; ++c) set_chain(*store, c, 5);
    // The pages' stamps (mtimes) a minute old, so each hit below writes its new stamp (a hit
    // within 1 s of the stamp on disk keeps it: file_index.h "Stamps").
    const auto old = std::filesystem::file_time_type::clock::now() - std::chrono::minutes(1);
    for (const auto& e : std::filesystem::recursive_directory_iterator(dir_)) {
      if (e.is_regular_file()) std::filesystem::last_write_time(e.path(), old);
    }
    for (const auto& chain : chains) {
      for (const PageKey& k : chain) {
        std::vector<std::byte> out(kPageBytes);
        ASSERT_EQ(store->Get({k}, {PageBuffer::Of(out)}).get().leading_ok(), 1);
      }
    }
    ASSERT_EQ(store->Stats().stored_pages, 40);
    store->Close();
  }
  auto store = Open();  // the restart
  ASSERT_NE(store, nullptr);
  ASSERT_EQ(store->Stats().stored_pages, 40);
  for (int c = 100; c < 108; ++c) {
    set_chain(*store, c, 3);
    int64_t stranded = 0;
    for (const auto& [k, parent] : parent_of) {
      if (store->Exists({k}).get().leading == 1 && parent &&
          store->Exists({*parent}).get().leading == 0) {
        ++stranded;
      }
    }
    EXPECT_EQ(stranded, 0) << "after chain " << c;
    for (const auto& chain : chains) {
      const int64_t leading = store->Exists(chain).get().leading;
      std::vector<std::vector<std::byte>> out(static_cast<size_t>(leading),
                                              std::vector<std::byte>(kPageBytes));
      std::vector<PageBuffer> bufs;
      for (auto& b : out) bufs.push_back(PageBuffer::Of(b));
      const std::vector<PageKey> prefix(chain.begin(), chain.begin() + leading);
      ASSERT_EQ(store->Get(prefix, bufs).get().leading_ok(), leading);
      for (size_t i = 0; i < prefix.size(); ++i) EXPECT_EQ(out[i], BytesOf(prefix[i]));
    }
  }
  EXPECT_EQ(store->Stats().evicted_pages, 24);
}

// Two file stores on one directory, as two processes would be: the second is opened before the
// first writes (its scan finds nothing), then finds the first's chains by lookups alone (Exists
// of each page alone, tail first, for half the chains; Get page by page, head first, for the
// other half: either way every head is older than its tail, so a plain LRU takes heads first;
// the first overfill takes the oldest, a head of each kind). Each page it finds this way comes
// with the parent its header names, so when it overfills, it takes the found chains tail first:
// no stored page's parent is missing, and every stored chain reads back byte for byte. (Before
// found pages took their parents, they were roots here, and this stranded tails.)
TEST_P(ChainEvictionTest, PagesAnotherStoreWroteKeepTheirChains) {
  if (GetParam() != "file") GTEST_SKIP() << "only file stores share their pages";
  std::unordered_map<PageKey, std::optional<PageKey>, PageKeyHash> parent_of;
  std::vector<std::vector<PageKey>> chains;
  auto set_chain = [&](StorageBackend& store, int c, int pages) {
    std::vector<int32_t> tokens;
    for (int t = 0; t < pages * 4; ++t) tokens.push_back(c * 1000 + t);
    const std::vector<PageKey> keys = *ComputePromptPageKeys(tokens, 4);
    std::vector<std::vector<std::byte>> in;
    std::vector<PageBuffer> bufs;
    std::vector<std::optional<PageKey>> parents;
    for (size_t i = 0; i < keys.size(); ++i) {
      in.push_back(BytesOf(keys[i]));
      parents.push_back(i == 0 ? std::nullopt : std::optional<PageKey>(keys[i - 1]));
      parent_of[keys[i]] = parents.back();
    }
    for (auto& b : in) bufs.push_back(PageBuffer::Of(b));
    const BatchResult r = store.Set(keys, bufs, parents).get();
    EXPECT_EQ(r.leading_ok(), pages) << r.status.ToString();
    return keys;
  };
  auto writer = Open();
  auto finder = Open();
  ASSERT_NE(writer, nullptr);
  ASSERT_NE(finder, nullptr);
  ASSERT_EQ(finder->Stats().stored_pages, 0);
  for (int c = 0; c < 8; ++c) chains.push_back(set_chain(*writer, c, 5));
  ASSERT_EQ(writer->Stats().stored_pages, 40);
  for (size_t c = 0; c < chains.size(); ++c) {
    if (c % 2 == 0) {  // Exists of each page alone, tail first: the head is found last, the oldest
      for (auto k = chains[c].rbegin(); k != chains[c].rend(); ++k) {
        ASSERT_EQ(finder->Exists({*k}).get().leading, 1);
      }
      continue;
    }
    for (const PageKey& k : chains[c]) {  // Get page by page, head first: the head the oldest
      std::vector<std::byte> out(kPageBytes);
      ASSERT_EQ(finder->Get({k}, {PageBuffer::Of(out)}).get().leading_ok(), 1);
      EXPECT_EQ(out, BytesOf(k));
    }
  }
  ASSERT_EQ(finder->Stats().stored_pages, 40);
  // Overfilled by chains of its own: the found pages are the oldest, so all 24 victims are
  // theirs. Checked by Exists alone meanwhile (a Get would make the pages it reads the newest).
  for (int c = 100; c < 108; ++c) {
    set_chain(*finder, c, 3);
    int64_t stranded = 0;
    for (const auto& [k, parent] : parent_of) {
      if (finder->Exists({k}).get().leading == 1 && parent &&
          finder->Exists({*parent}).get().leading == 0) {
        ++stranded;
      }
    }
    EXPECT_EQ(stranded, 0) << "after chain " << c;
  }
  EXPECT_EQ(finder->Stats().evicted_pages, 24);
  int64_t left = 0;
  for (const auto& chain : chains) {
    const int64_t leading = finder->Exists(chain).get().leading;
    left += leading;
    std::vector<std::vector<std::byte>> out(static_cast<size_t>(leading),
                                            std::vector<std::byte>(kPageBytes));
    std::vector<PageBuffer> bufs;
    for (auto& b : out) bufs.push_back(PageBuffer::Of(b));
    const std::vector<PageKey> prefix(chain.begin(), chain.begin() + leading);
    ASSERT_EQ(finder->Get(prefix, bufs).get().leading_ok(), leading);
    for (size_t i = 0; i < prefix.size(); ++i) EXPECT_EQ(out[i], BytesOf(prefix[i]));
  }
  EXPECT_EQ(left, 40 - 24);
}

INSTANTIATE_TEST_SUITE_P(Stores, ChainEvictionTest, ::testing::Values("memory", "file"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace kvtier
