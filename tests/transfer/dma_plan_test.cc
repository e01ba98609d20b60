// The dma backend's host-side plan (src/transfer/cuda/dma_plan.h): how slot runs are found
// (FindSlotRuns, plan_rules.h: the same runs as ContinuesRun pair by pair), how single copies are
// split over batch calls (BatchPieces), which pieces merge into runs, which runs group into
// strided copies, and when two strided copies join into one depth-2 copy. A joined copy must move
// exactly the bytes of the two copies it replaces: checked by running plans on host buffers and
// comparing with running the pieces one by one.
#include "transfer/cuda/dma_plan.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "transfer/plan_rules.h"

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

// The runs ContinuesRun gives pair by pair (the rule's definition).
std::vector<int64_t> RunsPairByPair(const SlotIndices& si, const SlotIndices& di, int64_t sp,
                                    int64_t dp) {
  std::vector<int64_t> starts;
  for (int64_t k = 0; k < si.count; ++k) {
    if (k == 0 || !ContinuesRun(si.at(k - 1), di.at(k - 1), si.at(k), di.at(k), sp, dp)) {
      starts.push_back(k);
    }
  }
  starts.push_back(si.count);
  return starts;
}

// Index lists made of runs of random lengths at random places (page-aligned or not, some of
// them continuing the previous run, some descending), so that runs end at page boundaries, at
// breaks on one side only and at the end of the list.
std::vector<int64_t> RandomRuns(std::mt19937_64& rng, int64_t n, int64_t slots, int64_t page) {
  std::vector<int64_t> v;
  std::uniform_int_distribution<int64_t> len(1, 3 * page + 2), at(0, slots - 1), kind(0, 5);
  while (static_cast<int64_t>(v.size()) < n) {
    const int64_t k = kind(rng);
    int64_t start = at(rng);
    if (k == 0) start -= start % page;               // page-aligned
    if (k == 1 && !v.empty()) start = v.back() + 1;  // continues the previous run
    if (k == 2 && !v.empty()) start = v.back();      // repeats a slot
    const int64_t l = len(rng);
    for (int64_t j = 0; j < l && static_cast<int64_t>(v.size()) < n; ++j) {
      v.push_back(k == 3 ? start - j : start + j);  // kind 3: descending
    }
  }
  return v;
}

TEST(DmaPlanTest, FindSlotRunsGivesTheRunsOfContinuesRunForAnyIndicesTypesAndPages) {
  std::mt19937_64 rng(37);
  for (int trial = 0; trial < 400; ++trial) {
    const int64_t page = std::vector<int64_t>{1, 2, 3, 16, 64}[trial % 5];
    const int64_t n = trial % 7 == 0 ? trial % 3 : 1 + static_cast<int64_t>(rng() % 700);
    const std::vector<int64_t> s64 = RandomRuns(rng, n, 5000, page);
    // The destination mostly follows the source (runs continue on both sides), with breaks.
    std::vector<int64_t> d64 = s64;
    for (auto& d : d64) d += 1000;
    for (int64_t b = 0; b < n / 50; ++b) d64[rng() % n] += 7;
    if (trial % 4 == 3) d64 = RandomRuns(rng, n, 5000, page);
    const std::vector<int32_t> s32(s64.begin(), s64.end()), d32(d64.begin(), d64.end());
    const SlotIndices s[] = {SlotIndices::Host(std::span<const int64_t>(s64)),
                             SlotIndices::Host(std::span<const int32_t>(s32))};
    const SlotIndices d[] = {SlotIndices::Host(std::span<const int64_t>(d64)),
                             SlotIndices::Host(std::span<const int32_t>(d32))};
    for (const int64_t sp : {int64_t{0}, page}) {
      for (const int64_t dp : {int64_t{0}, page, page + 1}) {
        for (const SlotIndices& si : s) {
          for (const SlotIndices& di : d) {
            std::vector<int64_t> got = {-1};  // appended to, not cleared
            FindSlotRuns(si, di, sp, dp, &got);
            got.erase(got.begin());
            ASSERT_EQ(got, RunsPairByPair(si, di, sp, dp))
                << "trial " << trial << " n " << n << " pages " << sp << "/" << dp;
          }
        }
      }
    }
  }
}

