// The shared host tier on a GPU: two processes (shared_host_pool_worker mode=gpu) on one GPU,
// each registering the segment with CUDA, publish half of a workload's prompts through the GPU
// (device -> shared pages with the kernel backend) and load every prompt's cached prefix from the
// shared pages into a poisoned device pool with the kernel backend, checking every byte; so each
// loads pages the other wrote. Afterwards this process checks the index and every READY page.
//
// Skips itself when no GPU is present (CudaDeviceCount() == 0), so CI without a GPU passes;
// scripts/gpu_check.sh runs it on a GPU machine.
#include <gtest/gtest.h>

#include <cstdio>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "kvtier/device.h"
#include "kvtier/shared_host_pool.h"
#include "pool/shared_host_pool_test_util.h"
#include "pool/shared_host_pool_worker_process.h"

namespace kvtier {
namespace {

constexpr int kFamilies = 3;
constexpr int64_t kMaxPages = 6;
constexpr int64_t kPrompts = 24;

TEST(SharedHostPoolGpuTest, TwoProcessesLoadFromTheSharedPoolWithTheKernelBackend) {
  if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device present";
  for (KvLayout layout : {KvLayout::kPageFirst, KvLayout::kPageFirstDirect}) {
    SCOPED_TRACE(LayoutName(layout));
    testing::ScopedSegmentName name("gpu");
    SharedHostPoolConfig config;
    config.name = name.get();
    config.geometry = testing::SmallSharedGeometry(256);  // room for every prompt: no eviction
    config.geometry.layout = layout;
    config.geometry.slot_bytes = 256;
    config.register_with_cuda = true;
    auto created = SharedHostPool::Create(config);
    ASSERT_TRUE(created.ok()) << created.status().ToString();
    std::unique_ptr<SharedHostPool> pool = std::move(created).value();
    ASSERT_TRUE(pool->cuda_registered());

    std::vector<std::unique_ptr<testing::Worker>> workers;
    for (int parity = 0; parity < 2; ++parity) {
      workers.push_back(std::make_unique<testing::Worker>(std::vector<std::string>{
          "name=" + name.get(), "mode=gpu", "seed=11", "parity=" + std::to_string(parity),
          "prompts=" + std::to_string(kPrompts), "families=" + std::to_string(kFamilies),
          "max_pages=" + std::to_string(kMaxPages)}));
    }
    for (auto& w : workers) {
      std::string out;
      ASSERT_EQ(w->Wait(120000, &out), 0) << "worker " << w->pid() << " printed: " << out;
      long long loaded = 0;
      ASSERT_EQ(std::sscanf(out.c_str(), "gpu loaded_pages=%lld", &loaded), 1) << out;
      EXPECT_GT(loaded, 0);
    }

    ASSERT_TRUE(pool->CheckInvariants().ok()) << pool->CheckInvariants().ToString();
    auto info = pool->Inspect();
    ASSERT_TRUE(info.ok());
    EXPECT_EQ(info->writing_pages, 0);
    EXPECT_EQ(info->pinned_pages, 0);
    EXPECT_EQ(info->processes.size(), 1u);
    EXPECT_EQ(info->evictions, 0);
    std::set<int64_t> seen;
    ASSERT_TRUE(testing::CheckEveryPage(*pool, 11, kPrompts, kFamilies, kMaxPages, &seen).ok());
    EXPECT_EQ(static_cast<int64_t>(seen.size()), info->ready_pages);
    EXPECT_GT(info->ready_pages, 0);
  }
}

}  // namespace
}  // namespace kvtier
