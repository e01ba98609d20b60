// HierarchicalCache with a storage tier (memory:// and the fault wrapper): backups to storage,
// QueryStorage, Prefetch under each policy, faults as misses within the timeout; the fixes of
// the cache v2 issue (foreign handles, empty namespaces, counts near INT64_MAX, thread bounds,
// failed backups, nothing blocking under the mutex); page-granular leaf-LRU eviction checked
// against an independent computation.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <limits>
#include <map>
#include <random>
#include <thread>

#include "cache/cache_test_util.h"
#include "kvtier/hierarchical_cache.h"
#include "kvtier/storage.h"
#include "kvtier/testing/storage_fault.h"
#include "storage/redis_test_server.h"
#include "support/missing_dependency.h"

namespace kvtier {
namespace {

using testing::CheckingEngine;
using testing::DeviceTier;
using testing::Hashes;
using Clock = std::chrono::steady_clock;

constexpr int64_t kLayers = 2;
constexpr int64_t kSlotBytes = 8;

StorageNamespace NamespaceFor(int64_t page, KvLayout layout = KvLayout::kPageFirst) {
  StorageNamespace ns;
  ns.model_id = "cache-test";
  ns.layout = layout;
  ns.num_layers = kLayers;
  ns.slot_bytes = kSlotBytes;
  ns.page_size = page;
  return ns;
}

std::shared_ptr<StorageBackend> MemoryStore(int64_t page, StorageOptions options = {}) {
  auto b = OpenStorage("memory://?capacity=64MiB", NamespaceFor(page), options);
  EXPECT_TRUE(b.ok()) << b.status().ToString();
  return std::shared_ptr<StorageBackend>(std::move(*b));
}

// A memory store behind the fault wrapper; `faults` points at the wrapper.
std::shared_ptr<StorageBackend> FaultyStore(int64_t page, FaultInjectingStorage** faults,
                                            StorageOptions options = {}) {
  auto inner = OpenStorage("memory://?capacity=64MiB", NamespaceFor(page), options);
  EXPECT_TRUE(inner.ok()) << inner.status().ToString();
  auto w = FaultInjectingStorage::Wrap(std::move(*inner), 7, options);
  EXPECT_TRUE(w.ok()) << w.status().ToString();
  *faults = w->get();
  return std::shared_ptr<StorageBackend>(std::move(*w));
}

struct TestCache {
  std::unique_ptr<DeviceTier> device;
  std::unique_ptr<HierarchicalCache> cache;
  CheckingEngine* engine = nullptr;
};

TestCache Make(HierarchicalCacheConfig cfg, int64_t page, int64_t device_pages,
               int64_t host_pages) {
  TestCache s;
  KvGeometry g{KvLayout::kLayerFirst, kLayers, device_pages * page, kSlotBytes, page, 1};
  auto dev = DeviceTier::Create(TransferBackend::kCpu, g, false);
  EXPECT_TRUE(dev.ok()) << dev.status().ToString();
  s.device = std::move(*dev);
  cfg.host_capacity_bytes = host_pages * page * kLayers * kSlotBytes * 2;
  cfg.transfer.cpu_threads = 1;
  auto inner = MakeTransferEngine(TransferBackend::kCpu, cfg.transfer);
  EXPECT_TRUE(inner.ok());
  auto engine = std::make_unique<CheckingEngine>(std::move(*inner));
  s.engine = engine.get();
  auto c = HierarchicalCache::Create(cfg, s.device->region(), std::move(engine));
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  s.cache = std::move(*c);
  s.engine->cache = s.cache.get();
  return s;
}

std::vector<Token> Seq(int64_t n, Token base) {
  std::vector<Token> t(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) t[static_cast<size_t>(i)] = base + static_cast<Token>(i);
  return t;
}

void ExpectConsistent(const TestCache& s) {
  const Status st = s.cache->CheckConsistency();
  EXPECT_TRUE(st.ok()) << st.ToString();
}

// The engine's prefill: match, compute (pattern) the uncached rest, insert, release.
void Prefill(TestCache& s, std::span<const Token> tokens, std::string_view ns = "") {
  auto m = s.cache->Match(tokens, ns);
  ASSERT_TRUE(m.ok());
  const auto hashes = Hashes(tokens, ns);
  std::vector<int64_t> slots = m->device_slots;
  const int64_t rest = static_cast<int64_t>(tokens.size()) - m->device_tokens;
  auto fresh = s.cache->AllocateDeviceSlots(rest);
  ASSERT_TRUE(fresh.ok()) << fresh.status().ToString();
  ASSERT_TRUE(
      s.device->Fill(*fresh, std::span<const uint64_t>(hashes).subspan(m->device_tokens)).ok());
  slots.insert(slots.end(), fresh->begin(), fresh->end());
  auto r = s.cache->Insert(tokens, slots, ns);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_TRUE(s.cache->Release(m->handle).ok());
  ExpectConsistent(s);
}

HierarchicalCacheConfig StorageConfig(std::shared_ptr<StorageBackend> store) {
  HierarchicalCacheConfig cfg;
  cfg.write_policy = WritePolicy::kWriteThrough;
  cfg.backup_threads = 1;
  cfg.storage.backend = std::move(store);
  cfg.storage.prefetch_threshold_tokens = 0;
  return cfg;
}

// Pushes everything out of the device and host tiers (write_through: it stays in storage).
void EvictAll(TestCache& s) {
  ASSERT_TRUE(s.cache->WaitForBackups().ok());
  ASSERT_TRUE(s.cache->EvictDevice(std::numeric_limits<int64_t>::max()).ok());
  ASSERT_TRUE(s.cache->EvictHost(std::numeric_limits<int64_t>::max()).ok());
  ExpectConsistent(s);
}

class PrefetchPolicyTest : public ::testing::TestWithParam<PrefetchPolicy> {};

TEST_P(PrefetchPolicyTest, PageEvictedFromDeviceAndHostComesBackByteExact) {
  TestCache s = Make(StorageConfig(MemoryStore(4)), 4, 16, 32);
  const auto a = Seq(40, 1000);
  Prefill(s, a);
  EvictAll(s);
  CacheStats st = s.cache->stats();
  EXPECT_EQ(st.storage_backup_tokens, 40);
  EXPECT_EQ(st.device_cached_tokens, 0);
  EXPECT_EQ(st.host_used_tokens, 0);
  EXPECT_EQ(st.storage_only_tokens, 40);
  auto m = s.cache->Match(a);
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->device_tokens, 0);
  EXPECT_EQ(m->host_tokens, 0);
  EXPECT_EQ(m->storage_tokens, 40);
  auto p = s.cache->Prefetch(m->handle, GetParam());
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(p->state, PrefetchState::kRunning);
  EXPECT_EQ(p->requested_tokens, 40);
  ExpectConsistent(s);
  if (GetParam() == PrefetchPolicy::kBestEffort) {
    // Best effort takes what has arrived when asked; wait until everything has, to compare (60 s
    // at most, a hang guard: a count of 2,000 polls of 1 ms was a 2 s bound on the reads).
    const auto give_up = Clock::now() + std::chrono::seconds(60);
    for (;;) {
      auto poll = s.cache->PollPrefetch(m->handle);
      ASSERT_TRUE(poll.ok());
      if (poll->arrived_tokens == 40) break;
      ASSERT_LT(Clock::now(), give_up) << "the prefetch's reads did not arrive (a hang)";
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
  auto l = s.cache->LoadBack(m->handle);
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  EXPECT_EQ(l->prefetch.state, PrefetchState::kComplete);
  EXPECT_EQ(l->prefetch.arrived_tokens, 40);
  EXPECT_EQ(l->loaded_tokens, 40);
  ASSERT_EQ(l->device_slots.size(), 40u);
  EXPECT_TRUE(s.device->Verify(l->device_slots, Hashes(a, "")).ok());
  ASSERT_TRUE(s.cache->Release(m->handle).ok());
  ExpectConsistent(s);
  st = s.cache->stats();
  EXPECT_EQ(st.prefetched_tokens, 40);
  EXPECT_EQ(st.prefetch_complete, 1);
  EXPECT_EQ(s.engine->under_lock.load(), 0);
}

INSTANTIATE_TEST_SUITE_P(Policies, PrefetchPolicyTest,
                         ::testing::Values(PrefetchPolicy::kBestEffort,
                                           PrefetchPolicy::kWaitComplete, PrefetchPolicy::kTimeout),
                         [](const auto& info) {
                           return std::string(PrefetchPolicyName(info.param));
                         });

// A layer_first host pool keeps a page in num_layers pieces per buffer: its pages are gathered
// into a staging buffer before a Set and scattered after a Get. Pages written by one cache come
// back byte-exact (the pattern helper) into that cache and into a second one over the same store.
class LayerFirstHostTest : public ::testing::TestWithParam<std::string> {
 protected:
  void TearDown() override {
    std::error_code ec;
    if (!dir_.empty()) std::filesystem::remove_all(dir_, ec);
  }
  std::shared_ptr<StorageBackend> Store() {
    std::string url = GetParam();
    if (url == "file") {
      std::string tmpl = "/tmp/kvtier_cache_layer_first_XXXXXX";
      EXPECT_NE(::mkdtemp(tmpl.data()), nullptr);
      dir_ = tmpl;
      url = "file://" + dir_;
    }
    auto b = OpenStorage(url, NamespaceFor(4, KvLayout::kLayerFirst));
    EXPECT_TRUE(b.ok()) << b.status().ToString();
    return b.ok() ? std::shared_ptr<StorageBackend>(std::move(*b)) : nullptr;
  }
  std::string dir_;
};

TEST_P(LayerFirstHostTest, PagesRoundTripThroughStorageByteExact) {
  auto store = Store();
  ASSERT_NE(store, nullptr);
  HierarchicalCacheConfig cfg = StorageConfig(store);
  cfg.host_layout = KvLayout::kLayerFirst;
  TestCache s = Make(cfg, 4, 16, 32);
  const auto a = Seq(40, 300);  // 10 pages
  Prefill(s, a);
  EvictAll(s);
  EXPECT_EQ(s.cache->stats().storage_backup_tokens, 40);
  EXPECT_EQ(store->Stats().stored_pages, 10);

  for (int round = 0; round < 2; ++round) {
    TestCache* c = &s;
    TestCache fresh;
    if (round == 1) {  // a second cache over the same store reads what the first wrote
      fresh = Make(cfg, 4, 16, 32);
      c = &fresh;
    }
    auto m = c->cache->Match(a);
    ASSERT_TRUE(m.ok());
    ASSERT_TRUE(c->cache->QueryStorage(m->handle).ok());
    m = c->cache->Match(a);
    ASSERT_EQ(m->storage_tokens, 40);
    ASSERT_TRUE(c->cache->Prefetch(m->handle, PrefetchPolicy::kWaitComplete).ok());
    auto l = c->cache->LoadBack(m->handle);
    ASSERT_TRUE(l.ok()) << l.status().ToString();
    EXPECT_EQ(l->prefetch.state, PrefetchState::kComplete);
    ASSERT_EQ(l->loaded_tokens, 40);
    const Status v = c->device->Verify(l->device_slots, Hashes(a, ""));
    EXPECT_TRUE(v.ok()) << v.ToString();
    ASSERT_TRUE(c->cache->Release(m->handle).ok());
    ExpectConsistent(*c);
    EXPECT_EQ(c->cache->stats().prefetched_tokens, 40);
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, LayerFirstHostTest,
                         ::testing::Values("memory://?capacity=64MiB", "file"),
                         [](const auto& info) {
                           return std::string(info.param == "file" ? "file" : "memory");
                         });

TEST(StorageTierTest, QueryStorageFindsAnotherCachesPagesOnlyInItsNamespace) {
  auto store = MemoryStore(4);
  TestCache first = Make(StorageConfig(store), 4, 16, 32);
  TestCache second = Make(StorageConfig(store), 4, 16, 32);
  const auto a = Seq(36, 7);  // 9 pages
  Prefill(first, a, "tenant");
  ASSERT_TRUE(first.cache->WaitForBackups().ok());

  auto other = second.cache->Match(a, "someone-else");
  ASSERT_TRUE(other.ok());
  auto q0 = second.cache->QueryStorage(other->handle);
  ASSERT_TRUE(q0.ok());
  EXPECT_EQ(q0->queried_tokens, 0);  // another tenant's salt: other keys
  ASSERT_TRUE(second.cache->Release(other->handle).ok());

  std::vector<Token> longer = a;
  longer.insert(longer.end(), {1, 2, 3, 4, 5, 6});  // one page more and a partial page
  auto m = second.cache->Match(longer, "tenant");
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->storage_tokens, 0);
  auto q = second.cache->QueryStorage(m->handle);
  ASSERT_TRUE(q.ok()) << q.status().ToString();
  EXPECT_EQ(q->queried_tokens, 36);
  EXPECT_EQ(q->storage_tokens, 36);
  ExpectConsistent(second);
  auto p = second.cache->Prefetch(m->handle, PrefetchPolicy::kWaitComplete);
  ASSERT_TRUE(p.ok());
  auto l = second.cache->LoadBack(m->handle);
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  EXPECT_EQ(l->loaded_tokens, 36);
  EXPECT_TRUE(second.device->Verify(l->device_slots, Hashes(a, "tenant")).ok());
  ASSERT_TRUE(second.cache->Release(m->handle).ok());
  ExpectConsistent(second);
  // A second Match now sees it on the device.
  auto again = second.cache->Match(longer, "tenant");
  EXPECT_EQ(again->device_tokens, 36);
  ASSERT_TRUE(second.cache->Release(again->handle).ok());
}

TEST(StorageTierTest, ThresholdAndHalfOfHostCap) {
  auto store = MemoryStore(4);
  HierarchicalCacheConfig cfg = StorageConfig(store);
  cfg.storage.prefetch_threshold_tokens = 256;
  TestCache s = Make(cfg, 4, 64, 32);  // host: 32 pages, at most 16 filling
  const auto a = Seq(128, 1);
  Prefill(s, a);
  EvictAll(s);
  auto m = s.cache->Match(a);
  auto p = s.cache->Prefetch(m->handle, PrefetchPolicy::kWaitComplete);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->state, PrefetchState::kNone);  // 128 < 256 tokens
  EXPECT_EQ(s.cache->stats().prefetch_below_threshold_tokens, 128);
  ASSERT_TRUE(s.cache->Release(m->handle).ok());

  cfg.storage.prefetch_threshold_tokens = 16;
  TestCache t = Make(cfg, 4, 64, 32);
  m = t.cache->Match(a);
  ASSERT_TRUE(t.cache->QueryStorage(m->handle).ok());
  p = t.cache->Prefetch(m->handle, PrefetchPolicy::kWaitComplete);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->requested_tokens, 64);  // half of 32 pages of 4
  EXPECT_LE(t.cache->stats().host_filling_tokens, 64);
  auto f = t.cache->FinishPrefetch(m->handle);
  ASSERT_TRUE(f.ok());
  EXPECT_EQ(f->state, PrefetchState::kComplete);
  EXPECT_EQ(f->host_tokens, 64);
  ASSERT_TRUE(t.cache->Release(m->handle).ok());
  ExpectConsistent(t);
}

TEST(StorageTierTest, CorruptOrMissingPagesCutThePrefixNeverWrongBytes) {
  FaultInjectingStorage* faults = nullptr;
  auto store = FaultyStore(4, &faults);
  TestCache s = Make(StorageConfig(store), 4, 16, 32);
  const auto a = Seq(32, 50);
  Prefill(s, a);
  EvictAll(s);
  ASSERT_TRUE(faults->SetCorruptFraction(1.0).ok());
  auto m = s.cache->Match(a);
  ASSERT_EQ(m->storage_tokens, 32);
  ASSERT_TRUE(s.cache->Prefetch(m->handle, PrefetchPolicy::kWaitComplete).ok());
  auto f = s.cache->FinishPrefetch(m->handle);
  ASSERT_TRUE(f.ok());
  EXPECT_EQ(f->state, PrefetchState::kPartial);
  EXPECT_EQ(f->arrived_tokens, 0);
  EXPECT_EQ(f->host_tokens, 0);
  auto l = s.cache->LoadBack(m->handle);
  ASSERT_TRUE(l.ok());
  EXPECT_EQ(l->loaded_tokens, 0);
  EXPECT_TRUE(l->device_slots.empty());
  ASSERT_TRUE(s.cache->Release(m->handle).ok());
  ExpectConsistent(s);
  EXPECT_GT(s.cache->stats().storage_corrupt_pages, 0);
  // The tree forgot the pages storage could not give back.
  faults->ClearFaults();
  m = s.cache->Match(a);
  EXPECT_EQ(m->storage_tokens, 0);
  ASSERT_TRUE(s.cache->Release(m->handle).ok());
  ExpectConsistent(s);
}

// The store's reads are held until the test releases them, its timeout is 60 s: a FinishPrefetch
// that waited for them would take that long (the hang guard below), one that does not returns.
TEST(StorageTierTest, TimeoutAndBestEffortDoNotWaitForSlowStorage) {
  FaultInjectingStorage* faults = nullptr;
  StorageOptions options;
  options.timeout = std::chrono::seconds(60);
  auto store = FaultyStore(4, &faults, options);
  HierarchicalCacheConfig cfg = StorageConfig(store);
  cfg.storage.prefetch_timeout_base_s = 0.05;
  cfg.storage.prefetch_timeout_per_1k_tokens_s = 0;
  TestCache s = Make(cfg, 4, 16, 32);
  const auto a = Seq(32, 9);
  Prefill(s, a);
  EvictAll(s);
  auto keys = ComputePromptPageKeys(a, 4);
  ASSERT_TRUE(keys.ok());
  faults->HoldReads(*keys);
  for (PrefetchPolicy policy : {PrefetchPolicy::kTimeout, PrefetchPolicy::kBestEffort}) {
    SCOPED_TRACE(PrefetchPolicyName(policy));
    auto m = s.cache->Match(a);
    ASSERT_TRUE(s.cache->Prefetch(m->handle, policy).ok());
    const auto start = Clock::now();
    auto f = s.cache->FinishPrefetch(m->handle);
    const double waited = std::chrono::duration<double>(Clock::now() - start).count();
    ASSERT_TRUE(f.ok());
    EXPECT_EQ(f->arrived_tokens, 0);
    EXPECT_EQ(f->state, policy == PrefetchPolicy::kTimeout ? PrefetchState::kTimedOut
                                                           : PrefetchState::kPartial);
    EXPECT_LT(waited, 30.0);  // a hang guard: waiting for the held reads takes 60 s
    ASSERT_TRUE(s.cache->Release(m->handle).ok());
    ExpectConsistent(s);
  }
  // The cancelled reads still complete; their host pages come back then.
  faults->ClearFaults();
  ASSERT_TRUE(s.cache->WaitForBackups().ok());
  const auto give_up = Clock::now() + std::chrono::seconds(30);  // a hang guard
  while (s.cache->stats().host_filling_tokens != 0 && Clock::now() < give_up) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_EQ(s.cache->stats().host_filling_tokens, 0);
  EXPECT_EQ(s.cache->stats().prefetch_timed_out, 1);
  ExpectConsistent(s);
}

// Issue 23: read and write time-outs are counted apart. Writes held past their deadline time the
// backup's pages out (write time-outs only); then reads held past theirs time the prefetch's
// pages out (read time-outs only). The metrics carry both under one family, labelled by op. The
// store's timeout is the bound under test, so it is short (5 s: each held call ends there), yet
// far above what the calls that must not time out (b's backup, 4 pages into memory) take on a
// loaded box; the reads are held, not delayed, so nothing depends on how fast anything runs.
TEST(StorageTierTest, ReadAndWriteTimeoutsAreCountedApart) {
  FaultInjectingStorage* faults = nullptr;
  StorageOptions options;
  options.timeout = std::chrono::seconds(5);
  auto store = FaultyStore(4, &faults, options);
  TestCache s = Make(StorageConfig(store), 4, 16, 32);
  faults->HoldWrites(true);
  Prefill(s, Seq(16, 500));  // 4 pages, their backup held
  ASSERT_TRUE(s.cache->WaitForBackups().ok());
  faults->HoldWrites(false);
  CacheStats st = s.cache->stats();
  EXPECT_EQ(st.storage_write_timeouts, 4);
  EXPECT_EQ(st.storage_read_timeouts, 0);
  const int64_t timed_out_writes = faults->injected().timed_out_calls;
  EXPECT_GT(timed_out_writes, 0);

  const auto b = Seq(16, 900);
  Prefill(s, b);
  EvictAll(s);  // b only in storage now
  auto b_keys = ComputePromptPageKeys(b, 4);
  ASSERT_TRUE(b_keys.ok());
  faults->HoldReads(*b_keys);  // until their deadline: read time-outs
  auto m = s.cache->Match(b);
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->storage_tokens, 16);
  ASSERT_TRUE(s.cache->Prefetch(m->handle, PrefetchPolicy::kWaitComplete).ok());
  auto f = s.cache->FinishPrefetch(m->handle);
  ASSERT_TRUE(f.ok());
  EXPECT_EQ(f->arrived_tokens, 0);
  ASSERT_TRUE(s.cache->Release(m->handle).ok());
  faults->ClearFaults();
  EXPECT_GT(faults->injected().timed_out_calls, timed_out_writes);  // the held reads
  st = s.cache->stats();
  EXPECT_EQ(st.storage_read_timeouts, 4);
  EXPECT_EQ(st.storage_write_timeouts, 4);
  const std::string text = s.cache->Metrics();
  EXPECT_NE(text.find("kvtier:storage_timeouts_total{op=\"read\"} 4\n"), std::string::npos) << text;
  EXPECT_NE(text.find("kvtier:storage_timeouts_total{op=\"write\"} 4\n"), std::string::npos)
      << text;
  ExpectConsistent(s);
}

