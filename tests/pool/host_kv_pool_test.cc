// Tests for HostKvPool: geometry of every layout (MHA and MLA), buffers usable end to end,
// capacity from bytes and from a device ratio with rounding to whole pages, every bad config
// field, huge-page fallback, allocator exhaustion, an impossible capacity as OutOfMemory, and
// cpu-backend transfers into and out of the pool region compared byte for byte.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "kvtier/host_pool.h"
#include "kvtier/transfer.h"
#include "support/kv_test_util.h"
#include "util/log.h"

#if defined(KVTIER_WITH_CUDA)
#include <cuda_runtime.h>
#endif

namespace kvtier {
namespace {

constexpr KvLayout kAllLayouts[] = {KvLayout::kLayerFirst, KvLayout::kPageFirst,
                                    KvLayout::kPageFirstDirect, KvLayout::kPageHead};

// 3 layers x 64-byte slots, pages of 4, 4 heads (16-byte head chunks for page_head).
HostKvPoolConfig SmallConfig(KvLayout layout, bool mla) {
  HostKvPoolConfig c;
  c.geometry.layout = layout;
  c.mla = mla;
  c.geometry.num_layers = 3;
  c.geometry.slot_bytes = 64;
  c.geometry.page_size = 4;
  c.geometry.head_num = 4;
  c.capacity_bytes = 0;
  return c;
}

int64_t PageBytes(const HostKvPoolConfig& c) {
  return (c.mla ? 1 : 2) * c.geometry.num_layers * c.geometry.slot_bytes * c.geometry.page_size;
}

std::unique_ptr<HostKvPool> MustCreate(const HostKvPoolConfig& config) {
  auto created = HostKvPool::Create(config);
  EXPECT_TRUE(created.ok()) << created.status().ToString();
  if (!created.ok()) return nullptr;
  return std::move(created).value();
}

void ExpectInvalid(const HostKvPoolConfig& config, const std::string& needle) {
  SCOPED_TRACE(needle);
  EXPECT_TRUE(config.Validate().IsInvalidArgument()) << config.Validate().ToString();
  auto created = HostKvPool::Create(config);
  ASSERT_FALSE(created.ok());
  EXPECT_TRUE(created.status().IsInvalidArgument()) << created.status().ToString();
  EXPECT_NE(created.status().message().find(needle), std::string::npos)
      << created.status().message();
}

// Writes random bytes over every byte of every buffer and reads them back; K and V must not
// overlap (V is written after K, then both are checked).
void ExpectBuffersUsable(const HostKvPool& pool, std::mt19937_64& rng) {
  const KvRegion& r = pool.region();
  const size_t bytes = static_cast<size_t>(r.geometry.buffer_bytes());
  std::vector<std::vector<std::byte>> want(r.num_buffers(), std::vector<std::byte>(bytes));
  for (int b = 0; b < r.num_buffers(); ++b) {
    for (auto& x : want[b]) x = static_cast<std::byte>(rng());
    std::memcpy(r.LayerBase(b, 0), want[b].data(), bytes);
  }
  for (int b = 0; b < r.num_buffers(); ++b) {
    ASSERT_EQ(std::memcmp(r.LayerBase(b, 0), want[b].data(), bytes), 0) << "buffer " << b;
  }
}

TEST(HostKvPoolTest, GeometryAndBuffersForEveryLayoutMhaAndMla) {
  std::mt19937_64 rng(testing::TestSeed());
  for (KvLayout layout : kAllLayouts) {
    for (bool mla : {false, true}) {
      SCOPED_TRACE(::testing::Message() << LayoutName(layout) << (mla ? " mla" : " mha"));
      HostKvPoolConfig c = SmallConfig(layout, mla);
      c.capacity_bytes = 10 * PageBytes(c);
      auto pool = MustCreate(c);
      ASSERT_NE(pool, nullptr);
      const KvRegion& r = pool->region();
      EXPECT_TRUE(r.Validate().ok()) << r.Validate().ToString();
      EXPECT_EQ(r.memory, MemoryKind::kHost);
      EXPECT_EQ(r.mla, mla);
      EXPECT_EQ(r.geometry.layout, layout);
      EXPECT_EQ(r.geometry.num_layers, 3);
      EXPECT_EQ(r.geometry.slot_bytes, 64);
      EXPECT_EQ(r.geometry.page_size, 4);
      EXPECT_EQ(r.geometry.head_num, 4);
      EXPECT_EQ(r.geometry.num_slots, 40);
      EXPECT_EQ(pool->num_slots(), 40);
      EXPECT_EQ(pool->num_pages(), 10);
      EXPECT_NE(r.k, nullptr);
      EXPECT_EQ(r.v == nullptr, mla);
      EXPECT_FALSE(r.has_layer_table());
      EXPECT_EQ(pool->capacity_bytes(), c.capacity_bytes);
      EXPECT_EQ(pool->capacity_bytes(), r.num_buffers() * r.geometry.buffer_bytes());
      EXPECT_EQ(pool->allocator().num_slots(), 40);
      EXPECT_EQ(pool->allocator().page_size(), 4);
      EXPECT_EQ(pool->allocator().free_pages(), 10);
      EXPECT_FALSE(pool->huge_pages());
      ExpectBuffersUsable(*pool, rng);
    }
  }
}

TEST(HostKvPoolTest, CapacityFromBytesRoundsDownToWholePages) {
  HostKvPoolConfig c = SmallConfig(KvLayout::kPageFirstDirect, /*mla=*/false);
  const int64_t page = PageBytes(c);  // 2 * 3 * 64 * 4 = 1536
  ASSERT_EQ(page, 1536);
  c.capacity_bytes = 7 * page + page - 4;
  auto pool = MustCreate(c);
  ASSERT_NE(pool, nullptr);
  EXPECT_EQ(pool->num_pages(), 7);
  EXPECT_EQ(pool->num_slots(), 28);
  EXPECT_EQ(pool->capacity_bytes(), 7 * page);

  c.capacity_bytes = page;  // exactly one page
  pool = MustCreate(c);
  ASSERT_NE(pool, nullptr);
  EXPECT_EQ(pool->num_pages(), 1);
  EXPECT_EQ(pool->capacity_bytes(), page);
}

TEST(HostKvPoolTest, GeometryNumSlotsIsDerivedFromTheCapacity) {
  HostKvPoolConfig c = SmallConfig(KvLayout::kPageFirst, /*mla=*/false);
  c.geometry.num_slots = 4096;  // e.g. copied from a device pool's geometry; not read
  c.capacity_bytes = 3 * PageBytes(c);
  auto pool = MustCreate(c);
  ASSERT_NE(pool, nullptr);
  EXPECT_EQ(pool->num_slots(), 12);
  EXPECT_EQ(pool->geometry().num_slots, 12);
  EXPECT_EQ(pool->geometry().slot_bytes, 64);
}

TEST(HostKvPoolTest, CapacityFromDeviceRatio) {
  HostKvPoolConfig c = SmallConfig(KvLayout::kLayerFirst, /*mla=*/true);
  const int64_t page = PageBytes(c);  // 3 * 64 * 4 = 768
  c.device_pool_bytes = int64_t{1} << 20;
  c.device_ratio = 0.25;  // 262144 bytes = 341.33 pages -> 341
  auto pool = MustCreate(c);
  ASSERT_NE(pool, nullptr);
  EXPECT_EQ(pool->num_pages(), (int64_t{1} << 18) / page);
  EXPECT_EQ(pool->num_pages(), 341);
  EXPECT_EQ(pool->capacity_bytes(), 341 * page);

  c.device_ratio = 2.5;  // larger than the device pool is fine (the host tier is usually larger)
  pool = MustCreate(c);
  ASSERT_NE(pool, nullptr);
  EXPECT_EQ(pool->num_pages(), (int64_t{5} << 19) / page);
}

TEST(HostKvPoolTest, CapacityBelowOnePageIsInvalid) {
  HostKvPoolConfig c = SmallConfig(KvLayout::kPageFirst, /*mla=*/false);
  c.capacity_bytes = PageBytes(c) - 1;
  ExpectInvalid(c, "less than one page of 1536 bytes");

  c.capacity_bytes = 0;
  c.device_pool_bytes = 1000;
  c.device_ratio = 0.5;
  auto created = HostKvPool::Create(c);
  ASSERT_FALSE(created.ok());
  EXPECT_TRUE(created.status().IsInvalidArgument());
  EXPECT_NE(created.status().message().find("device_ratio = 0.5"), std::string::npos)
      << created.status().message();
}

TEST(HostKvPoolTest, BadConfigFieldsAreNamed) {
  const HostKvPoolConfig good = [] {
    HostKvPoolConfig c = SmallConfig(KvLayout::kPageHead, /*mla=*/false);
    c.capacity_bytes = 1 << 20;
    return c;
  }();
  ASSERT_TRUE(good.Validate().ok()) << good.Validate().ToString();

  struct Case {
    void (*mutate)(HostKvPoolConfig&);
    const char* needle;
  };
  const Case cases[] = {
      {[](HostKvPoolConfig& c) { c.geometry.layout = static_cast<KvLayout>(7); }, "layout = 7"},
      {[](HostKvPoolConfig& c) { c.geometry.num_layers = 0; }, "num_layers = 0"},
      {[](HostKvPoolConfig& c) { c.geometry.num_layers = -2; }, "num_layers = -2"},
      {[](HostKvPoolConfig& c) { c.geometry.slot_bytes = 0; }, "slot_bytes = 0"},
      {[](HostKvPoolConfig& c) { c.geometry.slot_bytes = 66; }, "slot_bytes = 66"},
      {[](HostKvPoolConfig& c) { c.geometry.page_size = 0; }, "page_size = 0"},
      {[](HostKvPoolConfig& c) { c.geometry.head_num = 0; }, "head_num = 0"},
      {[](HostKvPoolConfig& c) { c.geometry.head_num = 3; }, "head_num = 3"},
      {[](HostKvPoolConfig& c) { c.geometry.head_num = 32; }, "head_num = 32"},  // 2-byte heads
      {[](HostKvPoolConfig& c) { c.capacity_bytes = -1; }, "capacity_bytes = -1"},
      {[](HostKvPoolConfig& c) { c.capacity_bytes = 0; }, "exactly one of capacity_bytes"},
      {[](HostKvPoolConfig& c) {
         c.device_ratio = 0.5;
         c.device_pool_bytes = 1 << 20;
       },
       "exactly one of capacity_bytes"},
      {[](HostKvPoolConfig& c) { c.device_ratio = -0.5; }, "device_ratio = -0.5"},
      {[](HostKvPoolConfig& c) { c.device_ratio = std::numeric_limits<double>::quiet_NaN(); },
       "device_ratio = nan"},
      {[](HostKvPoolConfig& c) { c.device_ratio = std::numeric_limits<double>::infinity(); },
       "device_ratio = inf"},
      {[](HostKvPoolConfig& c) { c.device_pool_bytes = -5; }, "device_pool_bytes = -5"},
      {[](HostKvPoolConfig& c) {
         c.capacity_bytes = 0;
         c.device_ratio = 0.5;
       },
       "device_pool_bytes = 0 must be positive"},
  };
  for (const Case& k : cases) {
    HostKvPoolConfig c = good;
    k.mutate(c);
    ExpectInvalid(c, k.needle);
  }

  // Sizes whose products overflow are rejected, not wrapped.
  HostKvPoolConfig huge = good;
  huge.geometry.layout = KvLayout::kPageFirst;
  huge.geometry.num_layers = int64_t{1} << 40;
  huge.geometry.slot_bytes = int64_t{1} << 30;
  ExpectInvalid(huge, "overflows int64");
  HostKvPoolConfig ratio = good;
  ratio.capacity_bytes = 0;
  ratio.device_pool_bytes = std::numeric_limits<int64_t>::max();
  ratio.device_ratio = 4.0;
  ExpectInvalid(ratio, "overflows int64");
}

// Huge pages available in the pool right now, per /proc/meminfo (0 if unknown).
int64_t FreeHugePages() {
  std::FILE* f = std::fopen("/proc/meminfo", "r");
  if (f == nullptr) return 0;
  char line[256];
  long long n = 0;
  while (std::fgets(line, sizeof(line), f) != nullptr) {
    if (std::sscanf(line, "HugePages_Free: %lld", &n) == 1) break;
  }
  std::fclose(f);
  return n;
}

TEST(HostKvPoolTest, HugePagesFallBackCleanly) {
  std::mt19937_64 rng(testing::TestSeed());
  for (bool mla : {false, true}) {
    HostKvPoolConfig c = SmallConfig(KvLayout::kPageFirst, mla);
    c.capacity_bytes = 64 * PageBytes(c);
    c.huge_pages = true;
    const int64_t free_huge = FreeHugePages();
    ::testing::internal::CaptureStderr();
    auto pool = MustCreate(c);
    const std::string err = ::testing::internal::GetCapturedStderr();
    ASSERT_NE(pool, nullptr);
    if (free_huge == 0) {
      // No huge pages reserved here: the pool must come up on normal pages and say why.
      EXPECT_FALSE(pool->huge_pages());
      if (util::LogEnabled(util::LogLevel::kWarning)) {
        EXPECT_NE(err.find("MAP_HUGETLB"), std::string::npos) << err;
        EXPECT_NE(err.find("using normal pages"), std::string::npos) << err;
      }
    }
    if (pool->huge_pages()) {
      EXPECT_EQ(err.find("MAP_HUGETLB"), std::string::npos) << err;
    }
    EXPECT_EQ(pool->num_pages(), 64);
    ExpectBuffersUsable(*pool, rng);
  }
}

TEST(HostKvPoolTest, AllocationExhaustionIsOutOfMemory) {
  HostKvPoolConfig c = SmallConfig(KvLayout::kPageFirstDirect, /*mla=*/false);
  c.capacity_bytes = 5 * PageBytes(c);
  auto pool = MustCreate(c);
  ASSERT_NE(pool, nullptr);
  auto all = pool->AllocatePages(5);
  ASSERT_TRUE(all.ok()) << all.status().ToString();
  for (int64_t p : *all) EXPECT_TRUE(pool->allocator().IsAllocated(p));
  auto more = pool->AllocatePages(1);
  ASSERT_FALSE(more.ok());
  EXPECT_TRUE(more.status().IsOutOfMemory()) << more.status().ToString();
  EXPECT_NE(more.status().message().find("only 0 of 5"), std::string::npos)
      << more.status().message();

  const std::vector<int64_t> two(all->begin(), all->begin() + 2);
  ASSERT_TRUE(pool->FreePages(two).ok());
  Status twice = pool->FreePages(two);
  EXPECT_TRUE(twice.IsInvalidArgument()) << twice.ToString();
  EXPECT_NE(twice.message().find("double free"), std::string::npos);
  Status foreign = pool->FreePages(std::vector<int64_t>{(*all)[3] + 1});
  EXPECT_TRUE(foreign.IsInvalidArgument()) << foreign.ToString();
  EXPECT_NE(foreign.message().find("foreign"), std::string::npos);
  EXPECT_EQ(pool->allocator().used_pages(), 3);
  auto again = pool->AllocatePages(2);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_TRUE(pool->AllocatePages(1).status().IsOutOfMemory());
}

TEST(HostKvPoolTest, ImpossibleCapacityIsOutOfMemoryNotAnAbort) {
  for (bool huge : {false, true}) {
    HostKvPoolConfig c = SmallConfig(KvLayout::kLayerFirst, /*mla=*/false);
    c.capacity_bytes = int64_t{1} << 50;  // 1 PiB: beyond any machine's memory and address space
    c.huge_pages = huge;
    ::testing::internal::CaptureStderr();  // the huge-page fallback warning, if any
    auto created = HostKvPool::Create(c);
    (void)::testing::internal::GetCapturedStderr();
    ASSERT_FALSE(created.ok());
    EXPECT_TRUE(created.status().IsOutOfMemory()) << created.status().ToString();
    // The message names the bytes of the mapping that failed: K (half the pool, whole pages).
    const int64_t page = PageBytes(c);
    const int64_t buffer_bytes = c.capacity_bytes / page * page / 2;
    EXPECT_NE(created.status().message().find(std::to_string(buffer_bytes) + " bytes"),
              std::string::npos)
        << created.status().message();
  }
}

TEST(HostKvPoolTest, CudaRegistrationFollowsTheBuildAndTheConfig) {
  HostKvPoolConfig c = SmallConfig(KvLayout::kPageFirst, /*mla=*/false);
  c.capacity_bytes = 16 * PageBytes(c);
  c.register_with_cuda = false;
  auto pool = MustCreate(c);
  ASSERT_NE(pool, nullptr);
  EXPECT_FALSE(pool->cuda_registered());

  c.register_with_cuda = true;
  pool = MustCreate(c);
  ASSERT_NE(pool, nullptr);
#if defined(KVTIER_WITH_CUDA)
  int devices = 0;
  const bool gpu = cudaGetDeviceCount(&devices) == cudaSuccess && devices > 0;
  (void)cudaGetLastError();
  EXPECT_EQ(pool->cuda_registered(), gpu);
  if (gpu) {
    for (void* base : {pool->region().k, pool->region().v}) {
      cudaPointerAttributes attr{};
      ASSERT_EQ(cudaPointerGetAttributes(&attr, base), cudaSuccess);
      EXPECT_EQ(attr.type, cudaMemoryTypeHost);
      EXPECT_EQ(attr.hostPointer, base);
    }
  }
#else
  EXPECT_FALSE(pool->cuda_registered());
#endif
}

TEST(HostKvPoolTest, MoveKeepsTheBuffers) {
  HostKvPoolConfig c = SmallConfig(KvLayout::kPageHead, /*mla=*/true);
  c.capacity_bytes = 8 * PageBytes(c);
  auto pool = MustCreate(c);
  ASSERT_NE(pool, nullptr);
  void* k = pool->region().k;
  std::memset(k, 0x5C, static_cast<size_t>(pool->region().geometry.buffer_bytes()));
  HostKvPool moved(std::move(*pool));
  EXPECT_EQ(moved.region().k, k);
  EXPECT_EQ(moved.capacity_bytes(), 8 * PageBytes(c));
  EXPECT_EQ(moved.allocator().num_pages(), 8);
  EXPECT_EQ(static_cast<unsigned char*>(moved.region().k)[moved.capacity_bytes() - 1], 0x5C);
  EXPECT_EQ(pool->capacity_bytes(), 0);  // NOLINT(bugprone-use-after-move): moved-from is empty
  pool.reset();  // destroying the moved-from pool must not unmap the buffers
  EXPECT_EQ(static_cast<unsigned char*>(moved.region().k)[0], 0x5C);
}

// Bytes of (buffer b, layer l, slot s) in a region, head chunk by head chunk.
std::vector<std::byte> SlotBytes(const KvRegion& r, int b, int64_t l, int64_t s, int64_t heads) {
  std::vector<std::byte> out;
  const int64_t chunk = r.geometry.slot_bytes / heads;
  for (int64_t h = 0; h < heads; ++h) {
    KvGeometry g = r.geometry;
    g.head_num = r.geometry.layout == KvLayout::kPageHead ? r.geometry.head_num : heads;
    const std::byte* p =
        r.LayerBase(b, l) + (r.has_layer_table() ? g.OffsetInLayer(s, h) : g.HeadOffset(l, s, h));
    out.insert(out.end(), p, p + chunk);
  }
  return out;
}

TEST(HostKvPoolTest, CpuTransferRoundTripsThroughThePool) {
  auto engine_or = MakeTransferEngine(TransferBackend::kCpu);
  ASSERT_TRUE(engine_or.ok()) << engine_or.status().ToString();
  TransferEngine& engine = **engine_or;
  const uint64_t seed = testing::TestSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);

