// The checksum pool: the values it computes are PayloadChecksum's, for one- and two-segment
// pages; batches from several threads at once each get their own results; Wait() with nothing
// queued returns; a pool of one thread busy with another batch does not hold a caller up (the
// caller runs its own queued jobs); a batch destroyed without Wait() still waits for its jobs.
#include "storage/redis/checksum_pool.h"

#include <gtest/gtest.h>

#include <cstddef>
#include <random>
#include <thread>
#include <vector>

#include "storage/page_format.h"

namespace kvtier::storage {
namespace {

std::vector<std::byte> RandomBytes(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<std::byte> bytes(n);
  for (auto& b : bytes) b = static_cast<std::byte>(rng());
  return bytes;
}

uint64_t Expected(const PageBuffer& payload) {
  uint64_t checksum = 0;
  EXPECT_TRUE(PayloadChecksum(DefaultChecksumKind(), payload, &checksum));
  return checksum;
}

TEST(ChecksumPoolTest, ValuesArePayloadChecksums) {
  ChecksumPool pool(3);
  std::vector<std::vector<std::byte>> k, v;
  std::vector<PageBuffer> pages;
  for (int i = 0; i < 24; ++i) {
    k.push_back(RandomBytes(1000 + 977 * static_cast<size_t>(i), 2 * i));
    v.push_back(RandomBytes(3000 + 13 * static_cast<size_t>(i), 2 * i + 1));
  }
  for (int i = 0; i < 24; ++i) {
    pages.push_back(i % 2 == 0 ? PageBuffer::Of(k[i]) : PageBuffer::Of(k[i], v[i]));
  }
  std::vector<uint64_t> sums(pages.size(), 0);
  ChecksumPool::Batch batch(pool);
  for (size_t i = 0; i < pages.size(); ++i) batch.Add(pages[i], &sums[i]);
  batch.Wait();
  for (size_t i = 0; i < pages.size(); ++i) EXPECT_EQ(sums[i], Expected(pages[i])) << i;
  // The same batch can take more jobs after a Wait().
  uint64_t again = 0;
  batch.Add(pages[5], &again);
  batch.Wait();
  EXPECT_EQ(again, sums[5]);
}

TEST(ChecksumPoolTest, ConcurrentBatchesGetTheirOwnResults) {
  ChecksumPool pool(2);
  std::vector<std::thread> callers;
  for (int t = 0; t < 4; ++t) {
    callers.emplace_back([&pool, t] {
      for (int round = 0; round < 20; ++round) {
        std::vector<std::vector<std::byte>> data;
        std::vector<PageBuffer> pages;
        for (int i = 0; i < 6; ++i) data.push_back(RandomBytes(4096 + 64 * i, t * 1000 + round));
        for (auto& d : data) pages.push_back(PageBuffer::Of(d));
        std::vector<uint64_t> sums(pages.size(), 0);
        ChecksumPool::Batch batch(pool);
        for (size_t i = 0; i < pages.size(); ++i) batch.Add(pages[i], &sums[i]);
        batch.Wait();
        for (size_t i = 0; i < pages.size(); ++i) EXPECT_EQ(sums[i], Expected(pages[i]));
      }
    });
  }
  for (auto& c : callers) c.join();
}

TEST(ChecksumPoolTest, WaitWithNothingQueuedReturns) {
  ChecksumPool pool(1);
  ChecksumPool::Batch batch(pool);
  batch.Wait();
  batch.Wait();
}

// One pool thread kept busy by a large job of another batch: a second batch's Wait() computes its
// own jobs instead of queueing behind it, and both end with the right values.
TEST(ChecksumPoolTest, CallerRunsItsOwnQueuedJobs) {
  ChecksumPool pool(1);
  std::vector<std::byte> big = RandomBytes(size_t{64} << 20, 7);
  const PageBuffer big_page = PageBuffer::Of(big);
  uint64_t big_sum = 0;
  std::vector<std::byte> small = RandomBytes(8192, 8);
  const PageBuffer small_page = PageBuffer::Of(small);
  uint64_t small_sum = 0;
  {
    ChecksumPool::Batch busy(pool);
    busy.Add(big_page, &big_sum);
    ChecksumPool::Batch mine(pool);
    mine.Add(small_page, &small_sum);
    mine.Wait();
    EXPECT_EQ(small_sum, Expected(small_page));
  }  // `busy` waits for its job here
  EXPECT_EQ(big_sum, Expected(big_page));
}

TEST(ChecksumPoolTest, DestroyedBatchWaitsForItsJobs) {
  ChecksumPool pool(2);
  std::vector<std::byte> data = RandomBytes(size_t{8} << 20, 9);
  const PageBuffer page = PageBuffer::Of(data);
  std::vector<uint64_t> sums(8, 0);
  {
    ChecksumPool::Batch batch(pool);
    for (auto& s : sums) batch.Add(page, &s);
  }
  const uint64_t expected = Expected(page);
  for (uint64_t s : sums) EXPECT_EQ(s, expected);
}

}  // namespace
}  // namespace kvtier::storage