TEST(DmaPlanTest, FindSlotRunsCutsAtEveryPageStartOfEitherSide) {
  // Slots 6..13 -> 30..37: one run without pages; cut wherever either side starts a page.
  std::vector<int64_t> s(8), d(8);
  for (int64_t k = 0; k < 8; ++k) s[k] = 6 + k, d[k] = 30 + k;
  const SlotIndices si = SlotIndices::Host(std::span<const int64_t>(s));
  const SlotIndices di = SlotIndices::Host(std::span<const int64_t>(d));
  std::vector<int64_t> runs;
  FindSlotRuns(si, di, 0, 0, &runs);
  EXPECT_EQ(runs, (std::vector<int64_t>{0, 8}));
  runs.clear();
  FindSlotRuns(si, di, 4, 0, &runs);  // source pages start at slots 8 and 12
  EXPECT_EQ(runs, (std::vector<int64_t>{0, 2, 6, 8}));
  runs.clear();
  FindSlotRuns(si, di, 4, 16, &runs);  // and the destination's at slot 32 (k = 2 too)
  EXPECT_EQ(runs, (std::vector<int64_t>{0, 2, 6, 8}));
  runs.clear();
  FindSlotRuns(si, di, 0, 8, &runs);  // destination pages start at slot 32
  EXPECT_EQ(runs, (std::vector<int64_t>{0, 2, 8}));
}

TEST(DmaPlanTest, BatchPiecesGrowFromTheFirstToTheCapAndEndWithoutAShortTail) {
  auto pieces = [](size_t count) {
    std::vector<size_t> out;
    BatchPieces p(count);
    for (size_t done = 0; done < count;) {
      out.push_back(p.Next());
      done += out.back();
    }
    EXPECT_EQ(p.Next(), 0u);
    return out;
  };
  EXPECT_EQ(pieces(2), (std::vector<size_t>{2}));
  EXPECT_EQ(pieces(24), (std::vector<size_t>{24}));
  EXPECT_EQ(pieces(25), (std::vector<size_t>{16, 9}));
  EXPECT_EQ(pieces(128), (std::vector<size_t>{16, 32, 32, 48}));  // MLA page-64 per-layer load
  EXPECT_EQ(pieces(256), (std::vector<size_t>{16, 32, 32, 32, 32, 32, 32, 48}));  // MHA
  EXPECT_EQ(pieces(2048),                                                         // cap 128
            (std::vector<size_t>{16, 32, 64, 128, 128, 128, 128, 128, 128, 128, 128, 128, 128, 128,
                                 128, 128, 128, 144}));
  for (size_t count = 2; count < 20000; count += count < 3000 ? 1 : 97) {
    const std::vector<size_t> p = pieces(count);
    const size_t cap = std::max<size_t>(32, count / 16);
    size_t sum = 0, want = kFirstBatchPiece;
    for (size_t i = 0; i < p.size(); ++i) {
      sum += p[i];
      if (i + 1 < p.size()) {
        EXPECT_EQ(p[i], want) << count;  // 16, 32, ... up to the cap
      } else {
        EXPECT_GE(p[i], std::min<size_t>(count, 9)) << count;  // never a short tail
        EXPECT_LE(2 * p[i], 3 * want) << count;
      }
      want = std::min(cap, 2 * want);
    }
    EXPECT_EQ(sum, count);
  }
}