  for (KvLayout pool_layout : kAllLayouts) {
    for (bool mla : {false, true}) {
      SCOPED_TRACE(::testing::Message()
                   << "pool " << LayoutName(pool_layout) << (mla ? " mla" : " mha"));
      HostKvPoolConfig c = SmallConfig(pool_layout, mla);
      c.capacity_bytes = 12 * PageBytes(c);
      auto pool = MustCreate(c);
      ASSERT_NE(pool, nullptr);
      const KvRegion& pr = pool->region();
      const int64_t heads = c.geometry.head_num;  // page_head side needs it; others are contiguous

      // An engine-side region in another layout with random KV, and a poisoned one to load into.
      KvGeometry eg;
      eg.layout =
          pool_layout == KvLayout::kLayerFirst ? KvLayout::kPageFirst : KvLayout::kLayerFirst;
      eg.num_layers = c.geometry.num_layers;
      eg.num_slots = 64;
      eg.slot_bytes = c.geometry.slot_bytes;
      eg.page_size = c.geometry.page_size;
      eg.head_num = 1;
      testing::HostRegion engine_src(eg, mla);
      engine_src.FillRandom(rng);
      testing::HostRegion engine_dst(eg, mla);
      engine_dst.Fill(testing::kPoison);
      // The pool's own bytes start poisoned too, so a missed slot shows.
      for (int b = 0; b < pr.num_buffers(); ++b) {
        std::memset(pr.LayerBase(b, 0), static_cast<int>(testing::kPoison),
                    static_cast<size_t>(pr.geometry.buffer_bytes()));
      }

      // Back up 5 random engine slots per page into 5 freshly allocated pool pages (all layers).
      auto pages = pool->AllocatePages(5);
      ASSERT_TRUE(pages.ok()) << pages.status().ToString();
      const std::vector<int64_t> pool_slots = PageSlots(*pages, c.geometry.page_size);
      std::vector<int64_t> engine_slots(64);
      for (int64_t i = 0; i < 64; ++i) engine_slots[i] = i;
      std::shuffle(engine_slots.begin(), engine_slots.end(), rng);
      engine_slots.resize(pool_slots.size());

      Status s = engine.Transfer(TransferRequest::AllLayers(
          engine_src.region(), pr, SlotIndices::Host(engine_slots), SlotIndices::Host(pool_slots)));
      ASSERT_TRUE(s.ok()) << s.ToString();
      for (size_t i = 0; i < pool_slots.size(); ++i) {
        for (int b = 0; b < pr.num_buffers(); ++b) {
          for (int64_t l = 0; l < c.geometry.num_layers; ++l) {
            ASSERT_EQ(SlotBytes(pr, b, l, pool_slots[i], heads),
                      SlotBytes(engine_src.region(), b, l, engine_slots[i], heads))
                << "pool slot " << pool_slots[i] << " buffer " << b << " layer " << l;
          }
        }
      }

      // Load back layer by layer into other engine slots; everything else stays poisoned.
      std::vector<int64_t> load_slots(64);
      for (int64_t i = 0; i < 64; ++i) load_slots[i] = 63 - i;
      std::shuffle(load_slots.begin(), load_slots.end(), rng);
      load_slots.resize(pool_slots.size());
      for (int64_t l = 0; l < c.geometry.num_layers; ++l) {
        s = engine.Transfer(TransferRequest::PerLayer(pr, engine_dst.region(),
                                                      SlotIndices::Host(pool_slots),
                                                      SlotIndices::Host(load_slots), l));
        ASSERT_TRUE(s.ok()) << s.ToString();
      }
      std::vector<bool> loaded(64, false);
      for (int64_t x : load_slots) loaded[x] = true;
      const std::vector<std::byte> poison(static_cast<size_t>(c.geometry.slot_bytes),
                                          testing::kPoison);
      for (int64_t slot = 0; slot < 64; ++slot) {
        for (int b = 0; b < pr.num_buffers(); ++b) {
          for (int64_t l = 0; l < c.geometry.num_layers; ++l) {
            const auto got = SlotBytes(engine_dst.region(), b, l, slot, heads);
            if (!loaded[slot]) {
              ASSERT_EQ(got, poison) << "engine slot " << slot << " was written";
            }
          }
        }
      }
      for (size_t i = 0; i < load_slots.size(); ++i) {
        for (int b = 0; b < pr.num_buffers(); ++b) {
          for (int64_t l = 0; l < c.geometry.num_layers; ++l) {
            ASSERT_EQ(SlotBytes(engine_dst.region(), b, l, load_slots[i], heads),
                      SlotBytes(engine_src.region(), b, l, engine_slots[i], heads))
                << "engine slot " << load_slots[i] << " buffer " << b << " layer " << l;
          }
        }
      }
      ASSERT_TRUE(pool->FreePages(*pages).ok());
    }
  }
}

}  // namespace
}  // namespace kvtier