// Admission by reuse (issue 40): when the store cannot take everything, a page read twice is
// written and a page read once is not, under every admission policy. The store's one queue page
// is held by a's write (deterministic: writes wait until released), so b and c compete for a
// backlog of one page: b (read once) waits there; c, once read a second time, displaces it (all:
// by hit count; frequency: by its sketch count; hits: b is refused outright).
class StorageAdmissionTest : public ::testing::TestWithParam<StorageAdmission> {};

TEST_P(StorageAdmissionTest, APageReadTwiceIsKeptOverAPageReadOnce) {
  FaultInjectingStorage* faults = nullptr;
  StorageOptions options;
  options.timeout = std::chrono::seconds(60);  // a hang guard: the held write is released below
  auto store = FaultyStore(4, &faults, options);
  HierarchicalCacheConfig cfg = StorageConfig(store);
  cfg.backup_threads = 0;  // backups land inline: each store starts at the next call's reaping
  cfg.storage.max_backup_queue_pages = 1;
  cfg.storage.admission.policy = GetParam();
  cfg.storage.admission.threshold = 2;
  cfg.storage.admission.backlog_bytes = 4 * kLayers * kSlotBytes * 2;  // one page
  TestCache s = Make(cfg, 4, 16, 32);
  faults->HoldWrites(true);
  const auto a = Seq(4, 100), b = Seq(4, 200), c = Seq(4, 300);
  Prefill(s, a);
  Prefill(s, a);  // read twice (hits admits it now): a's store holds the queue
  Prefill(s, b);  // b: read once
  Prefill(s, c);  // c: read once ...
  Prefill(s, c);  // ... and twice
  CacheStats st = s.cache->stats();
  EXPECT_EQ(st.storage_backlog_tokens, 4);
  faults->HoldWrites(false);
  ASSERT_TRUE(s.cache->WaitForBackups().ok());
  auto key = [](const std::vector<Token>& t) { return ComputePromptPageKeys(t, 4, "")->at(0); };
  auto stored = [&](const std::vector<Token>& t) {
    return faults->inner().Exists(std::vector<PageKey>{key(t)}).get().leading == 1;
  };
  EXPECT_TRUE(stored(a));
  EXPECT_TRUE(stored(c));
  EXPECT_FALSE(stored(b));
  st = s.cache->stats();
  EXPECT_EQ(st.storage_backup_tokens, 8);
  EXPECT_EQ(st.storage_backlog_tokens, 0);
  EXPECT_EQ(st.storage_queue_drops, 0);
  EXPECT_GT(st.storage_backup_backlog_tokens + st.storage_backup_refused_tokens, 0);
  if (GetParam() == StorageAdmission::kHits) {
    EXPECT_EQ(st.storage_backup_backlog_tokens, 0);  // nothing below the threshold got in
  } else {
    EXPECT_GE(st.storage_backup_backlog_tokens, 4);  // b, given up for c
  }
  ExpectConsistent(s);
}

