// HierarchicalCache over three tiers (device, host, storage on memory:// or file://, behind the
// fault wrapper): random Match / QueryStorage / Prefetch (every policy) / LoadBack / Insert /
// Release / evictions in every tier, with faults switched on and off, and pins (Pin / Unpin in
// random tiers with TTLs on a clock the test moves; a device-pinned prefix never loses a device
// page while its pin lives). After every step the
// cache's invariants hold (CheckConsistency), every slot a match or a load-back returns holds the
// right bytes (the KV pattern), and no match is longer than the longest prefix ever inserted (the
// model). A final phase evicts everything from device and host and brings it back through
// Prefetch, byte-exact. The "Concurrent" variant runs four threads on one cache (TSan in CI), and
// a fork test has a second process find the first's prefixes in one file store. In the model
// tests the transfer engine and the storage wrapper fail every call made while the calling thread
// holds the cache's mutex (nothing blocking runs under it), and the runs check none was.
//
// Environment: KVTIER_TEST_BACKEND=cpu|kernel|dma (the device tier and the cache's backend; GPU
// backends skip without a GPU; the two-process test always runs on cpu), KVTIER_TEST_SEED (one
// seed), KVTIER_TEST_STEPS (steps per run, default 600).
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <limits>
#include <mutex>
#include <random>
#include <set>
#include <thread>

#include "cache/cache_test_util.h"
#include "kvtier/device.h"
#include "kvtier/hierarchical_cache.h"
#include "kvtier/storage.h"
#include "kvtier/testing/kv_pattern.h"
#include "kvtier/testing/storage_fault.h"

