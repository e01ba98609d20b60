// HierarchicalCache: configuration, the engine flow, write policies, eviction, the named copy
// races (with a gated transfer engine holding copies back), and bad input.
#include "kvtier/hierarchical_cache.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <sys/mman.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <mutex>
#include <random>
#include <thread>

#include "cache/cache_test_util.h"
#include "kvtier/device.h"

#if defined(KVTIER_WITH_CUDA)
#include <cuda_runtime.h>
#endif

namespace kvtier {
namespace {

using testing::DeviceTier;
using testing::GatedEngine;
using testing::Hashes;

constexpr int64_t kLayers = 2;
constexpr int64_t kSlotBytes = 8;

struct TestCache {
  std::unique_ptr<DeviceTier> device;
  std::unique_ptr<HierarchicalCache> cache;
  GatedEngine* gate = nullptr;
};

TestCache Make(HierarchicalCacheConfig cfg, int64_t page, int64_t device_pages, int64_t host_pages,
               bool gated = false) {
  TestCache s;
  KvGeometry g{KvLayout::kLayerFirst, kLayers, device_pages * page, kSlotBytes, page, 1};
  auto dev = DeviceTier::Create(TransferBackend::kCpu, g, false);
  EXPECT_TRUE(dev.ok()) << dev.status().ToString();
  s.device = std::move(*dev);
  // host_pages 0 keeps cfg's host_ratio (0: no host tier).
  cfg.host_capacity_bytes = host_pages * page * kLayers * kSlotBytes * 2;
  cfg.transfer.cpu_threads = 1;
  std::unique_ptr<TransferEngine> engine;
  if (gated) {
    auto inner = MakeTransferEngine(TransferBackend::kCpu, cfg.transfer);
    EXPECT_TRUE(inner.ok());
    auto g2 = std::make_unique<GatedEngine>(std::move(*inner), s.device->region().k);
    s.gate = g2.get();
    engine = std::move(g2);
  }
  auto c = HierarchicalCache::Create(cfg, s.device->region(), std::move(engine));
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  s.cache = std::move(*c);
  if (s.gate != nullptr) s.gate->cache = s.cache.get();  // its calls fail under the mutex
  return s;
}

std::vector<Token> Seq(int64_t n, Token base) {
  std::vector<Token> t(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) t[i] = base + static_cast<Token>(i);
  return t;
}

// The engine's prefill: match, compute (pattern) the uncached rest, insert, release.
InsertResult Prefill(TestCache& s, std::span<const Token> tokens, std::string_view ns = "") {
  auto m = s.cache->Match(tokens, ns);
  EXPECT_TRUE(m.ok());
  const auto hashes = Hashes(tokens, ns);
  std::vector<int64_t> slots = m->device_slots;
  const int64_t rest = static_cast<int64_t>(tokens.size()) - m->device_tokens;
  auto fresh = s.cache->AllocateDeviceSlots(rest);
  EXPECT_TRUE(fresh.ok()) << fresh.status().ToString();
  EXPECT_TRUE(
      s.device->Fill(*fresh, std::span<const uint64_t>(hashes).subspan(m->device_tokens)).ok());
  slots.insert(slots.end(), fresh->begin(), fresh->end());
  auto r = s.cache->Insert(tokens, slots, ns);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(s.cache->Release(m->handle).ok());
  EXPECT_TRUE(s.cache->CheckConsistency().ok()) << s.cache->CheckConsistency().ToString();
  return r.ok() ? *r : InsertResult{};
}

TEST(HierarchicalCacheConfigTest, ValidateNamesTheField) {
  HierarchicalCacheConfig c;
  EXPECT_TRUE(c.Validate().ok());
  auto bad = [](auto mutate, const char* field) {
    HierarchicalCacheConfig c;
    mutate(c);
    Status st = c.Validate();
    EXPECT_TRUE(st.IsInvalidArgument()) << field;
    EXPECT_NE(st.message().find(field), std::string::npos) << st.message();
  };
  bad([](auto& c) { c.page_size = 3; }, "page_size");
  bad([](auto& c) { c.page_size = 512; }, "page_size");
  bad([](auto& c) { c.host_capacity_bytes = -1; }, "host_capacity_bytes");
  bad([](auto& c) { c.host_ratio = -1; }, "host_ratio");
  bad([](auto& c) { c.host_ratio = std::nan(""); }, "host_ratio");
  bad([](auto& c) { c.write_through_threshold = 0; }, "write_through_threshold");
  bad([](auto& c) { c.backup_threads = -1; }, "backup_threads");
  bad([](auto& c) { c.load_back_min_tokens = -5; }, "load_back_min_tokens");
  bad([](auto& c) { c.transfer.max_sms = 0; }, "max_sms");
  EXPECT_EQ(*ParseWritePolicy("write_back"), WritePolicy::kWriteBack);
  EXPECT_TRUE(ParseWritePolicy("write_sometimes").status().IsInvalidArgument());
  EXPECT_EQ(*ParseEvictionPolicy("lfu"), EvictionPolicyKind::kLfu);
}

TEST(HierarchicalCacheConfigTest, CreateChecksTheDeviceRegion) {
  KvGeometry g{KvLayout::kPageFirst, 2, 64, 8, 4, 1};
  auto dev = DeviceTier::Create(TransferBackend::kCpu, g, false);
  ASSERT_TRUE(dev.ok());
  auto c = HierarchicalCache::Create({}, (*dev)->region());
  EXPECT_TRUE(c.status().IsInvalidArgument());
  EXPECT_NE(c.status().message().find("layer_first"), std::string::npos);
  KvGeometry g2{KvLayout::kLayerFirst, 2, 60, 8, 3, 1};
  auto dev2 = DeviceTier::Create(TransferBackend::kCpu, g2, false);
  ASSERT_TRUE(dev2.ok());
  EXPECT_TRUE(HierarchicalCache::Create({}, (*dev2)->region()).status().IsInvalidArgument());
  HierarchicalCacheConfig cfg;
  cfg.page_size = 8;
  KvGeometry g3{KvLayout::kLayerFirst, 2, 64, 8, 4, 1};
  auto dev3 = DeviceTier::Create(TransferBackend::kCpu, g3, false);
  ASSERT_TRUE(dev3.ok());
  EXPECT_TRUE(HierarchicalCache::Create(cfg, (*dev3)->region()).status().IsInvalidArgument());
  // Host capacity as a ratio of the device pool.
  cfg.page_size = 0;
  cfg.host_ratio = 1.5;
  auto ok = HierarchicalCache::Create(cfg, (*dev3)->region());
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_EQ((*ok)->stats().host_total_tokens, 96);
  EXPECT_EQ((*ok)->stats().device_total_tokens, 64);
}

// A device region in read-only host memory (a read-only mmap) is refused at Create, naming the
// buffer: load_back writes into it (issue 36: it was accepted and the first load-back crashed).
// Per-layer tables are checked layer by layer.
TEST(HierarchicalCacheConfigTest, CreateRefusesAReadOnlyDeviceRegion) {
  KvGeometry g{KvLayout::kLayerFirst, 2, 64, 8, 4, 1};
  const size_t bytes = static_cast<size_t>(2 * 64 * 8);
  void* ro = ::mmap(nullptr, bytes, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  void* rw = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(ro, MAP_FAILED);
  ASSERT_NE(rw, MAP_FAILED);
  KvRegion region;
  region.geometry = g;
  region.memory = MemoryKind::kHost;
  region.k = rw;
  region.v = ro;
  HierarchicalCacheConfig cfg;
  cfg.host_ratio = 0;
  auto c = HierarchicalCache::Create(cfg, region);
  ASSERT_FALSE(c.ok());
  EXPECT_TRUE(c.status().IsInvalidArgument()) << c.status().ToString();
  EXPECT_NE(c.status().message().find("device_region.v"), std::string::npos)
      << c.status().ToString();
  EXPECT_NE(c.status().message().find("read-only"), std::string::npos) << c.status().ToString();
  // Layer tables: layer 1 of K read-only.
  std::byte* ro_bytes = static_cast<std::byte*>(ro);
  std::byte* rw_bytes = static_cast<std::byte*>(rw);
  void* k_layers[] = {rw_bytes, ro_bytes};
  void* v_layers[] = {rw_bytes + bytes / 2, rw_bytes};
  KvRegion tables;
  tables.geometry = g;
  tables.memory = MemoryKind::kHost;
  tables.k_layers = k_layers;
  tables.v_layers = v_layers;
  auto t = HierarchicalCache::Create(cfg, tables);
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("device_region.k layer 1"), std::string::npos)
      << t.status().ToString();
  region.v = rw_bytes;  // both writable (K and V sharing it is the caller's business)
  EXPECT_TRUE(HierarchicalCache::Create(cfg, region).ok());
  ::munmap(ro, bytes);
  ::munmap(rw, bytes);
}

TEST(HierarchicalCacheTest, DeviceHitHostHitAndLoadBack) {
  HierarchicalCacheConfig cfg;
  cfg.write_policy = WritePolicy::kWriteThrough;
  cfg.backup_threads = 0;
  TestCache s = Make(cfg, 4, 8, 16);
  const auto a = Seq(16, 100);
  const auto ha = Hashes(a, "");
  InsertResult ins = Prefill(s, a);
  EXPECT_EQ(ins.new_tokens, 16);
  auto m = s.cache->Match(a);
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->device_tokens, 16);
  EXPECT_EQ(m->host_tokens, 0);
  ASSERT_TRUE(s.device->Verify(m->device_slots, ha).ok());
  ASSERT_TRUE(s.cache->Release(m->handle).ok());
  // Evict everything from the device: the write-through copy keeps it in host memory.
  auto ev = s.cache->EvictDevice(1000);
  ASSERT_TRUE(ev.ok());
  EXPECT_EQ(*ev, 16);
  std::vector<Token> longer = a;
  longer.insert(longer.end(), {1, 2, 3});  // a partial page more
  m = s.cache->Match(longer);
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->device_tokens, 0);
  EXPECT_EQ(m->host_tokens, 16);
  ASSERT_TRUE(VerifyKvPattern(s.cache->host_region(), m->host_slots, ha).ok());
  auto lb = s.cache->LoadBack(m->handle);
  ASSERT_TRUE(lb.ok()) << lb.status().ToString();
  EXPECT_EQ(lb->loaded_tokens, 16);
  ASSERT_EQ(lb->device_slots.size(), 16u);
  ASSERT_TRUE(s.device->Verify(lb->device_slots, ha).ok());
  EXPECT_TRUE(s.cache->WaitLayer(m->handle, 1, nullptr).ok());
  ASSERT_TRUE(s.cache->Release(m->handle).ok());
  auto m2 = s.cache->Match(a);
  EXPECT_EQ(m2->device_tokens, 16);
  EXPECT_EQ(m2->device_slots, lb->device_slots);
  ASSERT_TRUE(s.cache->Release(m2->handle).ok());
  const CacheStats st = s.cache->stats();
  EXPECT_EQ(st.load_back_tokens, 16);
  EXPECT_EQ(st.backup_tokens, 16);
  EXPECT_EQ(st.device_evicted_tokens, 16);
  EXPECT_EQ(st.host_hit_tokens, 16);
  EXPECT_EQ(st.device_hit_tokens, 32);
  EXPECT_EQ(st.live_handles, 0);
  ASSERT_TRUE(s.cache->CheckConsistency().ok());
}

