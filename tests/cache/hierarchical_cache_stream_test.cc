// Streamed storage hits (StorageTierConfig::stream_load_back): a LoadBack that ends a waited-for
// prefetch copies the pages to the device as they arrive, in prefix order. Over a real memory
// store behind the fault wrapper, whose held reads make batches complete out of order: the load
// copies nothing of a piece before the pages ahead of it landed; every byte handed out is right
// (random tokens, poisoned device and free host slots); a missing or corrupt page cuts the load
// there (the rest is a miss and the tree forgets it); the timeout policy's deadline ends the
// stream; Release while the stream waits, or while one of its copies runs, leaves the cache
// consistent; and the results equal the unstreamed path's (stream_load_back off).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <future>
#include <limits>
#include <mutex>
#include <random>
#include <thread>

#include "cache/cache_test_util.h"
#include "kvtier/hierarchical_cache.h"
#include "kvtier/storage.h"
#include "kvtier/testing/kv_pattern.h"
#include "kvtier/testing/storage_fault.h"

namespace kvtier {
namespace {

using testing::DeviceTier;
using testing::Hashes;
using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

constexpr int64_t kLayers = 3;
constexpr int64_t kSlotBytes = 8;
constexpr int64_t kPage = 4;
constexpr int64_t kHostPartPages = 8;  // in host memory before the storage hit
constexpr int64_t kStoragePages = 64;  // read from storage, 8 batches of 8
constexpr int64_t kBatchPages = 8;
constexpr int64_t kPages = kHostPartPages + kStoragePages;

// Wraps the cpu engine: records the slots of every copy into the device tier (a load-back piece),
// holds them at a gate while it is closed, and fails any call made under the cache's mutex.
class RecordingEngine final : public TransferEngine, public testing::CacheMutexCheck {
 public:
  RecordingEngine(std::unique_ptr<TransferEngine> inner, const void* device_k)
      : inner_(std::move(inner)), device_k_(device_k) {}
  TransferBackend backend() const override { return inner_->backend(); }
  Status Synchronize(CudaStream stream) override {
    KVTIER_RETURN_IF_ERROR(Check("Synchronize"));
    return inner_->Synchronize(stream);
  }
  // Load copies so far, each as its number of slots.
  std::vector<int64_t> loads() {
    std::lock_guard<std::mutex> lk(mu_);
    return loads_;
  }
  // Blocks until `n` load copies were seen (or 30 s: the caller's assertion fails then).
  bool AwaitLoads(size_t n) {
    std::unique_lock<std::mutex> lk(mu_);
    return cv_.wait_for(lk, 30s, [&] { return loads_.size() >= n; });
  }
  // Blocks until the load copies seen cover `slots` slots (or 30 s).
  bool AwaitLoadedSlots(int64_t slots) {
    std::unique_lock<std::mutex> lk(mu_);
    return cv_.wait_for(lk, 30s, [&] {
      int64_t sum = 0;
      for (int64_t n : loads_) sum += n;
      return sum >= slots;
    });
  }
  void CloseGate() {
    std::lock_guard<std::mutex> lk(mu_);
    closed_ = true;
  }
  void OpenGate() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      closed_ = false;
    }
    cv_.notify_all();
  }

 protected:
  Status DoTransfer(const TransferRequest& request, const TransferOptions& options) override {
    KVTIER_RETURN_IF_ERROR(Check("Transfer"));
    if (request.dst->k == device_k_) {
      std::unique_lock<std::mutex> lk(mu_);
      loads_.push_back(request.num_slots());
      cv_.notify_all();
      cv_.wait(lk, [&] { return !closed_; });
    }
    return inner_->Transfer(request, options);
  }

 private:
  std::unique_ptr<TransferEngine> inner_;
  const void* device_k_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<int64_t> loads_;
  bool closed_ = false;
};

struct Rig {
  FaultInjectingStorage* faults = nullptr;
  std::unique_ptr<DeviceTier> device;
  std::unique_ptr<HierarchicalCache> cache;
  RecordingEngine* engine = nullptr;
  std::vector<Token> tokens;  // kPages pages of random tokens
  std::vector<uint64_t> hashes;
  std::vector<PageKey> keys;  // of tokens' pages

