// The cpu backend against the independent reference (ReferenceTransfer): every layout pair,
// per-layer and all-layer, MHA and MLA, page sizes {1, 2, 16, 64, 256}, index counts {0, 1,
// random pages, random tokens}, base pointers and per-layer tables, serial and threaded, on random
// data with poisoned destinations; whole destination buffers are compared so stray writes show.
#include <gtest/gtest.h>

#include <random>
#include <tuple>

#include "kvtier/testing/reference_copy.h"
#include "kvtier/transfer.h"
#include "support/kv_test_util.h"

namespace kvtier {
namespace {

using testing::HostRegion;
using testing::kPoison;

constexpr KvLayout kLayouts[] = {KvLayout::kLayerFirst, KvLayout::kPageFirst,
                                 KvLayout::kPageFirstDirect, KvLayout::kPageHead};

KvGeometry MakeGeometry(KvLayout layout, bool mla, int64_t page_size, int64_t pages) {
  KvGeometry g;
  g.layout = layout;
  g.num_layers = 3;
  g.page_size = page_size;
  g.num_slots = pages * page_size;
  g.slot_bytes = mla ? 72 : 64;
  g.head_num = mla ? 1 : 4;
  return g;
}

std::unique_ptr<TransferEngine> CpuEngine(int threads, int64_t threshold) {
  TransferEngineConfig cfg;
  cfg.cpu_threads = threads;
  cfg.cpu_parallel_threshold_bytes = threshold;
  auto engine = MakeTransferEngine(TransferBackend::kCpu, cfg);
  EXPECT_TRUE(engine.ok()) << engine.status().ToString();
  return std::move(engine).value();
}

// (src layout, dst layout, all layers, mla, page size)
using Case = std::tuple<KvLayout, KvLayout, bool, bool, int64_t>;

class CpuTransferMatrixTest : public ::testing::TestWithParam<Case> {};

TEST_P(CpuTransferMatrixTest, MatchesReferenceByteForByte) {
  const auto [src_layout, dst_layout, all_layers, mla, page_size] = GetParam();
  const uint64_t seed = testing::TestSeed() ^ (static_cast<uint64_t>(src_layout) << 8) ^
                        (static_cast<uint64_t>(dst_layout) << 12) ^ (all_layers << 16) ^
                        (mla << 17) ^ (page_size << 20);
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  const KvGeometry sg = MakeGeometry(src_layout, mla, page_size, 6);
  const KvGeometry dg = MakeGeometry(dst_layout, mla, page_size, 5);
  auto serial = CpuEngine(1, 0);
  auto threaded = CpuEngine(3, 1);
  // The largest threshold validation allows: one task, and no overflow rounding the task count.
  auto unsplit = CpuEngine(3, std::numeric_limits<int64_t>::max());

  for (int tables = 0; tables < 2; ++tables) {
    const bool src_table = tables && src_layout == KvLayout::kLayerFirst;
    const bool dst_table = tables && dst_layout == KvLayout::kLayerFirst;
    if (tables && !src_table && !dst_table) continue;
    HostRegion src(sg, mla, src_table);
    HostRegion dst(dg, mla, dst_table);
    HostRegion expected(dg, mla, dst_table);
    for (int variant = 0; variant < 4; ++variant) {
      testing::SlotPairs pairs;
      switch (variant) {
        case 0:
          break;  // no slots
        case 1:
          pairs = testing::RandomTokenPairs(rng, sg.num_slots, dg.num_slots, 1);
          break;
        case 2:
          pairs = testing::RandomPagePairs(rng, sg.num_slots, dg.num_slots, page_size,
                                           1 + static_cast<int64_t>(rng() % 4));
          break;
        case 3:
          pairs = testing::RandomTokenPairs(rng, sg.num_slots, dg.num_slots,
                                            1 + static_cast<int64_t>(rng() % dg.num_slots));
          break;
      }
      for (TransferEngine* engine : {serial.get(), threaded.get(), unsplit.get()}) {
        SCOPED_TRACE(::testing::Message()
                     << "variant " << variant << " tables " << tables << " slots "
                     << pairs.src.size() << " threaded " << (engine == threaded.get()));
        src.FillRandom(rng);
        dst.Fill(kPoison);
        expected.Fill(kPoison);
        TransferRequest req;
        req.src = &src.region();
        req.src_slots = SlotIndices::Host(std::span<const int64_t>(pairs.src));
        req.dst_slots = SlotIndices::Host(std::span<const int64_t>(pairs.dst));
        if (all_layers) {
          req.num_layers = sg.num_layers;
        } else {
          req.src_layer = 1;
          req.dst_layer = 2;
          req.num_layers = 1;
        }
        req.dst = &expected.region();
        ASSERT_TRUE(testing::ReferenceTransfer(req).ok());
        req.dst = &dst.region();
        const Status st = engine->Transfer(req);
        ASSERT_TRUE(st.ok()) << st.ToString();
        ASSERT_EQ(dst.Snapshot(), expected.Snapshot());
      }
    }
  }
}

std::string CaseName(const ::testing::TestParamInfo<Case>& info) {
  const auto [s, d, all, mla, p] = info.param;
  return std::string(LayoutName(s)) + "_to_" + LayoutName(d) + (all ? "_all" : "_one") +
         (mla ? "_mla" : "_mha") + "_p" + std::to_string(p);
}

INSTANTIATE_TEST_SUITE_P(EveryPair, CpuTransferMatrixTest,
                         ::testing::Combine(::testing::ValuesIn(kLayouts),
                                            ::testing::ValuesIn(kLayouts), ::testing::Bool(),
                                            ::testing::Bool(),
                                            ::testing::Values<int64_t>(1, 2, 16, 64, 256)),
                         CaseName);

// int32 indices take the same path as int64.
TEST(CpuTransferTest, Int32IndicesMatchInt64) {
  std::mt19937_64 rng(testing::TestSeed());
  const KvGeometry g = MakeGeometry(KvLayout::kPageFirst, false, 16, 4);
  const KvGeometry d = MakeGeometry(KvLayout::kLayerFirst, false, 16, 4);
  HostRegion src(g, false), a(d, false), b(d, false);
  src.FillRandom(rng);
  a.Fill(kPoison);
  b.Fill(kPoison);
  auto pairs = testing::RandomPagePairs(rng, g.num_slots, d.num_slots, 16, 3);
  std::vector<int32_t> s32(pairs.src.begin(), pairs.src.end()),
      d32(pairs.dst.begin(), pairs.dst.end());
  auto engine = CpuEngine(2, 1);
  ASSERT_TRUE(
      engine
          ->Transfer(TransferRequest::AllLayers(
              src.region(), a.region(), SlotIndices::Host(std::span<const int64_t>(pairs.src)),
              SlotIndices::Host(std::span<const int64_t>(pairs.dst))))
          .ok());
  ASSERT_TRUE(engine
                  ->Transfer(TransferRequest::AllLayers(
                      src.region(), b.region(), SlotIndices::Host(std::span<const int32_t>(s32)),
                      SlotIndices::Host(std::span<const int32_t>(d32))))
                  .ok());
  EXPECT_EQ(a.Snapshot(), b.Snapshot());
}

TEST(CpuTransferTest, RejectsDeviceMemoryAndDeviceIndices) {
  const KvGeometry g = MakeGeometry(KvLayout::kLayerFirst, false, 1, 8);
  HostRegion src(g, false), dst(g, false);
  dst.Fill(kPoison);
  const auto before = dst.Snapshot();
  std::vector<int64_t> idx = {0, 1};
  auto engine = CpuEngine(1, 0);
  KvRegion device_dst = dst.region();
  device_dst.memory = MemoryKind::kDevice;
  Status st = engine->Transfer(TransferRequest::AllLayers(
      src.region(), device_dst, SlotIndices::Host(std::span<const int64_t>(idx)),
      SlotIndices::Host(std::span<const int64_t>(idx))));
  EXPECT_TRUE(st.IsInvalidArgument()) << st.ToString();
  EXPECT_NE(st.message().find("device"), std::string::npos) << st.message();
  st = engine->Transfer(TransferRequest::AllLayers(src.region(), dst.region(),
                                                   SlotIndices::Device(idx.data(), 2),
                                                   SlotIndices::Device(idx.data(), 2)));
  EXPECT_TRUE(st.IsInvalidArgument()) << st.ToString();
  EXPECT_EQ(dst.Snapshot(), before);
}

TEST(CpuTransferTest, BackendNamesRoundTrip) {
  for (auto b : {TransferBackend::kCpu, TransferBackend::kKernel, TransferBackend::kDma,
                 TransferBackend::kAuto}) {
    auto parsed = ParseTransferBackend(TransferBackendName(b));
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(*parsed, b);
  }
  EXPECT_TRUE(ParseTransferBackend("gpu").status().IsInvalidArgument());
  for (auto l : kLayouts) {
    auto parsed = ParseLayout(LayoutName(l));
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(*parsed, l);
  }
  auto bad = ParseLayout("head_first");
  EXPECT_TRUE(bad.status().IsInvalidArgument());
  EXPECT_NE(bad.status().message().find("head_first"), std::string::npos);
}

TEST(CpuTransferTest, GpuBackendsWithoutCudaAreUnavailable) {
  if (BuiltWithCuda()) GTEST_SKIP() << "built with CUDA";
  auto engine = MakeTransferEngine(TransferBackend::kKernel);
  EXPECT_TRUE(engine.status().IsUnavailable()) << engine.status().ToString();
}

}  // namespace
}  // namespace kvtier
