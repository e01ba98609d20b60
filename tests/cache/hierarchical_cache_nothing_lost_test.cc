// HierarchicalCache with a storage tier (memory://, file://, and redis:// and redis+cluster://
// against servers the test starts on 127.0.0.1): nothing is lost on the way to storage. A prefix of
// any length (1 page to 131,072 tokens, pages of 16 and 64 tokens), inserted at once or as
// back-to-back chunked-prefill inserts, is entirely in storage after WaitForBackups(); a skipped
// page is counted under its true reason (queue_full, capacity, policy, failed), never another's; a
// page read back corrupt is healed by the next backup.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "cache/cache_test_util.h"
#include "kvtier/hierarchical_cache.h"
#include "kvtier/page_key.h"
#include "kvtier/storage.h"
#include "kvtier/testing/storage_fault.h"
#include "storage/redis_test_server.h"
#include "support/missing_dependency.h"

namespace kvtier {
namespace {

using testing::DeviceTier;
using testing::Hashes;

constexpr int64_t kLayers = 2;
constexpr int64_t kSlotBytes = 8;
constexpr int64_t kLongest = 131072;

// How long a wait for another thread's progress may take before the test calls it a hang. Long:
// a loaded box (a sanitizer build beside busy loops) is slow, and a wait that gave up after a
// count of short sleeps failed tests that were right.
constexpr auto kHangGuard = std::chrono::seconds(60);

// Polls `reached` every `poll` until it holds or kHangGuard passed; whether it held.
template <typename Reached>
bool PollUntil(Reached reached, std::chrono::milliseconds poll = std::chrono::milliseconds(5)) {
  const auto give_up = std::chrono::steady_clock::now() + kHangGuard;
  while (!reached()) {
    if (std::chrono::steady_clock::now() > give_up) return false;
    std::this_thread::sleep_for(poll);
  }
  return true;
}

StorageNamespace NamespaceFor(int64_t page) {
  StorageNamespace ns;
  ns.model_id = "nothing-lost";
  ns.layout = KvLayout::kPageFirst;
  ns.num_layers = kLayers;
  ns.slot_bytes = kSlotBytes;
  ns.page_size = page;
  return ns;
}

std::vector<Token> Seq(int64_t n, Token base) {
  std::vector<Token> t(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) t[static_cast<size_t>(i)] = base + static_cast<Token>(i);
  return t;
}

struct TestCache {
  std::unique_ptr<DeviceTier> device;
  std::unique_ptr<HierarchicalCache> cache;
};

TestCache Make(std::shared_ptr<StorageBackend> store, int64_t page, int64_t pages,
               WritePolicy policy = WritePolicy::kWriteThrough) {
  TestCache s;
  KvGeometry g{KvLayout::kLayerFirst, kLayers, pages * page, kSlotBytes, page, 1};
  auto dev = DeviceTier::Create(TransferBackend::kCpu, g, false);
  EXPECT_TRUE(dev.ok()) << dev.status().ToString();
  s.device = std::move(*dev);
  HierarchicalCacheConfig cfg;
  cfg.write_policy = policy;
  cfg.backup_threads = 1;
  cfg.host_capacity_bytes = pages * page * kLayers * kSlotBytes * 2;
  cfg.transfer.cpu_threads = 1;
  cfg.storage.backend = std::move(store);
  cfg.storage.prefetch_threshold_tokens = 0;
  auto c = HierarchicalCache::Create(cfg, s.device->region());
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  s.cache = std::move(*c);
  return s;
}

// The engine's prefill: match, compute (pattern) the uncached rest, insert, release.
void Prefill(TestCache& s, std::span<const Token> tokens) {
  auto m = s.cache->Match(tokens);
  ASSERT_TRUE(m.ok());
  const auto hashes = Hashes(tokens, "");
  std::vector<int64_t> slots = m->device_slots;
  const int64_t rest = static_cast<int64_t>(tokens.size()) - m->device_tokens;
  auto fresh = s.cache->AllocateDeviceSlots(rest);
  ASSERT_TRUE(fresh.ok()) << fresh.status().ToString();
  ASSERT_TRUE(
      s.device->Fill(*fresh, std::span<const uint64_t>(hashes).subspan(m->device_tokens)).ok());
  slots.insert(slots.end(), fresh->begin(), fresh->end());
  auto r = s.cache->Insert(tokens, slots);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_TRUE(s.cache->Release(m->handle).ok());
}

// The leading pages of `tokens` the store holds (Exists, batch by batch).
int64_t StoredPages(StorageBackend& store, std::span<const Token> tokens, int64_t page) {
  auto keys = ComputePromptPageKeys(tokens, page, "");
  EXPECT_TRUE(keys.ok());
  const int64_t batch = store.options().max_batch_pages;
  int64_t held = 0;
  for (size_t from = 0; from < keys->size(); from += static_cast<size_t>(batch)) {
    const size_t n = std::min(keys->size() - from, static_cast<size_t>(batch));
    ExistsResult e =
        store.Exists(std::vector<PageKey>(keys->begin() + from, keys->begin() + from + n)).get();
    EXPECT_TRUE(e.status.ok()) << e.status.ToString();
    held += e.leading;
    if (e.leading < static_cast<int64_t>(n)) break;
  }
  return held;
}

// Reads `tokens` back through storage only (a second cache over the same store) and checks the
// bytes.
void ExpectReadBack(std::shared_ptr<StorageBackend> store, std::span<const Token> tokens,
                    int64_t page) {
  // Host room for the whole prefix within the prefetch share (max_prefetch_host_fraction).
  TestCache c = Make(std::move(store), page, 4 * static_cast<int64_t>(tokens.size()) / page);
  auto m = c.cache->Match(tokens);
  ASSERT_TRUE(m.ok());
  ASSERT_TRUE(c.cache->QueryStorage(m->handle).ok());
  ASSERT_TRUE(c.cache->Release(m->handle).ok());
  m = c.cache->Match(tokens);
  ASSERT_EQ(m->storage_tokens, static_cast<int64_t>(tokens.size()));
  ASSERT_TRUE(c.cache->Prefetch(m->handle, PrefetchPolicy::kWaitComplete).ok());
  auto l = c.cache->LoadBack(m->handle);
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  EXPECT_EQ(l->prefetch.state, PrefetchState::kComplete);
  ASSERT_EQ(l->loaded_tokens, static_cast<int64_t>(tokens.size()));
  const Status v = c.device->Verify(l->device_slots, Hashes(tokens, ""));
  EXPECT_TRUE(v.ok()) << v.ToString();
  ASSERT_TRUE(c.cache->Release(m->handle).ok());
}

// Parameters: the backend ("memory", "file", "redis" or "redis_cluster") and the page size.
class NothingLostTest : public ::testing::TestWithParam<std::tuple<std::string, int64_t>> {
 protected:
  void SetUp() override {
    if (backend().starts_with("redis")) {
#if KVTIER_HAVE_HIREDIS
      if (std::string why = testing::RedisTestSkipReason(); !why.empty())
        KVTIER_SKIP_MISSING_DEPENDENCY(why);
#else
      KVTIER_SKIP_MISSING_DEPENDENCY("built without hiredis: no Redis backend");
#endif
    }
  }
  void TearDown() override {
    std::error_code ec;
    if (!dir_.empty()) std::filesystem::remove_all(dir_, ec);
  }
  const std::string& backend() const { return std::get<0>(GetParam()); }
  int64_t page() const { return std::get<1>(GetParam()); }
  // Opens the store; a Redis server or cluster is started first (and stopped with the fixture).
  std::shared_ptr<StorageBackend> Store() {
    std::string url = "memory://?capacity=256MiB";
    if (backend() == "file") {
      std::string tmpl = "/tmp/kvtier_nothing_lost_XXXXXX";
      EXPECT_NE(::mkdtemp(tmpl.data()), nullptr);
      dir_ = tmpl;
      url = "file://" + dir_;
    }
#if KVTIER_HAVE_HIREDIS
    if (backend() == "redis") {
      server_ = std::make_unique<testing::RedisTestServer>();
      const std::string error = server_->Start();
      EXPECT_EQ(error, "");
      if (!error.empty()) return nullptr;
      url = "redis://" + server_->address();
    } else if (backend() == "redis_cluster") {
      cluster_ = std::make_unique<testing::RedisTestCluster>();
      const std::string error = cluster_->Start();
      EXPECT_EQ(error, "");
      if (!error.empty()) return nullptr;
      url = cluster_->Url();
    }
#endif
    // A generous per-call timeout: this checks the cache's bookkeeping, not how fast a loaded
    // test machine writes thousands of files (a timed-out page would be counted as failed).
    StorageOptions options;
    options.timeout = std::chrono::seconds(60);
    auto b = OpenStorage(url, NamespaceFor(page()), options);
    EXPECT_TRUE(b.ok()) << b.status().ToString();
    return b.ok() ? std::shared_ptr<StorageBackend>(std::move(*b)) : nullptr;
  }
  std::string dir_;
#if KVTIER_HAVE_HIREDIS
  // Declared after nothing that outlives them: the tests' caches and stores are locals, gone
  // before the fixture stops the servers.
  std::unique_ptr<testing::RedisTestServer> server_;
  std::unique_ptr<testing::RedisTestCluster> cluster_;
#endif
};

TEST_P(NothingLostTest, OneInsertOfAnyLengthEndsEntirelyInStorage) {
  auto store = Store();
  ASSERT_NE(store, nullptr);
  const int64_t P = page();
  // Room in every tier for everything: no page may be skipped for capacity here.
  TestCache s = Make(store, P, 2 * kLongest / P);
  Token base = 1;
  int64_t total = 0;
  for (int64_t length : {P, int64_t{4096}, int64_t{8192}, kLongest}) {
    const auto a = Seq(length, base);
    base += static_cast<Token>(length) + 1000;
    Prefill(s, a);
    ASSERT_TRUE(s.cache->WaitForBackups().ok());
    EXPECT_EQ(StoredPages(*store, a, P), length / P) << length << " tokens";
    total += length;
  }
  const CacheStats st = s.cache->stats();
  EXPECT_EQ(st.storage_backup_tokens, total);
  EXPECT_EQ(st.backup_skipped_tokens, 0);
  EXPECT_EQ(st.storage_backup_dropped_tokens, 0);
  EXPECT_EQ(st.storage_backup_failed_tokens, 0);
  EXPECT_EQ(st.storage_queue_drops, 0);
  EXPECT_TRUE(s.cache->CheckConsistency().ok());
}

TEST_P(NothingLostTest, BackToBackChunkedPrefillInsertsEndEntirelyInStorage) {
  auto store = Store();
  ASSERT_NE(store, nullptr);
  const int64_t P = page();
  TestCache s = Make(store, P, 2 * kLongest / P);
  // A[:4096] then A[:8192], as the issue has it; then B in 8 chunks up to 131,072 tokens.
  const auto a = Seq(8192, 5);
  Prefill(s, std::span<const Token>(a).first(4096));
  Prefill(s, a);
  // (A file store at page 16 stops at 32,768 tokens: 8,192 files take too long for a unit test;
  // the one-insert test writes 131,072 tokens there.)
  const int64_t longest = std::get<0>(GetParam()) == "file" && P == 16 ? 32768 : kLongest;
  const auto b = Seq(longest, 900000);
  for (int64_t end = longest / 8; end <= longest; end += longest / 8) {
    Prefill(s, std::span<const Token>(b).first(static_cast<size_t>(end)));
  }
  ASSERT_TRUE(s.cache->WaitForBackups().ok());
  EXPECT_EQ(StoredPages(*store, a, P), 8192 / P);
  EXPECT_EQ(StoredPages(*store, b, P), longest / P);
  const CacheStats st = s.cache->stats();
  EXPECT_EQ(st.storage_backup_tokens, 8192 + longest);
  EXPECT_EQ(st.backup_skipped_tokens, 0);
  EXPECT_EQ(st.storage_backup_dropped_tokens, 0);
  EXPECT_EQ(st.storage_backup_failed_tokens, 0);
  EXPECT_TRUE(s.cache->CheckConsistency().ok());
  ExpectReadBack(store, a, P);  // the chunks' pages, byte for byte
}

INSTANTIATE_TEST_SUITE_P(Backends, NothingLostTest,
                         ::testing::Combine(::testing::Values("memory", "file", "redis",
                                                              "redis_cluster"),
                                            ::testing::Values(16, 64)),
                         [](const auto& info) {
                           return std::get<0>(info.param) + "_page" +
                                  std::to_string(std::get<1>(info.param));
                         });

// A memory store behind the fault wrapper.
std::shared_ptr<FaultInjectingStorage> FaultyStore(int64_t page,
                                                   const StorageOptions& options = {}) {
  auto inner = OpenStorage("memory://?capacity=64MiB", NamespaceFor(page));
  EXPECT_TRUE(inner.ok()) << inner.status().ToString();
  auto w = FaultInjectingStorage::Wrap(std::move(*inner), 7, options);
  EXPECT_TRUE(w.ok()) << w.status().ToString();
  return std::shared_ptr<FaultInjectingStorage>(std::move(*w));
}

// 600 pages: a store of the first 512 (the default queue) and 88 behind it, which follow only
// when it lands whole, so they are counted as failed with it.
TEST(NothingLostReasonsTest, FailedWritesAreCountedAsFailedNotAsQueueFull) {
  auto store = FaultyStore(16);
  TestCache s = Make(store, 16, 1024);
  ASSERT_TRUE(store->SetErrorFraction(1).ok());  // every Exists and Set fails
  const auto a = Seq(600 * 16, 3);
  Prefill(s, a);
  ASSERT_TRUE(s.cache->WaitForBackups().ok());
  CacheStats st = s.cache->stats();
  EXPECT_EQ(st.storage_backup_failed_tokens, 600 * 16);
  EXPECT_EQ(st.storage_backup_dropped_tokens, 0);
  EXPECT_EQ(st.storage_backup_tokens, 0);
  store->ClearFaults();
  // Nothing is marked stored: a later backup of the same prefix (another insert) writes it all.
  ASSERT_TRUE(s.cache->EvictDevice(1 << 30).ok());
  ASSERT_TRUE(s.cache->EvictHost(1 << 30).ok());
  Prefill(s, a);
  ASSERT_TRUE(s.cache->WaitForBackups().ok());
  EXPECT_EQ(StoredPages(*store, a, 16), 600);
  st = s.cache->stats();
  EXPECT_EQ(st.storage_backup_tokens, 600 * 16);
}

// A page whose write fails leaves a hole in its prompt's chain: the pages the same store wrote
// after it are unreachable (a lookup stops at the hole), so they are removed again rather than
// left in the store; the next store of the prefix writes everything.
TEST(NothingLostReasonsTest, PagesWrittenPastAFailedPageAreRemovedNotStranded) {
  auto store = FaultyStore(16);
  TestCache s = Make(store, 16, 1024);
  const auto a = Seq(8192, 5);
  ASSERT_TRUE(store->SetErrorFraction(0.05).ok());  // some pages (and Exists calls) fail
  Prefill(s, a);
  ASSERT_TRUE(s.cache->WaitForBackups().ok());
  store->ClearFaults();
  auto keys = ComputePromptPageKeys(a, 16, "");
  ASSERT_TRUE(keys.ok());
  const int64_t leading = StoredPages(*store, a, 16);
  ASSERT_LT(leading, static_cast<int64_t>(keys->size())) << "no write failed: nothing to check";
  int64_t beyond = 0;  // stored pages past the first missing one
  for (size_t i = static_cast<size_t>(leading) + 1; i < keys->size(); ++i) {
    ExistsResult e = store->Exists(std::vector<PageKey>{(*keys)[i]}).get();
    ASSERT_TRUE(e.status.ok()) << e.status.ToString();
    beyond += e.leading;
  }
  // The removals go through the same faulty store, so about 5 % of them fail too and those pages
  // stay (without the removal, nearly every page past the hole stays: 459 in one run).
  const int64_t removed = s.cache->stats().storage_stranded_removed_pages;
  EXPECT_GE(removed, 50) << "the first failure came late: too few pages past it to judge";
  EXPECT_LE(beyond, removed / 5) << "pages stranded past the hole at page " << leading;
  // The next store of the prefix fills the hole and writes the rest again.
  ASSERT_TRUE(s.cache->EvictDevice(1 << 30).ok());
  ASSERT_TRUE(s.cache->EvictHost(1 << 30).ok());
  Prefill(s, a);
  ASSERT_TRUE(s.cache->WaitForBackups().ok());
  EXPECT_EQ(StoredPages(*store, a, 16), 8192 / 16);
  EXPECT_TRUE(s.cache->CheckConsistency().ok());
}

// A race between another thread's removal of the pages past a hole and the main thread. A
// removal is queued by the call that reaps the failed store and submitted by that call after the
// lock; another thread's call can run in between, and storage orders a read after a write of its
// key but no two writes. Here the removal's submission is stalled (the store's caller check holds
// a Remove until Go) while the main thread works on the same prompt.
class NothingLostRaceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    StorageOptions options;
    options.io_threads = 1;  // the seeded faults in a fixed order
    auto inner = OpenStorage("memory://?capacity=64MiB", NamespaceFor(16), options);
    ASSERT_TRUE(inner.ok()) << inner.status().ToString();
    auto wrapped = FaultInjectingStorage::Wrap(std::move(*inner), 5, options);
    ASSERT_TRUE(wrapped.ok()) << wrapped.status().ToString();
    store_ = std::shared_ptr<FaultInjectingStorage>(std::move(*wrapped));
    store_->SetCallerCheck([this](std::string_view call) {
      if (call != "Remove") return Status::OK();
      std::unique_lock<std::mutex> lk(mu_);
      ++stalled_;
      cv_.notify_all();
      cv_.wait_for(lk, 2 * kHangGuard, [&] { return go_; });  // a hang guard (TearDown says go)
      return Status::OK();
    });
    s_ = Make(store_, 16, 256);
  }
  void TearDown() override {
    (void)Go();  // lets a stalled removal go if the test stopped before it did (its result unused)
    if (other_.valid()) other_.wait();
    s_ = TestCache{};
    if (store_) store_->SetCallerCheck(nullptr);
  }
  // Another thread stores `tokens` with a tenth of the pages failing; reaping the store queues
  // the removal of the pages written past the first hole, whose submission stalls. Returns the
  // hole (the leading pages stored), or -1 when no removal came (the seed gave no hole with
  // pages written past it). `wait_for_backups`: the other thread then waits for its backups (the
  // removal and what it released included); else it returns once the removal was submitted.
  int64_t StoreWithAHoleElsewhere(std::span<const Token> tokens, bool wait_for_backups = true) {
    EXPECT_TRUE(store_->SetErrorFraction(0.1).ok());
    other_ = std::async(std::launch::async, [this, tokens, wait_for_backups] {
      Prefill(s_, tokens);
      if (wait_for_backups) return s_.cache->WaitForBackups();
      const bool submitted = PollUntil(
          [&] {
            (void)s_.cache->stats();  // reaps the store: the removal is submitted (stalled) here
            std::lock_guard<std::mutex> lk(mu_);
            return stalled_ > 0;
          },
          std::chrono::milliseconds(1));
      return submitted ? Status::OK()
                       : Status::Unavailable("no removal was submitted within the hang guard");
    });
    {
      std::unique_lock<std::mutex> lk(mu_);
      if (!cv_.wait_for(lk, kHangGuard, [&] { return stalled_ > 0; })) return -1;
    }
    store_->ClearFaults();
    return StoredPages(*store_, tokens, 16);
  }
  // Lets the stalled removal go; the other thread's result.
  Status Go() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      go_ = true;
    }
    cv_.notify_all();
    return other_.valid() ? other_.get() : Status::OK();
  }
  // The pages the tree marks stored (its storage part once device and host are emptied) are
  // exactly the leading pages the store holds.
  void ExpectTheTreeMarksStoredWhatTheStoreHolds(std::span<const Token> tokens) {
    ASSERT_TRUE(s_.cache->EvictDevice(1 << 30).ok());
    ASSERT_TRUE(s_.cache->EvictHost(1 << 30).ok());
    auto m = s_.cache->Match(tokens);
    ASSERT_TRUE(m.ok());
    EXPECT_EQ(m->storage_tokens, StoredPages(*store_, tokens, 16) * 16);
    ASSERT_TRUE(s_.cache->Release(m->handle).ok());
  }

  std::shared_ptr<FaultInjectingStorage> store_;
  TestCache s_;
  std::future<Status> other_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool go_ = false;
  int stalled_ = 0;
};

