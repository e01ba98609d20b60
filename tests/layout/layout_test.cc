// KvGeometry's address math: the formulas of docs/architecture.md §2 at hand-computed points, and
// for every layout a bijection between (layer, slot, head) chunks and the chunks of the buffer.
#include "kvtier/layout.h"

#include <gtest/gtest.h>

#include <vector>

namespace kvtier {
namespace {

KvGeometry Geo(KvLayout layout) {
  KvGeometry g;
  g.layout = layout;
  g.num_layers = 3;   // L
  g.num_slots = 32;   // N
  g.slot_bytes = 64;  // S
  g.page_size = 8;    // P
  g.head_num = 4;     // H, S/H = 16
  return g;
}

TEST(LayoutTest, HandComputedOffsets) {
  // (l=2, i=13, h=1): p = 1, o = 5.
  EXPECT_EQ(Geo(KvLayout::kLayerFirst).HeadOffset(2, 13, 1), 2 * 32 * 64 + 13 * 64 + 16);
  EXPECT_EQ(Geo(KvLayout::kPageFirst).HeadOffset(2, 13, 1), 13 * 3 * 64 + 2 * 64 + 16);
  EXPECT_EQ(Geo(KvLayout::kPageFirstDirect).HeadOffset(2, 13, 1),
            1 * 3 * 8 * 64 + 2 * 8 * 64 + 5 * 64 + 16);
  EXPECT_EQ(Geo(KvLayout::kPageHead).HeadOffset(2, 13, 1),
            1 * 4 * 8 * 3 * 16 + 1 * 8 * 3 * 16 + 5 * 3 * 16 + 2 * 16);
  EXPECT_EQ(Geo(KvLayout::kLayerFirst).OffsetInLayer(13, 2), 13 * 64 + 32);
}

TEST(LayoutTest, EveryLayoutIsABijectionOntoTheBuffer) {
  for (int li = 0; li < kNumLayouts; ++li) {
    const KvGeometry g = Geo(static_cast<KvLayout>(li));
    SCOPED_TRACE(LayoutName(g.layout));
    const int64_t chunk = g.head_bytes();
    std::vector<int> hits(static_cast<size_t>(g.buffer_bytes() / chunk), 0);
    for (int64_t l = 0; l < g.num_layers; ++l) {
      for (int64_t i = 0; i < g.num_slots; ++i) {
        for (int64_t h = 0; h < g.head_num; ++h) {
          const int64_t off = g.HeadOffset(l, i, h);
          ASSERT_EQ(off % chunk, 0);
          ASSERT_GE(off, 0);
          ASSERT_LT(off, g.buffer_bytes());
          ++hits[static_cast<size_t>(off / chunk)];
        }
      }
    }
    for (int h : hits) ASSERT_EQ(h, 1);
    EXPECT_EQ(g.slot_contiguous(), g.layout != KvLayout::kPageHead);
  }
}

TEST(LayoutTest, ContiguousUnits) {
  // page_first: all layers of one slot are adjacent.
  const KvGeometry pf = Geo(KvLayout::kPageFirst);
  EXPECT_EQ(pf.SlotOffset(1, 7), pf.SlotOffset(0, 7) + pf.slot_bytes);
  // page_first_direct: one page of one layer, then the next layer of the same page.
  const KvGeometry pfd = Geo(KvLayout::kPageFirstDirect);
  EXPECT_EQ(pfd.SlotOffset(0, 9), pfd.SlotOffset(0, 8) + pfd.slot_bytes);
  EXPECT_EQ(pfd.SlotOffset(1, 8), pfd.SlotOffset(0, 15) + pfd.slot_bytes);
  // page_head: all layers of one head of one slot.
  const KvGeometry ph = Geo(KvLayout::kPageHead);
  EXPECT_EQ(ph.HeadOffset(1, 8, 2), ph.HeadOffset(0, 8, 2) + ph.head_bytes());
}

TEST(LayoutTest, Names) {
  EXPECT_STREQ(LayoutName(KvLayout::kPageFirstDirect), "page_first_direct");
  EXPECT_STREQ(MemoryKindName(MemoryKind::kDevice), "device");
}

}  // namespace
}  // namespace kvtier