// host_capacity_bytes = 0 and host_ratio = 0: no host tier. Device evictions forget the tokens
// under every write policy, nothing is backed up, matches have no host part, and the host gauges
// read 0. A storage tier without a host tier is refused, naming both.
TEST(HierarchicalCacheTest, NoHostTier) {
  {
    HierarchicalCacheConfig c;
    c.host_ratio = 0;
    EXPECT_TRUE(c.Validate().ok()) << c.Validate().ToString();
    EXPECT_FALSE(c.has_host_tier());
    c.storage.url = "memory://";
    const Status st = c.Validate();
    EXPECT_TRUE(st.IsInvalidArgument()) << st.ToString();
    EXPECT_NE(st.message().find("storage"), std::string::npos) << st.message();
    EXPECT_NE(st.message().find("host tier"), std::string::npos) << st.message();
    EXPECT_NE(st.message().find("host_ratio"), std::string::npos) << st.message();
  }
  for (WritePolicy wp :
       {WritePolicy::kWriteThrough, WritePolicy::kWriteThroughSelective, WritePolicy::kWriteBack}) {
    for (int threads : {0, 1}) {
      SCOPED_TRACE(fmt::format("{} backup_threads {}", WritePolicyName(wp), threads));
      HierarchicalCacheConfig cfg;
      cfg.write_policy = wp;
      cfg.write_through_threshold = 1;
      cfg.backup_threads = threads;
      cfg.host_ratio = 0;
      std::vector<EvictionEvent> events;
      cfg.eviction_listener = [&](const EvictionEvent& e) { events.push_back(e); };
      TestCache s = Make(cfg, 4, 8, /*host_pages=*/0);
      ASSERT_NE(s.cache, nullptr);
      EXPECT_EQ(s.cache->host_region().geometry.num_slots, 0);
      const auto a = Seq(16, 100), b = Seq(24, 500);
      const auto ha = Hashes(a, ""), hb = Hashes(b, "");
      Prefill(s, a);
      Prefill(s, a);  // a second hit: write_through_selective would back up now
      auto m = s.cache->Match(a);
      ASSERT_TRUE(m.ok());
      EXPECT_EQ(m->device_tokens, 16);
      EXPECT_TRUE(s.device->Verify(m->device_slots, ha).ok());
      ASSERT_TRUE(s.cache->Release(m->handle).ok());
      ASSERT_TRUE(s.cache->WaitForBackups().ok());
      // b needs 6 of the 8 device pages: a's tail goes, forgotten.
      Prefill(s, b);
      m = s.cache->Match(b);
      ASSERT_TRUE(m.ok());
      EXPECT_EQ(m->device_tokens, 24);
      EXPECT_TRUE(s.device->Verify(m->device_slots, hb).ok());
      ASSERT_TRUE(s.cache->Release(m->handle).ok());
      m = s.cache->Match(a);
      ASSERT_TRUE(m.ok());
      EXPECT_EQ(m->device_tokens, 8);  // the head pages stayed on the device
      EXPECT_EQ(m->host_tokens, 0);
      EXPECT_TRUE(m->host_slots.empty());
      EXPECT_TRUE(s.device->Verify(m->device_slots, std::span(ha).first(8)).ok());
      auto lb = s.cache->LoadBack(m->handle);
      ASSERT_TRUE(lb.ok()) << lb.status().ToString();
      EXPECT_EQ(lb->loaded_tokens, 0);
      EXPECT_EQ(lb->device_slots, m->device_slots);
      ASSERT_TRUE(s.cache->Release(m->handle).ok());
      EXPECT_EQ(*s.cache->EvictHost(1000), 0);
      EXPECT_EQ(*s.cache->EvictDevice(1000), 32);
      m = s.cache->Match(b);
      EXPECT_EQ(m->device_tokens + m->host_tokens + m->storage_tokens, 0);
      ASSERT_TRUE(s.cache->Release(m->handle).ok());
      ASSERT_TRUE(s.cache->WaitForBackups().ok());
      ASSERT_TRUE(s.cache->CheckConsistency().ok()) << s.cache->CheckConsistency().ToString();
      ASSERT_FALSE(events.empty());
      for (const EvictionEvent& e : events) {
        EXPECT_EQ(e.tier, CacheTier::kDevice);
        EXPECT_FALSE(e.kept_in_host);
      }
      const CacheStats st = s.cache->stats();
      EXPECT_EQ(st.host_total_tokens, 0);
      EXPECT_EQ(st.host_total_bytes, 0);
      EXPECT_EQ(st.host_used_tokens, 0);
      EXPECT_EQ(st.host_hit_tokens, 0);
      EXPECT_EQ(st.backup_tokens + st.backup_skipped_tokens + st.write_back_tokens, 0);
      EXPECT_EQ(st.device_evicted_tokens, 40);
      EXPECT_EQ(st.dropped_tokens, 40);
      EXPECT_EQ(st.device_cached_tokens, 0);
      EXPECT_EQ(st.nodes, 0);
      const std::string text = s.cache->Metrics();
      EXPECT_NE(text.find("kvtier:hicache_host_total_tokens 0\n"), std::string::npos) << text;
    }
  }
}

