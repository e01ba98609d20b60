// KV pattern helper: deterministic, prefix-dependent, layout-independent, and detects every
// single-byte change.
#include "kvtier/testing/kv_pattern.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <random>

#include "kvtier/testing/reference_copy.h"

namespace kvtier {
namespace {

struct OwnedRegion {
  std::vector<std::byte> k, v;
  KvRegion region;
  OwnedRegion(KvLayout layout, bool mla, int64_t layers, int64_t slots, int64_t slot_bytes,
              int64_t page, int64_t heads) {
    region.geometry = {layout, layers, slots, slot_bytes, page, heads};
    region.mla = mla;
    k.assign(static_cast<size_t>(region.geometry.buffer_bytes()), std::byte{0xAB});
    region.k = k.data();
    if (!mla) {
      v.assign(k.size(), std::byte{0xCD});
      region.v = v.data();
    }
  }
};

TEST(KvPatternTest, HashesDependOnWholePrefixAndSalt) {
  std::vector<Token> a = {1, 2, 3, 4};
  std::vector<Token> b = {9, 2, 3, 4};
  auto ha = KvPatternHashes(a, 0);
  auto hb = KvPatternHashes(b, 0);
  ASSERT_EQ(ha.size(), 4u);
  for (size_t i = 0; i < 4; ++i) EXPECT_NE(ha[i], hb[i]) << i;
  EXPECT_EQ(KvPatternHashes(a, 0), ha);
  EXPECT_NE(KvPatternHashes(a, KvPatternSalt("tenant"))[0], ha[0]);
  auto prefix = KvPatternHashes(std::span<const Token>(a).first(2), 0);
  EXPECT_EQ(prefix[1], ha[1]);
}

TEST(KvPatternTest, FillVerifyAndDetectEveryLayoutThroughACopy) {
  std::mt19937_64 rng(7);
  for (bool mla : {false, true}) {
    for (KvLayout layout : {KvLayout::kLayerFirst, KvLayout::kPageFirst, KvLayout::kPageFirstDirect,
                            KvLayout::kPageHead}) {
      SCOPED_TRACE(fmt::format("{} {}", LayoutName(layout), mla ? "mla" : "mha"));
      OwnedRegion src(KvLayout::kLayerFirst, mla, 3, 32, 24, 4, 2);
      OwnedRegion dst(layout, mla, 3, 64, 24, 4, 2);
      std::vector<Token> tokens(8);
      for (auto& t : tokens) t = static_cast<Token>(rng() % 100);
      auto h = KvPatternHashes(tokens, 1);
      std::vector<int64_t> s_slots = {4, 5, 6, 7, 12, 13, 14, 15};
      std::vector<int64_t> d_slots = {40, 41, 42, 43, 8, 9, 10, 11};
      ASSERT_TRUE(FillKvPattern(src.region, s_slots, h).ok());
      ASSERT_TRUE(VerifyKvPattern(src.region, s_slots, h).ok());
      // Poisoned destination fails, a real copy passes.
      EXPECT_EQ(VerifyKvPattern(dst.region, d_slots, h).code(), StatusCode::kCorruption);
      ASSERT_TRUE(testing::ReferenceTransfer(TransferRequest::AllLayers(src.region, dst.region,
                                                                        SlotIndices::Host(s_slots),
                                                                        SlotIndices::Host(d_slots)))
                      .ok());
      ASSERT_TRUE(VerifyKvPattern(dst.region, d_slots, h).ok());
      // Wrong slot order (another token's KV) is caught.
      std::vector<int64_t> swapped = d_slots;
      std::swap(swapped[0], swapped[1]);
      EXPECT_EQ(VerifyKvPattern(dst.region, swapped, h).code(), StatusCode::kCorruption);
      // Flip one random byte of the destination buffer inside a verified slot's bytes.
      auto& buf = (mla || rng() % 2 == 0) ? dst.k : dst.v;
      const int64_t layer = static_cast<int64_t>(rng() % 3);
      const int64_t head = static_cast<int64_t>(rng() % 2);
      const int64_t off = dst.region.geometry.HeadOffset(layer, d_slots[5], head) +
                          static_cast<int64_t>(rng() % 12);
      buf[static_cast<size_t>(off)] ^= std::byte{0x10};
      const Status st = VerifyKvPattern(dst.region, d_slots, h);
      EXPECT_EQ(st.code(), StatusCode::kCorruption);
      EXPECT_NE(st.message().find("token 5"), std::string::npos) << st.message();
    }
  }
}

TEST(KvPatternTest, BadArguments) {
  OwnedRegion r(KvLayout::kLayerFirst, false, 1, 8, 8, 1, 1);
  std::vector<int64_t> slots = {8};
  std::vector<uint64_t> h = {1};
  EXPECT_TRUE(FillKvPattern(r.region, slots, h).IsInvalidArgument());
  std::vector<int64_t> two = {0, 1};
  EXPECT_TRUE(VerifyKvPattern(r.region, two, h).IsInvalidArgument());
  KvRegion dev = r.region;
  dev.memory = MemoryKind::kDevice;
  std::vector<int64_t> one = {0};
  EXPECT_TRUE(FillKvPattern(dev, one, h).IsInvalidArgument());
  // Nothing was written by the failed calls.
  EXPECT_EQ(r.k[0], std::byte{0xAB});
}

}  // namespace
}  // namespace kvtier