  // The storage part's batch `b` (its pages' keys).
  std::vector<PageKey> Batch(int64_t b) const {
    const auto first = keys.begin() + kHostPartPages + b * kBatchPages;
    return {first, first + kBatchPages};
  }
  std::span<const Token> Prefix(int64_t pages) const {
    return std::span<const Token>(tokens).first(static_cast<size_t>(pages * kPage));
  }
};

void ExpectConsistent(const Rig& r) {
  const Status st = r.cache->CheckConsistency();
  EXPECT_TRUE(st.ok()) << st.ToString();
}

// A cache over a memory store behind the fault wrapper (4 I/O threads: held reads do not stop
// the others) holding `tokens` in storage, with the first kHostPartPages pages in host memory too,
// and nothing else: the device pool and the free host pages hold random bytes.
Rig MakeRig(bool stream, uint32_t seed,
            const std::function<void(HierarchicalCacheConfig&)>& tweak = nullptr) {
  Rig r;
  StorageNamespace ns;
  ns.model_id = "stream-test";
  ns.num_layers = kLayers;
  ns.slot_bytes = kSlotBytes;
  ns.page_size = kPage;
  StorageOptions options;
  options.io_threads = 4;
  options.timeout = 30s;  // a bound for a broken build, never reached by a passing one
  auto inner = OpenStorage("memory://?capacity=64MiB", ns, options);
  EXPECT_TRUE(inner.ok()) << inner.status().ToString();
  auto wrapped = FaultInjectingStorage::Wrap(std::move(*inner), seed, options);
  EXPECT_TRUE(wrapped.ok()) << wrapped.status().ToString();
  r.faults = wrapped->get();

  HierarchicalCacheConfig cfg;
  cfg.write_policy = WritePolicy::kWriteThrough;
  cfg.backup_threads = 1;
  cfg.storage.backend = std::shared_ptr<StorageBackend>(std::move(*wrapped));
  cfg.storage.prefetch_threshold_tokens = 0;
  cfg.storage.max_prefetch_host_fraction = 1.0;
  cfg.storage.max_prefetch_batch_pages = kBatchPages;
  cfg.storage.stream_load_back = stream;
  const int64_t device_pages = 2 * kPages;
  cfg.host_capacity_bytes = 2 * kPages * kPage * kLayers * kSlotBytes * 2;
  cfg.transfer.cpu_threads = 1;
  if (tweak) tweak(cfg);
  KvGeometry g{KvLayout::kLayerFirst, kLayers, device_pages * kPage, kSlotBytes, kPage, 1};
  auto dev = DeviceTier::Create(TransferBackend::kCpu, g, false);
  EXPECT_TRUE(dev.ok());
  r.device = std::move(*dev);
  auto cpu = MakeTransferEngine(TransferBackend::kCpu, cfg.transfer);
  EXPECT_TRUE(cpu.ok());
  auto engine = std::make_unique<RecordingEngine>(std::move(*cpu), r.device->region().k);
  r.engine = engine.get();
  auto c = HierarchicalCache::Create(cfg, r.device->region(), std::move(engine));
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  r.cache = std::move(*c);
  r.engine->cache = r.cache.get();

  std::mt19937 rng(seed);
  r.tokens.resize(static_cast<size_t>(kPages * kPage));
  for (Token& t : r.tokens) t = static_cast<Token>(rng() % (Token{1} << 30));
  r.hashes = Hashes(r.tokens, "");
  r.keys = *ComputePromptPageKeys(r.tokens, kPage);

  // Prefill, back up to storage, forget everything but storage.
  auto slots = r.cache->AllocateDeviceSlots(kPages * kPage);
  EXPECT_TRUE(slots.ok());
  EXPECT_TRUE(r.device->Fill(*slots, r.hashes).ok());
  EXPECT_TRUE(r.cache->Insert(r.tokens, *slots).ok());
  EXPECT_TRUE(r.cache->WaitForBackups().ok());
  EXPECT_TRUE(r.cache->EvictDevice(std::numeric_limits<int64_t>::max()).ok());
  EXPECT_TRUE(r.cache->EvictHost(std::numeric_limits<int64_t>::max()).ok());
  // The host part comes back from storage on its own.
  auto m = r.cache->Match(r.Prefix(kHostPartPages));
  EXPECT_TRUE(m.ok());
  EXPECT_TRUE(r.cache->Prefetch(m->handle, PrefetchPolicy::kWaitComplete).ok());
  EXPECT_EQ(r.cache->FinishPrefetch(m->handle)->host_tokens, kHostPartPages * kPage);
  EXPECT_TRUE(r.cache->Release(m->handle).ok());

  // Poison: the whole device pool, and every host page but the host part's.
  auto poison = [&](const KvRegion& region) {
    const int64_t bytes = region.geometry.buffer_bytes();
    for (void* buffer : {region.k, region.v}) {
      auto* p = static_cast<unsigned char*>(buffer);
      for (int64_t i = 0; i < bytes; ++i) p[i] = static_cast<unsigned char>(rng());
    }
  };
  poison(r.device->region());
  auto host = r.cache->Match(r.tokens);
  EXPECT_TRUE(host.ok());
  EXPECT_EQ(host->host_tokens, kHostPartPages * kPage);
  EXPECT_EQ(host->storage_tokens, kStoragePages * kPage);
  poison(r.cache->host_region());
  EXPECT_TRUE(FillKvPattern(r.cache->host_region(), host->host_slots,
                            std::span<const uint64_t>(r.hashes).first(host->host_slots.size()))
                  .ok());
  EXPECT_TRUE(r.cache->Release(host->handle).ok());
  ExpectConsistent(r);
  return r;
}