// The main thread stores the prompt again while the removal stalls: that store waits for the
// removal (without the ordering its Set lands first and the late Remove takes its pages, which the
// tree marks stored). After WaitForBackups every page the tree marks stored is in the store,
// byte-exact.
TEST_F(NothingLostRaceTest, AStoreOfPagesBeingRemovedWaitsForTheRemoval) {
  const auto a = Seq(65 * 16, 21);
  ASSERT_GE(StoreWithAHoleElsewhere(std::span<const Token>(a).first(64 * 16)), 0)
      << "no removal: no page failed with pages written past it (change the seed)";
  // The prompt and one page more: the new page's backup stores the path from the hole on. Wait
  // until that store is held back, or (without the ordering) has landed.
  Prefill(s_, a);
  auto keys = ComputePromptPageKeys(a, 16, "");
  ASSERT_TRUE(keys.ok());
  ASSERT_TRUE(PollUntil([&] {
    const CacheStats st = s_.cache->stats();
    return st.storage_stores_held > 0 ||
           (st.storage_backup_inflight_tokens == 0 &&
            store_->inner().Exists(std::vector<PageKey>{keys->back()}).get().leading == 1);
  })) << "the new page's store was neither held nor landed (a hang)";
  ASSERT_TRUE(Go().ok());
  ASSERT_TRUE(s_.cache->WaitForBackups().ok());
  const CacheStats st = s_.cache->stats();
  EXPECT_GT(st.storage_stranded_removed_pages, 0);
  EXPECT_EQ(st.storage_stores_held, 1);
  EXPECT_TRUE(s_.cache->CheckConsistency().ok());
  ExpectTheTreeMarksStoredWhatTheStoreHolds(a);
  EXPECT_EQ(StoredPages(*store_, a, 16), 65);
  ExpectReadBack(store_, a, 16);
}

