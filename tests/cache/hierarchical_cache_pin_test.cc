// HierarchicalCache::Pin / Unpin (retention): a pinned prefix survives eviction pressure in each
// tier it names (and only those), its TTL ends it (an injected clock, never sleeps), budgets
// refuse pins beyond them and change nothing, Unpin ends it, pins and match handles are
// independent, and the stores (memory://, file://) keep pinned pages out of their own eviction.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "cache/cache_test_util.h"
#include "kvtier/hierarchical_cache.h"
#include "kvtier/storage.h"

namespace kvtier {
namespace {

using testing::DeviceTier;
using testing::Hashes;

constexpr int64_t kLayers = 2;
constexpr int64_t kSlotBytes = 8;
constexpr int64_t kPage = 4;
constexpr CacheTier kDevice[] = {CacheTier::kDevice};
constexpr CacheTier kHost[] = {CacheTier::kHost};
constexpr CacheTier kStorage[] = {CacheTier::kStorage};
constexpr CacheTier kAll[] = {CacheTier::kDevice, CacheTier::kHost, CacheTier::kStorage};

// A clock the test moves by hand.
struct FakeClock {
  std::shared_ptr<std::atomic<int64_t>> ns = std::make_shared<std::atomic<int64_t>>(1'000'000);
  std::function<std::chrono::steady_clock::time_point()> fn() const {
    return
        [ns = ns] { return std::chrono::steady_clock::time_point(std::chrono::nanoseconds(*ns)); };
  }
  void Advance(double seconds) { *ns += static_cast<int64_t>(seconds * 1e9); }
};

StorageNamespace NamespaceFor(int64_t page) {
  StorageNamespace ns;
  ns.model_id = "pin-test";
  ns.layout = KvLayout::kPageFirst;
  ns.num_layers = kLayers;
  ns.slot_bytes = kSlotBytes;
  ns.page_size = page;
  return ns;
}

struct TestCache {
  std::unique_ptr<DeviceTier> device;
  std::unique_ptr<HierarchicalCache> cache;
};

// host_pages 0: no host tier.
TestCache Make(HierarchicalCacheConfig cfg, int64_t device_pages, int64_t host_pages) {
  TestCache s;
  KvGeometry g{KvLayout::kLayerFirst, kLayers, device_pages * kPage, kSlotBytes, kPage, 1};
  auto dev = DeviceTier::Create(TransferBackend::kCpu, g, false);
  EXPECT_TRUE(dev.ok()) << dev.status().ToString();
  s.device = std::move(*dev);
  cfg.host_capacity_bytes = host_pages * kPage * kLayers * kSlotBytes * 2;
  if (host_pages == 0) cfg.host_ratio = 0;
  cfg.transfer.cpu_threads = 1;
  cfg.backup_threads = 0;  // deterministic: copies run in the calling thread
  auto c = HierarchicalCache::Create(cfg, s.device->region());
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  if (c.ok()) s.cache = std::move(*c);
  return s;
}

std::vector<Token> Seq(int64_t n, Token base) {
  std::vector<Token> t(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) t[static_cast<size_t>(i)] = base + static_cast<Token>(i);
  return t;
}

// The engine's prefill: match, load back, compute the rest, insert, release.
void Prefill(TestCache& s, std::span<const Token> tokens) {
  HierarchicalCache& c = *s.cache;
  auto m = c.Match(tokens);
  ASSERT_TRUE(m.ok());
  auto lb = c.LoadBack(m->handle);
  ASSERT_TRUE(lb.ok()) << lb.status().ToString();
  const auto hashes = Hashes(tokens, "");
  std::vector<int64_t> slots = lb->device_slots;
  auto fresh = c.AllocateDeviceSlots(static_cast<int64_t>(tokens.size() - slots.size()));
  ASSERT_TRUE(fresh.ok()) << fresh.status().ToString();
  ASSERT_TRUE(s.device->Fill(*fresh, std::span<const uint64_t>(hashes).subspan(slots.size())).ok());
  slots.insert(slots.end(), fresh->begin(), fresh->end());
  ASSERT_TRUE(c.Insert(tokens, slots).ok());
  ASSERT_TRUE(c.Release(m->handle).ok());
  ASSERT_TRUE(c.CheckConsistency().ok()) << c.CheckConsistency().ToString();
}

// Requests of fresh prompts that fill every tier several times over.
void Pressure(TestCache& s, int rounds, int64_t pages_each, Token base = 100000) {
  for (int r = 0; r < rounds; ++r) {
    Prefill(s, Seq(pages_each * kPage, base + static_cast<Token>(r) * 1000));
    if (::testing::Test::HasFatalFailure()) return;
    (void)s.cache->WaitForBackups();
  }
}

struct Where {
  int64_t device = 0, host = 0, storage = 0;
};
Where Find(HierarchicalCache& c, std::span<const Token> tokens) {
  auto m = c.Match(tokens);
  EXPECT_TRUE(m.ok());
  Where w{m->device_tokens, m->host_tokens, m->storage_tokens};
  EXPECT_TRUE(c.Release(m->handle).ok());
  return w;
}

TEST(PinTest, DevicePinSurvivesDevicePressureAndEndsAtUnpin) {
  HierarchicalCacheConfig cfg;
  cfg.pin_device_budget_tokens = 4 * kPage;
  TestCache s = Make(cfg, /*device_pages=*/8, /*host_pages=*/0);
  ASSERT_NE(s.cache, nullptr);
  const auto prompt = Seq(2 * kPage, 1);
  Prefill(s, prompt);
  auto pin = s.cache->Pin(prompt, kDevice);
  ASSERT_TRUE(pin.ok()) << pin.status().ToString();
  EXPECT_NE(pin->pin.id, 0u);
  EXPECT_EQ(pin->pinned_tokens, 2 * kPage);
  EXPECT_FALSE(pin->store_pinned);
  EXPECT_EQ(s.cache->stats().pinned_device_tokens, 2 * kPage);
  EXPECT_EQ(s.cache->stats().live_pins, 1);
  Pressure(s, 12, 3);
  EXPECT_EQ(Find(*s.cache, prompt).device, 2 * kPage);
  EXPECT_GT(s.cache->stats().device_evicted_tokens, 8 * kPage) << "no pressure";
  // A longer prompt over the pinned one: its tail is not pinned (pins cover what was cached).
  auto longer = Seq(3 * kPage, 1);
  Prefill(s, longer);
  Pressure(s, 6, 3);
  EXPECT_EQ(Find(*s.cache, longer).device, 2 * kPage);
  ASSERT_TRUE(s.cache->Unpin(pin->pin).ok());
  EXPECT_EQ(s.cache->stats().pinned_device_tokens, 0);
  EXPECT_TRUE(s.cache->Unpin(pin->pin).IsInvalidArgument()) << "a second Unpin";
  Pressure(s, 6, 3);
  EXPECT_EQ(Find(*s.cache, prompt).device, 0) << "unpinned, it is evictable again";
  ASSERT_TRUE(s.cache->CheckConsistency().ok()) << s.cache->CheckConsistency().ToString();
}

TEST(PinTest, HostPinKeepsTheHostCopyButNotTheDeviceOne) {
  HierarchicalCacheConfig cfg;
  cfg.write_policy = WritePolicy::kWriteThrough;
  cfg.pin_host_budget_tokens = 4 * kPage;
  TestCache s = Make(cfg, /*device_pages=*/8, /*host_pages=*/8);
  ASSERT_NE(s.cache, nullptr);
  const auto prompt = Seq(2 * kPage, 1);
  Prefill(s, prompt);
  ASSERT_TRUE(s.cache->WaitForBackups().ok());
  auto pin = s.cache->Pin(prompt, kHost, kPinForever);
  ASSERT_TRUE(pin.ok()) << pin.status().ToString();
  Pressure(s, 12, 3);
  const Where w = Find(*s.cache, prompt);
  EXPECT_EQ(w.device, 0) << "the device copy is not pinned";
  EXPECT_EQ(w.host, 2 * kPage);
  EXPECT_GT(s.cache->stats().host_evicted_tokens, 8 * kPage) << "no host pressure";
  // It loads back byte-exact from the pinned host copy.
  auto m = s.cache->Match(prompt);
  ASSERT_TRUE(m.ok());
  auto lb = s.cache->LoadBack(m->handle);
  ASSERT_TRUE(lb.ok());
  ASSERT_EQ(lb->device_slots.size(), prompt.size());
  EXPECT_TRUE(s.device->Verify(lb->device_slots, Hashes(prompt, "")).ok());
  ASSERT_TRUE(s.cache->Release(m->handle).ok());
  ASSERT_TRUE(s.cache->CheckConsistency().ok()) << s.cache->CheckConsistency().ToString();
}

TEST(PinTest, StoragePinKeepsPagesInTheTreeAndTheStore) {
  for (const char* scheme : {"memory", "file"}) {
    SCOPED_TRACE(scheme);
    const std::string dir =
        (std::filesystem::temp_directory_path() / fmt::format("kvtier-pin-{}", getpid())).string();
    std::filesystem::remove_all(dir);
    // Room for 12 pages in the store (a page's payload is 128 bytes; a file holds it after a
    // 4 KiB header block, a memory value after the stored header).
    const int64_t payload = kPage * kLayers * kSlotBytes * 2;
    const int64_t page_bytes =
        payload + (std::string(scheme) == "memory" ? kStoredPageHeaderBytes : 4096);
    const std::string url =
        std::string(scheme) == "memory"
            ? fmt::format("memory://pin-test-{}?capacity={}", getpid(), 12 * page_bytes)
            : fmt::format("file://{}?capacity={}", dir, 12 * page_bytes);
    auto store = OpenStorage(url, NamespaceFor(kPage));
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    std::shared_ptr<StorageBackend> backend(std::move(*store));
    HierarchicalCacheConfig cfg;
    cfg.write_policy = WritePolicy::kWriteThrough;
    cfg.storage.backend = backend;
    cfg.storage.max_storage_only_pages = 4;
    cfg.storage.prefetch_threshold_tokens = 0;
    cfg.pin_storage_budget_tokens = 4 * kPage;
    {
      TestCache s = Make(cfg, /*device_pages=*/8, /*host_pages=*/16);
      ASSERT_NE(s.cache, nullptr);
      const auto prompt = Seq(2 * kPage, 1);
      Prefill(s, prompt);
      ASSERT_TRUE(s.cache->WaitForBackups().ok());
      auto pin = s.cache->Pin(prompt, kStorage, kPinForever);
      ASSERT_TRUE(pin.ok()) << pin.status().ToString();
      EXPECT_TRUE(pin->store_pinned);
      Pressure(s, 12, 3);
      EXPECT_GT(backend->Stats().evicted_pages, 0) << "no store pressure";
      EXPECT_GT(s.cache->stats().storage_forgotten_tokens, 0) << "no tree pressure";
      const Where w = Find(*s.cache, prompt);
      EXPECT_EQ(w.device + w.host + w.storage, 2 * kPage) << "the tree forgot the pinned pages";
      // The store still holds them: they come back byte-exact.
      auto m = s.cache->Match(prompt);
      ASSERT_TRUE(m.ok());
      ASSERT_TRUE(s.cache->Prefetch(m->handle, PrefetchPolicy::kWaitComplete).ok());
      auto lb = s.cache->LoadBack(m->handle);
      ASSERT_TRUE(lb.ok()) << lb.status().ToString();
      ASSERT_EQ(lb->device_slots.size(), prompt.size())
          << "where " << w.device << "/" << w.host << "/" << w.storage << " prefetch "
          << PrefetchStateName(lb->prefetch.state) << " arrived " << lb->prefetch.arrived_tokens
          << " corrupt " << s.cache->stats().storage_corrupt_pages << " errors "
          << s.cache->stats().storage_errors;
      EXPECT_TRUE(s.device->Verify(lb->device_slots, Hashes(prompt, "")).ok());
      ASSERT_TRUE(s.cache->Release(m->handle).ok());
      ASSERT_TRUE(s.cache->CheckConsistency().ok()) << s.cache->CheckConsistency().ToString();
    }
    std::filesystem::remove_all(dir);
  }
}

TEST(PinTest, TtlEndsThePinLazily) {
  FakeClock clock;
  HierarchicalCacheConfig cfg;
  cfg.pin_device_budget_tokens = 4 * kPage;
  cfg.pin_clock = clock.fn();
  TestCache s = Make(cfg, 8, 0);
  ASSERT_NE(s.cache, nullptr);
  const auto prompt = Seq(2 * kPage, 1);
  Prefill(s, prompt);
  auto pin = s.cache->Pin(prompt, kDevice, /*ttl_seconds=*/10);
  ASSERT_TRUE(pin.ok());
  clock.Advance(9.5);
  Pressure(s, 6, 3);
  EXPECT_EQ(Find(*s.cache, prompt).device, 2 * kPage) << "before its TTL";
  EXPECT_EQ(s.cache->stats().pins_expired, 0);
  clock.Advance(1);
  EXPECT_EQ(s.cache->stats().live_pins, 0) << "the next call ends it";
  EXPECT_EQ(s.cache->stats().pins_expired, 1);
  EXPECT_EQ(s.cache->stats().pinned_device_tokens, 0);
  EXPECT_TRUE(s.cache->Unpin(pin->pin).IsInvalidArgument()) << "expired: not live";
  Pressure(s, 6, 3);
  EXPECT_EQ(Find(*s.cache, prompt).device, 0);
  ASSERT_TRUE(s.cache->CheckConsistency().ok());
}

TEST(PinTest, BudgetRefusesBeyondItAndCountsOverlapsOnce) {
  HierarchicalCacheConfig cfg;
  cfg.pin_device_budget_tokens = 3 * kPage;
  TestCache s = Make(cfg, 8, 0);
  ASSERT_NE(s.cache, nullptr);
  const auto a = Seq(2 * kPage, 1);
  const auto b = Seq(2 * kPage, 5000);
  Prefill(s, a);
  Prefill(s, b);
  auto pa = s.cache->Pin(a, kDevice);
  ASSERT_TRUE(pa.ok());
  auto again = s.cache->Pin(a, kDevice);  // the same tokens: counted once
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(s.cache->stats().pinned_device_tokens, 2 * kPage);
  auto pb = s.cache->Pin(b, kDevice);
  ASSERT_FALSE(pb.ok());
  EXPECT_TRUE(pb.status().IsInvalidArgument());
  EXPECT_NE(pb.status().message().find("pin_device_budget_tokens = 12"), std::string::npos)
      << pb.status().message();
  EXPECT_EQ(s.cache->stats().pinned_device_tokens, 2 * kPage) << "a refused pin changes nothing";
  EXPECT_EQ(s.cache->stats().pins_refused, 1);
  // Tiers without a budget refuse too; a half-fitting prefix of b fits.
  EXPECT_TRUE(s.cache->Pin(a, kAll).status().IsInvalidArgument()) << "no host tier";
  auto half = s.cache->Pin(std::span<const Token>(b).first(kPage), kDevice);
  ASSERT_TRUE(half.ok()) << half.status().ToString();
  EXPECT_EQ(half->pinned_tokens, kPage);
  EXPECT_EQ(s.cache->stats().pinned_device_tokens, 3 * kPage);
  ASSERT_TRUE(s.cache->Unpin(pa->pin).ok());
  EXPECT_EQ(s.cache->stats().pinned_device_tokens, 3 * kPage) << "`again` still covers a";
  ASSERT_TRUE(s.cache->Unpin(again->pin).ok());
  EXPECT_EQ(s.cache->stats().pinned_device_tokens, kPage);
  ASSERT_TRUE(s.cache->CheckConsistency().ok()) << s.cache->CheckConsistency().ToString();
}

TEST(PinTest, BadArgumentsAndNothingCached) {
  HierarchicalCacheConfig cfg;
  cfg.pin_device_budget_tokens = 4 * kPage;
  TestCache s = Make(cfg, 8, 0);
  ASSERT_NE(s.cache, nullptr);
  const auto prompt = Seq(2 * kPage, 1);
  auto none = s.cache->Pin(prompt, kDevice);
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(none->pin.id, 0u);
  EXPECT_EQ(none->pinned_tokens, 0);
  Prefill(s, prompt);
  EXPECT_TRUE(s.cache->Pin(prompt, {}).status().IsInvalidArgument());
  const CacheTier twice[] = {CacheTier::kDevice, CacheTier::kDevice};
  EXPECT_TRUE(s.cache->Pin(prompt, twice).status().IsInvalidArgument());
  const CacheTier unknown[] = {static_cast<CacheTier>(200)};
  EXPECT_TRUE(s.cache->Pin(prompt, unknown).status().IsInvalidArgument());
  EXPECT_TRUE(s.cache->Pin(prompt, kDevice, 0).status().IsInvalidArgument());
  EXPECT_TRUE(s.cache->Pin(prompt, kDevice, -1).status().IsInvalidArgument());
  EXPECT_TRUE(s.cache->Pin(prompt, kDevice, std::nan("")).status().IsInvalidArgument());
  EXPECT_TRUE(s.cache->Pin(prompt, kStorage).status().IsInvalidArgument()) << "no storage tier";
  EXPECT_TRUE(s.cache->Unpin(PinHandle{12345}).IsInvalidArgument());
  auto other_ns = s.cache->Pin(prompt, kDevice, kPinForever, "tenant-b");
  ASSERT_TRUE(other_ns.ok());
  EXPECT_EQ(other_ns->pinned_tokens, 0) << "namespaces do not share prefixes";
  // Budgets that leave no room are refused at Create.
  HierarchicalCacheConfig full;
  full.pin_device_budget_tokens = 8 * kPage;
  KvGeometry g{KvLayout::kLayerFirst, kLayers, 8 * kPage, kSlotBytes, kPage, 1};
  auto dev = DeviceTier::Create(TransferBackend::kCpu, g, false);
  ASSERT_TRUE(dev.ok());
  full.host_ratio = 0;
  auto c = HierarchicalCache::Create(full, (*dev)->region());
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("pin_device_budget_tokens"), std::string::npos);
  HierarchicalCacheConfig negative;
  negative.pin_host_budget_tokens = -1;
  EXPECT_NE(negative.Validate().message().find("pin_host_budget_tokens"), std::string::npos);
}

TEST(PinTest, PinsAndMatchHandlesAreIndependent) {
  HierarchicalCacheConfig cfg;
  cfg.pin_device_budget_tokens = 6 * kPage;
  TestCache s = Make(cfg, 8, 0);
  ASSERT_NE(s.cache, nullptr);
  const auto prompt = Seq(3 * kPage, 1);
  Prefill(s, prompt);
  // A live handle on the prompt, a pin of its first two pages (splitting the node under the
  // handle), the handle released: the pin alone keeps the two pages.
  auto m = s.cache->Match(prompt);
  ASSERT_TRUE(m.ok());
  auto pin = s.cache->Pin(std::span<const Token>(prompt).first(2 * kPage), kDevice);
  ASSERT_TRUE(pin.ok());
  ASSERT_TRUE(s.cache->CheckConsistency().ok()) << s.cache->CheckConsistency().ToString();
  ASSERT_TRUE(s.cache->Release(m->handle).ok());
  Pressure(s, 8, 3);
  EXPECT_EQ(Find(*s.cache, prompt).device, 2 * kPage);
  // A match handle taken after the pin, and the pin ended while it is live: the handle still
  // protects its match until Release.
  auto m2 = s.cache->Match(prompt);
  ASSERT_TRUE(m2.ok());
  ASSERT_TRUE(s.cache->Unpin(pin->pin).ok());
  ASSERT_TRUE(s.cache->EvictDevice(1 << 20).ok());
  EXPECT_EQ(Find(*s.cache, prompt).device, 2 * kPage);
  ASSERT_TRUE(s.cache->Release(m2->handle).ok());
  ASSERT_TRUE(s.cache->EvictDevice(1 << 20).ok());
  EXPECT_EQ(Find(*s.cache, prompt).device, 0);
  ASSERT_TRUE(s.cache->CheckConsistency().ok()) << s.cache->CheckConsistency().ToString();
}

TEST(PinTest, AllocationCountsPinnedPagesAsUnevictable) {
  HierarchicalCacheConfig cfg;
  cfg.pin_device_budget_tokens = 4 * kPage;
  TestCache s = Make(cfg, 8, 0);
  ASSERT_NE(s.cache, nullptr);
  const auto prompt = Seq(4 * kPage, 1);
  Prefill(s, prompt);
  ASSERT_TRUE(s.cache->Pin(prompt, kDevice).ok());
  // 5 pages cannot be had (4 of 8 are pinned): refused before anything is evicted.
  auto big = s.cache->AllocateDeviceSlots(5 * kPage);
  ASSERT_FALSE(big.ok());
  EXPECT_TRUE(big.status().IsOutOfMemory());
  EXPECT_NE(big.status().message().find("4 by Pin"), std::string::npos) << big.status().message();
  auto fits = s.cache->AllocateDeviceSlots(4 * kPage);
  ASSERT_TRUE(fits.ok());
  ASSERT_TRUE(s.cache->FreeDeviceSlots(*fits).ok());
  EXPECT_EQ(Find(*s.cache, prompt).device, 4 * kPage);
}

TEST(PinTest, MetricsShowPinnedTokensPerTier) {
  HierarchicalCacheConfig cfg;
  cfg.write_policy = WritePolicy::kWriteThrough;
  cfg.pin_device_budget_tokens = 4 * kPage;
  cfg.pin_host_budget_tokens = 4 * kPage;
  TestCache s = Make(cfg, 8, 8);
  ASSERT_NE(s.cache, nullptr);
  const auto prompt = Seq(2 * kPage, 1);
  Prefill(s, prompt);
  const CacheTier both[] = {CacheTier::kDevice, CacheTier::kHost};
  ASSERT_TRUE(s.cache->Pin(prompt, both).ok());
  const std::string text = s.cache->Metrics();
  EXPECT_NE(text.find("kvtier:pinned_tokens{tier=\"device\"} 8"), std::string::npos) << text;
  EXPECT_NE(text.find("kvtier:pinned_tokens{tier=\"host\"} 8"), std::string::npos);
  EXPECT_NE(text.find("kvtier:pinned_tokens{tier=\"storage\"} 0"), std::string::npos);
  EXPECT_NE(text.find("kvtier:live_pins 1"), std::string::npos);
  EXPECT_NE(text.find("kvtier:pins_total 1"), std::string::npos);
}

}  // namespace
}  // namespace kvtier