// The first `pages` pages of the rig's tokens are at `slots`, byte for byte.
void ExpectBytes(Rig& r, const std::vector<int64_t>& slots, int64_t pages) {
  ASSERT_EQ(static_cast<int64_t>(slots.size()), pages * kPage);
  const Status st =
      r.device->Verify(slots, std::span<const uint64_t>(r.hashes).first(slots.size()));
  EXPECT_TRUE(st.ok()) << st.ToString();
}

// Read pages the store answered so far (hits or not).
int64_t ReadPages(Rig& r) {
  const StorageStats st = r.faults->Stats();
  return st.get_hit_pages + st.get_absent_pages + st.get_corrupt_pages + st.get_failed_pages +
         st.get_timed_out_pages;
}

// Waits until the store has answered `pages` more read pages than `before` (30 s at most), and a
// little longer for their completions to reach the cache (those come right after).
void AwaitReadPages(Rig& r, int64_t before, int64_t pages) {
  const auto give_up = Clock::now() + 30s;
  while (ReadPages(r) - before < pages && Clock::now() < give_up) {
    std::this_thread::sleep_for(1ms);
  }
  ASSERT_GE(ReadPages(r) - before, pages);
  std::this_thread::sleep_for(10ms);
}

// Waits until `h`'s prefetch has `tokens` arrived tokens, 30 s at most.
void AwaitArrived(Rig& r, MatchHandle h, int64_t tokens) {
  const auto give_up = Clock::now() + 30s;
  while (r.cache->PollPrefetch(h)->arrived_tokens < tokens && Clock::now() < give_up) {
    std::this_thread::sleep_for(1ms);
  }
  ASSERT_EQ(r.cache->PollPrefetch(h)->arrived_tokens, tokens);
}

// Waits until `n` reads are held, 30 s at most.
void AwaitHeld(Rig& r, int n) {
  const auto give_up = Clock::now() + 30s;
  while (r.faults->held_reads() < n && Clock::now() < give_up) std::this_thread::sleep_for(1ms);
  ASSERT_EQ(r.faults->held_reads(), n);
}

// Waits until no host page is filling any more: reads a concluded prefetch cancelled free their
// pages when they complete (30 s at most).
void AwaitNoFilling(Rig& r) {
  const auto give_up = Clock::now() + 30s;
  while (r.cache->stats().host_filling_tokens != 0 && Clock::now() < give_up) {
    std::this_thread::sleep_for(1ms);
  }
  EXPECT_EQ(r.cache->stats().host_filling_tokens, 0);
}