TEST(HierarchicalCacheTest, LoadBackSkipsShortHostHits) {
  HierarchicalCacheConfig cfg;
  cfg.write_policy = WritePolicy::kWriteThrough;
  cfg.backup_threads = 0;
  cfg.load_back_min_tokens = 12;
  TestCache s = Make(cfg, 4, 8, 16);
  const auto a = Seq(8, 1);
  Prefill(s, a);
  ASSERT_TRUE(s.cache->EvictDevice(8).ok());
  auto m = s.cache->Match(a);
  ASSERT_EQ(m->host_tokens, 8);
  auto lb = s.cache->LoadBack(m->handle);
  ASSERT_TRUE(lb.ok());
  EXPECT_EQ(lb->loaded_tokens, 0);
  EXPECT_EQ(lb->skipped_tokens, 8);
  EXPECT_EQ(s.cache->stats().device_cached_tokens, 0);
  ASSERT_TRUE(s.cache->Release(m->handle).ok());
}

TEST(HierarchicalCacheTest, WritePolicies) {
  const auto a = Seq(8, 1);
  {
    SCOPED_TRACE("write_through backs up on insert");
    HierarchicalCacheConfig cfg;
    cfg.write_policy = WritePolicy::kWriteThrough;
    TestCache s = Make(cfg, 4, 8, 16);
    Prefill(s, a);
    ASSERT_TRUE(s.cache->WaitForBackups().ok());
    EXPECT_EQ(s.cache->stats().backup_tokens, 8);
    EXPECT_EQ(s.cache->stats().host_used_tokens, 8);
  }
  {
    SCOPED_TRACE("write_through_selective backs up at the threshold");
    HierarchicalCacheConfig cfg;
    cfg.write_policy = WritePolicy::kWriteThroughSelective;
    cfg.write_through_threshold = 3;
    cfg.backup_threads = 0;
    TestCache s = Make(cfg, 4, 8, 16);
    Prefill(s, a);  // the prefill's own Match missed; insert: hit 1
    EXPECT_EQ(s.cache->stats().backup_tokens, 0);
    auto m = s.cache->Match(a);  // 2
    ASSERT_TRUE(s.cache->Release(m->handle).ok());
    EXPECT_EQ(s.cache->stats().backup_tokens, 0);
    m = s.cache->Match(a);  // 3
    ASSERT_TRUE(s.cache->Release(m->handle).ok());
    EXPECT_EQ(s.cache->stats().backup_tokens, 8);
    // An unbacked child is backed up together with nothing more (its parent already is).
    auto b = a;
    b.insert(b.end(), {50, 51, 52, 53});
    Prefill(s, b);
    for (int i = 0; i < 2; ++i) {
      m = s.cache->Match(b);
      ASSERT_TRUE(s.cache->Release(m->handle).ok());
    }
    EXPECT_EQ(s.cache->stats().backup_tokens, 12);
  }
  {
    SCOPED_TRACE("write_back copies only on eviction, parent first");
    HierarchicalCacheConfig cfg;
    cfg.write_policy = WritePolicy::kWriteBack;
    TestCache s = Make(cfg, 4, 8, 16);
    Prefill(s, a);
    auto b = a;
    b.insert(b.end(), {50, 51, 52, 53});
    Prefill(s, b);
    for (int i = 0; i < 5; ++i) {
      auto m = s.cache->Match(b);
      ASSERT_TRUE(s.cache->Release(m->handle).ok());
    }
    EXPECT_EQ(s.cache->stats().host_used_tokens, 0);
    auto ev = s.cache->EvictDevice(4);  // evicts the leaf {50..53}: its whole path is copied
    ASSERT_TRUE(ev.ok());
    EXPECT_EQ(*ev, 4);
    EXPECT_EQ(s.cache->stats().write_back_tokens, 12);
    EXPECT_EQ(s.cache->stats().dropped_tokens, 0);
    auto m = s.cache->Match(b);
    EXPECT_EQ(m->device_tokens, 8);
    EXPECT_EQ(m->host_tokens, 4);
    ASSERT_TRUE(VerifyKvPattern(s.cache->host_region(), m->host_slots,
                                std::span<const uint64_t>(Hashes(b, "")).subspan(8))
                    .ok());
    ASSERT_TRUE(s.cache->Release(m->handle).ok());
    ASSERT_TRUE(s.cache->CheckConsistency().ok());
  }
}