// Close while a removal is in flight and a store waits behind it: Close waits for the removal,
// then runs the store it released and waits for that; nothing leaks, and the store ends whole.
TEST_F(NothingLostRaceTest, CloseWaitsForTheRemovalThenForTheStoreItReleased) {
  const auto a = Seq(65 * 16, 25);
  ASSERT_GE(StoreWithAHoleElsewhere(std::span<const Token>(a).first(64 * 16),
                                    /*wait_for_backups=*/false),
            0)
      << "no removal: no page failed with pages written past it (change the seed)";
  Prefill(s_, a);
  ASSERT_TRUE(PollUntil([&] { return s_.cache->stats().storage_stores_held != 0; }))
      << "the store was not held back behind the removal (a hang)";
  ASSERT_EQ(s_.cache->stats().storage_stores_held, 1);
  store_->HoldWrites(true);  // the removal, once submitted, stays in flight
  ASSERT_TRUE(Go().ok());    // the other thread submitted it and returned
  auto release = std::async(std::launch::async, [this] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    store_->HoldWrites(false);
  });
  s_ = TestCache{};  // Close, while the removal is held
  release.get();
  EXPECT_EQ(store_->held_writes(), 0);
  EXPECT_EQ(StoredPages(*store_, a, 16), 65);
  ExpectReadBack(store_, a, 16);
}