INSTANTIATE_TEST_SUITE_P(Policies, StorageAdmissionTest,
                         ::testing::Values(StorageAdmission::kAll, StorageAdmission::kHits,
                                           StorageAdmission::kFrequency),
                         [](const auto& info) { return StorageAdmissionName(info.param); });

// Never slower than recomputing. The first prefetch measures the read bandwidth; the rule then
// cuts what is slower to read than to recompute. Deterministic without timing assertions: a
// store delaying every Get by 200 ms takes at least 0.2 s to read the prefix, against 32 ns to
// recompute it at 1e9 tokens/s (cut); an undelayed store read against a prefill of 1 token/s
// (32 s) would need 32 s for 1 KiB to be cut (not cut).
TEST(StorageTierTest, SlowStorageIsCutInFavourOfRecomputingFastStorageIsNot) {
  for (const bool slow : {true, false}) {
    SCOPED_TRACE(slow ? "slow store" : "fast store");
    FaultInjectingStorage* faults = nullptr;
    StorageOptions options;
    options.timeout = std::chrono::seconds(60);  // a hang guard: the 200 ms delay must not reach it
    HierarchicalCacheConfig cfg = StorageConfig(FaultyStore(4, &faults, options));
    cfg.storage.prefill_tokens_per_second = slow ? 1e9 : 1.0;
    TestCache s = Make(cfg, 4, 16, 32);
    const auto a = Seq(32, 300);
    Prefill(s, a);
    EvictAll(s);
    if (slow) {
      ASSERT_TRUE(faults->SetDelay(std::chrono::milliseconds(200)).ok());
    }
    // Nothing measured yet: nothing is cut, and this prefetch measures the bandwidth.
    auto m = s.cache->Match(a);
    ASSERT_TRUE(m.ok());
    auto q = s.cache->QueryStorage(m->handle);
    ASSERT_TRUE(q.ok());
    EXPECT_EQ(q->storage_tokens, 32);
    EXPECT_EQ(q->worth_reading_tokens, 32);
    EXPECT_EQ(q->cut.reason, StorageCutReason::kNone);
    EXPECT_EQ(q->cut.read_bytes_per_second, 0);
    auto p = s.cache->Prefetch(m->handle, PrefetchPolicy::kWaitComplete);
    ASSERT_TRUE(p.ok());
    EXPECT_EQ(p->state, PrefetchState::kRunning);
    EXPECT_EQ(p->cut.tokens, 0);
    auto f = s.cache->FinishPrefetch(m->handle);
    ASSERT_TRUE(f.ok());
    EXPECT_EQ(f->state, PrefetchState::kComplete);
    ASSERT_TRUE(s.cache->Release(m->handle).ok());
    EvictAll(s);
    // Measured now: the slow store's hit is left to recomputing, the fast one's is read.
    m = s.cache->Match(a);
    ASSERT_TRUE(m.ok());
    q = s.cache->QueryStorage(m->handle);
    ASSERT_TRUE(q.ok());
    EXPECT_EQ(q->storage_tokens, 32);
    EXPECT_GT(q->cut.read_bytes_per_second, 0);
    EXPECT_GT(q->cut.read_seconds, 0);
    EXPECT_DOUBLE_EQ(q->cut.recompute_seconds, 32 / cfg.storage.prefill_tokens_per_second);
    p = s.cache->Prefetch(m->handle, PrefetchPolicy::kWaitComplete);
    ASSERT_TRUE(p.ok());
    if (slow) {
      EXPECT_GE(q->cut.read_seconds, 0.2 * 0.99);  // the delay bounds the measured bandwidth
      EXPECT_EQ(q->cut.reason, StorageCutReason::kRecomputeCheaper);
      EXPECT_STREQ(StorageCutReasonName(q->cut.reason), "recompute_cheaper");
      EXPECT_EQ(q->cut.tokens, 32);
      EXPECT_EQ(q->worth_reading_tokens, 0);
      EXPECT_EQ(p->state, PrefetchState::kNone);
      EXPECT_EQ(p->cut.reason, StorageCutReason::kRecomputeCheaper);
      EXPECT_EQ(p->cut.tokens, 32);
      EXPECT_EQ(p->requested_tokens, 0);
      auto l = s.cache->LoadBack(m->handle);
      ASSERT_TRUE(l.ok());
      EXPECT_EQ(l->loaded_tokens, 0);
      EXPECT_TRUE(l->device_slots.empty());
    } else {
      EXPECT_EQ(q->cut.reason, StorageCutReason::kNone);
      EXPECT_EQ(q->cut.tokens, 0);
      EXPECT_EQ(q->worth_reading_tokens, 32);
      EXPECT_EQ(p->state, PrefetchState::kRunning);
      EXPECT_EQ(p->cut.tokens, 0);
      EXPECT_EQ(p->requested_tokens, 32);
      auto l = s.cache->LoadBack(m->handle);
      ASSERT_TRUE(l.ok());
      EXPECT_EQ(l->prefetch.state, PrefetchState::kComplete);
      ASSERT_EQ(l->device_slots.size(), 32u);
      EXPECT_TRUE(s.device->Verify(l->device_slots, Hashes(a, "")).ok());
    }
    ASSERT_TRUE(s.cache->Release(m->handle).ok());
    faults->ClearFaults();
    ExpectConsistent(s);
  }
}

