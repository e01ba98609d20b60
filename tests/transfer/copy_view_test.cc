// The address decomposition the CUDA copy kernel relies on (copy_kernels.cuh): for a fixed slot,
// every layout's offset is linear in the layer and the head, with the strides the kernel engine
// computes (RegionView::layer_stride / head_stride), and the slot part is the division-free
// SlotAddressing. Checked on the host against KvGeometry::HeadOffset for every layout, head
// count and page size; CUDA-free, runs in every build.
#include "transfer/cuda/copy_view.h"

#include <gtest/gtest.h>

#include "kvtier/layout.h"

namespace kvtier {
namespace {

TEST(CopyViewTest, OffsetsAreLinearInLayerAndHeadForAFixedSlot) {
  for (KvLayout layout : {KvLayout::kLayerFirst, KvLayout::kPageFirst, KvLayout::kPageFirstDirect,
                          KvLayout::kPageHead}) {
    for (int64_t heads : {1, 2, 8}) {
      for (int64_t page : {1, 4, 16}) {
        KvGeometry g;
        g.layout = layout;
        g.num_layers = 5;
        g.page_size = page;
        g.num_slots = page * 6;
        g.slot_bytes = 64 * heads;
        g.head_num = heads;
        const int64_t layer_stride = g.HeadOffset(1, 0, 0) - g.HeadOffset(0, 0, 0);
        const int64_t head_stride = g.HeadOffset(0, 0, 1) - g.HeadOffset(0, 0, 0);
        for (int64_t first = 0; first < g.num_layers; ++first) {
          for (int64_t slot = 0; slot < g.num_slots; ++slot) {
            const int64_t base = g.HeadOffset(first, slot, 0);
            for (int64_t l = 0; first + l < g.num_layers; ++l) {
              for (int64_t h = 0; h < heads; ++h) {
                ASSERT_EQ(g.HeadOffset(first + l, slot, h),
                          base + l * layer_stride + h * head_stride)
                    << LayoutName(layout) << " heads " << heads << " page " << page << " slot "
                    << slot << " layer " << first + l << " head " << h;
              }
            }
          }
        }
        // The kernel's division-free slot offset (SlotAddressing) equals KvGeometry's.
        for (int64_t first = 0; first < g.num_layers; ++first) {
          const auto with_base = transfer::cuda::SlotAddressing::Make(g, false, first);
          const auto in_layer = transfer::cuda::SlotAddressing::Make(g, true, first);
          for (int64_t slot = 0; slot < g.num_slots; ++slot) {
            ASSERT_EQ(with_base.Offset(slot), g.HeadOffset(first, slot, 0))
                << LayoutName(layout) << " heads " << heads << " page " << page << " slot " << slot
                << " first layer " << first;
            ASSERT_EQ(in_layer.Offset(slot), g.OffsetInLayer(slot, 0));
          }
        }
        // Per-layer tables: offset within a layer is linear in the head.
        EXPECT_EQ(g.OffsetInLayer(3, 1) - g.OffsetInLayer(3, 0),
                  g.OffsetInLayer(0, 1) - g.OffsetInLayer(0, 0));
      }
    }
  }
}

// Pools of more than 2^32 slots: SlotAddressing divides in 64 bits there.
TEST(CopyViewTest, SlotAddressingOfHugePools) {
  for (KvLayout layout : {KvLayout::kLayerFirst, KvLayout::kPageFirst, KvLayout::kPageFirstDirect,
                          KvLayout::kPageHead}) {
    KvGeometry g;
    g.layout = layout;
    g.num_layers = 3;
    g.page_size = 16;
    g.num_slots = int64_t{1} << 34;
    g.slot_bytes = 128;
    g.head_num = 2;
    const auto a = transfer::cuda::SlotAddressing::Make(g, false, 2);
    EXPECT_EQ(a.wide_slots, 1);
    for (int64_t slot : {int64_t{0}, int64_t{17}, (int64_t{1} << 32) + 5, (int64_t{1} << 34) - 1}) {
      EXPECT_EQ(a.Offset(slot), g.HeadOffset(2, slot, 0)) << LayoutName(layout) << " " << slot;
    }
  }
}

}  // namespace
}  // namespace kvtier
