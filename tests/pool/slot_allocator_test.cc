// Tests for SlotAllocator: argument checks, a randomised model-based test against a std::set
// reference (double free, foreign and out-of-range indices, repeats within one call, exhaustion;
// all-or-nothing and occupancy checked after every step) and a multi-threaded test.
#include "kvtier/slot_allocator.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <random>
#include <set>
#include <thread>
#include <vector>

namespace kvtier {
namespace {

std::unique_ptr<SlotAllocator> MakeAllocator(int64_t num_slots, int64_t page_size) {
  auto created = SlotAllocator::Create(num_slots, page_size);
  EXPECT_TRUE(created.ok()) << created.status().ToString();
  return std::move(created).value();
}

TEST(SlotAllocatorTest, CreateRejectsBadArguments) {
  struct Case {
    int64_t num_slots, page_size;
    const char* needle;
  };
  for (const Case& c : {Case{0, 1, "num_slots = 0"}, Case{-16, 4, "num_slots = -16"},
                        Case{16, 0, "page_size = 0"}, Case{16, -4, "page_size = -4"},
                        Case{18, 4, "page_size = 4 does not divide num_slots = 18"}}) {
    auto created = SlotAllocator::Create(c.num_slots, c.page_size);
    ASSERT_FALSE(created.ok());
    EXPECT_TRUE(created.status().IsInvalidArgument());
    EXPECT_NE(created.status().message().find(c.needle), std::string::npos)
        << created.status().message();
  }
}

TEST(SlotAllocatorTest, FreshAllocatorCounters) {
  auto a = MakeAllocator(64, 16);
  EXPECT_EQ(a->num_slots(), 64);
  EXPECT_EQ(a->page_size(), 16);
  EXPECT_EQ(a->num_pages(), 4);
  EXPECT_EQ(a->free_pages(), 4);
  EXPECT_EQ(a->used_pages(), 0);
  for (int64_t s = 0; s < 64; ++s) EXPECT_FALSE(a->IsAllocated(s));
  EXPECT_FALSE(a->IsAllocated(-16));
  EXPECT_FALSE(a->IsAllocated(64));
}

TEST(SlotAllocatorTest, AllocateZeroNegativeAndExhaustion) {
  auto a = MakeAllocator(48, 16);
  auto none = a->AllocatePages(0);
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->empty());

  auto negative = a->AllocatePages(-1);
  ASSERT_FALSE(negative.ok());
  EXPECT_TRUE(negative.status().IsInvalidArgument());
  EXPECT_NE(negative.status().message().find("n = -1"), std::string::npos);

  auto two = a->AllocatePages(2);
  ASSERT_TRUE(two.ok());
  auto too_many = a->AllocatePages(2);
  ASSERT_FALSE(too_many.ok());
  EXPECT_TRUE(too_many.status().IsOutOfMemory());
  EXPECT_NE(too_many.status().message().find("n = 2"), std::string::npos)
      << too_many.status().message();
  EXPECT_NE(too_many.status().message().find("only 1 of 3"), std::string::npos)
      << too_many.status().message();
  EXPECT_EQ(a->free_pages(), 1);  // the failed call took nothing