TEST(HierarchicalCacheTest, InsertTakesOwnershipAndFreesDuplicates) {
  HierarchicalCacheConfig cfg;
  cfg.write_policy = WritePolicy::kWriteBack;
  TestCache s = Make(cfg, 4, 8, 16);
  const auto a = Seq(8, 1);
  Prefill(s, a);
  // A second request computed the same prefix concurrently, in its own slots.
  auto slots = s.cache->AllocateDeviceSlots(12);
  ASSERT_TRUE(slots.ok());
  auto b = a;
  b.insert(b.end(), {9, 9, 9, 9});
  ASSERT_TRUE(s.device->Fill(*slots, Hashes(b, "")).ok());
  auto r = s.cache->Insert(b, *slots);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->cached_tokens, 8);
  EXPECT_EQ(r->new_tokens, 4);
  EXPECT_EQ(r->duplicate_tokens, 8);
  const CacheStats st = s.cache->stats();
  EXPECT_EQ(st.device_used_tokens, 12);
  EXPECT_EQ(st.device_engine_tokens, 0);
  ASSERT_TRUE(s.cache->CheckConsistency().ok());
}

TEST(HierarchicalCacheTest, PinnedInsertSurvivesPressureUntilReleased) {
  HierarchicalCacheConfig cfg;
  cfg.write_policy = WritePolicy::kWriteBack;
  TestCache s = Make(cfg, 4, 4, 0 + 8);
  const auto a = Seq(8, 1);
  auto slots = s.cache->AllocateDeviceSlots(8);
  ASSERT_TRUE(slots.ok());
  ASSERT_TRUE(s.device->Fill(*slots, Hashes(a, "")).ok());
  auto ins = s.cache->Insert(a, *slots, "", {.pin = true});
  ASSERT_TRUE(ins.ok());
  ASSERT_NE(ins->handle.id, 0u);
  EXPECT_EQ(*s.cache->EvictDevice(1000), 0);  // pinned: nothing may go
  EXPECT_TRUE(s.cache->AllocateDeviceSlots(12).status().IsOutOfMemory());
  ASSERT_TRUE(s.device->Verify(*slots, Hashes(a, "")).ok());
  ASSERT_TRUE(s.cache->CheckConsistency().ok());
  ASSERT_TRUE(s.cache->Release(ins->handle).ok());
  EXPECT_TRUE(s.cache->Release(ins->handle).IsInvalidArgument());
  EXPECT_EQ(*s.cache->EvictDevice(1000), 8);
  ASSERT_TRUE(s.cache->CheckConsistency().ok());
}