// The hole is filled (the prefix up to it stored again) while the removal stalls: a QueryStorage
// of the rest finds the pages being removed still there, and must not mark them stored.
TEST_F(NothingLostRaceTest, QueryStorageDoesNotFindPagesBeingRemoved) {
  const auto a = Seq(64 * 16, 23);
  const int64_t hole = StoreWithAHoleElsewhere(a);
  ASSERT_GE(hole, 0) << "no removal: no page failed with pages written past it (change the seed)";
  ASSERT_TRUE(s_.cache->EvictDevice(1 << 30).ok());
  ASSERT_TRUE(s_.cache->EvictHost(1 << 30).ok());  // the unstored part is forgotten
  const auto filled = std::span<const Token>(a).first(static_cast<size_t>((hole + 1) * 16));
  Prefill(s_, filled);  // recomputed: its store writes the missing page only
  // (Not WaitForBackups: it would wait for the stalled removal.)
  (void)PollUntil([&] {
    (void)s_.cache->stats();  // reaps the backup (which queues the store) and the store
    return StoredPages(*store_, a, 16) > hole;
  });
  ASSERT_GT(StoredPages(*store_, a, 16), hole + 1) << "the pages past the hole are there (yet)";
  auto m = s_.cache->Match(a);
  ASSERT_TRUE(m.ok());
  auto q = s_.cache->QueryStorage(m->handle);
  ASSERT_TRUE(q.ok()) << q.status().ToString();
  EXPECT_EQ(q->queried_tokens, 0);
  ASSERT_TRUE(s_.cache->Release(m->handle).ok());
  ASSERT_TRUE(Go().ok());
  ASSERT_TRUE(s_.cache->WaitForBackups().ok());
  EXPECT_EQ(StoredPages(*store_, a, 16), hole + 1);
  EXPECT_TRUE(s_.cache->CheckConsistency().ok());
  ExpectTheTreeMarksStoredWhatTheStoreHolds(a);
  ExpectReadBack(store_, filled, 16);
}

