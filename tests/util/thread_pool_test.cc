// ThreadPool: every task runs exactly once per loop, loops from several threads at once are
// serialised, and a cpu transfer engine shared by several threads gives each caller its bytes.
// Names match the thread-sanitizer step of scripts/setup.sh ("Thread", "Concurren").
#include "util/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <random>
#include <thread>
#include <vector>

#include "kvtier/testing/reference_copy.h"
#include "kvtier/transfer.h"
#include "support/kv_test_util.h"

namespace kvtier {
namespace {

TEST(ThreadPoolTest, EveryTaskRunsOnce) {
  util::ThreadPool pool(3);
  EXPECT_EQ(pool.num_threads(), 3);
  for (int64_t n : {0, 1, 2, 7, 1000}) {
    std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
    pool.ParallelFor(n, [&](int64_t t) { hits[static_cast<size_t>(t)].fetch_add(1); });
    for (auto& h : hits) EXPECT_EQ(h.load(), 1);
  }
}

TEST(ThreadPoolTest, LoopsFromSeveralThreadsAreSerialisedAndComplete) {
  util::ThreadPool pool(2);
  std::atomic<int64_t> total{0};
  std::vector<std::thread> callers;
  for (int c = 0; c < 4; ++c) {
    callers.emplace_back([&] {
      for (int i = 0; i < 50; ++i) pool.ParallelFor(16, [&](int64_t t) { total += t; });
    });
  }
  for (auto& t : callers) t.join();
  EXPECT_EQ(total.load(), 4 * 50 * (15 * 16 / 2));
}

TEST(ThreadPoolTest, PostedTasksRunBesideLoopsAndBeforeDestruction) {
  std::atomic<int> posted{0};
  {
    util::ThreadPool pool(3);
    std::atomic<int64_t> total{0};
    for (int i = 0; i < 100; ++i) {
      pool.Post([&] { posted.fetch_add(1); });
      pool.ParallelFor(8, [&](int64_t t) { total += t; });
    }
    EXPECT_EQ(total.load(), 100 * 28);
  }  // the destructor runs what is still queued
  EXPECT_EQ(posted.load(), 100);
  util::ThreadPool inline_pool(1);  // no worker: Post runs in the caller
  int ran = 0;
  inline_pool.Post([&] { ++ran; });
  EXPECT_EQ(ran, 1);
}

TEST(ThreadPoolTest, CreateBoundsTheThreadCount) {
  for (int n : {0, -1, util::ThreadPool::kMaxThreads + 1, 100000}) {
    auto pool = util::ThreadPool::Create(n);
    ASSERT_FALSE(pool.ok()) << n;
    EXPECT_EQ(pool.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(pool.status().message().find(std::to_string(n)), std::string::npos);
  }
  auto pool = util::ThreadPool::Create(2);
  ASSERT_TRUE(pool.ok()) << pool.status().ToString();
  EXPECT_EQ((*pool)->num_threads(), 2);
  TransferEngineConfig cfg;
  cfg.cpu_threads = 100000;  // used to start 100,000 threads
  EXPECT_EQ(cfg.Validate().code(), StatusCode::kInvalidArgument);
}

TEST(ThreadPoolTest, ConcurrentCpuTransfersOnOneEngine) {
  KvGeometry g;
  g.layout = KvLayout::kPageFirst;
  g.num_layers = 4;
  g.num_slots = 256;
  g.page_size = 16;
  g.slot_bytes = 64;
  KvGeometry d = g;
  d.layout = KvLayout::kLayerFirst;
  TransferEngineConfig cfg;
  cfg.cpu_threads = 2;
  cfg.cpu_parallel_threshold_bytes = 1;  // every request takes the pool
  auto engine = std::move(MakeTransferEngine(TransferBackend::kCpu, cfg).value());
  constexpr int kCallers = 4;
  std::vector<std::unique_ptr<testing::HostRegion>> src, dst, want;
  std::vector<testing::SlotPairs> pairs;
  std::mt19937_64 rng(testing::TestSeed());
  for (int c = 0; c < kCallers; ++c) {
    src.push_back(std::make_unique<testing::HostRegion>(g, false));
    dst.push_back(std::make_unique<testing::HostRegion>(d, false));
    want.push_back(std::make_unique<testing::HostRegion>(d, false));
    src[c]->FillRandom(rng);
    dst[c]->Fill(testing::kPoison);
    want[c]->Fill(testing::kPoison);
    pairs.push_back(testing::RandomPagePairs(rng, g.num_slots, d.num_slots, 16, 8));
    auto req =
        TransferRequest::AllLayers(src[c]->region(), want[c]->region(),
                                   SlotIndices::Host(std::span<const int64_t>(pairs[c].src)),
                                   SlotIndices::Host(std::span<const int64_t>(pairs[c].dst)));
    ASSERT_TRUE(testing::ReferenceTransfer(req).ok());
  }
  std::vector<std::thread> callers;
  std::atomic<int> failures{0};
  for (int c = 0; c < kCallers; ++c) {
    callers.emplace_back([&, c] {
      for (int i = 0; i < 20; ++i) {
        auto req =
            TransferRequest::AllLayers(src[c]->region(), dst[c]->region(),
                                       SlotIndices::Host(std::span<const int64_t>(pairs[c].src)),
                                       SlotIndices::Host(std::span<const int64_t>(pairs[c].dst)));
        if (!engine->Transfer(req).ok()) ++failures;
      }
    });
  }
  for (auto& t : callers) t.join();
  EXPECT_EQ(failures.load(), 0);
  for (int c = 0; c < kCallers; ++c) EXPECT_EQ(dst[c]->Snapshot(), want[c]->Snapshot()) << c;
}

}  // namespace
}  // namespace kvtier