// dma_first_batch_piece: the same growth from another first piece; the cap is at least twice
// the first piece (so a first piece of 64 leaves a 128-copy per-layer load in two calls).
TEST(DmaPlanTest, BatchPiecesStartAtTheConfiguredFirstPiece) {
  auto pieces = [](size_t count, size_t first) {
    std::vector<size_t> out;
    BatchPieces p(count, first);
    for (size_t done = 0; done < count;) {
      out.push_back(p.Next());
      EXPECT_GT(out.back(), 0u) << count << " " << first;
      if (out.back() == 0) break;
      done += out.back();
    }
    EXPECT_EQ(p.Next(), 0u);
    return out;
  };
  EXPECT_EQ(pieces(128, 64), (std::vector<size_t>{64, 64}));   // MLA page-64 per-layer load
  EXPECT_EQ(pieces(256, 64), (std::vector<size_t>{64, 192}));  // MHA page 64; MLA page 16's lanes
  EXPECT_EQ(pieces(96, 64), (std::vector<size_t>{96}));        // up to 1.5 pieces: one call
  EXPECT_EQ(pieces(2048, 64), (std::vector<size_t>{64, 128, 128, 128, 128, 128, 128, 128, 128, 128,
                                                   128, 128, 128, 128, 128, 192}));
  EXPECT_EQ(pieces(128, 16), pieces(128, kFirstBatchPiece));  // the default
  EXPECT_EQ(pieces(5, 1), (std::vector<size_t>{1, 2, 2}));
  EXPECT_EQ(pieces(5, 0), pieces(5, 1));  // 0 counts as 1: never a call of no copies
  EXPECT_EQ(pieces(1000, 1 << 20), (std::vector<size_t>{1000}));
  for (size_t first : {1, 3, 16, 64, 200}) {
    for (size_t count = 1; count < 5000; count += count < 600 ? 1 : 61) {
      const std::vector<size_t> p = pieces(count, first);
      const size_t cap = std::max<size_t>(2 * first, count / 16);
      size_t sum = 0, want = first;
      for (size_t i = 0; i < p.size(); ++i) {
        sum += p[i];
        if (i + 1 < p.size()) {
          EXPECT_EQ(p[i], want) << count << " " << first;
        }
        want = std::min(cap, 2 * want);
      }
      EXPECT_EQ(sum, count) << first;
    }
  }
}

// DmaBatchSplit::kWhole and a busy stream under kWholeWhenBusy: every copy in one call.
TEST(DmaPlanTest, WholeBatchIsOneCallAndOnlyWhereTheSplitSaysSo) {
  for (size_t count : {0, 1, 2, 128, 256, 8192, 100000}) {
    BatchPieces p = BatchPieces::Whole(count);
    EXPECT_EQ(p.Next(), count);
    EXPECT_EQ(p.Next(), 0u);
  }
  EXPECT_FALSE(WholeBatch(DmaBatchSplit::kGrowing, false));
  EXPECT_FALSE(WholeBatch(DmaBatchSplit::kGrowing, true));  // today's pieces, busy or not
  EXPECT_TRUE(WholeBatch(DmaBatchSplit::kWhole, false));
  EXPECT_TRUE(WholeBatch(DmaBatchSplit::kWhole, true));
  EXPECT_FALSE(WholeBatch(DmaBatchSplit::kWholeWhenBusy, false));  // idle: the early start
  EXPECT_TRUE(WholeBatch(DmaBatchSplit::kWholeWhenBusy, true));
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

// dma_stride_layers = false: each (run, layer) is one plain copy, even where the rows are a
// constant pitch apart (which Add would group) or contiguous with the piece before (which Add
// would merge); the pieces pending before it are flushed first, so the plan keeps call order.
TEST(DmaPlanTest, SingleCopiesNeitherMergeNorGroupAndKeepTheirOrder) {
  std::vector<std::byte> src(8192), dst(8192);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<std::byte>(i * 7 + 1);
  CopyPlanner p;
  p.Reset(kMaxPitch);
  p.Add(src.data() + 4096, dst.data() + 4096, 32, 0);
  for (int row = 0; row < 4; ++row) {
    p.AddSingle(src.data() + row * 1000, dst.data() + row * 500, 64);
  }
  p.AddSingle(src.data() + 3064, dst.data() + 1564, 64);  // right after the last row
  p.Finish();
  EXPECT_TRUE(p.copies_2d().empty());
  ASSERT_EQ(p.sizes().size(), 6u);
  EXPECT_EQ(p.srcs()[0], src.data() + 4096);
  for (int row = 0; row < 4; ++row) {
    EXPECT_EQ(p.srcs()[1 + row], src.data() + row * 1000);
    EXPECT_EQ(p.dsts()[1 + row], dst.data() + row * 500);
    EXPECT_EQ(p.sizes()[1 + row], 64u);
  }
  Execute(p);
  for (int row = 0; row < 4; ++row) {
    EXPECT_EQ(std::memcmp(dst.data() + row * 500, src.data() + row * 1000, 64), 0);
  }
  EXPECT_EQ(std::memcmp(dst.data() + 1564, src.data() + 3064, 64), 0);
}

}  // namespace
}  // namespace kvtier::transfer::cuda