TEST(HierarchicalCacheTest, NamespacesAreIsolated) {
  HierarchicalCacheConfig cfg;
  TestCache s = Make(cfg, 2, 16, 16);
  const auto a = Seq(6, 3);
  Prefill(s, a, "tenant-a");
  auto m = s.cache->Match(a, "tenant-b");
  EXPECT_EQ(m->device_tokens + m->host_tokens, 0);
  ASSERT_TRUE(s.cache->Release(m->handle).ok());
  Prefill(s, a, "tenant-b");
  auto ma = s.cache->Match(a, "tenant-a");
  auto mb = s.cache->Match(a, "tenant-b");
  EXPECT_NE(ma->device_slots, mb->device_slots);
  ASSERT_TRUE(s.device->Verify(ma->device_slots, Hashes(a, "tenant-a")).ok());
  ASSERT_TRUE(s.device->Verify(mb->device_slots, Hashes(a, "tenant-b")).ok());
  EXPECT_FALSE(s.device->Verify(mb->device_slots, Hashes(a, "tenant-a")).ok());
  ASSERT_TRUE(s.cache->Release(ma->handle).ok());
  ASSERT_TRUE(s.cache->Release(mb->handle).ok());
}

TEST(HierarchicalCacheTest, EvictionFollowsThePolicy) {
  for (auto kind : {EvictionPolicyKind::kLru, EvictionPolicyKind::kFifo, EvictionPolicyKind::kLfu,
                    EvictionPolicyKind::kPriority}) {
    SCOPED_TRACE(EvictionPolicyName(kind));
    HierarchicalCacheConfig cfg;
    cfg.device_eviction = kind;
    cfg.write_policy = WritePolicy::kWriteBack;
    std::vector<std::vector<Token>> evicted;
    cfg.eviction_listener = [&](const EvictionEvent& e) {
      if (e.tier == CacheTier::kDevice) evicted.emplace_back(e.prefix.begin(), e.prefix.end());
    };
    TestCache s = Make(cfg, 2, 16, 16);
    const auto a = Seq(2, 10), b = Seq(2, 20), c = Seq(2, 30);
    auto ia = Prefill(s, a);
    Prefill(s, b);
    auto slots = s.cache->AllocateDeviceSlots(2);
    ASSERT_TRUE(s.device->Fill(*slots, Hashes(c, "")).ok());
    ASSERT_TRUE(s.cache->Insert(c, *slots, "", {.priority = 5}).ok());
    (void)ia;
    for (int i = 0; i < 3; ++i) {  // a: most recent, most hit
      auto m = s.cache->Match(a);
      ASSERT_TRUE(s.cache->Release(m->handle).ok());
    }
    ASSERT_TRUE(s.cache->EvictDevice(2).ok());
    ASSERT_EQ(evicted.size(), 1u);
    const std::vector<Token> want = kind == EvictionPolicyKind::kFifo ? a : b;
    EXPECT_EQ(evicted[0], want);
  }
}

// ---- the copy races ----------------------------------------------------------------------

// A device slot must not be freed (and handed to the engine) while a backup still reads it.
TEST(HierarchicalCacheRaceTest, DeviceSlotNotFreedWhileBackupReadsIt) {
  HierarchicalCacheConfig cfg;
  cfg.write_policy = WritePolicy::kWriteThrough;
  cfg.backup_threads = 1;
  TestCache s = Make(cfg, 4, 4, 16, /*gated=*/true);
  s.gate->Close();
  const auto a = Seq(16, 7);  // fills the whole device pool
  Prefill(s, a);
  s.gate->AwaitWaiting(1);  // the backup of `a` is in flight, held at the gate
  std::atomic<bool> returned{false};
  Result<std::vector<int64_t>> got = Status::Internal("not run");
  std::thread engine_thread([&] {
    got = s.cache->AllocateDeviceSlots(16);  // needs a's slots
    returned = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(150));
  EXPECT_FALSE(returned.load()) << "device slots were handed out while a backup read them";
  s.gate->Open();
  engine_thread.join();
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  // The engine overwrites its new slots; the host copy must still be a's KV.
  ASSERT_TRUE(s.device->Fill(*got, Hashes(Seq(16, 900), "")).ok());
  auto m = s.cache->Match(a);
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->host_tokens, 16);
  ASSERT_TRUE(VerifyKvPattern(s.cache->host_region(), m->host_slots, Hashes(a, "")).ok());
  ASSERT_TRUE(s.cache->Release(m->handle).ok());
  ASSERT_TRUE(s.cache->FreeDeviceSlots(*got).ok());
  ASSERT_TRUE(s.cache->CheckConsistency().ok());
  EXPECT_EQ(s.gate->under_lock.load(), 0) << "engine calls under the cache's mutex";
}

// A host page must not be reused while a backup writes into it.
TEST(HierarchicalCacheRaceTest, HostPageNotReusedWhileBackupWritesIt) {
  HierarchicalCacheConfig cfg;
  cfg.write_policy = WritePolicy::kWriteThrough;
  cfg.backup_threads = 1;
  TestCache s = Make(cfg, 4, 16, 4, /*gated=*/true);  // host: 4 pages
  s.gate->Close();
  const auto a = Seq(8, 1);
  Prefill(s, a);
  s.gate->AwaitWaiting(1);
  // Host pressure while a's copy is in flight: nothing may take a's two host pages.
  EXPECT_EQ(*s.cache->EvictHost(1000), 0);
  const auto b = Seq(12, 500);
  Prefill(s, b);  // its backup needs 3 host pages; only 2 are free
  CacheStats st = s.cache->stats();
  EXPECT_EQ(st.backup_skipped_tokens, 12);
  EXPECT_EQ(st.host_used_tokens, 8);
  ASSERT_TRUE(s.cache->CheckConsistency().ok());
  s.gate->Open();
  ASSERT_TRUE(s.cache->WaitForBackups().ok());
  ASSERT_TRUE(s.cache->EvictDevice(1000).ok());
  auto m = s.cache->Match(a);
  EXPECT_EQ(m->host_tokens, 8);
  ASSERT_TRUE(VerifyKvPattern(s.cache->host_region(), m->host_slots, Hashes(a, "")).ok());
  ASSERT_TRUE(s.cache->Release(m->handle).ok());
  auto mb = s.cache->Match(b);
  EXPECT_EQ(mb->device_tokens + mb->host_tokens, 0);  // b was never backed up: dropped
  ASSERT_TRUE(s.cache->Release(mb->handle).ok());
  EXPECT_EQ(s.gate->under_lock.load(), 0) << "engine calls under the cache's mutex";
}

