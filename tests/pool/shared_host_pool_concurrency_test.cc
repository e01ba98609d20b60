// Concurrency of SharedHostPool within one process (run under TSan in CI): threads with their
// own attachments (as separate engine processes would have) and threads sharing one attachment
// insert and match overlapping prefixes of two tenants at once on a pool small enough to evict
// all the time. Every page read is checked byte for byte; afterwards the index invariants hold,
// nothing is left WRITING or pinned, and every READY page holds the bytes of its key.
#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "kvtier/shared_host_pool.h"
#include "pool/shared_host_pool_test_util.h"
#include "support/kv_test_util.h"

namespace kvtier {
namespace {

using testing::ScopedSegmentName;
using testing::Tenant;

constexpr int kFamilies = 3;
constexpr int64_t kMaxPages = 5;
constexpr int64_t kPrompts = 24;

TEST(SharedHostPoolConcurrencyTest, ThreadsInsertAndMatchOverlappingPrefixes) {
  ScopedSegmentName name("threads");
  SharedHostPoolConfig config;
  config.name = name.get();
  config.geometry = testing::SmallSharedGeometry(20);
  config.register_with_cuda = false;
  auto created = SharedHostPool::Create(config);
  ASSERT_TRUE(created.ok()) << created.status().ToString();
  std::unique_ptr<SharedHostPool> shared = std::move(created).value();
  std::vector<std::unique_ptr<SharedHostPool>> own;
  for (int i = 0; i < 2; ++i) {
    auto attached = SharedHostPool::Attach(name.get());
    ASSERT_TRUE(attached.ok()) << attached.status().ToString();
    own.push_back(std::move(attached).value());
  }
  // Threads 0 and 1 have an attachment each; threads 2 and 3 share the creator's.
  SharedHostPool* pools[4] = {own[0].get(), own[1].get(), shared.get(), shared.get()};
  const std::vector<Tenant> tenants = testing::WorkloadTenants();
  const uint64_t seed = testing::TestSeed();
  std::atomic<int64_t> hits{0};
  std::vector<std::string> errors(4);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      SharedHostPool& pool = *pools[t];
      for (int64_t i = 0; i < 150; ++i) {
        const int64_t index = (i * 7 + t * 5) % kPrompts;
        const Tenant& tenant = tenants[static_cast<size_t>(index % 2)];
        auto prompt = testing::PagesOf(
            testing::WorkloadPrompt(seed, index, kFamilies, kMaxPages, 4), 4, tenant);
        if (!prompt.ok()) {
          errors[t] = prompt.status().ToString();
          return;
        }
        auto hit = testing::CheckPrefix(pool, tenant, *prompt);
        testing::PublishStats stats;
        Status s = hit.ok() ? testing::Publish(pool, tenant, *prompt, &stats) : hit.status();
        if (s.ok()) hit = testing::CheckPrefix(pool, tenant, *prompt);
        if (s.ok() && !hit.ok()) s = hit.status();
        if (!s.ok()) {
          errors[t] = "thread " + std::to_string(t) + " prompt " + std::to_string(index) + ": " +
                      s.ToString();
          return;
        }
        hits += *hit;
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (const std::string& e : errors) EXPECT_EQ(e, "");
  EXPECT_GT(hits.load(), 0);

  ASSERT_TRUE(shared->CheckInvariants().ok()) << shared->CheckInvariants().ToString();
  auto info = shared->Inspect();
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->writing_pages, 0);
  EXPECT_EQ(info->pinned_pages, 0);
  EXPECT_EQ(info->processes.size(), 3u);
  EXPECT_GT(info->evictions, 0);
  // Every READY page holds its key's bytes.
  std::set<int64_t> seen;
  for (int64_t index = 0; index < kPrompts; ++index) {
    const Tenant& tenant = tenants[static_cast<size_t>(index % 2)];
    auto prompt =
        testing::PagesOf(testing::WorkloadPrompt(seed, index, kFamilies, kMaxPages, 4), 4, tenant);
    ASSERT_TRUE(prompt.ok());
    for (size_t k = 0; k < prompt->keys.size(); ++k) {
      auto page = shared->PinPrefix(tenant.namespace_hash,
                                    std::span<const PageKey>(prompt->keys).subspan(k, 1));
      ASSERT_TRUE(page.ok());
      if (page->empty()) continue;
      EXPECT_TRUE(testing::VerifyPage(*shared, (*page)[0], *prompt, k).ok());
      seen.insert((*page)[0]);
      ASSERT_TRUE(shared->Unpin(*page).ok());
    }
  }
  EXPECT_EQ(static_cast<int64_t>(seen.size()), info->ready_pages);
}

}  // namespace
}  // namespace kvtier
