// Storage shared across TP sizes: a store filled by a TP=1 cache serves each rank of TP=2 its
// heads, a store filled by the TP=2 ranks serves a TP=1 cache (Match -> QueryStorage -> Prefetch
// -> LoadBack, bytes checked), and MLA pages written by the TP=2 leader are the bytes TP=1 wrote.
#include "tp/head_split_storage.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <random>

#include "kvtier/hierarchical_cache.h"
#include "kvtier/testing/kv_pattern.h"
#include "kvtier/testing/tp_shard_pattern.h"
#include "kvtier/tp_group.h"

namespace kvtier::tp {
namespace {

constexpr int64_t kPage = 4;
constexpr int64_t kHeads = 4;
constexpr int64_t kLayers = 3;
constexpr int64_t kHeadBytes = 16;

struct Owned {
  Owned(const KvGeometry& g, bool mla) {
    k.assign(static_cast<size_t>(g.buffer_bytes()), std::byte{0x11});
    v.assign(mla ? 0 : k.size(), std::byte{0x22});
    region.geometry = g;
    region.mla = mla;
    region.k = k.data();
    region.v = mla ? nullptr : v.data();
  }
  std::vector<std::byte> k, v;
  KvRegion region;
};

// A TP=1 model: kHeads heads of kHeadBytes (MLA: one latent of kHeads * kHeadBytes).
KvGeometry Full(KvLayout layout, int64_t slots, bool mla) {
  return KvGeometry{layout, kLayers, slots, kHeads * kHeadBytes, kPage, mla ? 1 : kHeads};
}

// The namespace of rank `rank`'s page_head pages at `tp`.
StorageNamespace RankPages(bool mla, int rank, int tp) {
  StorageNamespace ns;
  ns.model_id = "tp-storage-test";
  ns.layout = KvLayout::kPageHead;
  ns.mla = mla;
  ns.num_layers = kLayers;
  ns.page_size = kPage;
  ns.slot_bytes = mla ? kHeads * kHeadBytes : kHeads * kHeadBytes / tp;
  ns.head_num = mla ? 1 : kHeads / tp;
  ns.tp_rank = rank;
  ns.tp_size = tp;
  return ns;
}

std::shared_ptr<StorageBackend> HeadStore(bool mla) {
  auto s = OpenStorage("memory://?capacity=64MiB", HeadObjectNamespace(RankPages(mla, 0, 1)));
  EXPECT_TRUE(s.ok()) << s.status().ToString();
  return std::shared_ptr<StorageBackend>(std::move(*s));
}

std::shared_ptr<StorageBackend> RankStore(std::shared_ptr<StorageBackend> inner, bool mla, int rank,
                                          int tp, bool read_only = false) {
  HeadSplitOptions o;
  o.first_head = mla ? 0 : rank * kHeads / tp;
  o.read_only = read_only;
  auto s = OpenHeadSplitStorage(std::move(inner), RankPages(mla, rank, tp), o);
  EXPECT_TRUE(s.ok()) << s.status().ToString();
  return std::shared_ptr<StorageBackend>(std::move(*s));
}

std::vector<std::vector<Token>> Prompts() {
  std::mt19937_64 rng(5);
  std::vector<std::vector<Token>> out(4);
  for (auto& p : out) {
    p.resize(static_cast<size_t>(kPage * (2 + rng() % 5)));
    for (auto& t : p) t = static_cast<Token>(rng() % 30000);
  }
  return out;
}

// A TP=1 cache whose storage tier is `store` (page_head host pages, all heads).
std::unique_ptr<HierarchicalCache> Tp1Cache(const KvRegion& device,
                                            std::shared_ptr<StorageBackend> store) {
  HierarchicalCacheConfig c;
  c.write_policy = WritePolicy::kWriteThrough;
  c.host_layout = KvLayout::kPageHead;
  c.host_head_num = device.geometry.head_num;
  c.backup_threads = 0;
  c.storage.backend = std::move(store);
  c.storage.prefetch_threshold_tokens = 0;
  c.storage.prefetch_policy = PrefetchPolicy::kWaitComplete;
  auto cache = HierarchicalCache::Create(c, device);
  EXPECT_TRUE(cache.ok()) << cache.status().ToString();
  return std::move(*cache);
}

// TP=1 writes through its cache; each TP=2 rank reads its heads of every page (page_head host
// pages of its own) and holds exactly its heads' KV.
TEST(HeadSplitStorageTest, AStoreFilledAtTp1ServesEachTp2RankItsHeads) {
  for (bool mla : {false, true}) {
    auto heads = HeadStore(mla);
    Owned dev(Full(KvLayout::kLayerFirst, 64 * kPage, mla), mla);
    auto cache = Tp1Cache(dev.region, RankStore(heads, mla, 0, 1));
    const auto prompts = Prompts();
    for (const auto& p : prompts) {
      auto slots = cache->AllocateDeviceSlots(static_cast<int64_t>(p.size()));
      ASSERT_TRUE(slots.ok());
      ASSERT_TRUE(FillKvPattern(dev.region, *slots, KvPatternHashes(p, KvPatternSalt(""))).ok());
      ASSERT_TRUE(cache->Insert(p, *slots).ok());
    }
    ASSERT_TRUE(cache->WaitForBackups().ok());
    EXPECT_GT(cache->stats().storage_backup_tokens, 0);
    for (int rank = 0; rank < 2; ++rank) {
      auto store = RankStore(heads, mla, rank, 2);
      KvGeometry g = *TpShardGeometry(Full(KvLayout::kPageHead, 64 * kPage, mla), mla, 2);
      Owned host(g, mla);
      for (const auto& p : prompts) {
        auto keys = ComputePromptPageKeys(p, kPage);
        ASSERT_TRUE(keys.ok());
        std::vector<int64_t> slots(p.size());
        for (size_t i = 0; i < slots.size(); ++i) slots[i] = static_cast<int64_t>(i) + 8 * kPage;
        std::vector<PageBuffer> buffers;
        for (size_t pg = 0; pg < keys->size(); ++pg) {
          const int64_t off = g.SlotBase(slots[pg * kPage]);
          const size_t bytes = static_cast<size_t>(kPage * kLayers * g.slot_bytes);
          std::span<std::byte> k(static_cast<std::byte*>(host.region.k) + off, bytes);
          buffers.push_back(
              mla ? PageBuffer::Of(k)
                  : PageBuffer::Of(k, std::span<std::byte>(
                                          static_cast<std::byte*>(host.region.v) + off, bytes)));
        }
        BatchResult r = store->Get(*keys, buffers).get();
        ASSERT_TRUE(r.status.ok()) << r.status.ToString();
        ASSERT_EQ(r.leading_ok(), static_cast<int64_t>(keys->size()));
        const Status st = VerifyTpShardPattern(host.region, mla, rank, 2, slots,
                                               KvPatternHashes(p, KvPatternSalt("")));
        EXPECT_TRUE(st.ok()) << "mla " << mla << " rank " << rank << ": " << st.ToString();
      }
    }
  }
}

// Writes the prompts' pages at `tp`: each rank fills its heads into page_head host pages and
// Sets them through its adapter. Returns the keys written.
void WriteAtTp(std::shared_ptr<StorageBackend> heads, bool mla, int tp,
               const std::vector<std::vector<Token>>& prompts) {
  for (int rank = 0; rank < tp; ++rank) {
    // MLA: the leader is the one writer; a follower's adapter is read-only.
    auto store = RankStore(heads, mla, rank, tp, /*read_only=*/mla && rank > 0);
    KvGeometry g = *TpShardGeometry(Full(KvLayout::kPageHead, 64 * kPage, mla), mla, tp);
    Owned host(g, mla);
    for (const auto& p : prompts) {
      std::vector<int64_t> slots(p.size());
      for (size_t i = 0; i < slots.size(); ++i) slots[i] = static_cast<int64_t>(i);
      ASSERT_TRUE(FillTpShardPattern(host.region, mla, rank, tp, slots,
                                     KvPatternHashes(p, KvPatternSalt("")))
                      .ok());
      auto keys = ComputePromptPageKeys(p, kPage);
      std::vector<PageBuffer> buffers;
      for (size_t pg = 0; pg < keys->size(); ++pg) {
        const int64_t off = g.SlotBase(static_cast<int64_t>(pg) * kPage);
        const size_t bytes = static_cast<size_t>(kPage * kLayers * g.slot_bytes);
        std::span<std::byte> k(static_cast<std::byte*>(host.region.k) + off, bytes);
        buffers.push_back(
            mla ? PageBuffer::Of(k)
                : PageBuffer::Of(k, std::span<std::byte>(
                                        static_cast<std::byte*>(host.region.v) + off, bytes)));
      }
      BatchResult r = store->Set(*keys, buffers).get();
      ASSERT_TRUE(r.status.ok());
      const PageStatus want = mla && rank > 0 ? PageStatus::kSkipped : PageStatus::kOk;
      EXPECT_EQ(r.count(want), static_cast<int64_t>(keys->size()));
    }
  }
}

// The TP=2 ranks write their heads; a TP=1 cache finds the pages (QueryStorage), prefetches and
// loads them, and its device slots hold the whole pattern.
TEST(HeadSplitStorageTest, AStoreFilledAtTp2ServesATp1Cache) {
  for (bool mla : {false, true}) {
    auto heads = HeadStore(mla);
    const auto prompts = Prompts();
    WriteAtTp(heads, mla, 2, prompts);
    Owned dev(Full(KvLayout::kLayerFirst, 64 * kPage, mla), mla);
    auto cache = Tp1Cache(dev.region, RankStore(heads, mla, 0, 1));
    for (const auto& p : prompts) {
      auto m = cache->Match(p);
      ASSERT_TRUE(m.ok());
      auto q = cache->QueryStorage(m->handle);
      ASSERT_TRUE(q.ok());
      EXPECT_EQ(q->storage_tokens, static_cast<int64_t>(p.size())) << "mla " << mla;
      ASSERT_TRUE(cache->Prefetch(m->handle).ok());
      auto lb = cache->LoadBack(m->handle);
      ASSERT_TRUE(lb.ok()) << lb.status().ToString();
      ASSERT_EQ(lb->device_slots.size(), p.size());
      const Status st =
          VerifyKvPattern(dev.region, lb->device_slots, KvPatternHashes(p, KvPatternSalt("")));
      EXPECT_TRUE(st.ok()) << "mla " << mla << ": " << st.ToString();
      ASSERT_TRUE(cache->Release(m->handle).ok());
    }
  }
}

// MLA: the objects the TP=2 leader wrote are byte for byte those TP=1 wrote.
TEST(HeadSplitStorageTest, MlaBytesWrittenAtTp2EqualTp1s) {
  const auto prompts = Prompts();
  auto at1 = HeadStore(true), at2 = HeadStore(true);
  WriteAtTp(at1, true, 1, prompts);
  WriteAtTp(at2, true, 2, prompts);
  const int64_t page_bytes = at1->ns().page_bytes();
  for (const auto& p : prompts) {
    auto keys = ComputePromptPageKeys(p, kPage);
    for (const PageKey& key : *keys) {
      std::vector<std::byte> a(static_cast<size_t>(page_bytes)), b(a.size(), std::byte{1});
      BatchResult ra = at1->Get({HeadObjectKey(key, 0)}, {PageBuffer::Of(a)}).get();
      BatchResult rb = at2->Get({HeadObjectKey(key, 0)}, {PageBuffer::Of(b)}).get();
      ASSERT_EQ(ra.leading_ok(), 1);
      ASSERT_EQ(rb.leading_ok(), 1);
      EXPECT_EQ(a, b);
    }
  }
  EXPECT_EQ(at1->Stats().stored_pages, at2->Stats().stored_pages);
}

TEST(HeadSplitStorageTest, AMismatchedInnerNamespaceIsRefused) {
  auto heads = HeadStore(false);
  StorageNamespace pages = RankPages(false, 0, 2);
  pages.page_size = 8;  // not the inner namespace's
  EXPECT_TRUE(OpenHeadSplitStorage(heads, pages, {}).status().IsInvalidArgument());
  pages = RankPages(false, 0, 2);
  pages.layout = KvLayout::kPageFirst;
  EXPECT_NE(OpenHeadSplitStorage(heads, pages, {}).status().message().find("page_head"),
            std::string::npos);
}

// OpenTpRankStorage (the public entry): the TP=2 ranks' views of one file store each write their
// heads of a page; a TP=1 view reads the whole page only once every rank has (a page is a hit
// only when every head is), and it is rank 0's bytes followed by rank 1's (heads are the outer
// dimension of a page_head page). MLA: rank 1's view writes nothing; it reads rank 0's latent.
// Pages the inner store evicts by itself (its capacity) come out of the adapter as the rank's
// page keys (KV events), each once, and exactly the pages that no longer read back whole.
TEST(HeadSplitStorageTest, TheInnerStoresEvictionsAreReportedAsPageKeys) {
  const StorageNamespace rank = RankPages(false, 1, 2);
  const int64_t head_bytes = HeadObjectNamespace(rank).page_bytes();
  // Room for 6 head objects: 3 of this rank's pages (2 heads each).
  auto inner =
      OpenStorage(fmt::format("memory://?capacity={}", 6 * head_bytes), HeadObjectNamespace(rank));
  ASSERT_TRUE(inner.ok()) << inner.status().ToString();
  auto store = RankStore(std::shared_ptr<StorageBackend>(std::move(*inner)), false, 1, 2);
  store->TrackEvictions(true);
  std::vector<Token> tokens(static_cast<size_t>(kPage * 10));
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<Token>(i * 7 + 1);
  const auto keys = ComputePromptPageKeys(tokens, kPage);
  ASSERT_TRUE(keys.ok());
  const size_t half = static_cast<size_t>(rank.page_bytes() / 2);
  std::vector<std::byte> k(half, std::byte{0x3C}), v(half, std::byte{0xC3});
  for (const PageKey& key : *keys) {  // one page at a time, unchained: the oldest go first
    ASSERT_EQ(store->Set({key}, {PageBuffer::Of(k, v)}).get().leading_ok(), 1);
  }
  std::vector<PageKey> evicted = store->TakeEvictions();
  std::sort(evicted.begin(), evicted.end());
  std::vector<PageKey> missing;
  for (const PageKey& key : *keys) {
    if (store->Get({key}, {PageBuffer::Of(k, v)}).get().leading_ok() == 0) missing.push_back(key);
  }
  std::sort(missing.begin(), missing.end());
  EXPECT_GE(missing.size(), keys->size() - 3);  // the store keeps at most 3
  EXPECT_LT(missing.size(), keys->size());
  EXPECT_EQ(evicted, missing);
  EXPECT_TRUE(store->TakeEvictions().empty());  // taken once
  store->TrackEvictions(false);
}

TEST(HeadSplitStorageTest, OpenTpRankStorageSplitsPagesByHeadAcrossTpSizes) {
  const std::string dir = (std::filesystem::temp_directory_path() /
                           ("kvtier-tp-rank-store-" + std::to_string(getpid())))
                              .string();
  const std::string url = "file://" + dir;
  const auto keys = ComputePromptPageKeys(Prompts()[0], kPage);
  ASSERT_TRUE(keys.ok());
  const PageKey key = (*keys)[0];
  for (const bool mla : {false, true}) {
    std::filesystem::remove_all(dir);
    auto r0 = OpenTpRankStorage(url, RankPages(mla, 0, 2));
    auto r1 = OpenTpRankStorage(url, RankPages(mla, 1, 2));
    auto one = OpenTpRankStorage(url, RankPages(mla, 0, 1));
    ASSERT_TRUE(r0.ok() && r1.ok() && one.ok()) << r0.status().ToString();
    const size_t half = static_cast<size_t>((*r0)->ns().page_bytes() / (mla ? 1 : 2));
    std::vector<std::byte> k0(half), v0(half), k1(half), v1(half);
    std::mt19937_64 rng(mla ? 3 : 4);
    for (auto* b : {&k0, &v0, &k1, &v1}) {
      for (auto& x : *b) x = static_cast<std::byte>(rng());
    }
    auto buffer = [mla](std::vector<std::byte>& k, std::vector<std::byte>& v) {
      return mla ? PageBuffer::Of(k) : PageBuffer::Of(k, v);
    };
    ASSERT_EQ((*r0)->Set({key}, {buffer(k0, v0)}).get().leading_ok(), 1);
    // A TP=1 page: MHA both ranks' heads of each buffer, MLA the one latent.
    std::vector<std::byte> k(mla ? half : 2 * half), v(mla ? 0 : 2 * half);
    if (!mla) {
      // Rank 1's heads are not stored yet: TP=1 misses the page.
      EXPECT_EQ((*one)->Get({key}, {PageBuffer::Of(k, v)}).get().leading_ok(), 0);
    }
    const BatchResult set1 = (*r1)->Set({key}, {buffer(k1, v1)}).get();
    if (mla) {
      ASSERT_EQ(set1.pages.size(), 1u);
      EXPECT_EQ(set1.pages[0], PageStatus::kSkipped);  // the leader is the one writer
      std::vector<std::byte> got(half);
      ASSERT_EQ((*r1)->Get({key}, {PageBuffer::Of(got)}).get().leading_ok(), 1);
      EXPECT_EQ(got, k0);
      ASSERT_EQ((*one)->Get({key}, {PageBuffer::Of(k)}).get().leading_ok(), 1);
      EXPECT_EQ(k, k0);
      continue;
    }
    ASSERT_EQ(set1.leading_ok(), 1);
    ASSERT_EQ((*one)->Get({key}, {PageBuffer::Of(k, v)}).get().leading_ok(), 1);
    EXPECT_TRUE(std::equal(k0.begin(), k0.end(), k.begin()));
    EXPECT_TRUE(std::equal(k1.begin(), k1.end(), k.begin() + static_cast<ptrdiff_t>(half)));
    EXPECT_TRUE(std::equal(v0.begin(), v0.end(), v.begin()));
    EXPECT_TRUE(std::equal(v1.begin(), v1.end(), v.begin() + static_cast<ptrdiff_t>(half)));
  }
  StorageNamespace bad = RankPages(false, 0, 2);
  bad.layout = KvLayout::kPageFirst;
  EXPECT_TRUE(OpenTpRankStorage(url, bad).status().IsInvalidArgument());
  bad = RankPages(false, 2, 2);  // tp_rank out of range
  EXPECT_TRUE(OpenTpRankStorage(url, bad).status().IsInvalidArgument());
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace kvtier::tp