// A store that is down fails each call at once: the cache's calls go on (storage hits become
// misses) without waiting for the store's timeout, here 60 s, so that a call that waited for it
// fails the 30 s hang guard whatever the machine's load.
TEST(StorageTierTest, StorageDownKeepsServingWithinTheTimeout) {
  FaultInjectingStorage* faults = nullptr;
  StorageOptions options;
  options.timeout = std::chrono::seconds(60);
  auto store = FaultyStore(4, &faults, options);
  TestCache s = Make(StorageConfig(store), 4, 16, 32);
  const auto a = Seq(32, 300);
  Prefill(s, a);
  EvictAll(s);
  faults->SetDown(true);
  double slowest = 0;
  auto timed = [&](auto&& fn) {
    const auto start = Clock::now();
    fn();
    slowest = std::max(slowest, std::chrono::duration<double>(Clock::now() - start).count());
  };
  for (int round = 0; round < 5; ++round) {
    const auto b = Seq(32, 5000 + round * 100);
    timed([&] { Prefill(s, b); });
    timed([&] { ASSERT_TRUE(s.cache->WaitForBackups().ok()); });
    auto m = s.cache->Match(a);
    ASSERT_TRUE(m.ok());
    timed([&] { ASSERT_TRUE(s.cache->QueryStorage(m->handle).ok()); });
    timed([&] { ASSERT_TRUE(s.cache->Prefetch(m->handle, PrefetchPolicy::kWaitComplete).ok()); });
    timed([&] {
      auto l = s.cache->LoadBack(m->handle);
      ASSERT_TRUE(l.ok()) << l.status().ToString();
      EXPECT_EQ(l->loaded_tokens, 0);  // storage hits became misses
    });
    ASSERT_TRUE(s.cache->Release(m->handle).ok());
    ExpectConsistent(s);
  }
  EXPECT_LT(slowest, 30.0);  // a hang guard: no call waited for the store's 60 s timeout
  EXPECT_GT(s.cache->stats().storage_errors, 0);
  // Back up: what b wrote while down was not stored, a's pages are still there.
  faults->SetDown(false);
  auto m = s.cache->Match(a);
  if (m->storage_tokens == 0) {
    ASSERT_TRUE(s.cache->QueryStorage(m->handle).ok());
  }
  ASSERT_TRUE(s.cache->Prefetch(m->handle, PrefetchPolicy::kWaitComplete).ok());
  auto l = s.cache->LoadBack(m->handle);
  ASSERT_TRUE(l.ok());
  EXPECT_EQ(l->device_slots.size(), a.size());
  EXPECT_TRUE(s.device->Verify(l->device_slots, Hashes(a, "")).ok());
  ASSERT_TRUE(s.cache->Release(m->handle).ok());
}