int64_t Sum(const std::vector<int64_t>& v) {
  int64_t s = 0;
  for (int64_t x : v) s += x;
  return s;
}

// Batches 0 and 3 of the storage part arrive last. Streamed, the host part is copied at once,
// nothing of batches 1-7 before batch 0 landed, then batches 0-2, and the rest only after
// batch 3; everything arrives byte-exact either way.
class StreamTest : public ::testing::TestWithParam<bool> {};

TEST_P(StreamTest, PagesArrivingOutOfOrderAreLoadedInPrefixOrderByteExact) {
  const bool stream = GetParam();
  Rig r = MakeRig(stream, 11);
  std::vector<PageKey> held = r.Batch(0);
  for (const PageKey& k : r.Batch(3)) held.push_back(k);
  r.faults->HoldReads(held);
  const int64_t read_before = ReadPages(r);
  auto m = r.cache->Match(r.tokens);
  ASSERT_TRUE(m.ok());
  auto p = r.cache->Prefetch(m->handle, PrefetchPolicy::kWaitComplete);
  ASSERT_TRUE(p.ok());
  ASSERT_EQ(p->requested_tokens, kStoragePages * kPage);
  AwaitHeld(r, 2);
  AwaitReadPages(r, read_before, kStoragePages - 2 * kBatchPages);  // batches 1, 2, 4-7

  auto load = std::async(std::launch::async, [&] { return r.cache->LoadBack(m->handle); });
  if (stream) {
    ASSERT_TRUE(r.engine->AwaitLoads(1));
    std::this_thread::sleep_for(20ms);  // a wrong stream would copy batches 1-2 or 4-7 now
    EXPECT_EQ(r.engine->loads(), (std::vector<int64_t>{kHostPartPages * kPage}));
    // Batch 0 lands: batches 0-2 are the prefix now; 4-7 wait for batch 3.
    r.faults->HoldReads(r.Batch(3));
    ASSERT_TRUE(r.engine->AwaitLoadedSlots((kHostPartPages + 3 * kBatchPages) * kPage));
    std::this_thread::sleep_for(20ms);
    EXPECT_EQ(Sum(r.engine->loads()), (kHostPartPages + 3 * kBatchPages) * kPage);
    ExpectConsistent(r);  // mid-stream: the streamed pages are the tree's
  } else {
    r.faults->HoldReads(r.Batch(3));
    std::this_thread::sleep_for(20ms);
    EXPECT_TRUE(r.engine->loads().empty());  // the whole read first
  }
  r.faults->HoldReads({});
  auto l = load.get();
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  EXPECT_EQ(l->loaded_tokens, kPages * kPage);
  EXPECT_EQ(l->prefetch.state, PrefetchState::kComplete);
  EXPECT_EQ(l->prefetch.arrived_tokens, kStoragePages * kPage);
  ExpectBytes(r, l->device_slots, kPages);
  EXPECT_EQ(Sum(r.engine->loads()), kPages * kPage);
  if (stream) {
    EXPECT_GE(r.engine->loads().size(), 3u);
  } else {
    EXPECT_EQ(r.engine->loads(), (std::vector<int64_t>{kPages * kPage}));
  }
  for (int64_t layer = 0; layer < kLayers; ++layer) {
    EXPECT_TRUE(r.cache->WaitLayer(m->handle, layer, nullptr).ok());
  }
  EXPECT_TRUE(r.cache->WaitLayer(m->handle, kLayers, nullptr).IsInvalidArgument());
  ASSERT_TRUE(r.cache->Release(m->handle).ok());
  ExpectConsistent(r);
  const CacheStats st = r.cache->stats();
  EXPECT_EQ(st.prefetched_tokens, (kHostPartPages + kStoragePages) * kPage);  // incl. MakeRig's
  EXPECT_EQ(st.prefetch_complete, 2);
  EXPECT_EQ(st.host_filling_tokens, 0);
  EXPECT_EQ(st.load_back_calls, 1);
  EXPECT_EQ(st.load_back_tokens, kPages * kPage);
  EXPECT_EQ(r.engine->under_lock.load(), 0);

  // A second request finds it all on the device.
  auto again = r.cache->Match(r.tokens);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->device_tokens, kPages * kPage);
  ExpectBytes(r, again->device_slots, kPages);
  ASSERT_TRUE(r.cache->Release(again->handle).ok());
}

