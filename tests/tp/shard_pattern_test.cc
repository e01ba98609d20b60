// A rank's share of the KV pattern is exactly its heads' bytes of the TP=1 pattern (any layout,
// page_head included; MLA: all of it), and a rank's pattern does not pass for another's.
#include <gtest/gtest.h>

#include <cstring>
#include <numeric>

#include "kvtier/testing/kv_pattern.h"
#include "kvtier/testing/tp_shard_pattern.h"
#include "kvtier/tp_group.h"

namespace kvtier {
namespace {

struct Owned {
  Owned(const KvGeometry& g, bool mla) {
    k.assign(static_cast<size_t>(g.buffer_bytes()), std::byte{0});
    v.assign(mla ? 0 : k.size(), std::byte{0});
    region.geometry = g;
    region.mla = mla;
    region.k = k.data();
    region.v = mla ? nullptr : v.data();
  }
  std::vector<std::byte> k, v;
  KvRegion region;
};

TEST(ShardPatternTest, ShardGeometrySplitsHeadsOrKeepsTheLatent) {
  const KvGeometry full{KvLayout::kPageHead, 2, 64, 8 * 16, 4, 8};
  auto g = TpShardGeometry(full, false, 4);
  ASSERT_TRUE(g.ok());
  EXPECT_EQ(g->head_num, 2);
  EXPECT_EQ(g->slot_bytes, 32);
  EXPECT_EQ(TpShardGeometry(full, true, 4)->slot_bytes, full.slot_bytes);
  EXPECT_NE(TpShardGeometry(full, false, 3).status().message().find("8 KV heads"),
            std::string::npos);
}

TEST(ShardPatternTest, RanksHoldTheirHeadsOfTheTp1Pattern) {
  for (KvLayout layout : {KvLayout::kLayerFirst, KvLayout::kPageFirst, KvLayout::kPageHead}) {
    for (bool mla : {false, true}) {
      const KvGeometry full{layout, 3, 32, 4 * 16, 4, 4};
      const std::vector<Token> tokens = {5, 9, 2, 7, 7, 1, 3, 0, 4, 4, 8, 6};
      const auto hashes = KvPatternHashes(tokens, KvPatternSalt("ns"));
      std::vector<int64_t> slots(tokens.size());
      std::iota(slots.begin(), slots.end(), 8);
      Owned whole(full, mla);
      ASSERT_TRUE(FillKvPattern(whole.region, slots, hashes).ok());
      auto g = TpShardGeometry(full, mla, 2);
      ASSERT_TRUE(g.ok());
      Owned r0(*g, mla), r1(*g, mla);
      ASSERT_TRUE(FillTpShardPattern(r0.region, mla, 0, 2, slots, hashes).ok());
      ASSERT_TRUE(FillTpShardPattern(r1.region, mla, 1, 2, slots, hashes).ok());
      ASSERT_TRUE(VerifyTpShardPattern(r1.region, mla, 1, 2, slots, hashes).ok());
      // Byte for byte: head h of the full slot is head h % 2 of rank h / 2 (MLA: every rank).
      for (int b = 0; b < whole.region.num_buffers(); ++b) {
        for (int64_t l = 0; l < full.num_layers; ++l) {
          for (int64_t s : slots) {
            for (int64_t h = 0; h < full.head_num; ++h) {
              const Owned& rank = mla ? (h % 2 ? r1 : r0) : (h / 2 ? r1 : r0);
              const int64_t rh = mla ? h : h % 2;
              const std::byte* want =
                  whole.region.LayerBase(b, l) + whole.region.LayerOffset(l, s, h);
              const int64_t hb = full.head_bytes();  // a head is as wide on every rank
              const std::byte* have =
                  rank.region.LayerBase(b, l) + rank.region.LayerOffset(l, s, rh);
              ASSERT_EQ(std::memcmp(want, have, static_cast<size_t>(hb)), 0)
                  << LayoutName(layout) << " mla " << mla << " slot " << s << " head " << h;
            }
          }
        }
      }
      if (!mla) {
        const Status st = VerifyTpShardPattern(r1.region, mla, 0, 2, slots, hashes);
        EXPECT_EQ(st.code(), StatusCode::kCorruption);
        EXPECT_NE(st.message().find("tp rank 0: token 0 (slot 8) layer 0 buffer K"),
                  std::string::npos)
            << st.ToString();
      }
    }
  }
}

TEST(ShardPatternTest, BadArgumentsAreInvalidArgument) {
  const KvGeometry g{KvLayout::kLayerFirst, 1, 8, 16, 4, 1};
  Owned r(g, false);
  const std::vector<int64_t> slots = {8};
  const std::vector<uint64_t> hashes = {1};
  EXPECT_TRUE(FillTpShardPattern(r.region, false, 0, 2, slots, hashes).IsInvalidArgument());
  EXPECT_TRUE(FillTpShardPattern(r.region, false, 2, 2, {}, {}).IsInvalidArgument());
  EXPECT_TRUE(FillTpShardPattern(r.region, false, 0, 2, slots, {}).IsInvalidArgument());
}

}  // namespace
}  // namespace kvtier