#if KVTIER_HAVE_HIREDIS
// A real Redis server killed in the middle of a run: the cache keeps serving (storage hits become
// misses), and no call waits for the store's timeout (60 s; refused connections fail at once), so
// a call that did fails the 30 s hang guard whatever the machine's load.
TEST(StorageTierTest, RedisStoppedMidRunKeepsServing) {
  if (std::string why = testing::RedisTestSkipReason(); !why.empty())
    KVTIER_SKIP_MISSING_DEPENDENCY(why);
  testing::RedisTestServer server;
  ASSERT_EQ(server.Start(), "");
  HierarchicalCacheConfig cfg;
  cfg.write_policy = WritePolicy::kWriteThrough;
  cfg.storage.url = "redis://" + server.address();
  cfg.storage.model_id = "cache-test";
  cfg.storage.options.timeout = std::chrono::seconds(60);
  cfg.storage.prefetch_threshold_tokens = 0;
  TestCache s = Make(cfg, 4, 16, 32);
  ASSERT_NE(s.cache, nullptr);
  const auto a = Seq(32, 4242);
  Prefill(s, a);
  EvictAll(s);
  EXPECT_GT(s.cache->stats().storage_backup_tokens, 0);
  server.Kill();
  double slowest = 0;
  auto timed = [&](auto&& fn) {
    const auto start = Clock::now();
    fn();
    slowest = std::max(slowest, std::chrono::duration<double>(Clock::now() - start).count());
  };
  for (int round = 0; round < 4; ++round) {
    timed([&] { Prefill(s, Seq(32, 9000 + round * 100)); });
    timed([&] { ASSERT_TRUE(s.cache->WaitForBackups().ok()); });
    auto m = s.cache->Match(a);
    ASSERT_TRUE(m.ok());
    timed([&] { ASSERT_TRUE(s.cache->QueryStorage(m->handle).ok()); });
    timed([&] { ASSERT_TRUE(s.cache->Prefetch(m->handle, PrefetchPolicy::kWaitComplete).ok()); });
    timed([&] {
      auto l = s.cache->LoadBack(m->handle);
      ASSERT_TRUE(l.ok()) << l.status().ToString();
      EXPECT_EQ(l->loaded_tokens, 0);  // the server is gone: storage hits became misses
    });
    ASSERT_TRUE(s.cache->Release(m->handle).ok());
    ExpectConsistent(s);
  }
  EXPECT_LT(slowest, 30.0);  // a hang guard: no call waited for the store's 60 s timeout
  EXPECT_GT(s.cache->stats().storage_errors, 0);
}
#endif  // KVTIER_HAVE_HIREDIS

