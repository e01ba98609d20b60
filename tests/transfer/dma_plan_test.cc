// The dma backend's host-side plan (src/transfer/cuda/dma_plan.h): which pieces merge into runs,
// which runs group into strided copies, and when two strided copies join into one depth-2 copy.
// A joined copy must move exactly the bytes of the two copies it replaces: checked by running
// plans on host buffers and comparing with running the pieces one by one.
#include "transfer/cuda/dma_plan.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <vector>

namespace kvtier::transfer::cuda {
namespace {

constexpr size_t kMaxPitch = size_t{1} << 30;

// Runs a plan (single runs and strided copies) on host memory, as the copy engines would.
void Execute(CopyPlanner& p) {
  for (size_t i = 0; i < p.sizes().size(); ++i) {
    std::memcpy(p.dsts()[i], p.srcs()[i], p.sizes()[i]);
  }
  for (const Copy2D& c : p.copies_2d()) {
    for (size_t z = 0; z < c.depth; ++z) {
      for (size_t row = 0; row < c.height; ++row) {
        std::memcpy(c.BlockDst(z) + row * c.dpitch, c.BlockSrc(z) + row * c.spitch, c.width);
      }
    }
  }
}

TEST(DmaPlanTest, ContiguousPiecesOfOneAllocationMergeIntoOneRun) {
  std::vector<std::byte> src(1024), dst(1024);
  CopyPlanner p;
  p.Reset(kMaxPitch);
  p.Add(src.data(), dst.data(), 64, 0);
  p.Add(src.data() + 64, dst.data() + 64, 64, 0);
  p.Add(src.data() + 128, dst.data() + 128, 64, 1);  // adjacent, but another allocation
  p.Finish();
  ASSERT_EQ(p.sizes().size(), 2u);
  EXPECT_EQ(p.sizes()[0], 128u);
  EXPECT_EQ(p.sizes()[1], 64u);
  EXPECT_TRUE(p.copies_2d().empty());
}

TEST(DmaPlanTest, RunsAtAConstantPitchGroupIntoOneStridedCopy) {
  std::vector<std::byte> src(8192), dst(8192);
  CopyPlanner p;
  p.Reset(kMaxPitch);
  for (int row = 0; row < 4; ++row) p.Add(src.data() + row * 1000, dst.data() + row * 500, 64, 0);
  p.Finish();
  ASSERT_EQ(p.copies_2d().size(), 1u);
  const Copy2D& c = p.copies_2d()[0];
  EXPECT_EQ(c.width, 64u);
  EXPECT_EQ(c.height, 4u);
  EXPECT_EQ(c.spitch, 1000u);
  EXPECT_EQ(c.dpitch, 500u);
  EXPECT_EQ(c.depth, 1u);
  EXPECT_TRUE(p.sizes().empty());
}

// Pages taken from a free list come out in descending order as often as ascending: a piece right
// before the run extends it backwards.
TEST(DmaPlanTest, PiecesInDescendingOrderMergeIntoOneRun) {
  std::vector<std::byte> src(1024), dst(1024);
  CopyPlanner p;
  p.Reset(kMaxPitch);
  for (int piece = 3; piece >= 0; --piece) {
    p.Add(src.data() + piece * 64, dst.data() + 256 + piece * 64, 64, 0);
  }
  p.Finish();
  ASSERT_EQ(p.sizes().size(), 1u);
  EXPECT_EQ(p.srcs()[0], src.data());
  EXPECT_EQ(p.dsts()[0], dst.data() + 256);
  EXPECT_EQ(p.sizes()[0], 256u);
}

// Rows at a constant pitch, highest first: one strided copy whose first row is the lowest, with
// positive pitches; a row that breaks the fall starts a new group.
TEST(DmaPlanTest, RunsFallingAtAConstantPitchGroupIntoOneStridedCopyFromTheLowestRow) {
  std::vector<std::byte> src(16384), dst(16384);
  CopyPlanner p;
  p.Reset(kMaxPitch);
  for (int row = 5; row >= 1; --row) {
    p.Add(src.data() + row * 1000, dst.data() + row * 500, 64, 0);
  }
  p.Add(src.data() + 9000, dst.data() + 4500, 64, 0);  // rises: not the group's next row
  p.Finish();
  ASSERT_EQ(p.copies_2d().size(), 1u);
  const Copy2D& c = p.copies_2d()[0];
  EXPECT_EQ(c.src, src.data() + 1000);
  EXPECT_EQ(c.dst, dst.data() + 500);
  EXPECT_EQ(c.width, 64u);
  EXPECT_EQ(c.height, 5u);
  EXPECT_EQ(c.spitch, 1000u);
  EXPECT_EQ(c.dpitch, 500u);
  ASSERT_EQ(p.sizes().size(), 1u);
  EXPECT_EQ(p.srcs()[0], src.data() + 9000);
}

// Any order of a load's pages (rising, falling, shuffled; K and V pieces of every layer of a
// page_first page into a layer_first pool) moves exactly the bytes of copying piece by piece, and
// a falling order plans as few copies as a rising one.
TEST(DmaPlanTest, AnyPageOrderMovesTheSameBytesAndFallingPlansAsFewCopiesAsRising) {
  constexpr int kPages = 32, kLayers = 4;
  constexpr size_t kPiece = 256;                      // one layer's K (or V) of a page
  constexpr size_t kHostPage = kLayers * 2 * kPiece;  // page_first: all layers together
  constexpr size_t kDeviceLayer = kPages * kPiece;    // layer_first: a layer's pages
  std::vector<std::byte> host(kPages * kHostPage), device(kLayers * 2 * kDeviceLayer);
  std::mt19937 rng(7);
  for (auto& b : host) b = static_cast<std::byte>(rng());
  auto plan = [&](const std::vector<int>& host_pages, const std::vector<int>& device_pages,
                  std::vector<std::byte>* out) {
    CopyPlanner p;
    p.Reset(kMaxPitch);
    for (int layer = 0; layer < kLayers; ++layer) {
      for (int kv = 0; kv < 2; ++kv) {
        for (size_t i = 0; i < host_pages.size(); ++i) {
          const std::byte* s = host.data() + host_pages[i] * kHostPage + (layer * 2 + kv) * kPiece;
          std::byte* d = out->data() + (layer * 2 + kv) * kDeviceLayer + device_pages[i] * kPiece;
          p.Add(s, d, kPiece, 0);
        }
      }
    }
    p.Finish();
    Execute(p);
    return p.sizes().size() + p.copies_2d().size();
  };
  std::vector<int> rising(kPages), falling(kPages), shuffled(kPages);
  for (int i = 0; i < kPages; ++i) rising[i] = i, falling[i] = kPages - 1 - i, shuffled[i] = i;
  std::shuffle(shuffled.begin(), shuffled.end(), rng);
  for (const auto& order : {rising, falling, shuffled}) {
    std::vector<std::byte> want(device.size(), std::byte{0xEE}),
        got(device.size(), std::byte{0xEE});
    for (int layer = 0; layer < kLayers; ++layer) {
      for (int kv = 0; kv < 2; ++kv) {
        for (int i = 0; i < kPages; ++i) {
          std::memcpy(want.data() + (layer * 2 + kv) * kDeviceLayer + order[i] * kPiece,
                      host.data() + order[i] * kHostPage + (layer * 2 + kv) * kPiece, kPiece);
        }
      }
    }
    plan(order, order, &got);
    EXPECT_EQ(got, want);
  }
  std::vector<std::byte> scratch(device.size());
  const size_t up = plan(rising, rising, &scratch);
  const size_t down = plan(falling, falling, &scratch);
  EXPECT_EQ(up, static_cast<size_t>(kLayers * 2));  // one strided copy per layer and buffer
  EXPECT_EQ(down, up);
}

TEST(DmaPlanTest, APitchAtTheDeviceLimitIsNotGrouped) {
  std::vector<std::byte> src(4096), dst(4096);
  CopyPlanner p;
  p.Reset(1000);  // max pitch: pitches of 1000 or more do not group
  for (int row = 0; row < 3; ++row) p.Add(src.data() + row * 1000, dst.data() + row * 100, 64, 0);
  p.Finish();
  EXPECT_TRUE(p.copies_2d().empty());
  EXPECT_EQ(p.sizes().size(), 3u);
}

// Two strided copies of the same shape, the second some bytes after the first on each side.
struct JoinCase {
  ptrdiff_t s_offset;  // bytes from the first copy's source to the second's
  ptrdiff_t d_offset;
  size_t second_width;
  bool merge_depth;
  bool joins;
};

TEST(DmaPlanTest, TwoStridedCopiesJoinOnlyWhenTheSecondIsWholeRowsAfterTheFirstOnBothSides) {
  constexpr size_t kWidth = 48, kSPitch = 256, kDPitch = 128, kHeight = 3;
  const JoinCase cases[] = {
      {8 * kSPitch, 5 * kDPitch, kWidth, true, true},        // V whole layers after K: joined
      {3 * kSPitch, 3 * kDPitch, kWidth, true, true},        // exactly `height` rows after: joined
      {2 * kSPitch, 5 * kDPitch, kWidth, true, false},       // blocks would overlap on the source
      {8 * kSPitch + 16, 5 * kDPitch, kWidth, true, false},  // not a whole number of rows
      {8 * kSPitch, 5 * kDPitch + 16, kWidth, true, false},
      {-8 * static_cast<ptrdiff_t>(kSPitch), 5 * kDPitch, kWidth, true, false},  // before
      {8 * kSPitch, 5 * kDPitch, kWidth - 16, true, false},                      // another shape
      {8 * kSPitch, 5 * kDPitch, kWidth, false, false},  // joining turned off
  };
  for (const JoinCase& jc : cases) {
    SCOPED_TRACE(::testing::Message()
                 << "s_offset " << jc.s_offset << " d_offset " << jc.d_offset << " width "
                 << jc.second_width << " merge " << jc.merge_depth);
    std::vector<std::byte> src(16 * kSPitch * 4), dst(16 * kDPitch * 4);
    std::mt19937_64 rng(7);
    for (auto& b : src) b = static_cast<std::byte>(rng());
    std::byte* s0 = src.data() + 8 * kSPitch;  // room before, for the negative offset
    std::byte* d0 = dst.data() + 8 * kDPitch;
    const Copy2D first{s0, d0, kWidth, kSPitch, kDPitch, kHeight, 1, kHeight, kHeight};
    const Copy2D second{
        s0 + jc.s_offset, d0 + jc.d_offset, jc.second_width, kSPitch, kDPitch, kHeight, 1,
        kHeight,          kHeight};
    CopyPlanner p;
    p.Reset(kMaxPitch);
    p.AddStrided(first, jc.merge_depth);
    p.AddStrided(second, jc.merge_depth);
    p.Finish();
    ASSERT_EQ(p.copies_2d().size(), jc.joins ? 1u : 2u);
    if (jc.joins) {
      const Copy2D& c = p.copies_2d()[0];
      EXPECT_EQ(c.depth, 2u);
      EXPECT_EQ(c.s_layer_height * kSPitch, static_cast<size_t>(jc.s_offset));
      EXPECT_EQ(c.d_layer_height * kDPitch, static_cast<size_t>(jc.d_offset));
    }
    // The plan moves exactly the bytes of the two copies.
    CopyPlanner reference;
    reference.Reset(kMaxPitch);
    reference.AddStrided(first, false);
    reference.AddStrided(second, false);
    reference.Finish();
    Execute(p);
    const std::vector<std::byte> planned = dst;
    std::fill(dst.begin(), dst.end(), std::byte{0});
    Execute(reference);
    EXPECT_TRUE(planned == dst) << "the plan moved other bytes than the two copies";
  }
}

TEST(DmaPlanTest, AThirdCopyNeverJoinsADepthTwoCopy) {
  constexpr size_t kWidth = 32, kPitch = 64, kHeight = 2;
  std::vector<std::byte> src(64 * kPitch), dst(64 * kPitch);
  CopyPlanner p;
  p.Reset(kMaxPitch);
  for (int k = 0; k < 3; ++k) {
    p.AddStrided(Copy2D{src.data() + k * 4 * kPitch, dst.data() + k * 4 * kPitch, kWidth, kPitch,
                        kPitch, kHeight, 1, kHeight, kHeight},
                 true);
  }
  p.Finish();
  ASSERT_EQ(p.copies_2d().size(), 2u);
  EXPECT_EQ(p.copies_2d()[0].depth, 2u);
  EXPECT_EQ(p.copies_2d()[1].depth, 1u);
}

TEST(DmaPlanTest, PiecesBeforeAStridedCopyAreFlushedFirst) {
  std::vector<std::byte> src(4096), dst(4096);
  CopyPlanner p;
  p.Reset(kMaxPitch);
  p.Add(src.data(), dst.data(), 16, 0);
  p.AddStrided(Copy2D{src.data() + 1024, dst.data() + 1024, 32, 128, 128, 4, 1, 4, 4}, true);
  p.Add(src.data() + 64, dst.data() + 64, 16, 0);
  p.Finish();
  EXPECT_EQ(p.sizes().size(), 2u);
  EXPECT_EQ(p.copies_2d().size(), 1u);
}

}  // namespace
}  // namespace kvtier::transfer::cuda