// A host node that a Match returned must survive host pressure until its LoadBack has run.
TEST(HierarchicalCacheRaceTest, MatchedHostNodeNotEvictedBeforeLoadBack) {
  HierarchicalCacheConfig cfg;
  cfg.write_policy = WritePolicy::kWriteThrough;
  cfg.backup_threads = 0;
  TestCache s = Make(cfg, 4, 8, 4);
  const auto a = Seq(8, 1);
  Prefill(s, a);
  ASSERT_TRUE(s.cache->EvictDevice(1000).ok());
  // Control: unpinned, host pressure does evict it.
  {
    auto m = s.cache->Match(a);
    ASSERT_EQ(m->host_tokens, 8);
    ASSERT_TRUE(s.cache->Release(m->handle).ok());
  }
  auto m = s.cache->Match(a);
  ASSERT_EQ(m->host_tokens, 8);
  EXPECT_EQ(*s.cache->EvictHost(1000), 0);
  for (int i = 0; i < 3; ++i) Prefill(s, Seq(8, 100 * (i + 2)));  // backups want host pages
  EXPECT_EQ(*s.cache->EvictHost(1000), 0);
  auto lb = s.cache->LoadBack(m->handle);
  ASSERT_TRUE(lb.ok()) << lb.status().ToString();
  EXPECT_EQ(lb->loaded_tokens, 8);
  ASSERT_TRUE(s.device->Verify(lb->device_slots, Hashes(a, "")).ok());
  ASSERT_TRUE(s.cache->Release(m->handle).ok());
  ASSERT_TRUE(s.cache->EvictDevice(1000).ok());
  EXPECT_GT(*s.cache->EvictHost(1000), 0);  // unpinned now
  ASSERT_TRUE(s.cache->CheckConsistency().ok());
}

// write_back: an unbacked node is copied before its device slots are freed; the eviction waits
// for that copy.
TEST(HierarchicalCacheRaceTest, WriteBackCopiesBeforeFreeing) {
  HierarchicalCacheConfig cfg;
  cfg.write_policy = WritePolicy::kWriteBack;
  TestCache s = Make(cfg, 4, 2, 8, /*gated=*/true);
  const auto a = Seq(8, 1);
  Prefill(s, a);
  s.gate->Close();
  std::atomic<bool> returned{false};
  Result<std::vector<int64_t>> got = Status::Internal("not run");
  std::thread engine_thread([&] {
    got = s.cache->AllocateDeviceSlots(8);
    returned = true;
  });
  s.gate->AwaitWaiting(1);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_FALSE(returned.load());
  s.gate->Open();
  engine_thread.join();
  ASSERT_TRUE(got.ok());
  ASSERT_TRUE(s.device->Fill(*got, Hashes(Seq(8, 77), "")).ok());
  auto m = s.cache->Match(a);
  EXPECT_EQ(m->host_tokens, 8);
  ASSERT_TRUE(VerifyKvPattern(s.cache->host_region(), m->host_slots, Hashes(a, "")).ok());
  ASSERT_TRUE(s.cache->Release(m->handle).ok());
  ASSERT_TRUE(s.cache->FreeDeviceSlots(*got).ok());
  EXPECT_EQ(s.gate->under_lock.load(), 0) << "engine calls under the cache's mutex";
}

// A LoadBack whose copy fails after part of it was submitted fails with the engine's error and
// changes nothing else: the match is as before, its pages come back to the pool (cpu: the copy
// is over when Transfer returns; the GPU test holds the queued part behind a gate), nothing is
// published, and a second LoadBack succeeds byte-exact.
TEST(HierarchicalCacheRaceTest, LoadBackFailingMidwayChangesNothingElse) {
  constexpr int64_t P = 4;
  KvGeometry g{KvLayout::kLayerFirst, kLayers, 8 * P, kSlotBytes, P, 1};
  auto dev = DeviceTier::Create(TransferBackend::kCpu, g, false);
  ASSERT_TRUE(dev.ok());
  HierarchicalCacheConfig cfg;
  cfg.write_policy = WritePolicy::kWriteThrough;
  cfg.backup_threads = 0;
  cfg.host_capacity_bytes = 16 * P * kLayers * kSlotBytes * 2;
  cfg.transfer.cpu_threads = 1;
  auto inner = MakeTransferEngine(TransferBackend::kCpu, cfg.transfer);
  ASSERT_TRUE(inner.ok());
  auto engine =
      std::make_unique<testing::MidwayFailingEngine>(std::move(*inner), (*dev)->region().k, 2);
  testing::MidwayFailingEngine* failing = engine.get();
  auto c = HierarchicalCache::Create(cfg, (*dev)->region(), std::move(engine));
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  TestCache s;
  s.device = std::move(*dev);
  s.cache = std::move(*c);
  failing->cache = s.cache.get();
  const auto a = Seq(16, 1), b = Seq(16, 500);
  Prefill(s, a);
  ASSERT_TRUE(s.cache->EvictDevice(1000).ok());
  Prefill(s, b);
  const CacheStats before = s.cache->stats();
  auto m = s.cache->Match(a);
  ASSERT_EQ(m->host_tokens, 16);
  failing->armed = true;
  auto lb = s.cache->LoadBack(m->handle);
  ASSERT_FALSE(lb.ok());
  EXPECT_EQ(lb.status().code(), StatusCode::kIOError) << lb.status().ToString();
  EXPECT_EQ(failing->enqueued_layers.load(), 1);
  ASSERT_TRUE(s.cache->CheckConsistency().ok()) << s.cache->CheckConsistency().ToString();
  const CacheStats after = s.cache->stats();
  EXPECT_EQ(after.device_used_tokens, before.device_used_tokens);
  EXPECT_EQ(after.device_cached_tokens, before.device_cached_tokens);
  EXPECT_EQ(after.load_back_tokens, before.load_back_tokens);
  auto again = s.cache->Match(a);
  EXPECT_EQ(again->device_tokens, 0);
  EXPECT_EQ(again->host_tokens, 16);
  ASSERT_TRUE(s.cache->Release(again->handle).ok());
  auto lb2 = s.cache->LoadBack(m->handle);
  ASSERT_TRUE(lb2.ok()) << lb2.status().ToString();
  EXPECT_EQ(lb2->loaded_tokens, 16);
  EXPECT_TRUE(s.device->Verify(lb2->device_slots, Hashes(a, "")).ok());
  ASSERT_TRUE(s.cache->Release(m->handle).ok());
  auto mb = s.cache->Match(b);
  EXPECT_EQ(mb->device_tokens, 16);
  EXPECT_TRUE(s.device->Verify(mb->device_slots, Hashes(b, "")).ok());
  ASSERT_TRUE(s.cache->Release(mb->handle).ok());
  ASSERT_TRUE(s.cache->CheckConsistency().ok());
  EXPECT_EQ(failing->under_lock.load(), 0) << "engine calls under the cache's mutex";
}