// ---- the fixes (each failed before) ---------------------------------------------------------

TEST(CacheFixesTest, HandleOfAnotherInstanceIsRefused) {
  HierarchicalCacheConfig cfg;
  TestCache c1 = Make(cfg, 4, 8, 8);
  TestCache c2 = Make(cfg, 4, 8, 8);
  const auto a = Seq(8, 1);
  Prefill(c1, a);
  Prefill(c2, a);  // the same calls: without instance tags m1 and m2 would have the same id
  auto m1 = c1.cache->Match(a);
  auto m2 = c2.cache->Match(a);
  ASSERT_TRUE(m1.ok() && m2.ok());
  const Status st = c2.cache->Release(m1->handle);
  EXPECT_TRUE(st.IsInvalidArgument()) << st.ToString();
  EXPECT_NE(st.message().find("another HierarchicalCache"), std::string::npos) << st.message();
  EXPECT_EQ(c2.cache->stats().live_handles, 1);  // c2's own handle is untouched
  EXPECT_TRUE(c1.cache->Release(m1->handle).ok());
  EXPECT_TRUE(c2.cache->Release(m2->handle).ok());
  EXPECT_EQ(c1.cache->stats().live_handles, 0);
}

TEST(CacheFixesTest, EmptyNamespacesAreRemovedAndEmptyInsertsCreateNone) {
  HierarchicalCacheConfig cfg;
  cfg.write_policy = WritePolicy::kWriteThrough;
  cfg.backup_threads = 0;
  TestCache s = Make(cfg, 4, 8, 8);
  for (int i = 0; i < 200; ++i) Prefill(s, Seq(4, i), fmt::format("ns{}", i));
  EXPECT_GT(s.cache->stats().namespaces, 0);
  ASSERT_TRUE(s.cache->EvictDevice(std::numeric_limits<int64_t>::max()).ok());
  ASSERT_TRUE(s.cache->EvictHost(std::numeric_limits<int64_t>::max()).ok());
  EXPECT_EQ(s.cache->stats().namespaces, 0);
  EXPECT_EQ(s.cache->stats().nodes, 0);
  auto r = s.cache->Insert({}, {}, "nobody", {.pin = true});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(s.cache->stats().namespaces, 0);
  EXPECT_TRUE(s.cache->Release(r->handle).ok());
  ExpectConsistent(s);
}

