// Pinned pages in the stores: PagePins (counts, TTLs on an injected clock, lazy expiry), the file
// store's index skipping pinned pages (and dropping a new page rather than a pinned one), the
// memory store refusing a Set that finds no unpinned room, and backends that cannot pin saying so.
#include "storage/page_pins.h"

#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <vector>

#include "kvtier/storage.h"
#include "kvtier/testing/storage_fault.h"
#include "storage/file/file_index.h"

namespace kvtier::storage {
namespace {

PageKey Key(int i) {
  PageKey k{};
  k.bytes[0] = static_cast<uint8_t>(i);
  k.bytes[1] = static_cast<uint8_t>(i >> 8);
  return k;
}

struct FakeClock {
  std::shared_ptr<std::atomic<int64_t>> ns = std::make_shared<std::atomic<int64_t>>(1'000'000);
  std::function<PagePins::Clock::time_point()> fn() const {
    return [ns = ns] { return PagePins::Clock::time_point(std::chrono::nanoseconds(*ns)); };
  }
};

TEST(PagePinsTest, CountsPerKeyAndExpiresLazily) {
  FakeClock clock;
  PagePins pins(clock.fn());
  const std::vector<PageKey> ab = {Key(1), Key(2)};
  const std::vector<PageKey> b = {Key(2)};
  const uint64_t forever = pins.Add(ab, std::chrono::nanoseconds::max());
  const uint64_t short_pin = pins.Add(b, std::chrono::seconds(5));
  EXPECT_NE(forever, short_pin);
  EXPECT_TRUE(pins.Pinned(Key(1)));
  EXPECT_TRUE(pins.Pinned(Key(2)));
  EXPECT_FALSE(pins.Pinned(Key(3)));
  EXPECT_EQ(pins.pinned_keys(), 2);
  EXPECT_TRUE(pins.Remove(forever));
  EXPECT_FALSE(pins.Remove(forever)) << "removed twice";
  EXPECT_FALSE(pins.Pinned(Key(1)));
  EXPECT_TRUE(pins.Pinned(Key(2))) << "the other pin still names it";
  *clock.ns += 4'999'999'999;
  EXPECT_TRUE(pins.Pinned(Key(2)));
  *clock.ns += 1;
  EXPECT_FALSE(pins.Pinned(Key(2))) << "its TTL has run out";
  EXPECT_FALSE(pins.Remove(short_pin)) << "expired: not live";
  EXPECT_EQ(pins.pinned_keys(), 0);
}

TEST(PagePinsTest, FileIndexSkipsPinnedPagesAndDropsTheNewOneWhenAllArePinned) {
  PagePins pins;
  std::vector<PageKey> removed;
  FileIndex index(
      /*capacity=*/300, [&](const PageKey& k) { removed.push_back(k); },
      [&](const PageKey& k) { return pins.Pinned(k); });
  index.Put(Key(1), 100, index.NextStamp());
  index.Put(Key(2), 100, index.NextStamp());
  index.Put(Key(3), 100, index.NextStamp());
  const std::vector<PageKey> oldest = {Key(1), Key(2)};
  const uint64_t pin = pins.Add(oldest, std::chrono::nanoseconds::max());
  index.Put(Key(4), 100, index.NextStamp());  // LRU would take 1; it is pinned: 3 goes
  EXPECT_EQ(removed, std::vector<PageKey>({Key(3)}));
  EXPECT_TRUE(index.Contains(Key(1)) && index.Contains(Key(2)) && index.Contains(Key(4)));
  const std::vector<PageKey> newest = {Key(4)};
  const uint64_t pin4 = pins.Add(newest, std::chrono::nanoseconds::max());
  removed.clear();
  index.Put(Key(5), 100, index.NextStamp());  // everything else pinned: 5 itself goes
  EXPECT_EQ(removed, std::vector<PageKey>({Key(5)}));
  EXPECT_LE(index.bytes(), index.capacity());
  EXPECT_FALSE(index.Contains(Key(5)));
  ASSERT_TRUE(pins.Remove(pin));
  ASSERT_TRUE(pins.Remove(pin4));
  removed.clear();
  index.Put(Key(6), 100, index.NextStamp());  // unpinned: LRU order again
  EXPECT_EQ(removed, std::vector<PageKey>({Key(1)}));
}

StorageNamespace Ns() {
  StorageNamespace ns;
  ns.model_id = "page-pins-test";
  ns.layout = KvLayout::kPageFirst;
  ns.num_layers = 1;
  ns.slot_bytes = 16;
  ns.page_size = 1;
  return ns;
}

TEST(PagePinsTest, MemoryStoreRefusesASetWithNoUnpinnedRoom) {
  const int64_t value = Ns().page_bytes() + kStoredPageHeaderBytes;
  auto b = OpenStorage("memory://page-pins-test?capacity=" + std::to_string(2 * value), Ns());
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  StorageBackend& store = **b;
  std::vector<std::byte> page(static_cast<size_t>(Ns().page_bytes()), std::byte{7});
  auto set = [&](int i) { return store.Set({Key(i)}, {PageBuffer::Of(page)}).get().pages.at(0); };
  ASSERT_EQ(set(1), PageStatus::kOk);
  ASSERT_EQ(set(2), PageStatus::kOk);
  const std::vector<PageKey> both = {Key(1), Key(2)};
  auto pin = store.PinPages(both, std::chrono::hours(1));
  ASSERT_TRUE(pin.ok()) << pin.status().ToString();
  EXPECT_EQ(set(3), PageStatus::kNoSpace) << "only pinned pages to evict";
  EXPECT_EQ(store.Exists({Key(1), Key(2)}).get().leading, 2);
  ASSERT_TRUE(store.UnpinPages(*pin).ok());
  EXPECT_TRUE(store.UnpinPages(*pin).IsInvalidArgument());
  EXPECT_EQ(set(3), PageStatus::kOk);
  EXPECT_EQ(store.Exists({Key(1)}).get().leading, 0) << "LRU again once unpinned";
  EXPECT_TRUE(store.PinPages(both, std::chrono::nanoseconds(0)).status().IsInvalidArgument());
}

TEST(PagePinsTest, ABackendThatCannotPinSaysSo) {
  auto inner = OpenStorage("memory://?capacity=1MiB", Ns());
  ASSERT_TRUE(inner.ok());
  auto wrapped = FaultInjectingStorage::Wrap(std::move(*inner), 1);
  ASSERT_TRUE(wrapped.ok());
  const std::vector<PageKey> one = {Key(1)};
  auto pin = (*wrapped)->PinPages(one, std::chrono::seconds(1));
  EXPECT_EQ(pin.status().code(), StatusCode::kFailedPrecondition) << pin.status().ToString();
}

}  // namespace
}  // namespace kvtier::storage
