// Every invalid request gets InvalidArgument naming the argument and the offending value, before
// any byte moves: the destination is compared with its poisoned snapshot after each attempt.
#include <gtest/gtest.h>

#include <functional>
#include <random>

#include "kvtier/transfer.h"
#include "support/kv_test_util.h"

namespace kvtier {
namespace {

using testing::HostRegion;

KvGeometry Geo(KvLayout layout, int64_t slots = 32, int64_t page = 4, int64_t slot_bytes = 64) {
  KvGeometry g;
  g.layout = layout;
  g.num_layers = 4;
  g.num_slots = slots;
  g.page_size = page;
  g.slot_bytes = slot_bytes;
  g.head_num = 4;
  return g;
}

struct Fixture {
  HostRegion src{Geo(KvLayout::kPageFirst), false};
  HostRegion dst{Geo(KvLayout::kLayerFirst), false};
  std::vector<int64_t> src_idx{0, 1, 2, 3};
  std::vector<int64_t> dst_idx{8, 9, 10, 11};
  std::unique_ptr<TransferEngine> engine;

  Fixture() {
    std::mt19937_64 rng(testing::TestSeed());
    src.FillRandom(rng);
    dst.Fill(testing::kPoison);
    engine = std::move(MakeTransferEngine(TransferBackend::kCpu).value());
  }
  TransferRequest Request() {
    return TransferRequest::AllLayers(src.region(), dst.region(),
                                      SlotIndices::Host(std::span<const int64_t>(src_idx)),
                                      SlotIndices::Host(std::span<const int64_t>(dst_idx)));
  }
};

// Applies `mutate` to a valid request and expects InvalidArgument mentioning every `needles`
// substring, with the destination untouched.
void ExpectRejected(
    const std::function<void(Fixture&, TransferRequest&, KvRegion&, KvRegion&)>& mutate,
    std::initializer_list<std::string> needles) {
  Fixture f;
  KvRegion src = f.src.region();
  KvRegion dst = f.dst.region();
  TransferRequest req = f.Request();
  req.src = &src;
  req.dst = &dst;
  mutate(f, req, src, dst);
  const auto before = f.dst.Snapshot();
  const Status st = f.engine->Transfer(req);
  EXPECT_TRUE(st.IsInvalidArgument()) << st.ToString();
  for (const auto& n : needles) EXPECT_NE(st.message().find(n), std::string::npos) << st.message();
  EXPECT_EQ(f.dst.Snapshot(), before) << "destination modified by a rejected request";
  EXPECT_EQ(ValidateTransfer(req).code(), st.code());
}

TEST(TransferValidationTest, ValidRequestSucceeds) {
  Fixture f;
  EXPECT_TRUE(f.engine->Transfer(f.Request()).ok());
}

TEST(TransferValidationTest, NegativeMaxSmsInOptions) {
  Fixture f;
  const auto before = f.dst.Snapshot();
  const Status st = f.engine->Transfer(f.Request(), {.max_sms = -2});
  EXPECT_TRUE(st.IsInvalidArgument()) << st.ToString();
  EXPECT_NE(st.message().find("max_sms = -2"), std::string::npos) << st.message();
  EXPECT_EQ(f.dst.Snapshot(), before) << "destination modified by a rejected request";
}

TEST(TransferValidationTest, EngineConfigLimits) {
  TransferEngineConfig config;
  EXPECT_TRUE(config.Validate().ok());
  config.max_sms_to_host = 0;  // = max_sms
  EXPECT_TRUE(config.Validate().ok());
  config.max_sms_to_host = -1;
  const Status st = config.Validate();
  EXPECT_TRUE(st.IsInvalidArgument()) << st.ToString();
  EXPECT_NE(st.message().find("max_sms_to_host = -1"), std::string::npos) << st.message();
  config.max_sms_to_host = 2;
  config.max_sms_beside_backup = 0;  // off
  EXPECT_TRUE(config.Validate().ok());
  config.max_sms_beside_backup = -1;
  EXPECT_NE(config.Validate().message().find("max_sms_beside_backup = -1"), std::string::npos);
  config.max_sms_beside_backup = 8;
  config.max_sms = 0;
  EXPECT_NE(config.Validate().message().find("max_sms = 0"), std::string::npos);
}

TEST(TransferValidationTest, DmaConfigLimits) {
  const std::pair<void (*)(TransferEngineConfig&), const char*> cases[] = {
      {[](TransferEngineConfig& c) { c.dma_lanes = 0; }, "dma_lanes = 0"},
      {[](TransferEngineConfig& c) { c.dma_lanes = 17; }, "dma_lanes = 17"},
      {[](TransferEngineConfig& c) { c.dma_ops_per_lane = 15; }, "dma_ops_per_lane = 15"},
      {[](TransferEngineConfig& c) { c.dma_ops_per_lane = (1 << 20) + 1; }, "dma_ops_per_lane"},
      {[](TransferEngineConfig& c) { c.dma_min_strided_rows = 1; }, "dma_min_strided_rows = 1"},
      {[](TransferEngineConfig& c) { c.dma_first_batch_piece = 0; }, "dma_first_batch_piece = 0"},
      {[](TransferEngineConfig& c) { c.dma_first_batch_piece = (1 << 20) + 1; },
       "dma_first_batch_piece"},
      {[](TransferEngineConfig& c) { c.dma_batch_split = static_cast<DmaBatchSplit>(3); },
       "dma_batch_split"},
  };
  for (const auto& [mutate, needle] : cases) {
    TransferEngineConfig config;
    mutate(config);
    const Status st = config.Validate();
    EXPECT_TRUE(st.IsInvalidArgument()) << needle;
    EXPECT_NE(st.message().find(needle), std::string::npos) << st.message();
    EXPECT_TRUE(MakeTransferEngine(TransferBackend::kCpu, config).status().IsInvalidArgument());
  }
  TransferEngineConfig edges;
  edges.dma_lanes = 1;
  edges.dma_ops_per_lane = 16;
  edges.dma_min_strided_rows = 2;
  EXPECT_TRUE(edges.Validate().ok());
  EXPECT_EQ(TransferEngineConfig{}.dma_min_strided_rows, 3);
  EXPECT_STREQ(DmaBatchSplitName(DmaBatchSplit::kWholeWhenBusy), "whole_when_busy");
}

TEST(TransferValidationTest, MismatchedLengths) {
  ExpectRejected(
      [](Fixture& f, TransferRequest& r, KvRegion&, KvRegion&) {
        f.dst_idx.pop_back();
        r.dst_slots = SlotIndices::Host(std::span<const int64_t>(f.dst_idx));
      },
      {"src_slots", "dst_slots", "4", "3"});
}

TEST(TransferValidationTest, SourceIndexOutOfRange) {
  ExpectRejected([](Fixture& f, TransferRequest&, KvRegion&, KvRegion&) { f.src_idx[2] = 32; },
                 {"src_slots[2]", "32", "[0, 32)"});
}

// With several bad indices, the first is named (the range is checked over the whole list first).
TEST(TransferValidationTest, TheFirstOfSeveralBadIndicesIsNamed) {
  ExpectRejected(
      [](Fixture& f, TransferRequest&, KvRegion&, KvRegion&) {
        f.src_idx[1] = -5;
        f.src_idx[3] = 99;
      },
      {"src_slots[1] = -5"});
}

TEST(TransferValidationTest, NegativeDestinationIndex) {
  ExpectRejected([](Fixture& f, TransferRequest&, KvRegion&, KvRegion&) { f.dst_idx[3] = -1; },
                 {"dst_slots[3]", "-1"});
}

TEST(TransferValidationTest, Int32IndexOutOfRange) {
  static std::vector<int32_t> idx32;
  ExpectRejected(
      [](Fixture&, TransferRequest& r, KvRegion&, KvRegion&) {
        idx32 = {0, 1, 2, 1000};
        r.dst_slots = SlotIndices::Host(std::span<const int32_t>(idx32));
      },
      {"dst_slots[3]", "1000"});
}

TEST(TransferValidationTest, NullIndexDataWithCount) {
  ExpectRejected(
      [](Fixture&, TransferRequest& r, KvRegion&, KvRegion&) { r.src_slots.data = nullptr; },
      {"src_slots", "null", "4"});
}

TEST(TransferValidationTest, ZeroSlotBytes) {
  ExpectRejected(
      [](Fixture&, TransferRequest&, KvRegion& s, KvRegion&) { s.geometry.slot_bytes = 0; },
      {"src.slot_bytes", "0"});
}

TEST(TransferValidationTest, MisalignedSlotBytes) {
  ExpectRejected(
      [](Fixture&, TransferRequest&, KvRegion&, KvRegion& d) { d.geometry.slot_bytes = 62; },
      {"dst.slot_bytes", "62", "multiple of 4"});
}

TEST(TransferValidationTest, SlotBytesDiffer) {
  ExpectRejected(
      [](Fixture&, TransferRequest&, KvRegion&, KvRegion& d) {
        d.geometry.slot_bytes = 32;
        d.geometry.num_slots = 64;  // same buffer bytes
      },
      {"slot_bytes", "64", "32"});
}

TEST(TransferValidationTest, SourceLayerOutOfRange) {
  ExpectRejected(
      [](Fixture&, TransferRequest& r, KvRegion&, KvRegion&) {
        r.src_layer = 4;
        r.dst_layer = 0;
        r.num_layers = 1;
      },
      {"src_layer = 4", "4 layers"});
}

TEST(TransferValidationTest, LayerRangePastTheEnd) {
  ExpectRejected(
      [](Fixture&, TransferRequest& r, KvRegion&, KvRegion&) {
        r.dst_layer = 2;
        r.src_layer = 0;
        r.num_layers = 3;
      },
      {"dst_layer = 2", "num_layers = 3"});
}

TEST(TransferValidationTest, ZeroLayers) {
  ExpectRejected([](Fixture&, TransferRequest& r, KvRegion&, KvRegion&) { r.num_layers = 0; },
                 {"num_layers = 0"});
}

TEST(TransferValidationTest, PageSizeDoesNotDividePool) {
  ExpectRejected(
      [](Fixture&, TransferRequest&, KvRegion& s, KvRegion&) { s.geometry.page_size = 5; },
      {"src.page_size = 5", "num_slots = 32"});
}

TEST(TransferValidationTest, MlaAgainstMha) {
  ExpectRejected(
      [](Fixture&, TransferRequest&, KvRegion& s, KvRegion&) {
        s.mla = true;
        s.v = nullptr;
      },
      {"MLA", "MHA"});
}

TEST(TransferValidationTest, MlaRegionWithVBuffer) {
  ExpectRejected(
      [](Fixture&, TransferRequest&, KvRegion& s, KvRegion& d) {
        s.mla = true;
        d.mla = true;
        d.v = nullptr;
      },
      {"src.v", "MLA"});
}

TEST(TransferValidationTest, NullBuffer) {
  ExpectRejected([](Fixture&, TransferRequest&, KvRegion&, KvRegion& d) { d.v = nullptr; },
                 {"dst.v is null"});
}

TEST(TransferValidationTest, HeadNumNotDividingSlotBytesForPageHead) {
  ExpectRejected(
      [](Fixture&, TransferRequest&, KvRegion& s, KvRegion&) {
        s.geometry.layout = KvLayout::kPageHead;
        s.geometry.head_num = 3;
      },
      {"src.head_num = 3", "slot_bytes = 64", "page_head"});
}

TEST(TransferValidationTest, PageHeadRegionsWithDifferentHeadNum) {
  ExpectRejected(
      [](Fixture&, TransferRequest&, KvRegion& s, KvRegion& d) {
        s.geometry.layout = KvLayout::kPageHead;
        d.geometry.layout = KvLayout::kPageHead;
        d.geometry.head_num = 2;
      },
      {"head_num", "4", "2"});
}

TEST(TransferValidationTest, LayerTableOnPageLayout) {
  static std::vector<void*> table(4, reinterpret_cast<void*>(0x1000));
  ExpectRejected(
      [](Fixture&, TransferRequest&, KvRegion& s, KvRegion&) {
        s.k = s.v = nullptr;
        s.k_layers = table;
        s.v_layers = table;
      },
      {"src", "per-layer pointer table", "page_first"});
}

TEST(TransferValidationTest, LayerTableWithWrongLength) {
  static std::vector<void*> table(3, reinterpret_cast<void*>(0x1000));
  ExpectRejected(
      [](Fixture&, TransferRequest&, KvRegion&, KvRegion& d) {
        d.k = d.v = nullptr;
        d.k_layers = table;
        d.v_layers = table;
      },
      {"dst.k_layers has 3 entries", "num_layers = 4"});
}

TEST(TransferValidationTest, NullRegions) {
  Fixture f;
  TransferRequest r = f.Request();
  r.dst = nullptr;
  EXPECT_TRUE(f.engine->Transfer(r).IsInvalidArgument());
  r = f.Request();
  r.src = nullptr;
  EXPECT_TRUE(f.engine->Transfer(r).IsInvalidArgument());
}

TEST(TransferValidationTest, EngineConfigIsValidated) {
  TransferEngineConfig cfg;
  cfg.cpu_threads = -2;
  auto e = MakeTransferEngine(TransferBackend::kCpu, cfg);
  EXPECT_TRUE(e.status().IsInvalidArgument());
  EXPECT_NE(e.status().message().find("cpu_threads = -2"), std::string::npos);
  // Bounded: a thread count no machine can start is an error, not a long hang.
  cfg.cpu_threads = 100000;
  e = MakeTransferEngine(TransferBackend::kCpu, cfg);
  EXPECT_TRUE(e.status().IsInvalidArgument());
  EXPECT_NE(e.status().message().find("cpu_threads = 100000 must be in [0, 1024]"),
            std::string::npos);
}

// A slot both read and written in one region: refused before any byte moves (the cpu backend
// would otherwise produce either the old or the new bytes, depending on thread timing).
TEST(TransferValidationTest, OverlappingSlotsInOneRegionAreRefused) {
  HostRegion pool{Geo(KvLayout::kPageFirst), false};
  std::mt19937_64 rng(testing::TestSeed());
  pool.FillRandom(rng);
  auto engine = std::move(MakeTransferEngine(TransferBackend::kCpu).value());
  const std::vector<int64_t> src{0, 1, 2, 3};
  const std::vector<int64_t> dst{4, 5, 3, 6};
  const auto before = pool.Snapshot();
  const Status st = engine->Transfer(TransferRequest::AllLayers(
      pool.region(), pool.region(), SlotIndices::Host(std::span<const int64_t>(src)),
      SlotIndices::Host(std::span<const int64_t>(dst))));
  EXPECT_TRUE(st.IsInvalidArgument()) << st.ToString();
  EXPECT_NE(st.message().find("dst_slots[2] = 3 is also read (src_slots[3])"), std::string::npos)
      << st.message();
  EXPECT_EQ(pool.Snapshot(), before);
  // Disjoint slots in one region, and the same slots in different layers, are fine.
  const std::vector<int64_t> other{8, 9, 10, 11};
  EXPECT_TRUE(
      engine
          ->Transfer(TransferRequest::AllLayers(pool.region(), pool.region(),
                                                SlotIndices::Host(std::span<const int64_t>(src)),
                                                SlotIndices::Host(std::span<const int64_t>(other))))
          .ok());
  TransferRequest layers{&pool.region(),
                         &pool.region(),
                         SlotIndices::Host(std::span<const int64_t>(src)),
                         SlotIndices::Host(std::span<const int64_t>(src)),
                         0,
                         2,
                         2};
  EXPECT_TRUE(engine->Transfer(layers).ok());
}

TEST(TransferValidationTest, DifferentRegionsOverOverlappingMemoryAreRefused) {
  Fixture f;
  KvRegion shifted = f.src.region();
  shifted.k = static_cast<std::byte*>(shifted.k) + 64;  // the same buffer seen one slot later
  shifted.geometry.num_slots -= 4;                      // a whole number of pages still
  const auto req = TransferRequest::AllLayers(
      f.src.region(), shifted, SlotIndices::Host(std::span<const int64_t>(f.src_idx)),
      SlotIndices::Host(std::span<const int64_t>(f.dst_idx)));
  const Status st = ValidateTransfer(req);
  EXPECT_TRUE(st.IsInvalidArgument()) << st.ToString();
  EXPECT_NE(st.message().find("overlapping memory"), std::string::npos) << st.message();
}

}  // namespace
}  // namespace kvtier