// A backup that cannot find host memory (pins leave too little) evicts no host node: it is
// skipped, and the unpinned host prefix stays a host hit.
TEST(HierarchicalCacheTest, SkippedBackupEvictsNoHostNode) {
  HierarchicalCacheConfig cfg;
  cfg.write_policy = WritePolicy::kWriteThrough;
  cfg.backup_threads = 0;
  TestCache s = Make(cfg, 4, 8, 4);  // host: 4 pages
  const auto a = Seq(8, 1), b = Seq(8, 100), c = Seq(12, 200);
  Prefill(s, a);
  Prefill(s, b);  // a and b: 2 host pages each
  ASSERT_TRUE(s.cache->EvictDevice(1000).ok());
  auto pin = s.cache->Match(a);  // a's host pages are pinned; b's are evictable
  ASSERT_EQ(pin->host_tokens, 8);
  const CacheStats before = s.cache->stats();
  Prefill(s, c);  // its backup needs 3 host pages: 2 could be freed, not 3
  const CacheStats after = s.cache->stats();
  EXPECT_EQ(after.backup_skipped_tokens - before.backup_skipped_tokens, 12);
  EXPECT_EQ(after.host_evicted_tokens, before.host_evicted_tokens) << "host nodes evicted for "
                                                                      "a backup that was skipped";
  auto mb = s.cache->Match(b);
  EXPECT_EQ(mb->host_tokens, 8);
  EXPECT_TRUE(VerifyKvPattern(s.cache->host_region(), mb->host_slots, Hashes(b, "")).ok());
  ASSERT_TRUE(s.cache->Release(mb->handle).ok());
  ASSERT_TRUE(s.cache->Release(pin->handle).ok());
  ASSERT_TRUE(s.cache->CheckConsistency().ok());
}

