// HostTier: the local tier (the cache's own pool) and the shared tier (a segment: pages published
// by key, found by others, pinned while held, busy while another process writes).
#include "cache/host_tier.h"

#include <gtest/gtest.h>

#include <vector>

#include "kvtier/page_key.h"
#include "pool/shared_host_pool_test_util.h"

namespace kvtier {
namespace {

using testing::ScopedSegmentName;

constexpr int64_t kLayers = 2;
constexpr int64_t kSlotBytes = 8;
constexpr int64_t kPage = 4;

KvGeometry Geometry(int64_t pages, KvLayout layout) {
  return KvGeometry{layout, kLayers, pages * kPage, kSlotBytes, kPage, 1};
}

std::unique_ptr<HostTier> Local(int64_t pages) {
  HostKvPoolConfig c;
  c.geometry = Geometry(pages, KvLayout::kPageFirst);
  c.capacity_bytes = pages * kPage * kLayers * kSlotBytes * 2;
  auto pool = HostKvPool::Create(c);
  EXPECT_TRUE(pool.ok()) << pool.status().ToString();
  return MakeLocalHostTier(std::move(*pool));
}

std::vector<PageKey> Keys(int64_t pages, Token base) {
  std::vector<Token> tokens(static_cast<size_t>(pages * kPage));
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = base + static_cast<Token>(i);
  auto k = ComputePromptPageKeys(tokens, kPage, "");
  EXPECT_TRUE(k.ok());
  return *k;
}

TEST(HostTierTest, LocalTierAllocatesWritablePagesAndReleasesThem) {
  auto t = Local(4);
  EXPECT_FALSE(t->shared());
  EXPECT_EQ(t->num_pages(), 4);
  auto got = t->Acquire(3, {});
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  ASSERT_EQ(got->size(), 3u);
  std::vector<int64_t> starts;
  for (const auto& p : *got) {
    EXPECT_EQ(p.got, HostTier::Got::kWrite);
    EXPECT_TRUE(t->Holds(p.start));
    starts.push_back(p.start);
  }
  EXPECT_EQ(t->held_pages(), 3);
  EXPECT_EQ(t->free_pages(), 1);
  EXPECT_EQ(t->Acquire(2, {}).status().code(), StatusCode::kOutOfMemory);
  EXPECT_TRUE(t->Publish(starts).ok());
  EXPECT_TRUE(t->Abandon(std::vector<int64_t>{starts[0]}).ok());
  EXPECT_TRUE(t->Release(std::vector<int64_t>{starts[1], starts[2]}).ok());
  EXPECT_EQ(t->held_pages(), 0);
  EXPECT_FALSE(t->Holds(starts[1]));
  EXPECT_FALSE(t->Release(std::vector<int64_t>{starts[1]}).ok());  // not held
  auto found = t->FindPrefix(Keys(2, 1), 2);
  ASSERT_TRUE(found.ok());
  EXPECT_TRUE(found->empty());  // the local tier finds nothing by key
}

TEST(HostTierTest, SharedTierPublishesByKeyAndAnotherCacheFindsThePages) {
  ScopedSegmentName name("host-tier");
  SharedHostPoolConfig c;
  c.name = name.get();
  c.geometry = Geometry(8, KvLayout::kPageFirst);
  c.register_with_cuda = false;
  auto created = SharedHostPool::Create(c);
  ASSERT_TRUE(created.ok()) << created.status().ToString();
  std::shared_ptr<SharedHostPool> pool(std::move(*created));
  KvRegion device;
  device.geometry = Geometry(16, KvLayout::kLayerFirst);
  const int64_t page_bytes = kPage * kLayers * kSlotBytes * 2;
  auto a = OpenSharedHostTier(pool, device, false, "model", 4 * page_bytes);
  auto b = OpenSharedHostTier(pool, device, false, "model", 4 * page_bytes);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  ASSERT_TRUE(b.ok());
  EXPECT_TRUE((*a)->shared());
  EXPECT_EQ((*a)->num_pages(), 4);  // the budget, not the segment
  const auto keys = Keys(3, 10);
  EXPECT_EQ((*a)->Acquire(3, std::span<const PageKey>(keys).first(2)).status().code(),
            StatusCode::kInvalidArgument);  // one key per page
  auto got = (*a)->Acquire(3, keys);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  std::vector<int64_t> starts;
  for (const auto& p : *got) {
    ASSERT_EQ(p.got, HostTier::Got::kWrite);
    starts.push_back(p.start);
  }
  // Being written: b cannot take the same keys yet, and finds nothing.
  auto busy = (*b)->Acquire(1, std::span<const PageKey>(keys).first(1));
  ASSERT_TRUE(busy.ok());
  EXPECT_EQ((*busy)[0].got, HostTier::Got::kBusy);
  EXPECT_TRUE((*b)->FindPrefix(keys, 3)->empty());
  ASSERT_TRUE((*a)->Publish(starts).ok());
  // Published: b finds the prefix (at most what it asks for) and holds it.
  auto found = (*b)->FindPrefix(keys, 2);
  ASSERT_TRUE(found.ok());
  EXPECT_EQ(*found, (std::vector<int64_t>{starts[0], starts[1]}));
  EXPECT_EQ((*b)->held_pages(), 2);
  EXPECT_TRUE((*b)->Holds(starts[0]));
  // a's key acquired again by b: the page holds the bytes already.
  auto ready = (*b)->Acquire(1, std::span<const PageKey>(keys).subspan(2, 1));
  ASSERT_TRUE(ready.ok());
  EXPECT_EQ((*ready)[0].got, HostTier::Got::kReady);
  EXPECT_EQ((*ready)[0].start, starts[2]);
  EXPECT_TRUE((*b)->Release(std::vector<int64_t>{starts[0], starts[1], starts[2]}).ok());
  EXPECT_EQ((*b)->held_pages(), 0);
  EXPECT_TRUE((*a)->Release(starts).ok());
}

}  // namespace
}  // namespace kvtier