TEST(CacheFixesTest, CountsNearInt64MaxAndThreadCounts) {
  HierarchicalCacheConfig cfg;
  cfg.write_policy = WritePolicy::kWriteThrough;
  TestCache s = Make(cfg, 4, 8, 8);
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  EXPECT_TRUE(s.cache->AllocateDeviceSlots(kMax).status().IsInvalidArgument());
  EXPECT_TRUE(s.cache->AllocateDeviceSlots(kMax - 1).status().IsInvalidArgument());
  auto fewer = s.cache->AllocateDeviceSlots(kMax, {.allow_fewer = true});
  ASSERT_TRUE(fewer.ok());
  EXPECT_EQ(fewer->size(), 32u);
  ASSERT_TRUE(s.cache->FreeDeviceSlots(*fewer).ok());
  Prefill(s, Seq(8, 1));
  ASSERT_TRUE(s.cache->WaitForBackups().ok());
  // kMax tokens means everything (no overflow when rounding up to pages).
  auto evicted = s.cache->EvictDevice(kMax);
  ASSERT_TRUE(evicted.ok()) << evicted.status().ToString();
  EXPECT_EQ(*evicted, 8);
  evicted = s.cache->EvictHost(kMax);
  ASSERT_TRUE(evicted.ok()) << evicted.status().ToString();
  EXPECT_EQ(*evicted, 8);
  EXPECT_EQ(s.cache->stats().nodes, 0);
  EXPECT_TRUE(s.cache->EvictDevice(-1).status().IsInvalidArgument());
  KvGeometry g{KvLayout::kLayerFirst, kLayers, 32, kSlotBytes, 4, 1};
  HierarchicalCacheConfig bad;
  bad.backup_threads = 100000;
  EXPECT_TRUE(HierarchicalCache::Create(bad, s.device->region()).status().IsInvalidArgument());
  bad = HierarchicalCacheConfig();
  bad.transfer.cpu_threads = 100000;
  EXPECT_TRUE(HierarchicalCache::Create(bad, s.device->region()).status().IsInvalidArgument());
  (void)g;
}

// A failed backup is not counted as a backup, gives its host pages back, and WaitForBackups says
// why.
TEST(CacheFixesTest, FailedBackupIsNotCountedAsABackup) {
  HierarchicalCacheConfig cfg;
  cfg.write_policy = WritePolicy::kWriteThrough;
  cfg.backup_threads = 0;
  TestCache s = Make(cfg, 4, 8, 8);
  s.engine->fail_to = s.cache->host_region().k;  // copies into host memory fail
  s.engine->failures_left = 1;
  const auto a = Seq(8, 3);
  auto fresh = s.cache->AllocateDeviceSlots(8);
  ASSERT_TRUE(s.device->Fill(*fresh, Hashes(a, "")).ok());
  ASSERT_TRUE(s.cache->Insert(a, *fresh).ok());
  const Status st = s.cache->WaitForBackups();
  EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition) << st.ToString();
  EXPECT_NE(st.message().find("injected copy failure"), std::string::npos) << st.message();
  const CacheStats c = s.cache->stats();
  EXPECT_EQ(c.backup_tokens, 0);
  EXPECT_EQ(c.backup_failed_tokens, 8);
  EXPECT_EQ(c.backup_inflight_tokens, 0);
  EXPECT_EQ(c.host_used_tokens, 0);
  ExpectConsistent(s);
  // The cache stays usable, and the next backup of the same prefix works.
  auto m = s.cache->Match(a);
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->device_tokens, 8);
  ASSERT_TRUE(s.cache->Release(m->handle).ok());
  EXPECT_TRUE(s.cache->WaitForBackups().ok());
  EXPECT_EQ(s.cache->stats().backup_tokens, 8);
}

// An OutOfMemory leaves the cache as it was: nothing is evicted when pins leave too little.
TEST(CacheFixesTest, OutOfMemoryEvictsNothing) {
  HierarchicalCacheConfig cfg;
  cfg.write_policy = WritePolicy::kWriteThrough;
  cfg.backup_threads = 0;
  TestCache s = Make(cfg, 4, 8, 16);
  const auto a = Seq(16, 1), b = Seq(12, 100);
  Prefill(s, a);
  Prefill(s, b);
  auto pin = s.cache->Match(a);
  ASSERT_EQ(pin->device_tokens, 16);
  const CacheStats before = s.cache->stats();
  EXPECT_TRUE(s.cache->AllocateDeviceSlots(20).status().IsOutOfMemory());
  const CacheStats after = s.cache->stats();
  EXPECT_EQ(after.device_evicted_tokens, before.device_evicted_tokens);
  EXPECT_EQ(after.device_cached_tokens, before.device_cached_tokens);
  ASSERT_TRUE(s.cache->Release(pin->handle).ok());
  ExpectConsistent(s);
}

// No copy, storage call or user callback runs under the cache's mutex: the engine wrapper and
// the storage wrapper fail any call made while the caller holds it, the listener checks and calls
// back into the cache.
TEST(CacheFixesTest, NothingBlockingRunsUnderTheMutex) {
  for (WritePolicy wp :
       {WritePolicy::kWriteThrough, WritePolicy::kWriteThroughSelective, WritePolicy::kWriteBack}) {
    for (int threads : {0, 1}) {
      SCOPED_TRACE(fmt::format("{} backup_threads {}", WritePolicyName(wp), threads));
      FaultInjectingStorage* faults = nullptr;
      HierarchicalCacheConfig cfg = StorageConfig(FaultyStore(4, &faults));
      ASSERT_NE(faults, nullptr);
      auto probe = testing::FailStorageCallsUnderCacheMutex(*faults);
      cfg.write_policy = wp;
      cfg.backup_threads = threads;
      std::atomic<int> events{0}, held{0};
      HierarchicalCache* cache = nullptr;
      cfg.eviction_listener = [&](const EvictionEvent&) {
        ++events;
        if (cache->MutexHeldByCurrentThread()) ++held;
        (void)cache->stats();  // calling back in must not deadlock
      };
      TestCache s = Make(cfg, 4, 8, 16);
      cache = s.cache.get();
      probe->cache = cache;
      std::mt19937 rng(5);
      for (int i = 0; i < 200; ++i) {
        const auto t = Seq(4 * (1 + rng() % 6), static_cast<Token>(rng() % 5) * 1000);
        // What the tiers hold of t now (storage too), loaded back, then the rest prefilled.
        auto m = s.cache->Match(t);
        ASSERT_TRUE(m.ok());
        int64_t stored = m->storage_tokens;
        if (i % 3 == 0) {
          auto q = s.cache->QueryStorage(m->handle);
          ASSERT_TRUE(q.ok());
          stored = q->storage_tokens;
        }
        if (stored > 0) {
          ASSERT_TRUE(s.cache->Prefetch(m->handle, static_cast<PrefetchPolicy>(i % 3)).ok());
        }
        auto l = s.cache->LoadBack(m->handle);
        ASSERT_TRUE(l.ok()) << l.status().ToString();
        const auto hashes = Hashes(t, "");
        const Status bytes = s.device->Verify(
            l->device_slots, std::span<const uint64_t>(hashes).first(l->device_slots.size()));
        EXPECT_TRUE(bytes.ok()) << bytes.ToString();
        ASSERT_TRUE(s.cache->Release(m->handle).ok());
        Prefill(s, t);
      }
      ASSERT_TRUE(s.cache->WaitForBackups().ok());
      EXPECT_GT(events.load(), 0);
      EXPECT_EQ(held.load(), 0);
      EXPECT_GT(s.engine->calls.load(), 0);
      EXPECT_EQ(s.engine->under_lock.load(), 0);
      EXPECT_GT(probe->storage_calls.load(), 0);
      EXPECT_EQ(probe->storage_under_lock.load(), 0);
      EXPECT_GT(s.cache->stats().storage_backup_tokens, 0);
      EXPECT_GT(s.cache->stats().prefetch_calls, 0);
      EXPECT_GT(s.cache->stats().prefetched_tokens, 0) << s.cache->Metrics();
      ExpectConsistent(s);
    }
  }
}

