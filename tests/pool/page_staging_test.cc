// PageStaging against the real memory backend: a layer_first pool's pages are stored in
// page_first order (K of the page, then V; checked against an independent computation), come back
// into another layer_first pool byte for byte, and a miss leaves the pool's bytes alone; a
// page_first pool's pages go straight from and to its memory; MLA has one buffer.
#include "pool/page_staging.h"

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "kvtier/storage.h"

namespace kvtier::storage {
namespace {

constexpr int64_t kLayers = 3, kSlots = 16, kSlotBytes = 8, kPage = 4;

// A host region over vectors it owns; byte (buffer b, layer l, slot i, j) = a function of all four.
struct Pool {
  std::vector<std::byte> k, v;
  KvRegion region;
  Pool(KvLayout layout, bool mla) {
    const size_t bytes = static_cast<size_t>(kLayers * kSlots * kSlotBytes);
    k.assign(bytes, std::byte{0xEE});
    if (!mla) v.assign(bytes, std::byte{0xEE});
    region.geometry = KvGeometry{layout, kLayers, kSlots, kSlotBytes, kPage, 1};
    region.mla = mla;
    region.k = k.data();
    region.v = mla ? nullptr : v.data();
  }
  std::byte* At(int b, int64_t layer, int64_t slot) const {
    return region.LayerBase(b, layer) + region.LayerOffset(layer, slot, 0);
  }
  static std::byte Expected(int b, int64_t layer, int64_t slot, int64_t j) {
    return static_cast<std::byte>(b * 101 + layer * 37 + slot * 11 + j);
  }
  void Fill() {
    for (int b = 0; b < region.num_buffers(); ++b) {
      for (int64_t l = 0; l < kLayers; ++l) {
        for (int64_t i = 0; i < kSlots; ++i) {
          for (int64_t j = 0; j < kSlotBytes; ++j) At(b, l, i)[j] = Expected(b, l, i, j);
        }
      }
    }
  }
  // The page starting at `start`, as a page_first pool of this geometry would store it.
  std::vector<std::byte> PageFirstBytes(int64_t start) const {
    std::vector<std::byte> out;
    for (int b = 0; b < region.num_buffers(); ++b) {
      for (int64_t t = 0; t < kPage; ++t) {
        for (int64_t l = 0; l < kLayers; ++l) {
          for (int64_t j = 0; j < kSlotBytes; ++j) out.push_back(Expected(b, l, start + t, j));
        }
      }
    }
    return out;
  }
  // Whether the page at `start` holds what slot `from`'s page held in a Fill()ed pool.
  bool PageHolds(int64_t start, int64_t from) const {
    for (int b = 0; b < region.num_buffers(); ++b) {
      for (int64_t l = 0; l < kLayers; ++l) {
        for (int64_t t = 0; t < kPage; ++t) {
          for (int64_t j = 0; j < kSlotBytes; ++j) {
            if (At(b, l, start + t)[j] != Expected(b, l, from + t, j)) return false;
          }
        }
      }
    }
    return true;
  }
  bool PageUntouched(int64_t start) const {
    for (int b = 0; b < region.num_buffers(); ++b) {
      for (int64_t l = 0; l < kLayers; ++l) {
        for (int64_t t = 0; t < kPage; ++t) {
          for (int64_t j = 0; j < kSlotBytes; ++j) {
            if (At(b, l, start + t)[j] != std::byte{0xEE}) return false;
          }
        }
      }
    }
    return true;
  }
};

std::unique_ptr<StorageBackend> MemoryStore(KvLayout layout, bool mla) {
  StorageNamespace ns;
  ns.model_id = "staging-test";
  ns.layout = layout;
  ns.mla = mla;
  ns.num_layers = kLayers;
  ns.slot_bytes = kSlotBytes;
  ns.page_size = kPage;
  auto b = OpenStorage("memory://?capacity=1MiB", ns);
  EXPECT_TRUE(b.ok()) << b.status().ToString();
  return std::move(*b);
}

std::vector<PageKey> Keys(int n) {
  std::vector<int32_t> tokens(static_cast<size_t>(n * kPage));
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>(i + 5);
  return *ComputePromptPageKeys(tokens, kPage);
}

BatchResult Await(std::function<void(std::function<void(BatchResult)>)> call) {
  std::promise<BatchResult> p;
  auto f = p.get_future();
  call([&p](BatchResult r) { p.set_value(std::move(r)); });
  return f.get();
}

class PageStagingTest : public ::testing::TestWithParam<bool> {};  // MLA or not

TEST_P(PageStagingTest, LayerFirstPagesAreStoredInPageFirstOrderAndScatteredBack) {
  const bool mla = GetParam();
  Pool src(KvLayout::kLayerFirst, mla), dst(KvLayout::kLayerFirst, mla);
  src.Fill();
  auto store = MemoryStore(KvLayout::kLayerFirst, mla);
  auto from = PageStaging::Create(src.region);
  auto to = PageStaging::Create(dst.region);
  ASSERT_TRUE(from.ok() && to.ok());
  EXPECT_FALSE((*from)->zero_copy());
  EXPECT_EQ((*from)->page_bytes(), store->ns().page_bytes());
  const auto keys = Keys(3);
  const std::vector<int64_t> starts = {8, 0};  // out of order on purpose
  BatchResult set = Await([&](auto done) {
    (*from)->SetAsync(*store, {keys[0], keys[1]}, starts, std::move(done));
  });
  ASSERT_TRUE(set.status.ok()) << set.status.ToString();
  ASSERT_EQ(set.leading_ok(), 2);
  // What the store holds, read with plain buffers: the page_first order of each page.
  for (size_t i = 0; i < 2; ++i) {
    std::vector<std::byte> raw(static_cast<size_t>(store->ns().page_bytes()), std::byte{0});
    ASSERT_EQ(store->Get({keys[i]}, {PageBuffer::Of(raw)}).get().leading_ok(), 1);
    EXPECT_EQ(raw, src.PageFirstBytes(starts[i])) << "page " << i;
  }
  // Back into another pool: keys[1] (slot 0's page) to slot 12, keys[0] (slot 8's) to slot 4,
  // and keys[2], never stored, to slot 0: a miss that leaves that page as it was.
  BatchResult get = Await([&](auto done) {
    (*to)->GetAsync(*store, {keys[1], keys[0], keys[2]}, std::vector<int64_t>{12, 4, 0},
                    std::move(done));
  });
  ASSERT_TRUE(get.status.ok());
  EXPECT_EQ(get.pages,
            (std::vector<PageStatus>{PageStatus::kOk, PageStatus::kOk, PageStatus::kAbsent}));
  EXPECT_TRUE(dst.PageHolds(12, 0));
  EXPECT_TRUE(dst.PageHolds(4, 8));
  EXPECT_TRUE(dst.PageUntouched(0));
  EXPECT_TRUE(dst.PageUntouched(8));
  // Staging buffers are reused: many more calls than the few kept, all still exact.
  for (int round = 0; round < 10; ++round) {
    Pool again(KvLayout::kLayerFirst, mla);
    auto into = PageStaging::Create(again.region);
    ASSERT_TRUE(into.ok());
    for (int64_t start : {0, 4, 8, 12}) {
      BatchResult r = Await([&](auto done) {
        (*into)->GetAsync(*store, {keys[round % 2]}, std::vector<int64_t>{start}, std::move(done));
      });
      ASSERT_EQ(r.leading_ok(), 1);
      EXPECT_TRUE(again.PageHolds(start, round % 2 == 0 ? 8 : 0));
    }
  }
}

TEST_P(PageStagingTest, PageFirstPagesGoStraightFromAndToThePool) {
  const bool mla = GetParam();
  Pool src(KvLayout::kPageFirst, mla), dst(KvLayout::kPageFirst, mla);
  src.Fill();
  auto store = MemoryStore(KvLayout::kPageFirst, mla);
  auto from = PageStaging::Create(src.region);
  auto to = PageStaging::Create(dst.region);
  ASSERT_TRUE(from.ok() && to.ok());
  EXPECT_TRUE((*from)->zero_copy());
  const auto keys = Keys(1);
  ASSERT_EQ(Await([&](auto done) {
              (*from)->SetAsync(*store, {keys[0]}, std::vector<int64_t>{4}, std::move(done));
            }).leading_ok(),
            1);
  std::vector<std::byte> raw(static_cast<size_t>(store->ns().page_bytes()));
  ASSERT_EQ(store->Get({keys[0]}, {PageBuffer::Of(raw)}).get().leading_ok(), 1);
  EXPECT_EQ(raw, src.PageFirstBytes(4));  // page_first: the pool's own bytes of the page
  ASSERT_EQ(Await([&](auto done) {
              (*to)->GetAsync(*store, {keys[0]}, std::vector<int64_t>{8}, std::move(done));
            }).leading_ok(),
            1);
  EXPECT_TRUE(dst.PageHolds(8, 4));
  EXPECT_TRUE(dst.PageUntouched(0));
}

TEST(PageStagingTest, DeviceRegionIsRefused) {
  Pool p(KvLayout::kLayerFirst, false);
  p.region.memory = MemoryKind::kDevice;
  auto s = PageStaging::Create(p.region);
  ASSERT_FALSE(s.ok());
  EXPECT_TRUE(s.status().IsInvalidArgument());
  EXPECT_NE(s.status().message().find("host memory"), std::string::npos);
}

INSTANTIATE_TEST_SUITE_P(Kinds, PageStagingTest, ::testing::Values(false, true),
                         [](const auto& info) { return std::string(info.param ? "mla" : "mha"); });

}  // namespace
}  // namespace kvtier::storage