#if defined(KVTIER_WITH_CUDA)
// GPU: the device slots a LoadBack writes must not be evicted (and reused) before its copy has
// finished, even once the handle is released. The copy is held back by a host function that
// blocks its stream until the test opens it.
TEST(HierarchicalCacheRaceTest, LoadBackDestinationNotEvictedWhileInFlight) {
  if (CudaDeviceCount() == 0) GTEST_SKIP() << "needs a GPU";
  TransferBackend backend = testing::BackendFromEnv();
  if (backend == TransferBackend::kCpu) backend = TransferBackend::kKernel;
  constexpr int64_t P = 4;
  KvGeometry g{KvLayout::kLayerFirst, kLayers, 4 * P, kSlotBytes, P, 1};
  auto dev = DeviceTier::Create(backend, g, false);
  ASSERT_TRUE(dev.ok()) << dev.status().ToString();
  HierarchicalCacheConfig cfg;
  cfg.write_policy = WritePolicy::kWriteThrough;
  cfg.transfer_backend = backend;
  cfg.host_capacity_bytes = 16 * P * kLayers * kSlotBytes * 2;
  auto cache_r = HierarchicalCache::Create(cfg, (*dev)->region());
  ASSERT_TRUE(cache_r.ok()) << cache_r.status().ToString();
  HierarchicalCache& cache = **cache_r;
  TestCache s;
  s.device = std::move(*dev);
  s.cache = std::move(*cache_r);
  const auto a = Seq(16, 3);  // the whole device pool
  Prefill(s, a);
  ASSERT_TRUE(cache.WaitForBackups().ok());
  ASSERT_EQ(*cache.EvictDevice(1000), 16);

  auto stream = CudaStreamHandle::Create(0);
  ASSERT_TRUE(stream.ok());
  struct Gate {
    std::mutex mu;
    std::condition_variable cv;
    bool open = false;
  } gate;
  ASSERT_EQ(cudaLaunchHostFunc(
                stream->get(),
                [](void* p) {
                  auto* g = static_cast<Gate*>(p);
                  std::unique_lock<std::mutex> lk(g->mu);
                  g->cv.wait(lk, [&] { return g->open; });
                },
                &gate),
            cudaSuccess);
  auto m = cache.Match(a);
  ASSERT_EQ(m->host_tokens, 16);
  auto lb = cache.LoadBack(m->handle, stream->get());  // enqueued behind the closed gate
  ASSERT_TRUE(lb.ok()) << lb.status().ToString();
  ASSERT_EQ(lb->loaded_tokens, 16);
  ASSERT_TRUE(cache.Release(m->handle).ok());
  std::atomic<bool> returned{false};
  Result<std::vector<int64_t>> got = Status::Internal("not run");
  std::thread engine_thread([&] {
    got = cache.AllocateDeviceSlots(16);  // needs the slots the load is about to fill
    returned = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(150));
  EXPECT_FALSE(returned.load()) << "slots of an unfinished load-back were handed out";
  {
    std::lock_guard<std::mutex> lk(gate.mu);
    gate.open = true;
  }
  gate.cv.notify_all();
  engine_thread.join();
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  ASSERT_TRUE(stream->Synchronize().ok());
  ASSERT_TRUE(cache.FreeDeviceSlots(*got).ok());
  auto m2 = cache.Match(a);  // evicted again, still in host memory, intact
  EXPECT_EQ(m2->host_tokens, 16);
  ASSERT_TRUE(VerifyKvPattern(cache.host_region(), m2->host_slots, Hashes(a, "")).ok());
  auto lb2 = cache.LoadBack(m2->handle, stream->get());
  ASSERT_TRUE(lb2.ok());
  for (int64_t l = 0; l < kLayers; ++l) ASSERT_TRUE(cache.WaitLayer(m2->handle, l, nullptr).ok());
  ASSERT_TRUE(stream->Synchronize().ok());
  ASSERT_TRUE(s.device->Verify(lb2->device_slots, Hashes(a, "")).ok());
  ASSERT_TRUE(cache.Release(m2->handle).ok());
  ASSERT_TRUE(cache.CheckConsistency().ok());
}
#endif  // KVTIER_WITH_CUDA

// ---- bad input ---------------------------------------------------------------------------

TEST(HierarchicalCacheBadInputTest, ClearStatusAndConsistentAfterwards) {
  HierarchicalCacheConfig cfg;
  cfg.backup_threads = 0;
  TestCache s = Make(cfg, 4, 8, 8);
  const auto a = Seq(8, 1);
  Prefill(s, a);
  auto check = [&](const Status& st, StatusCode code, const char* needle) {
    EXPECT_EQ(st.code(), code) << st.ToString();
    EXPECT_NE(st.message().find(needle), std::string::npos) << st.message();
    EXPECT_TRUE(s.cache->CheckConsistency().ok()) << s.cache->CheckConsistency().ToString();
  };
  const CacheStats before = s.cache->stats();
  auto slots = s.cache->AllocateDeviceSlots(8);
  ASSERT_TRUE(slots.ok());
  ASSERT_EQ(slots->size(), 8u);
  const auto b = Seq(8, 50);
  // Misaligned lengths.
  check(
      s.cache->Insert(std::span<const Token>(b).first(6), std::span<const int64_t>(*slots).first(6))
          .status(),
      StatusCode::kInvalidArgument, "multiple of page_size");
  check(s.cache->Insert(b, std::span<const int64_t>(*slots).first(4)).status(),
        StatusCode::kInvalidArgument, "device_slots has 4");
  check(s.cache->FreeDeviceSlots(std::span<const int64_t>(*slots).first(3)),
        StatusCode::kInvalidArgument, "multiple of page_size");
  // Pages broken up, out of range, repeated, not the engine's.
  std::vector<int64_t> broken = *slots;
  std::swap(broken[0], broken[1]);
  check(s.cache->Insert(b, broken).status(), StatusCode::kInvalidArgument, "page");
  std::vector<int64_t> outside = *slots;
  for (auto& x : outside) x += 1000;
  check(s.cache->Insert(b, outside).status(), StatusCode::kInvalidArgument, "outside");
  std::vector<int64_t> twice(slots->begin(), slots->begin() + 4);
  twice.insert(twice.end(), slots->begin(), slots->begin() + 4);
  check(s.cache->Insert(b, twice).status(), StatusCode::kInvalidArgument, "twice");
  auto m = s.cache->Match(a);
  std::vector<int64_t> theirs = m->device_slots;  // the tree's pages, at other positions
  check(s.cache->Insert(b, theirs).status(), StatusCode::kInvalidArgument,
        "cached by another prefix");
  check(s.cache->FreeDeviceSlots(theirs), StatusCode::kInvalidArgument, "cached by another");
  // The engine still holds its slots after all of that; use them properly.
  ASSERT_TRUE(s.device->Fill(*slots, Hashes(b, "")).ok());
  ASSERT_TRUE(s.cache->Insert(b, *slots).ok());
  check(s.cache->FreeDeviceSlots(*slots), StatusCode::kInvalidArgument, "cached by another");
  // Handles.
  ASSERT_TRUE(s.cache->Release(m->handle).ok());
  check(s.cache->Release(m->handle), StatusCode::kInvalidArgument, "not live");
  check(s.cache->Release(MatchHandle{424242}), StatusCode::kInvalidArgument, "not live");
  check(s.cache->LoadBack(m->handle).status(), StatusCode::kInvalidArgument, "not live");
  check(s.cache->WaitLayer(m->handle, 0, nullptr), StatusCode::kInvalidArgument, "not live");
  // Oversize and negative requests.
  check(s.cache->AllocateDeviceSlots(33).status(), StatusCode::kInvalidArgument, "exceeds");
  check(s.cache->AllocateDeviceSlots(-1).status(), StatusCode::kInvalidArgument, "negative");
  check(s.cache->EvictDevice(-1).status(), StatusCode::kInvalidArgument, "negative");
  // Everything pinned: allocation fails cleanly, nothing changes.
  auto pa = s.cache->Match(a);
  auto pb = s.cache->Match(b);
  auto rest = s.cache->AllocateDeviceSlots(16);
  ASSERT_TRUE(rest.ok());
  check(s.cache->AllocateDeviceSlots(4).status(), StatusCode::kOutOfMemory, "cannot make room");
  ASSERT_TRUE(s.cache->FreeDeviceSlots(*rest).ok());
  check(s.cache->FreeDeviceSlots(*rest), StatusCode::kInvalidArgument, "not allocated");
  ASSERT_TRUE(s.cache->Release(pa->handle).ok());
  ASSERT_TRUE(s.cache->Release(pb->handle).ok());
  const CacheStats after = s.cache->stats();
  EXPECT_EQ(after.device_engine_tokens, 0);
  EXPECT_EQ(after.device_cached_tokens, before.device_cached_tokens + 8);
  EXPECT_EQ(after.live_handles, 0);
  ASSERT_TRUE(s.device->Verify(s.cache->Match(b)->device_slots, Hashes(b, "")).ok());
}

}  // namespace
}  // namespace kvtier
