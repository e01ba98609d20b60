// CopyDensePaged (kvtier/dense_paged.h) on host memory: scatter then gather over every pool
// layout, base pointers and per-layer tables, MHA and MLA, element sizes 1/2/4/8, random dense
// strides (dimensions permuted in memory, padded, head_dim contiguous or not), int32 and int64
// slot lists, batch 0..2 and seq 0..9, against a reference that reads and writes bytes through
// KvGeometry::HeadOffset; poisoned destinations and whole-buffer comparisons show stray writes.
// And every argument check names its argument.
#include "kvtier/dense_paged.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "support/kv_test_util.h"

namespace kvtier {
namespace {

using testing::HostRegion;
using testing::kPoison;

// One dense tensor of `elem` byte elements [B, H, T, D] inside its own padded allocation.
struct DenseBuffer {
  std::vector<std::byte> bytes;
  DenseTensor tensor;
};

DenseBuffer RandomDense(std::mt19937_64& rng, const std::array<int64_t, 4>& shape, int64_t elem) {
  // Memory order of the dimensions, padding of each, and a head_dim step of 1 or 2 elements.
  std::array<int, 4> order = {0, 1, 2, 3};
  std::shuffle(order.begin(), order.end(), rng);
  const int64_t step = 1 + static_cast<int64_t>(rng() % 2);
  DenseBuffer d;
  int64_t stride = elem;
  for (int i = 3; i >= 0; --i) {
    const int dim = order[i];
    d.tensor.strides[dim] = dim == 3 ? stride * step : stride;
    const int64_t extent = (dim == 3 ? shape[dim] * step : shape[dim]) + int64_t(rng() % 2);
    stride *= std::max<int64_t>(extent, 1);
  }
  d.bytes.resize(static_cast<size_t>(stride));
  for (auto& b : d.bytes) b = static_cast<std::byte>(rng());
  d.tensor.data = d.bytes.data();
  return d;
}

std::byte* DenseElement(const DenseTensor& t, int64_t b, int64_t h, int64_t s, int64_t e) {
  return static_cast<std::byte*>(t.data) + b * t.strides[0] + h * t.strides[1] + s * t.strides[2] +
         e * t.strides[3];
}

// The pool byte of (buffer, layer, slot, dense head h, byte x of the head).
std::byte* PoolByte(const KvRegion& r, int buffer, int64_t layer, int64_t slot, int64_t h,
                    int64_t x, int64_t head_bytes) {
  const KvGeometry& g = r.geometry;
  const int64_t within = h * head_bytes + x;  // byte of the slot, heads in order
  const int64_t chunk = g.layout == KvLayout::kPageHead ? within / g.head_bytes() : 0;
  const int64_t offset = g.layout == KvLayout::kPageHead ? within % g.head_bytes() : within;
  return r.LayerBase(buffer, layer) + r.LayerOffset(layer, slot, chunk) + offset;
}

struct Case {
  KvLayout layout;
  bool mla;
  bool table;
  int64_t elem;
};

class DensePagedTest : public ::testing::TestWithParam<Case> {};

TEST_P(DensePagedTest, ScatterThenGatherByteForByte) {
  const Case c = GetParam();
  const uint64_t seed = testing::TestSeed() ^ (static_cast<uint64_t>(c.layout) << 4) ^
                        (uint64_t{c.mla} << 8) ^ (uint64_t{c.table} << 9) ^ (c.elem << 12);
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  for (int trial = 0; trial < 12; ++trial) {
    SCOPED_TRACE(::testing::Message() << "trial " << trial);
    const int64_t heads = c.mla ? 1 : 2;
    const int64_t head_dim = 16 / c.elem * (1 + static_cast<int64_t>(rng() % 2));
    const int64_t head_bytes = head_dim * c.elem;
    KvGeometry g;
    g.layout = c.layout;
    g.num_layers = 4;
    g.page_size = 4;
    g.num_slots = 48;
    g.slot_bytes = heads * head_bytes;
    g.head_num = c.layout == KvLayout::kPageHead ? heads : 1;
    HostRegion pool(g, c.mla, c.table && c.layout == KvLayout::kLayerFirst);
    pool.Fill(kPoison);
    const KvRegion& r = pool.region();

    const int64_t batch = static_cast<int64_t>(rng() % 3);
    const int64_t seq = static_cast<int64_t>(rng() % 10);
    const int64_t first_layer = static_cast<int64_t>(rng() % 4);
    const int64_t layers = 1 + static_cast<int64_t>(rng() % (4 - first_layer));
    std::vector<int64_t> order(g.num_slots);
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng);
    std::vector<int64_t> slots64(order.begin(), order.begin() + batch * seq);
    std::vector<int32_t> slots32(slots64.begin(), slots64.end());
    const SlotIndices slots = trial % 2 ? SlotIndices::Host(std::span<const int32_t>(slots32))
                                        : SlotIndices::Host(std::span<const int64_t>(slots64));

    const std::array<int64_t, 4> shape = {batch, heads, seq, head_dim};
    std::vector<DenseBuffer> src;
    for (int64_t i = 0; i < layers * r.num_buffers(); ++i) {
      src.push_back(RandomDense(rng, shape, c.elem));
    }
    auto tensors = [&](const std::vector<DenseBuffer>& v, int buffer) {
      std::vector<DenseTensor> out;
      for (int64_t i = 0; i < layers; ++i) out.push_back(v[buffer * layers + i].tensor);
      return out;
    };
    const std::vector<DenseTensor> k = tensors(src, 0);
    const std::vector<DenseTensor> v = c.mla ? std::vector<DenseTensor>{} : tensors(src, 1);
    DenseKv dense{batch, heads, seq, head_dim, c.elem, MemoryKind::kHost, -1, k, v};
    ASSERT_TRUE(CopyDensePaged(r, slots, dense, first_layer, DenseDirection::kToPool).ok());

    // The reference: the same bytes written into a poisoned copy of the pool.
    HostRegion want_pool(g, c.mla, c.table && c.layout == KvLayout::kLayerFirst);
    want_pool.Fill(kPoison);
    for (int buffer = 0; buffer < r.num_buffers(); ++buffer) {
      for (int64_t i = 0; i < layers; ++i) {
        const DenseTensor& t = src[buffer * layers + i].tensor;
        for (int64_t b = 0; b < batch; ++b) {
          for (int64_t s = 0; s < seq; ++s) {
            for (int64_t h = 0; h < heads; ++h) {
              for (int64_t x = 0; x < head_bytes; ++x) {
                *PoolByte(want_pool.region(), buffer, first_layer + i, slots64[b * seq + s], h, x,
                          head_bytes) = *(DenseElement(t, b, h, s, x / c.elem) + x % c.elem);
              }
            }
          }
        }
      }
    }
    ASSERT_EQ(pool.Snapshot(), want_pool.Snapshot());

    // Gather into poisoned tensors of other strides: the dense bytes come back.
    std::vector<DenseBuffer> out;
    for (int64_t i = 0; i < layers * r.num_buffers(); ++i) {
      out.push_back(RandomDense(rng, shape, c.elem));
    }
    const std::vector<DenseTensor> ok = tensors(out, 0);
    const std::vector<DenseTensor> ov = c.mla ? std::vector<DenseTensor>{} : tensors(out, 1);
    DenseKv back{batch, heads, seq, head_dim, c.elem, MemoryKind::kHost, -1, ok, ov};
    ASSERT_TRUE(CopyDensePaged(r, slots, back, first_layer, DenseDirection::kFromPool).ok());
    for (size_t n = 0; n < out.size(); ++n) {
      for (int64_t b = 0; b < batch; ++b) {
        for (int64_t h = 0; h < heads; ++h) {
          for (int64_t s = 0; s < seq; ++s) {
            for (int64_t e = 0; e < head_dim; ++e) {
              ASSERT_EQ(std::memcmp(DenseElement(out[n].tensor, b, h, s, e),
                                    DenseElement(src[n].tensor, b, h, s, e), c.elem),
                        0);
            }
          }
        }
      }
    }
  }
}

std::vector<Case> AllCases() {
  std::vector<Case> cases;
  for (KvLayout layout : {KvLayout::kLayerFirst, KvLayout::kPageFirst, KvLayout::kPageFirstDirect,
                          KvLayout::kPageHead}) {
    for (bool mla : {false, true}) {
      for (bool table : {false, true}) {
        if (table && layout != KvLayout::kLayerFirst) continue;
        for (int64_t elem : {1, 2, 4, 8}) cases.push_back({layout, mla, table, elem});
      }
    }
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Matrix, DensePagedTest, ::testing::ValuesIn(AllCases()),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           const Case& c = info.param;
                           return std::string(LayoutName(c.layout)) + (c.mla ? "_mla" : "_mha") +
                                  (c.table ? "_table" : "") + "_" + std::to_string(c.elem) + "B";
                         });

TEST(DensePagedValidationTest, EveryCheckNamesItsArgument) {
  KvGeometry g;
  g.num_layers = 2;
  g.num_slots = 16;
  g.slot_bytes = 16;
  g.page_size = 4;
  HostRegion pool(g, /*mla=*/false);
  HostRegion mla_pool(g, /*mla=*/true);
  std::vector<std::byte> bytes(1024);
  const DenseTensor t{bytes.data(), {256, 128, 16, 2}};  // [1, 2, 4, 4] of 2-byte elements
  const std::vector<DenseTensor> two = {t, t};
  const std::vector<DenseTensor> one = {t};
  std::vector<int64_t> slots = {0, 1, 2, 3};
  auto run = [&](const KvRegion& r, DenseKv d, int64_t first_layer = 0,
                 std::vector<int64_t> s = {0, 1, 2, 3}) {
    slots = s;
    return CopyDensePaged(r, SlotIndices::Host(std::span<const int64_t>(slots)), d, first_layer,
                          DenseDirection::kToPool);
  };
  const DenseKv good{1, 2, 4, 4, 2, MemoryKind::kHost, -1, two, two};
  EXPECT_TRUE(run(pool.region(), good).ok());
  struct Bad {
    DenseKv dense;
    int64_t first_layer;
    std::vector<int64_t> slots;
    const char* message;
  };
  const std::vector<Bad> bad = {
      {{1, 2, 4, 4, 2, MemoryKind::kHost, -1, {}, {}}, 0, {0, 1, 2, 3}, "k has no layers"},
      {{1, 2, 4, 4, 2, MemoryKind::kHost, -1, two, one}, 0, {0, 1, 2, 3}, "v has 1 layers"},
      {good, 1, {0, 1, 2, 3}, "first_layer = 1"},
      {{1, 2, 4, 2, 2, MemoryKind::kHost, -1, two, two}, 0, {0, 1, 2, 3}, "slot_bytes = 16"},
      {{1, 2, 4, 4, 3, MemoryKind::kHost, -1, two, two}, 0, {0, 1, 2, 3}, "elem_bytes = 3"},
      {good, 0, {0, 1, 2}, "slots has 3 entries"},
      {good, 0, {0, 1, 2, 16}, "slots[3] = 16"},
      {{1, 2, 4, 4, 2, MemoryKind::kDevice, 0, two, two}, 0, {0, 1, 2, 3}, "same CUDA device"},
  };
  for (const Bad& b : bad) {
    const Status st = run(pool.region(), b.dense, b.first_layer, b.slots);
    EXPECT_TRUE(st.IsInvalidArgument()) << b.message;
    EXPECT_NE(st.message().find(b.message), std::string::npos) << st.ToString();
  }
  const Status mla = run(mla_pool.region(), good);
  EXPECT_NE(mla.message().find("pool is MLA"), std::string::npos) << mla.ToString();
  DenseTensor negative = t;
  negative.strides[2] = -16;
  const std::vector<DenseTensor> neg = {negative, negative};
  const Status st = run(pool.region(), {1, 2, 4, 4, 2, MemoryKind::kHost, -1, neg, neg});
  EXPECT_NE(st.message().find("k[0] has a negative stride"), std::string::npos) << st.ToString();
}

}  // namespace
}  // namespace kvtier