  auto last = a->AllocatePages(1);
  ASSERT_TRUE(last.ok());
  std::vector<int64_t> all = *two;
  all.push_back((*last)[0]);
  std::sort(all.begin(), all.end());
  EXPECT_EQ(all, (std::vector<int64_t>{0, 16, 32}));
  EXPECT_TRUE(a->AllocatePages(1).status().IsOutOfMemory());
}

// The free list is a stack; pages freed in any order come back ascending (a copy between two
// tiers then pairs pages that lie together in the same order on both sides: dma_plan.h).
TEST(SlotAllocatorTest, PagesFreedInAnyOrderComeBackAscending) {
  auto a = MakeAllocator(128, 16);
  auto got = a->AllocatePages(6);
  ASSERT_TRUE(got.ok());
  for (const std::vector<int64_t>& freed :
       {std::vector<int64_t>{0, 16, 32, 48}, std::vector<int64_t>{48, 32, 16, 0},
        std::vector<int64_t>{32, 0, 48, 16}}) {
    ASSERT_TRUE(a->FreePages(freed).ok());
    auto again = a->AllocatePages(4);
    ASSERT_TRUE(again.ok());
    EXPECT_EQ(*again, (std::vector<int64_t>{0, 16, 32, 48}));
  }
}

TEST(SlotAllocatorTest, FreeErrorsNameTheIndexAndFreeNothing) {
  auto a = MakeAllocator(64, 16);
  auto got = a->AllocatePages(3);
  ASSERT_TRUE(got.ok());
  const std::vector<int64_t> pages = *got;  // 0, 16, 32 (fresh allocator: ascending)
  ASSERT_EQ(pages, (std::vector<int64_t>{0, 16, 32}));

  struct Case {
    std::vector<int64_t> arg;
    const char* needle;
  };
  const Case cases[] = {
      {{0, 64}, "page_starts[1] = 64 is out of range [0, 64)"},
      {{16, -16}, "page_starts[1] = -16 is out of range"},
      {{0, 16, 17}, "page_starts[2] = 17 is a foreign index"},
      {{48}, "page_starts[0] = 48 is not allocated (double free)"},
      {{0, 32, 16, 32}, "page_starts[3] = 32 repeats page_starts[1]"},
  };
  for (const Case& c : cases) {
    Status s = a->FreePages(c.arg);
    EXPECT_TRUE(s.IsInvalidArgument()) << s.ToString();
    EXPECT_NE(s.message().find(c.needle), std::string::npos) << s.message();
    EXPECT_EQ(a->used_pages(), 3);
    for (int64_t p : pages) EXPECT_TRUE(a->IsAllocated(p)) << p;
  }
  ASSERT_TRUE(a->FreePages(pages).ok());
  EXPECT_EQ(a->free_pages(), 4);
  Status twice = a->FreePages(std::vector<int64_t>{16});
  EXPECT_TRUE(twice.IsInvalidArgument());
  EXPECT_NE(twice.message().find("double free"), std::string::npos);
  EXPECT_TRUE(a->FreePages({}).ok());
}

TEST(SlotAllocatorTest, PageSlots) {
  const std::vector<int64_t> starts{32, 0};
  EXPECT_EQ(PageSlots(starts, 4), (std::vector<int64_t>{32, 33, 34, 35, 0, 1, 2, 3}));
  EXPECT_EQ(PageSlots(starts, 1), starts);
  EXPECT_TRUE(PageSlots({}, 16).empty());
}

// Drives the allocator and a std::set reference with the same random operations.
void RunModelTest(int64_t num_pages, int64_t page_size, uint32_t seed, int steps) {
  SCOPED_TRACE(testing::Message() << "seed " << seed << " num_pages " << num_pages << " page_size "
                                  << page_size);
  const int64_t num_slots = num_pages * page_size;
  auto a = MakeAllocator(num_slots, page_size);
  std::mt19937 rng(seed);
  std::set<int64_t> allocated;                     // page starts held by the model
  auto random_int = [&](int64_t lo, int64_t hi) {  // [lo, hi]
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  auto random_allocated = [&]() {
    auto it = allocated.begin();
    std::advance(it, random_int(0, static_cast<int64_t>(allocated.size()) - 1));
    return *it;
  };
  auto random_free_page = [&]() -> int64_t {  // REQUIRES: a free page exists
    for (;;) {
      const int64_t p = random_int(0, num_pages - 1) * page_size;
      if (!allocated.count(p)) return p;
    }
  };

  for (int step = 0; step < steps; ++step) {
    SCOPED_TRACE(testing::Message() << "step " << step);
    const int op = static_cast<int>(random_int(0, 9));
    const int64_t free_before = num_pages - static_cast<int64_t>(allocated.size());
    if (op <= 3) {
      // Allocate, sometimes more than is free.
      const int64_t n = random_int(0, std::min<int64_t>(num_pages, free_before + 2));
      auto got = a->AllocatePages(n);
      if (n > free_before) {
        ASSERT_FALSE(got.ok());
        ASSERT_TRUE(got.status().IsOutOfMemory()) << got.status().ToString();
      } else {
        ASSERT_TRUE(got.ok()) << got.status().ToString();
        ASSERT_EQ(static_cast<int64_t>(got->size()), n);
        for (int64_t p : *got) {
          ASSERT_GE(p, 0);
          ASSERT_LT(p, num_slots);
          ASSERT_EQ(p % page_size, 0);
          ASSERT_TRUE(allocated.insert(p).second) << "page " << p << " handed out twice";
        }
      }
    } else if (op <= 6) {
      // Valid free of a random subset.
      std::vector<int64_t> arg;
      for (int64_t p : allocated) {
        if (random_int(0, 2) == 0) arg.push_back(p);
      }
      std::shuffle(arg.begin(), arg.end(), rng);
      ASSERT_TRUE(a->FreePages(arg).ok());
      for (int64_t p : arg) allocated.erase(p);
    } else {
      // A free call with one bad entry among valid ones: nothing may be freed.
      std::vector<int64_t> arg;
      for (int64_t p : allocated) {
        if (random_int(0, 3) == 0) arg.push_back(p);
      }
      std::shuffle(arg.begin(), arg.end(), rng);
      int64_t bad;
      const int kind = static_cast<int>(random_int(0, 3));
      if (kind == 0 && page_size > 1) {
        bad = random_int(0, num_pages - 1) * page_size + random_int(1, page_size - 1);  // foreign
      } else if (kind == 1 && free_before > 0) {
        bad = random_free_page();  // double free
      } else if (kind == 2 && !arg.empty()) {
        bad = arg[random_int(0, static_cast<int64_t>(arg.size()) - 1)];  // repeat within call
      } else if (kind == 2 && !allocated.empty()) {
        bad = random_allocated();
        arg.push_back(bad);  // then repeated below
      } else {
        bad = random_int(0, 1) ? num_slots + page_size * random_int(0, 3)
                               : -page_size * random_int(1, 4);  // out of range
      }
      arg.insert(arg.begin() + random_int(0, static_cast<int64_t>(arg.size())), bad);
      Status s = a->FreePages(arg);
      ASSERT_TRUE(s.IsInvalidArgument()) << s.ToString();
      ASSERT_NE(s.message().find(std::to_string(bad)), std::string::npos) << s.message();
    }
    // Occupancy and membership after every step.
    ASSERT_EQ(a->used_pages(), static_cast<int64_t>(allocated.size()));
    ASSERT_EQ(a->free_pages(), num_pages - static_cast<int64_t>(allocated.size()));
    if (step % 16 == 0 || num_pages <= 64) {
      for (int64_t p = 0; p < num_pages; ++p) {
        ASSERT_EQ(a->IsAllocated(p * page_size), allocated.count(p * page_size) == 1)
            << "page start " << p * page_size;
      }
    }
  }
}

TEST(SlotAllocatorTest, RandomisedAgainstSetModel) {
  // KVTIER_TEST_SEED=<n> replays a failure; the seed of each run is in the failure trace.
  const char* env_seed = std::getenv("KVTIER_TEST_SEED");
  const uint32_t base_seed = env_seed != nullptr
                                 ? static_cast<uint32_t>(std::strtoul(env_seed, nullptr, 10))
                                 : std::random_device{}();
  int run = 0;
  for (int64_t page_size : {1, 2, 16, 64}) {
    for (int64_t num_pages : {1, 7, 64, 300}) {
      RunModelTest(num_pages, page_size, base_seed + run, 3000);
      ++run;
      if (testing::Test::HasFatalFailure()) return;
    }
  }
}

TEST(SlotAllocatorTest, ConcurrentAllocateAndFreeNeverShareAPage) {
  constexpr int64_t kPages = 256;
  constexpr int64_t kPageSize = 4;
  constexpr int kThreads = 4;
  constexpr int kIterations = 4000;
  auto a = MakeAllocator(kPages * kPageSize, kPageSize);
  // owner[page] = thread id + 1 while a thread holds it; 0 when free.
  std::vector<std::atomic<int>> owner(kPages);
  for (auto& o : owner) o.store(0);
  std::atomic<int> conflicts{0}, errors{0}, ready{0};

  auto worker = [&](int id) {
    ready++;
    while (ready.load() < kThreads) std::this_thread::yield();  // start together
    std::mt19937 rng(1234 + id);
    std::vector<int64_t> held;
    for (int it = 0; it < kIterations; ++it) {
      if (held.empty() || rng() % 2 == 0) {
        const int64_t n = 1 + rng() % 8;
        auto got = a->AllocatePages(n);
        if (!got.ok()) {
          if (!got.status().IsOutOfMemory()) errors++;
          continue;
        }
        for (int64_t p : *got) {
          int expected = 0;
          if (!owner[p / kPageSize].compare_exchange_strong(expected, id + 1)) conflicts++;
          held.push_back(p);
        }
      } else {
        const size_t k = 1 + rng() % held.size();
        std::shuffle(held.begin(), held.end(), rng);
        std::vector<int64_t> release(held.end() - k, held.end());
        held.resize(held.size() - k);
        // Clear ownership before the pages go back, so a fast re-allocation is not a conflict.
        for (int64_t p : release) {
          int expected = id + 1;
          if (!owner[p / kPageSize].compare_exchange_strong(expected, 0)) conflicts++;
        }
        if (!a->FreePages(release).ok()) errors++;
      }
    }
    for (int64_t p : held) owner[p / kPageSize].store(0);
    if (!a->FreePages(held).ok()) errors++;
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) threads.emplace_back(worker, t);
  for (auto& t : threads) t.join();
  EXPECT_EQ(conflicts.load(), 0);
  EXPECT_EQ(errors.load(), 0);
  EXPECT_EQ(a->used_pages(), 0);
  EXPECT_EQ(a->free_pages(), kPages);
}

}  // namespace
}  // namespace kvtier