// The first prompt's store is held in flight until every prompt was prefilled (held, not
// delayed: a delay of 50 ms let a loaded box land it between two prefills, and no store was
// dropped), so the ones behind it find the queue full.
TEST(NothingLostReasonsTest, AFullQueueIsCountedAsQueueFullAndTheRestIsStored) {
  StorageOptions options;
  options.timeout = kHangGuard;  // the held writes are released below
  auto store = FaultyStore(16, options);
  store->HoldWrites(true);  // stores stay in flight
  KvGeometry g{KvLayout::kLayerFirst, kLayers, 256 * 16, kSlotBytes, 16, 1};
  auto dev = DeviceTier::Create(TransferBackend::kCpu, g, false);
  ASSERT_TRUE(dev.ok());
  TestCache s;
  s.device = std::move(*dev);
  HierarchicalCacheConfig cfg;
  cfg.write_policy = WritePolicy::kWriteThrough;
  cfg.backup_threads = 0;  // backups land inline, so their stores queue at once
  cfg.host_capacity_bytes = 256 * 16 * kLayers * kSlotBytes * 2;
  cfg.storage.backend = store;
  cfg.storage.max_backup_queue_pages = 4;
  // Without a write backlog (a store the queue cannot take is dropped, counted as queue_full),
  // admitting every page; the backlog's drops are backup_planner_test's.
  cfg.storage.admission.policy = StorageAdmission::kAll;
  cfg.storage.admission.backlog_bytes = 0;
  auto c = HierarchicalCache::Create(cfg, s.device->region());
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  s.cache = std::move(*c);
  std::vector<std::vector<Token>> prompts;
  for (int i = 0; i < 4; ++i) {
    prompts.push_back(Seq(4 * 16, 1000 * (i + 1)));  // 4 pages each: one fills the queue
    Prefill(s, prompts.back());
  }
  store->HoldWrites(false);
  ASSERT_TRUE(s.cache->WaitForBackups().ok());
  const CacheStats st = s.cache->stats();
  int64_t stored = 0;
  for (const auto& p : prompts) stored += StoredPages(*store, p, 16) * 16;
  EXPECT_GT(st.storage_queue_drops, 0);
  EXPECT_EQ(st.storage_backup_tokens, stored);
  EXPECT_EQ(st.storage_backup_dropped_tokens + stored, 4 * 4 * 16);  // every page accounted for
  EXPECT_EQ(st.storage_backup_failed_tokens, 0);
}