namespace kvtier {
namespace {

using testing::CheckingEngine;
using testing::DeviceTier;
using testing::Hashes;
using testing::InsertedPrefixes;

constexpr int64_t kLayers = 2;
constexpr int64_t kSlotBytes = 8;
constexpr int64_t kLongDocPages = 160;  // the long-prompt variant's documents

// A temporary directory removed at the end of the scope.
class TempDir {
 public:
  TempDir() {
    std::string t = (std::filesystem::temp_directory_path() / "kvtier-cache-XXXXXX").string();
    path_ = mkdtemp(t.data()) != nullptr ? t : "";
    EXPECT_FALSE(path_.empty());
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

StorageNamespace NamespaceFor(int64_t page) {
  StorageNamespace ns;
  ns.model_id = "tiers-model-test";
  ns.layout = KvLayout::kPageFirst;
  ns.num_layers = kLayers;
  ns.slot_bytes = kSlotBytes;
  ns.page_size = page;
  return ns;
}

// The store under test behind the fault wrapper.
std::shared_ptr<StorageBackend> OpenStore(const std::string& url, int64_t page, uint64_t seed,
                                          FaultInjectingStorage** faults) {
  StorageOptions options;
  options.timeout = std::chrono::milliseconds(500);
  options.io_threads = 2;
  auto inner = OpenStorage(url, NamespaceFor(page), options);
  EXPECT_TRUE(inner.ok()) << inner.status().ToString();
  if (!inner.ok()) return nullptr;
  auto w = FaultInjectingStorage::Wrap(std::move(*inner), seed, options);
  EXPECT_TRUE(w.ok()) << w.status().ToString();
  *faults = w->get();
  return std::shared_ptr<StorageBackend>(std::move(*w));
}

struct CacheUnderTest {
  std::unique_ptr<DeviceTier> device;
  std::unique_ptr<HierarchicalCache> cache;
  CheckingEngine* engine = nullptr;                           // owned by the cache
  std::shared_ptr<testing::StorageMutexProbe> storage_probe;  // with `faults`

  // Nothing ran under the cache's mutex, and the checks saw calls (they could have failed).
  void ExpectNothingRanUnderTheMutex() const {
    EXPECT_GT(engine->calls.load(), 0);
    EXPECT_EQ(engine->under_lock.load(), 0) << "engine calls made under the cache's mutex";
    if (storage_probe) {
      EXPECT_GT(storage_probe->storage_calls.load(), 0);
      EXPECT_EQ(storage_probe->storage_under_lock.load(), 0)
          << "storage calls made under the cache's mutex";
    }
  }
};

// The device tier on `backend` (KVTIER_TEST_BACKEND for the model tests: cpu, kernel or dma).
// The cache's engine and, when given, the storage wrapper `faults` fail calls made under the
// cache's mutex.
CacheUnderTest MakeCache(HierarchicalCacheConfig cfg, int64_t page, int64_t device_pages,
                         int64_t host_pages, TransferBackend backend = TransferBackend::kCpu,
                         FaultInjectingStorage* faults = nullptr) {
  CacheUnderTest s;
  KvGeometry g{KvLayout::kLayerFirst, kLayers, device_pages * page, kSlotBytes, page, 1};
  cfg.transfer_backend = backend;
  auto dev = DeviceTier::Create(backend, g, false);
  EXPECT_TRUE(dev.ok()) << dev.status().ToString();
  s.device = std::move(*dev);
  cfg.host_capacity_bytes = host_pages * page * kLayers * kSlotBytes * 2;
  cfg.transfer.cpu_threads = 1;
  auto inner = MakeTransferEngine(backend, cfg.transfer);
  EXPECT_TRUE(inner.ok()) << inner.status().ToString();
  if (!inner.ok()) return s;
  auto engine = std::make_unique<CheckingEngine>(std::move(*inner));
  s.engine = engine.get();
  if (faults != nullptr) s.storage_probe = testing::FailStorageCallsUnderCacheMutex(*faults);
  auto c = HierarchicalCache::Create(cfg, s.device->region(), std::move(engine));
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  if (!c.ok()) {
    s.engine = nullptr;  // destroyed with the failed Create
    return s;
  }
  s.cache = std::move(*c);
  s.engine->cache = s.cache.get();
  if (s.storage_probe) s.storage_probe->cache = s.cache.get();
  return s;
}

// Prompts that share prefixes: documents of pages, cut at random lengths, in two namespaces.
class Prompts {
 public:
  // `doc_pages`: the documents' length; prompts take 1 to min(16, doc_pages) pages of one, or up
  // to all of it when `long_prompts`.
  Prompts(int64_t page, uint64_t seed, int64_t doc_pages = 24, bool long_prompts = false)
      : page_(page), long_(long_prompts), doc_pages_(doc_pages), rng_(seed) {
    for (int d = 0; d < 6; ++d) {
      std::vector<Token> doc(static_cast<size_t>(doc_pages * page));
      for (size_t i = 0; i < doc.size(); ++i) doc[i] = static_cast<Token>(d * 100000 + i);
      docs_.push_back(std::move(doc));
    }
  }
  std::pair<std::string, std::vector<Token>> Next(std::mt19937_64& rng) {
    const auto& doc = docs_[rng() % docs_.size()];
    const size_t pages = 1 + rng() % static_cast<size_t>(long_ ? doc_pages_ : 16);
    std::vector<Token> t(doc.begin(), doc.begin() + static_cast<long>(pages * page_));
    if (rng() % 3 == 0) {  // a distinct tail
      for (int64_t i = 0; i < page_ * static_cast<int64_t>(1 + rng() % 3); ++i) {
        t.push_back(static_cast<Token>(900000 + rng() % 50000));
      }
    }
    if (rng() % 5 == 0) t.push_back(7);  // a partial page
    return {rng() % 4 == 0 ? "tenant-b" : "", std::move(t)};
  }

 private:
  int64_t page_;
  bool long_;
  int64_t doc_pages_;
  std::mt19937_64 rng_;
  std::vector<std::vector<Token>> docs_;
};

struct Live {
  MatchHandle handle;
  std::string ns;
  std::vector<Token> tokens;
};

// A live pin as the model knows it: its pinned prefix, its tiers, its deadline on the test's
// clock (ns; -1: none) and the device tokens of the prefix when it was pinned.
struct LivePin {
  PinHandle pin;
  std::string ns;
  std::vector<Token> tokens;
  bool device = false;
  int64_t deadline_ns = -1;
  int64_t device_tokens = 0;
};

// The clock pins run on in the model tests (HierarchicalCacheConfig::pin_clock).
struct TestClock {
  std::shared_ptr<std::atomic<int64_t>> ns = std::make_shared<std::atomic<int64_t>>(1'000'000);
  std::function<std::chrono::steady_clock::time_point()> fn() const {
    return [ns = ns] {
      return std::chrono::steady_clock::time_point(std::chrono::nanoseconds(ns->load()));
    };
  }
};

// One random step of an engine thread. Returns false (after recording a failure) to stop.
class Driver {
 public:
  // `long_prompts`: prompts up to kLongDocPages pages, and some requests served as back-to-back
  // chunked-prefill requests (a prefix, then a longer one, ... then the whole prompt).
  // `clock` (the cache's pin_clock): pins are made and checked only with one.
  Driver(CacheUnderTest& s, InsertedPrefixes& model, FaultInjectingStorage* faults, uint64_t seed,
         bool allow_faults, bool long_prompts = false, const TestClock* clock = nullptr)
      : s_(s),
        model_(model),
        faults_(faults),
        rng_(seed),
        prompts_(s.cache->page_size(), seed, long_prompts ? kLongDocPages : 24, long_prompts),
        allow_faults_(allow_faults),
        chunked_(long_prompts),
        clock_(clock) {}

  ~Driver() {
    for (const Live& l : live_) EXPECT_TRUE(s_.cache->Release(l.handle).ok());
    for (const LivePin& p : pins_) {
      const Status st = s_.cache->Unpin(p.pin);  // or ended by its TTL already
      EXPECT_TRUE(st.ok() || st.IsInvalidArgument()) << st.ToString();
    }
    if (clock_ != nullptr) {
      EXPECT_EQ(s_.cache->stats().live_pins, 0);
    }
  }

  // A random pin (tiers, TTL), an unpin, or the clock moved; then every live device pin still
  // has the device tokens it had when it was made.
  void PinStep() {
    HierarchicalCache& c = *s_.cache;
    const int64_t now = clock_->ns->load();
    // Pins past their deadline are gone (the cache's next call ended them).
    std::erase_if(pins_,
                  [&](const LivePin& p) { return p.deadline_ns >= 0 && p.deadline_ns <= now; });
    const int op = static_cast<int>(rng_() % 10);
    if (op < 5) {
      auto [ns, tokens] = prompts_.Next(rng_);
      std::vector<CacheTier> tiers;
      for (CacheTier t : {CacheTier::kDevice, CacheTier::kHost, CacheTier::kStorage}) {
        if (rng_() % 2) tiers.push_back(t);
      }
      if (tiers.empty()) tiers.push_back(CacheTier::kDevice);
      const bool forever = rng_() % 3 == 0;
      const double ttl = forever ? kPinForever : 1.0 + static_cast<double>(rng_() % 10);
      auto r = c.Pin(tokens, tiers, ttl, ns);
      if (!r.ok()) {
        ASSERT_TRUE(r.status().IsInvalidArgument()) << r.status().ToString();
        ASSERT_NE(r.status().message().find("budget"), std::string::npos) << r.status().message();
        return;
      }
      if (r->pin.id == 0) return;
      LivePin p{r->pin,
                ns,
                std::vector<Token>(tokens.begin(), tokens.begin() + r->pinned_tokens),
                std::find(tiers.begin(), tiers.end(), CacheTier::kDevice) != tiers.end(),
                forever ? -1 : now + static_cast<int64_t>(ttl * 1e9),
                0};
      auto m = c.Match(p.tokens, p.ns);
      ASSERT_TRUE(m.ok());
      p.device_tokens = m->device_tokens;
      ASSERT_TRUE(c.Release(m->handle).ok());
      pins_.push_back(std::move(p));
    } else if (op < 8) {
      if (pins_.empty()) return;
      const size_t i = rng_() % pins_.size();
      ASSERT_TRUE(c.Unpin(pins_[i].pin).ok());
      pins_.erase(pins_.begin() + static_cast<long>(i));
      ASSERT_TRUE(c.Unpin(PinHandle{pins_.empty() ? 1 : pins_[0].pin.id + (1ull << 39)})
                      .IsInvalidArgument());
    } else {
      *clock_->ns += static_cast<int64_t>(rng_() % 4) * 1'000'000'000;
    }
  }

  void CheckPins() {
    HierarchicalCache& c = *s_.cache;
    const int64_t now = clock_->ns->load();
    for (const LivePin& p : pins_) {
      if (!p.device || (p.deadline_ns >= 0 && p.deadline_ns <= now)) continue;
      auto m = c.Match(p.tokens, p.ns);
      ASSERT_TRUE(m.ok());
      EXPECT_GE(m->device_tokens, p.device_tokens) << "a device-pinned page left the device";
      ASSERT_TRUE(c.Release(m->handle).ok());
    }
  }

  void CheckSlots(const Live& l, int64_t device_tokens, const std::vector<int64_t>& device_slots,
                  const std::vector<int64_t>& host_slots) {
    const auto hashes = Hashes(l.tokens, l.ns);
    ASSERT_EQ(static_cast<int64_t>(device_slots.size()), device_tokens);
    ASSERT_TRUE(
        s_.device
            ->Verify(device_slots, std::span<const uint64_t>(hashes).first(device_slots.size()))
            .ok())
        << "device bytes of a match";
    if (!host_slots.empty()) {
      ASSERT_TRUE(VerifyKvPattern(s_.cache->host_region(), host_slots,
                                  std::span<const uint64_t>(hashes).subspan(device_slots.size(),
                                                                            host_slots.size()))
                      .ok())
          << "host bytes of a match";
    }
  }

  // A request served like an engine: match, (query, prefetch), load back, prefill the rest,
  // insert, release.
  void Serve(const std::string& ns, const std::vector<Token>& tokens) {
    HierarchicalCache& c = *s_.cache;
    {
      auto m = c.Match(tokens, ns);
      ASSERT_TRUE(m.ok()) << m.status().ToString();
      Live l{m->handle, ns, tokens};
      ASSERT_LE(m->device_tokens + m->host_tokens + m->storage_tokens, model_.Longest(ns, tokens));
      CheckSlots(l, m->device_tokens, m->device_slots, m->host_slots);
      if (rng_() % 2 == 0) {
        auto q = c.QueryStorage(m->handle);
        ASSERT_TRUE(q.ok()) << q.status().ToString();
        auto p = c.Prefetch(m->handle, static_cast<PrefetchPolicy>(rng_() % 3));
        ASSERT_TRUE(p.ok()) << p.status().ToString();
      }
      auto lb = c.LoadBack(m->handle);
      if (!lb.ok()) {  // the pins of the live matches can leave too little device memory
        ASSERT_TRUE(lb.status().IsOutOfMemory()) << lb.status().ToString();
        ASSERT_TRUE(c.Release(m->handle).ok());
        return;
      }
      const int64_t cached = static_cast<int64_t>(lb->device_slots.size());
      CheckSlots(l, cached, lb->device_slots, {});
      const int64_t whole = static_cast<int64_t>(tokens.size()) / c.page_size() * c.page_size();
      auto fresh = c.AllocateDeviceSlots(whole - cached);
      if (fresh.ok()) {
        const auto hashes = Hashes(tokens, ns);
        ASSERT_TRUE(s_.device
                        ->Fill(*fresh, std::span<const uint64_t>(hashes).subspan(
                                           static_cast<size_t>(cached), fresh->size()))
                        .ok());
        std::vector<int64_t> slots = lb->device_slots;
        slots.insert(slots.end(), fresh->begin(), fresh->end());
        const std::span<const Token> ins(tokens.data(), static_cast<size_t>(whole));
        model_.Add(ns, ins);
        auto r = c.Insert(ins, slots, ns);
        ASSERT_TRUE(r.ok()) << r.status().ToString();
        longest_insert_pages_ = std::max(longest_insert_pages_, whole / c.page_size());
      } else {
        ASSERT_TRUE(fresh.status().IsOutOfMemory()) << fresh.status().ToString();
      }
      ASSERT_TRUE(c.Release(m->handle).ok());
    }
  }

  void Step() {
    HierarchicalCache& c = *s_.cache;
    const int op = static_cast<int>(rng_() % 100);
    if (op < 30) {
      auto [ns, tokens] = prompts_.Next(rng_);
      const int64_t pages = static_cast<int64_t>(tokens.size()) / c.page_size();
      if (chunked_ && pages >= 4 && rng_() % 2 == 0) {  // chunked prefill, back to back
        const int64_t chunks = 2 + static_cast<int64_t>(rng_() % 3);
        ++chunked_requests_;
        for (int64_t k = 1; k < chunks; ++k) {
          const int64_t end = pages * k / chunks * c.page_size();
          Serve(ns, std::vector<Token>(tokens.begin(), tokens.begin() + end));
          if (::testing::Test::HasFatalFailure()) return;
        }
      }
      Serve(ns, tokens);
    } else if (op < 45) {  // a match kept live (pins), maybe queried and prefetched
      if (live_.size() >= 3) return;
      auto [ns, tokens] = prompts_.Next(rng_);
      auto m = c.Match(tokens, ns);
      ASSERT_TRUE(m.ok());
      live_.push_back(Live{m->handle, ns, tokens});
      CheckSlots(live_.back(), m->device_tokens, m->device_slots, m->host_slots);
      if (rng_() % 2) {
        ASSERT_TRUE(c.QueryStorage(m->handle).ok());
      }
      if (rng_() % 2) {
        auto p = c.Prefetch(m->handle, static_cast<PrefetchPolicy>(rng_() % 3));
        ASSERT_TRUE(p.ok()) << p.status().ToString();
      }
    } else if (op < 55) {  // end a live match: finish its prefetch / load back / release
      if (live_.empty()) return;
      const size_t i = rng_() % live_.size();
      Live l = live_[i];
      live_.erase(live_.begin() + static_cast<long>(i));
      if (rng_() % 2) {
        auto f = c.FinishPrefetch(l.handle);
        ASSERT_TRUE(f.ok()) << f.status().ToString();
      }
      if (rng_() % 2) {
        auto lb = c.LoadBack(l.handle);
        if (lb.ok()) {
          CheckSlots(l, static_cast<int64_t>(lb->device_slots.size()), lb->device_slots, {});
        } else {
          ASSERT_TRUE(lb.status().IsOutOfMemory()) << lb.status().ToString();
        }
      }
      ASSERT_TRUE(c.Release(l.handle).ok());
    } else if (op < 62) {
      ASSERT_TRUE(c.EvictDevice(static_cast<int64_t>(rng_() % 40)).ok());
    } else if (op < 69) {
      ASSERT_TRUE(c.EvictHost(static_cast<int64_t>(rng_() % 40)).ok());
    } else if (op < 72) {
      const Status st = c.WaitForBackups();
      ASSERT_TRUE(st.ok() || st.code() == StatusCode::kFailedPrecondition) << st.ToString();
    } else if (op < 78 && allow_faults_ && faults_ != nullptr) {
      switch (rng_() % 6) {
        case 0:
          faults_->ClearFaults();
          break;
        case 1:
          ASSERT_TRUE(faults_->SetCorruptFraction(0.3).ok());
          break;
        case 2:
          ASSERT_TRUE(faults_->SetErrorFraction(0.3).ok());
          break;
        case 3:
          ASSERT_TRUE(faults_->SetDropFraction(0.5).ok());
          break;
        case 4:
          faults_->SetDown(rng_() % 2 == 0);
          break;
        case 5:
          ASSERT_TRUE(faults_->SetDelay(std::chrono::milliseconds(rng_() % 3)).ok());
          break;
      }
    } else if (op < 80) {
      (void)c.stats();
    } else if (op < 90 && clock_ != nullptr) {
      PinStep();
    }
    if (clock_ != nullptr && !::testing::Test::HasFatalFailure()) CheckPins();
  }

  // What the run exercised: requests served as chunked inserts, the longest insert in pages.
  int64_t chunked_requests() const { return chunked_requests_; }
  int64_t longest_insert_pages() const { return longest_insert_pages_; }

 private:
  int64_t chunked_requests_ = 0;
  int64_t longest_insert_pages_ = 0;
  CacheUnderTest& s_;
  InsertedPrefixes& model_;
  FaultInjectingStorage* faults_;
  std::mt19937_64 rng_;
  Prompts prompts_;
  bool allow_faults_;
  bool chunked_;
  const TestClock* clock_;
  std::vector<Live> live_;
  std::vector<LivePin> pins_;
};

// Everything leaves device and host memory, then comes back through QueryStorage + Prefetch.
// `doc_pages`: the prompt's length; `chunks`: inserted as that many back-to-back chunked-prefill
// inserts.
void EvictAllAndPrefetchBack(CacheUnderTest& s, FaultInjectingStorage* faults, int64_t page,
                             int64_t doc_pages = 8, int64_t chunks = 1) {
  HierarchicalCache& c = *s.cache;
  if (faults != nullptr) faults->ClearFaults();
  const CacheStats phase = c.stats();  // the failure message says what this phase lost
  const auto doc = [&] {
    std::vector<Token> t(static_cast<size_t>(doc_pages * page));
    for (size_t i = 0; i < t.size(); ++i) t[i] = static_cast<Token>(777000 + i);
    return t;
  }();
  // Room first: reads of cancelled prefetches finish (their pages come back), and under
  // write_back host pages leave only once storage has them.
  // Waited for by state, not for 5 s (an ASan build on a loaded box took longer, and the phase
  // then ran with reads still filling host pages): the 5 min are a hang guard only.
  const auto room_deadline = std::chrono::steady_clock::now() + std::chrono::minutes(5);
  while (c.stats().host_filling_tokens > 0 && std::chrono::steady_clock::now() < room_deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ASSERT_EQ(c.stats().host_filling_tokens, 0) << "reads still filling host pages after 5 min";
  // Under write_back a long path leaves host memory in parts (the store queue's room at a time):
  // rounds until it is empty, so that the prompt below competes with nothing for the queue.
  for (int round = 0; round < 3 || (round < 64 && c.stats().host_used_tokens > 0); ++round) {
    ASSERT_TRUE(c.EvictHost(std::numeric_limits<int64_t>::max()).ok());
    (void)c.WaitForBackups();
  }
  const auto hashes = Hashes(doc, "");
  for (int64_t k = 1; k <= chunks; ++k) {
    const std::span<const Token> chunk =
        std::span<const Token>(doc).first(static_cast<size_t>(doc_pages * k / chunks * page));
    auto m = c.Match(chunk);
    ASSERT_TRUE(m.ok());
    auto lb = c.LoadBack(m->handle);  // what an earlier chunk left in host memory
    ASSERT_TRUE(lb.ok()) << lb.status().ToString();
    const int64_t cached = static_cast<int64_t>(lb->device_slots.size());
    auto fresh = c.AllocateDeviceSlots(static_cast<int64_t>(chunk.size()) - cached);
    ASSERT_TRUE(fresh.ok()) << fresh.status().ToString();
    ASSERT_TRUE(s.device
                    ->Fill(*fresh, std::span<const uint64_t>(hashes).subspan(
                                       static_cast<size_t>(cached), fresh->size()))
                    .ok());
    std::vector<int64_t> slots = lb->device_slots;
    slots.insert(slots.end(), fresh->begin(), fresh->end());
    ASSERT_TRUE(c.Insert(chunk, slots).ok());
    ASSERT_TRUE(c.Release(m->handle).ok());
  }
  for (int i = 0; i < 3; ++i) {  // hits: write_through_selective backs it up at its threshold
    auto hit = c.Match(doc);
    ASSERT_TRUE(hit.ok());
    ASSERT_TRUE(c.Release(hit->handle).ok());
  }
  (void)c.WaitForBackups();
  // write_back stores only on host eviction, at most the store queue's room at a time (host
  // eviction waits for what is in flight): drain in rounds.
  for (int round = 0; round < 3 || (round < 64 && c.stats().host_used_tokens > 0); ++round) {
    ASSERT_TRUE(c.EvictDevice(std::numeric_limits<int64_t>::max()).ok());
    (void)c.WaitForBackups();
    ASSERT_TRUE(c.EvictHost(std::numeric_limits<int64_t>::max()).ok());
    (void)c.WaitForBackups();
  }
  ASSERT_TRUE(c.CheckConsistency().ok()) << c.CheckConsistency().ToString();
  auto m = c.Match(doc);
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->device_tokens, 0);
  EXPECT_EQ(m->host_tokens, 0);
  ASSERT_TRUE(c.QueryStorage(m->handle).ok());
  auto p = c.Prefetch(m->handle, PrefetchPolicy::kWaitComplete);
  ASSERT_TRUE(p.ok());
  auto lb = c.LoadBack(m->handle);
  ASSERT_TRUE(lb.ok()) << lb.status().ToString();
  EXPECT_EQ(lb->device_slots.size(), doc.size())
      << "the page did not come back from storage: query " << m->storage_tokens << " prefetch "
      << PrefetchStateName(lb->prefetch.state) << " arrived " << lb->prefetch.arrived_tokens
      << " stored " << c.stats().storage_backup_tokens << " dropped "
      << c.stats().storage_backup_dropped_tokens << " failed "
      << c.stats().storage_backup_failed_tokens << " write_back " << c.stats().write_back_tokens
      << " skipped " << c.stats().backup_skipped_tokens << " present "
      << c.stats().storage_backup_present_tokens << " qdrops " << c.stats().storage_queue_drops
      << " prefetch " << c.stats().prefetch_no_room_tokens << " corrupt "
      << c.stats().storage_corrupt_pages << "; in this phase: write timeouts "
      << c.stats().storage_write_timeouts - phase.storage_write_timeouts << " failed "
      << c.stats().storage_backup_failed_tokens - phase.storage_backup_failed_tokens << " dropped "
      << c.stats().storage_backup_dropped_tokens - phase.storage_backup_dropped_tokens << " qdrops "
      << c.stats().storage_queue_drops - phase.storage_queue_drops << " stored "
      << c.stats().storage_backup_tokens - phase.storage_backup_tokens;
  EXPECT_TRUE(s.device
                  ->Verify(lb->device_slots,
                           std::span<const uint64_t>(hashes).first(lb->device_slots.size()))
                  .ok());
  ASSERT_TRUE(c.Release(m->handle).ok());
  ASSERT_TRUE(c.CheckConsistency().ok()) << c.CheckConsistency().ToString();
}

struct Params {
  std::string store;  // "memory" or "file"
  uint64_t seed;
  bool long_prompts = false;  // prompts up to kLongDocPages pages, chunked prefill, small batches
};

class TiersModelTest : public ::testing::TestWithParam<Params> {};

void RunModel(const Params& p, int64_t steps) {
  TempDir dir;
  const int64_t page = int64_t{1} << (p.seed % 3);
  const std::string url = p.store == "file" ? fmt::format("file://{}?capacity=8MiB", dir.path())
                                            : std::string("memory://?capacity=8MiB");
  SCOPED_TRACE(fmt::format("store {} seed {} page {} (rerun: KVTIER_TEST_SEED={})", p.store, p.seed,
                           page, p.seed));
  FaultInjectingStorage* faults = nullptr;
  HierarchicalCacheConfig cfg;
  cfg.write_policy = static_cast<WritePolicy>(p.seed % 3);
  cfg.backup_threads = static_cast<int>(p.seed % 2);
  cfg.device_eviction = static_cast<EvictionPolicyKind>((p.seed / 3) % 4);
  cfg.storage.backend = OpenStore(url, page, p.seed, &faults);
  ASSERT_NE(cfg.storage.backend, nullptr);
  cfg.storage.prefetch_threshold_tokens = static_cast<int64_t>(p.seed % 4) * page;
  cfg.storage.prefetch_timeout_base_s = 0.02;
  cfg.storage.max_storage_only_pages = 64;
  cfg.storage.max_prefetch_batch_pages = 3;
  int64_t device_pages = 24, host_pages = 32;
  TestClock clock;
  cfg.pin_clock = clock.fn();
  cfg.pin_device_budget_tokens = 8 * page;
  cfg.pin_host_budget_tokens = 12 * page;
  cfg.pin_storage_budget_tokens = 24 * page;
  if (p.long_prompts) {
    // Stores in many batches, and paths longer than the queue's room stored in parts.
    cfg.storage.max_backup_batch_pages = 7;
    cfg.storage.max_backup_queue_pages = 40;
    cfg.storage.max_storage_only_pages = 4 * kLongDocPages;
    device_pages = 3 * kLongDocPages;
    host_pages = 4 * kLongDocPages;
    cfg.pin_device_budget_tokens = kLongDocPages * page;  // pins of prompts that long fit
    cfg.pin_host_budget_tokens = kLongDocPages * page;
    cfg.pin_storage_budget_tokens = 2 * kLongDocPages * page;
  }
  CacheUnderTest s =
      MakeCache(cfg, page, device_pages, host_pages, testing::BackendFromEnv(), faults);
  ASSERT_NE(s.cache, nullptr);
  InsertedPrefixes model(page);
  {
    Driver d(s, model, faults, p.seed, /*allow_faults=*/true, p.long_prompts, &clock);
    for (int64_t i = 0; i < steps; ++i) {
      d.Step();
      if (::testing::Test::HasFatalFailure()) return;
      const Status st = s.cache->CheckConsistency();
      ASSERT_TRUE(st.ok()) << "step " << i << ": " << st.ToString();
    }
    if (p.long_prompts && steps >= 100) {
      // The run did what the variant is for: chunked inserts, and inserts longer than a backup
      // batch and than the store queue's room (stored in batches and in parts).
      EXPECT_GT(d.chunked_requests(), 0);
      EXPECT_GT(d.longest_insert_pages(), cfg.storage.max_backup_queue_pages);
      EXPECT_GT(s.cache->stats().storage_backup_tokens, cfg.storage.max_backup_batch_pages * page);
    }
  }
  if (p.long_prompts) {
    EvictAllAndPrefetchBack(s, faults, page, kLongDocPages, /*chunks=*/4);
  } else {
    EvictAllAndPrefetchBack(s, faults, page);
  }
  const CacheStats stats = s.cache->stats();
  EXPECT_GT(stats.match_calls, 0);
  EXPECT_GT(stats.pins, 0) << "no pin was made";
  if (steps >= 600) {  // the default run of every seed reaches a TTL or a budget
    EXPECT_GT(stats.pins_expired + stats.pins_refused, 0) << "no TTL or budget was exercised";
  }
  s.ExpectNothingRanUnderTheMutex();
}

bool SkipWithoutGpu() {
  return testing::BackendFromEnv() != TransferBackend::kCpu && CudaDeviceCount() == 0;
}

TEST_P(TiersModelTest, InvariantsAndBytesHoldUnderRandomOperations) {
  if (SkipWithoutGpu()) GTEST_SKIP() << "KVTIER_TEST_BACKEND needs a GPU";
  const int64_t one = testing::EnvInt("KVTIER_TEST_SEED", 0);
  if (one != 0 && static_cast<uint64_t>(one) != GetParam().seed) GTEST_SKIP();
  RunModel(GetParam(), testing::EnvInt("KVTIER_TEST_STEPS", 600));
}

INSTANTIATE_TEST_SUITE_P(Stores, TiersModelTest,
                         ::testing::Values(Params{"memory", 1}, Params{"memory", 2},
                                           Params{"memory", 3}, Params{"memory", 4},
                                           Params{"memory", 5}, Params{"memory", 6},
                                           Params{"file", 7}, Params{"file", 8}, Params{"file", 9},
                                           Params{"memory", 10, true}, Params{"memory", 11, true},
                                           Params{"memory", 12, true}, Params{"file", 13, true}),
                         [](const auto& info) {
                           return fmt::format("{}_{}{}", info.param.store, info.param.seed,
                                              info.param.long_prompts ? "_long" : "");
                         });

// Four engine threads on one cache, faults included; the invariants are checked as they run.
TEST(TiersModelConcurrencyTest, ConcurrentThreadsKeepInvariantsAndBytes) {
  if (SkipWithoutGpu()) GTEST_SKIP() << "KVTIER_TEST_BACKEND needs a GPU";
  for (uint64_t seed : {11u, 12u, 13u}) {
    TempDir dir;
    const int64_t page = int64_t{1} << (seed % 3);
    SCOPED_TRACE(fmt::format("seed {} page {}", seed, page));
    FaultInjectingStorage* faults = nullptr;
    HierarchicalCacheConfig cfg;
    cfg.write_policy = static_cast<WritePolicy>(seed % 3);
    cfg.backup_threads = 2;
    cfg.storage.backend = OpenStore(seed % 2 ? std::string("memory://?capacity=8MiB")
                                             : fmt::format("file://{}?capacity=8MiB", dir.path()),
                                    page, seed, &faults);
    cfg.storage.prefetch_threshold_tokens = 0;
    cfg.storage.prefetch_timeout_base_s = 0.02;
    CacheUnderTest s = MakeCache(cfg, page, 64, 48, testing::BackendFromEnv(), faults);
    ASSERT_NE(s.cache, nullptr);
    InsertedPrefixes model(page);
    const int64_t steps = testing::EnvInt("KVTIER_TEST_STEPS", 600) / 2;
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t) {
      threads.emplace_back([&, t] {
        Driver d(s, model, faults, seed * 10 + static_cast<uint64_t>(t), /*allow_faults=*/t == 0);
        for (int64_t i = 0; i < steps && !::testing::Test::HasFailure(); ++i) {
          d.Step();
          if (i % 50 == 0) {
            const Status st = s.cache->CheckConsistency();
            EXPECT_TRUE(st.ok()) << st.ToString();
          }
        }
      });
    }
    for (auto& th : threads) th.join();
    ASSERT_TRUE(s.cache->CheckConsistency().ok()) << s.cache->CheckConsistency().ToString();
    EXPECT_EQ(s.cache->stats().live_handles, 0);
    s.ExpectNothingRanUnderTheMutex();
  }
}

// Two processes, one file store: the child writes prefixes through its cache and exits; the
// parent's cache finds them with QueryStorage and brings them back byte-exact with Prefetch.
TEST(TiersModelTest, SecondProcessFindsTheFirstsPrefixesInOneFileStore) {
  TempDir dir;
  constexpr int64_t kPage = 4;
  const std::string url = fmt::format("file://{}?capacity=8MiB", dir.path());
  std::vector<std::vector<Token>> docs;
  for (int d = 0; d < 3; ++d) {
    std::vector<Token> t(static_cast<size_t>(10 * kPage));
    for (size_t i = 0; i < t.size(); ++i) t[i] = static_cast<Token>(d * 5000 + i);
    docs.push_back(std::move(t));
  }
  auto config = [&]() {
    HierarchicalCacheConfig cfg;
    cfg.write_policy = WritePolicy::kWriteThrough;
    cfg.backup_threads = 1;
    cfg.storage.url = url;
    cfg.storage.model_id = "tiers-model-test";
    cfg.storage.prefetch_threshold_tokens = 0;
    return cfg;
  };
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    // The child: no gtest assertions (they would report into the parent's output twice).
    int code = 0;
    {
      CacheUnderTest s = MakeCache(config(), kPage, 64, 64);
      if (s.cache == nullptr) _exit(2);
      for (const auto& doc : docs) {
        auto fresh = s.cache->AllocateDeviceSlots(static_cast<int64_t>(doc.size()));
        if (!fresh.ok() || !s.device->Fill(*fresh, Hashes(doc, "")).ok() ||
            !s.cache->Insert(doc, *fresh).ok()) {
          code = 3;
        }
      }
      if (!s.cache->WaitForBackups().ok()) code = 4;
      if (s.cache->stats().storage_backup_tokens != 30 * kPage) code = 5;
    }
    _exit(code);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  ASSERT_EQ(WEXITSTATUS(status), 0) << "the writing process failed";

  CacheUnderTest s = MakeCache(config(), kPage, 64, 64);
  ASSERT_NE(s.cache, nullptr);
  for (const auto& doc : docs) {
    auto m = s.cache->Match(doc);
    ASSERT_TRUE(m.ok());
    EXPECT_EQ(m->device_tokens + m->host_tokens + m->storage_tokens, 0);
    auto q = s.cache->QueryStorage(m->handle);
    ASSERT_TRUE(q.ok()) << q.status().ToString();
    EXPECT_EQ(q->queried_tokens, static_cast<int64_t>(doc.size()));
    ASSERT_TRUE(s.cache->Prefetch(m->handle, PrefetchPolicy::kWaitComplete).ok());
    auto lb = s.cache->LoadBack(m->handle);
    ASSERT_TRUE(lb.ok()) << lb.status().ToString();
    ASSERT_EQ(lb->device_slots.size(), doc.size());
    EXPECT_TRUE(s.device->Verify(lb->device_slots, Hashes(doc, "")).ok());
    ASSERT_TRUE(s.cache->Release(m->handle).ok());
  }
  ASSERT_TRUE(s.cache->CheckConsistency().ok());
}

}  // namespace
}  // namespace kvtier