// A page storage lost, and later a batch read corrupt: each cuts the load at its first page
// (never a wrong byte), the tree forgets the pages from there, and the corrupt ones are removed
// from storage so that the next backup writes them again.
TEST_P(StreamTest, MissingOrCorruptPagesCutTheLoadAtThatPage) {
  const bool stream = GetParam();
  for (const bool corrupt : {false, true}) {
    SCOPED_TRACE(corrupt ? "corrupt batch 5" : "page 21 missing");
    Rig r = MakeRig(stream, corrupt ? 23 : 29);
    const int64_t cut = corrupt ? 5 * kBatchPages : 21;  // storage pages that arrive
    const PageKey first_lost = r.keys[static_cast<size_t>(kHostPartPages + cut)];
    const int64_t read_before = ReadPages(r);
    if (corrupt) {
      r.faults->HoldReads(r.Batch(5));
    } else {
      ASSERT_EQ(r.faults->inner().Remove({first_lost}).get().leading_ok(), 1);
    }
    auto m = r.cache->Match(r.tokens);
    ASSERT_TRUE(m.ok());
    ASSERT_TRUE(r.cache->Prefetch(m->handle, PrefetchPolicy::kWaitComplete).ok());
    if (corrupt) {
      AwaitHeld(r, 1);
      AwaitReadPages(r, read_before, kStoragePages - kBatchPages);
      ASSERT_TRUE(r.faults->SetCorruptFraction(1.0).ok());
      r.faults->HoldReads({});
    }
    auto l = r.cache->LoadBack(m->handle);
    ASSERT_TRUE(l.ok()) << l.status().ToString();
    EXPECT_EQ(l->prefetch.state, PrefetchState::kPartial);
    EXPECT_EQ(l->prefetch.arrived_tokens, cut * kPage);
    EXPECT_EQ(l->loaded_tokens, (kHostPartPages + cut) * kPage);
    ExpectBytes(r, l->device_slots, kHostPartPages + cut);
    EXPECT_EQ(Sum(r.engine->loads()), (kHostPartPages + cut) * kPage);
    ASSERT_TRUE(r.cache->Release(m->handle).ok());
    r.faults->ClearFaults();
    ExpectConsistent(r);
    AwaitNoFilling(r);  // streamed: the cut is known before the last batches complete
    const CacheStats st = r.cache->stats();
    if (corrupt) {
      EXPECT_EQ(st.storage_corrupt_pages, kBatchPages);
    }

    // The tree forgot the lost page and what follows; storage no longer holds a corrupt one.
    auto again = r.cache->Match(r.tokens);
    ASSERT_TRUE(again.ok());
    EXPECT_EQ(again->device_tokens, (kHostPartPages + cut) * kPage);
    EXPECT_EQ(again->storage_tokens, 0);
    ExpectBytes(r, again->device_slots, kHostPartPages + cut);
    ASSERT_TRUE(r.cache->Release(again->handle).ok());
    ASSERT_TRUE(r.cache->WaitForBackups().ok());
    EXPECT_EQ(r.faults->inner().Exists({first_lost}).get().leading, 0);
    ExpectConsistent(r);
  }
}