// The store has no room for a page (a capacity below one page is refused at open, so: memory://
// with its one page's room pinned by another backend on the same store, and file:// with a
// free-space floor above the file system's free space): every page is counted as capacity, none
// as failed.
TEST(NothingLostReasonsTest, AStoreWithoutRoomIsCountedAsCapacityNotAsFailed) {
  std::string tmpl = "/tmp/kvtier_nothing_lost_XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
  const std::string dir = tmpl;
  const StorageNamespace ns = NamespaceFor(16);
  const std::string one_page = std::to_string(kStoredPageHeaderBytes + ns.page_bytes());
  auto filler = OpenStorage("memory://nothing-lost-full?capacity=" + one_page, ns);
  ASSERT_TRUE(filler.ok()) << filler.status().ToString();
  {
    std::vector<std::byte> page(static_cast<size_t>(ns.page_bytes()), std::byte{7});
    const PageKey key = PageKey::FromHex(std::string(64, 'f')).value();
    ASSERT_EQ((*filler)->Set({key}, {PageBuffer::Of(page)}).get().leading_ok(), 1);
    ASSERT_TRUE((*filler)->PinPages({&key, 1}, std::chrono::nanoseconds::max()).ok());
  }
  StorageOptions no_room;
  no_room.min_free_bytes = int64_t{1} << 60;
  for (const auto& [url, options] :
       {std::pair{"memory://nothing-lost-full?capacity=" + one_page, StorageOptions{}},
        std::pair{"file://" + dir, no_room}}) {
    SCOPED_TRACE(url);
    auto b = OpenStorage(url, ns, options);
    ASSERT_TRUE(b.ok()) << b.status().ToString();
    std::shared_ptr<StorageBackend> store(std::move(*b));
    // The default queue of 512 pages: a store of the first 512 (two batches of 256) goes to the
    // store; the 88 behind it wait for it to land whole, and are counted under its reason when
    // it does not.
    TestCache s = Make(store, 16, 1024);
    const auto a = Seq(600 * 16, 3);  // 600 pages: more than the queue
    Prefill(s, a);
    ASSERT_TRUE(s.cache->WaitForBackups().ok());
    const CacheStats st = s.cache->stats();
    EXPECT_EQ(st.storage_backup_capacity_tokens, 600 * 16);
    EXPECT_EQ(st.storage_backup_failed_tokens, 0);
    EXPECT_EQ(st.storage_backup_dropped_tokens, 0);
    EXPECT_EQ(st.storage_backup_tokens, 0);
    EXPECT_EQ(store->Stats().set_no_space_pages, 512);  // the head alone reached the store
    const std::string metrics = s.cache->Metrics();
    EXPECT_NE(metrics.find("kvtier:storage_backup_skipped_tokens_total{reason=\"capacity\"} 9600"),
              std::string::npos)
        << metrics;
  }
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
}