// ---- page-granular eviction -----------------------------------------------------------------

// An independent leaf-LRU prefix cache over whole pages: a page is its whole prefix (the chain
// of page token vectors); recency = the last request that matched or inserted it; eviction takes
// the tail page of the least recently used leaf that the current request does not hold.
class LeafLruReference {
 public:
  explicit LeafLruReference(int64_t capacity_pages) : capacity_(capacity_pages) {}

  // Serves one request of whole pages; returns the hit in pages.
  int64_t Serve(const std::vector<std::vector<Token>>& pages, int64_t time) {
    std::vector<std::vector<Token>> prefix;
    int64_t hit = 0;
    for (const auto& p : pages) {
      prefix.push_back(p);
      auto it = cached_.find(prefix);
      if (it == cached_.end()) break;
      it->second = time;
      ++hit;
    }
    const int64_t want = static_cast<int64_t>(pages.size()) - hit;
    const int64_t room = std::min(want, capacity_ - hit);  // what fits beside the held hit
    while (static_cast<int64_t>(cached_.size()) + room > capacity_) EvictOne(pages, hit);
    prefix.assign(pages.begin(), pages.begin() + hit);
    for (int64_t i = hit; i < hit + room; ++i) {
      prefix.push_back(pages[static_cast<size_t>(i)]);
      cached_[prefix] = time;
    }
    return hit;
  }

 private:
  void EvictOne(const std::vector<std::vector<Token>>& held, int64_t held_pages) {
    const std::vector<std::vector<Token>>* best = nullptr;
    int64_t best_time = 0;
    for (const auto& [key, t] : cached_) {
      // A leaf: no cached page extends it.
      bool leaf = true;
      auto next = cached_.upper_bound(key);
      if (next != cached_.end() && next->first.size() > key.size() &&
          std::equal(key.begin(), key.end(), next->first.begin())) {
        leaf = false;
      }
      if (!leaf) continue;
      // Held by the current request (its matched pages).
      if (static_cast<int64_t>(key.size()) <= held_pages &&
          std::equal(key.begin(), key.end(), held.begin())) {
        continue;
      }
      if (best == nullptr || t < best_time) {
        best = &key;
        best_time = t;
      }
    }
    ASSERT_NE(best, nullptr);
    cached_.erase(*best);
  }

  int64_t capacity_;
  std::map<std::vector<std::vector<Token>>, int64_t> cached_;
};

TEST(PageGranularEvictionTest, DeviceTierIsALeafLruPrefixCache) {
  constexpr int64_t kPage = 2;
  for (int64_t capacity : {6, 11, 24}) {
    SCOPED_TRACE(fmt::format("capacity {} pages", capacity));
    HierarchicalCacheConfig cfg;
    cfg.write_through_threshold = int64_t{1} << 40;  // no backups: the device tier alone
    cfg.backup_threads = 0;
    TestCache s = Make(cfg, kPage, capacity, 1);
    LeafLruReference ref(capacity);
    std::mt19937 rng(static_cast<uint32_t>(capacity));
    int64_t hit_tokens = 0, ref_hit_tokens = 0;
    // Prompts share prefixes: a few "documents", each a chain of pages, cut at random lengths.
    std::vector<std::vector<std::vector<Token>>> docs(5);
    for (size_t d = 0; d < docs.size(); ++d) {
      for (int p = 0; p < 20; ++p) {
        const Token base = static_cast<Token>(d * 1000 + static_cast<size_t>(p) * 2);
        docs[d].push_back({base, base + 1});
      }
    }
    for (int64_t req = 1; req <= 400; ++req) {
      const auto& doc = docs[rng() % docs.size()];
      const size_t n = 1 + rng() % doc.size();
      std::vector<std::vector<Token>> pages(doc.begin(), doc.begin() + static_cast<long>(n));
      if (rng() % 4 == 0) pages.push_back({static_cast<Token>(90000 + req), 1});  // a fresh tail
      std::vector<Token> tokens;
      for (const auto& p : pages) tokens.insert(tokens.end(), p.begin(), p.end());
      ref_hit_tokens += ref.Serve(pages, req) * kPage;
      auto m = s.cache->Match(tokens);
      ASSERT_TRUE(m.ok());
      hit_tokens += m->device_tokens;
      const int64_t rest = static_cast<int64_t>(tokens.size()) - m->device_tokens;
      auto fresh = s.cache->AllocateDeviceSlots(rest, {.allow_fewer = true});
      ASSERT_TRUE(fresh.ok()) << fresh.status().ToString();
      std::vector<int64_t> slots = m->device_slots;
      slots.insert(slots.end(), fresh->begin(), fresh->end());
      const std::span<const Token> fits(tokens.data(), slots.size());
      const auto fit_hashes = Hashes(fits, "");
      ASSERT_TRUE(s.device
                      ->Fill(*fresh, std::span<const uint64_t>(fit_hashes)
                                         .subspan(static_cast<size_t>(m->device_tokens)))
                      .ok());
      ASSERT_TRUE(s.cache->Insert(fits, slots).ok());
      ASSERT_TRUE(s.cache->Release(m->handle).ok());
      ASSERT_EQ(hit_tokens, ref_hit_tokens) << "request " << req;
      ASSERT_EQ(s.cache->stats().device_cached_tokens,
                std::min<int64_t>(s.cache->stats().device_total_tokens,
                                  s.cache->stats().device_cached_tokens));
    }
    ExpectConsistent(s);
    EXPECT_GT(hit_tokens, 0);
  }
}

}  // namespace
}  // namespace kvtier