// The timeout policy's deadline ends the stream with the prefix that arrived before it.
TEST_P(StreamTest, TheTimeoutDeadlineEndsTheStream) {
  const bool stream = GetParam();
  // A deadline of 5 s (the base; nothing per token) passes while batch 2 is held. Batches 0 and 1
  // (memory reads) must arrive before it: 5 s, not 1 s, so that a loaded machine that starves
  // the I/O threads for a second does not end the stream before them.
  Rig r = MakeRig(stream, 31, [](HierarchicalCacheConfig& cfg) {
    cfg.storage.prefetch_timeout_base_s = 5.0;
    cfg.storage.prefetch_timeout_per_1k_tokens_s = 0;
  });
  r.faults->HoldReads(r.Batch(2));
  auto m = r.cache->Match(r.tokens);
  ASSERT_TRUE(m.ok());
  const auto start = Clock::now();  // before the deadline's start (Prefetch)
  ASSERT_TRUE(r.cache->Prefetch(m->handle, PrefetchPolicy::kTimeout).ok());
  AwaitHeld(r, 1);
  auto l = r.cache->LoadBack(m->handle);
  const double waited = std::chrono::duration<double>(Clock::now() - start).count();
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  EXPECT_EQ(l->prefetch.state, PrefetchState::kTimedOut);
  EXPECT_EQ(l->prefetch.arrived_tokens, 2 * kBatchPages * kPage);
  EXPECT_EQ(l->loaded_tokens, (kHostPartPages + 2 * kBatchPages) * kPage);
  ExpectBytes(r, l->device_slots, kHostPartPages + 2 * kBatchPages);
  EXPECT_GE(waited, 5.0);   // it waited for the deadline ...
  EXPECT_LT(waited, 20.0);  // ... not for the held read's 30 s (a hang guard)
  ASSERT_TRUE(r.cache->Release(m->handle).ok());
  r.faults->HoldReads({});
  ASSERT_TRUE(r.cache->WaitForBackups().ok());
  AwaitNoFilling(r);
  ExpectConsistent(r);
}

INSTANTIATE_TEST_SUITE_P(StreamOnOff, StreamTest, ::testing::Bool(), [](const auto& info) {
  return std::string(info.param ? "streamed" : "unstreamed");
});

// Release while the stream waits for a held batch, and while one of its copies is running: the
// LoadBack fails (the handle is gone), nothing is lost or double-freed, the pieces loaded before
// stay cached on the device byte-exact, and the reads still running come home.
TEST(StreamRaceTest, ReleaseMidStreamIsSafe) {
  for (const bool mid_copy : {false, true}) {
    SCOPED_TRACE(mid_copy ? "during a copy" : "while waiting for a batch");
    Rig r = MakeRig(/*stream=*/true, mid_copy ? 41 : 43);
    r.faults->HoldReads(r.Batch(1));
    auto m = r.cache->Match(r.tokens);
    ASSERT_TRUE(m.ok());
    ASSERT_TRUE(r.cache->Prefetch(m->handle, PrefetchPolicy::kWaitComplete).ok());
    AwaitHeld(r, 1);
    AwaitArrived(r, m->handle, kBatchPages * kPage);  // batch 0; batch 1 is held
    if (mid_copy) r.engine->CloseGate();
    auto load = std::async(std::launch::async, [&] { return r.cache->LoadBack(m->handle); });
    // The host part and batch 0 go in one piece: every page before the held batch arrived.
    ASSERT_TRUE(r.engine->AwaitLoads(1));
    EXPECT_EQ(r.engine->loads(), (std::vector<int64_t>{(kHostPartPages + kBatchPages) * kPage}));
    ASSERT_TRUE(r.cache->Release(m->handle).ok());  // the copy (if held) runs outside the lock
    ExpectConsistent(r);
    r.engine->OpenGate();
    auto l = load.get();
    EXPECT_TRUE(l.status().IsInvalidArgument()) << l.status().ToString();
    r.faults->HoldReads({});
    ASSERT_TRUE(r.cache->WaitForBackups().ok());
    AwaitNoFilling(r);
    ExpectConsistent(r);
    // What was loaded before the release stays cached on the device, byte-exact.
    EXPECT_EQ(r.engine->loads().size(), 1u);
    auto again = r.cache->Match(r.tokens);
    ASSERT_TRUE(again.ok());
    EXPECT_EQ(again->device_tokens, (kHostPartPages + kBatchPages) * kPage);
    ExpectBytes(r, again->device_slots, kHostPartPages + kBatchPages);
    ASSERT_TRUE(r.cache->Release(again->handle).ok());
    EXPECT_EQ(r.engine->under_lock.load(), 0);
  }
}

}  // namespace
}  // namespace kvtier