// The backend's own write queue is full (two writes held running, one queued, the rest
// rejected with Unavailable): the rejected stores are queue_full, not failed; the others are
// written once the writes go on, and every page is accounted for.
TEST(NothingLostReasonsTest, ABackendQueueRejectionIsCountedAsQueueFullNotAsFailed) {
  auto inner = OpenStorage("memory://?capacity=64MiB", NamespaceFor(16));
  ASSERT_TRUE(inner.ok());
  StorageOptions options;
  options.io_threads = 2;  // two writers (io_threads), two readers
  options.max_queued_batches = 1;
  options.timeout = std::chrono::seconds(30);
  auto w = FaultInjectingStorage::Wrap(std::move(*inner), 7, options);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  std::shared_ptr<FaultInjectingStorage> store(std::move(*w));
  store->HoldWrites(true);
  KvGeometry g{KvLayout::kLayerFirst, kLayers, 256 * 16, kSlotBytes, 16, 1};
  auto dev = DeviceTier::Create(TransferBackend::kCpu, g, false);
  ASSERT_TRUE(dev.ok());
  TestCache s;
  s.device = std::move(*dev);
  HierarchicalCacheConfig cfg;
  cfg.write_policy = WritePolicy::kWriteThrough;
  cfg.backup_threads = 0;  // backups land inline, so their stores go to the backend at once
  cfg.host_capacity_bytes = 256 * 16 * kLayers * kSlotBytes * 2;
  cfg.storage.backend = store;
  auto c = HierarchicalCache::Create(cfg, s.device->region());
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  s.cache = std::move(*c);
  std::vector<std::vector<Token>> prompts;
  for (int i = 0; i < 5; ++i) {
    prompts.push_back(Seq(4 * 16, 1000 * (i + 1)));
    Prefill(s, prompts.back());
  }
  // Five Sets reach the backend: two held running, one queued, two rejected. set_calls counts
  // every Set submitted, rejected ones too (adding rejected_calls counted a rejection twice and
  // could release the writes before the last Set came: 5 failures in 60 loaded runs).
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (store->Stats().set_calls < 5 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  store->HoldWrites(false);
  ASSERT_TRUE(s.cache->WaitForBackups().ok());
  const CacheStats st = s.cache->stats();
  int64_t stored = 0;
  for (const auto& p : prompts) stored += StoredPages(*store, p, 16) * 16;
  EXPECT_GE(st.storage_backup_dropped_tokens, 2 * 4 * 16);
  EXPECT_EQ(st.storage_backup_failed_tokens, 0);
  EXPECT_EQ(st.storage_backup_capacity_tokens, 0);
  EXPECT_EQ(st.storage_backup_tokens, stored);
  EXPECT_EQ(st.storage_backup_dropped_tokens + stored, 5 * 4 * 16);  // every page accounted for
  EXPECT_GE(st.storage_queue_drops, 2);
}

// write_through_selective: a prefix used once (below the threshold of 2) is never copied; when
// the device drops it, it is counted as policy. One used twice is stored, nothing skipped.
TEST(NothingLostReasonsTest, APrefixTheSelectivePolicyNeverCopiedIsCountedAsPolicy) {
  auto b = OpenStorage("memory://?capacity=64MiB", NamespaceFor(16));
  ASSERT_TRUE(b.ok());
  std::shared_ptr<StorageBackend> store(std::move(*b));
  TestCache s = Make(store, 16, 1024, WritePolicy::kWriteThroughSelective);
  const auto once = Seq(40 * 16, 5);
  const auto twice = Seq(24 * 16, 700000);
  Prefill(s, once);
  Prefill(s, twice);
  Prefill(s, twice);
  ASSERT_TRUE(s.cache->WaitForBackups().ok());
  EXPECT_EQ(StoredPages(*store, twice, 16), 24);
  EXPECT_EQ(StoredPages(*store, once, 16), 0);
  EXPECT_EQ(s.cache->stats().storage_backup_policy_tokens, 0);  // not dropped yet: not skipped
  ASSERT_TRUE(s.cache->EvictDevice(1 << 30).ok());
  ASSERT_TRUE(s.cache->WaitForBackups().ok());
  const CacheStats st = s.cache->stats();
  EXPECT_EQ(st.storage_backup_policy_tokens, 40 * 16);
  EXPECT_EQ(st.storage_backup_tokens, 24 * 16);
  EXPECT_EQ(st.storage_backup_failed_tokens + st.storage_backup_dropped_tokens +
                st.storage_backup_capacity_tokens,
            0);
  EXPECT_TRUE(s.cache->CheckConsistency().ok());
}

// write_back: nothing is due while the pages are on the device or in host memory (nothing
// stored, nothing counted as skipped); once eviction would drop them, every page is stored.
TEST(NothingLostReasonsTest, WriteBackStoresEverythingWhenItIsDueAndSkipsNothing) {
  auto b = OpenStorage("memory://?capacity=64MiB", NamespaceFor(16));
  ASSERT_TRUE(b.ok());
  std::shared_ptr<StorageBackend> store(std::move(*b));
  TestCache s = Make(store, 16, 2048, WritePolicy::kWriteBack);
  const auto a = Seq(600 * 16, 9);  // more than max_backup_batch_pages
  Prefill(s, std::span<const Token>(a).first(300 * 16));
  Prefill(s, a);
  ASSERT_TRUE(s.cache->WaitForBackups().ok());
  EXPECT_EQ(StoredPages(*store, a, 16), 0);
  CacheStats st = s.cache->stats();
  EXPECT_EQ(st.storage_backup_policy_tokens + st.storage_backup_dropped_tokens +
                st.storage_backup_failed_tokens + st.storage_backup_capacity_tokens,
            0);
  ASSERT_TRUE(s.cache->EvictDevice(1 << 30).ok());
  // Host eviction stores what it would drop; stores in flight hold their nodes until they land.
  for (int i = 0; i < 100 && StoredPages(*store, a, 16) < 600; ++i) {
    ASSERT_TRUE(s.cache->EvictHost(1 << 30).ok());
    ASSERT_TRUE(s.cache->WaitForBackups().ok());
  }
  EXPECT_EQ(StoredPages(*store, a, 16), 600);
  st = s.cache->stats();
  EXPECT_EQ(st.storage_backup_tokens, 600 * 16);
  EXPECT_EQ(st.storage_backup_policy_tokens + st.storage_backup_dropped_tokens +
                st.storage_backup_failed_tokens + st.storage_backup_capacity_tokens,
            0);
  EXPECT_TRUE(s.cache->CheckConsistency().ok());
}

TEST(NothingLostHealTest, APageReadBackCorruptIsWrittenAgainByTheNextBackup) {
  auto store = FaultyStore(16);
  const auto a = Seq(64 * 16, 11);
  {
    TestCache s = Make(store, 16, 128);
    Prefill(s, a);
    ASSERT_TRUE(s.cache->WaitForBackups().ok());
  }
  ASSERT_EQ(StoredPages(*store, a, 16), 64);
  // A second cache reads the prefix back corrupt: the pages are dropped from the tree and from
  // the store.
  TestCache s = Make(store, 16, 128);
  ASSERT_TRUE(store->SetCorruptFraction(1).ok());
  auto m = s.cache->Match(a);
  ASSERT_TRUE(m.ok());
  ASSERT_TRUE(s.cache->QueryStorage(m->handle).ok());
  ASSERT_TRUE(s.cache->Prefetch(m->handle, PrefetchPolicy::kWaitComplete).ok());
  auto f = s.cache->FinishPrefetch(m->handle);
  ASSERT_TRUE(f.ok());
  EXPECT_EQ(f->state, PrefetchState::kPartial);
  EXPECT_EQ(f->arrived_tokens, 0);
  ASSERT_TRUE(s.cache->Release(m->handle).ok());
  store->ClearFaults();
  ASSERT_TRUE(s.cache->WaitForBackups().ok());  // the removal of the corrupt pages
  EXPECT_EQ(StoredPages(*store, a, 16), 0);
  EXPECT_GT(s.cache->stats().storage_corrupt_pages, 0);
  // The next backup of the prefix (recomputed and inserted) writes every page again ...
  Prefill(s, a);
  ASSERT_TRUE(s.cache->WaitForBackups().ok());
  EXPECT_EQ(StoredPages(*store, a, 16), 64);
  EXPECT_TRUE(s.cache->CheckConsistency().ok());
  // ... and it reads back byte for byte.
  ExpectReadBack(store, a, 16);
}

}  // namespace
}  // namespace kvtier
