// HierarchicalCache on the shared host tier (OpenSharedHostStorage as its storage tier): a cache
// in another process (fork) backs up prefixes into the shared segment; a cache here finds them by
// key after its own tree match (QueryStorage), prefetches and loads them back byte-exact; pages
// published already are not written twice; other tenants and other deployments see nothing; a
// geometry that does not describe the pool is refused naming the field.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "cache/cache_test_util.h"
#include "kvtier/hierarchical_cache.h"
#include "kvtier/shared_host_pool.h"
#include "pool/shared_host_pool_test_util.h"

namespace kvtier {
namespace {

using testing::DeviceTier;
using testing::Hashes;

constexpr int64_t kLayers = 2;
constexpr int64_t kSlotBytes = 8;
constexpr int64_t kPage = 4;

StorageNamespace Deployment(const std::string& model = "shm-cache-test") {
  StorageNamespace ns;
  ns.model_id = model;
  ns.layout = KvLayout::kPageFirst;
  ns.num_layers = kLayers;
  ns.slot_bytes = kSlotBytes;
  ns.page_size = kPage;
  return ns;
}

std::shared_ptr<SharedHostPool> CreatePool(const std::string& name) {
  SharedHostPoolConfig c;
  c.name = name;
  c.geometry = {KvLayout::kPageFirst, kLayers, 64 * kPage, kSlotBytes, kPage, 1};
  c.register_with_cuda = false;
  auto created = SharedHostPool::Create(c);
  EXPECT_TRUE(created.ok()) << created.status().ToString();
  return created.ok() ? std::shared_ptr<SharedHostPool>(std::move(*created)) : nullptr;
}

struct TestCache {
  std::unique_ptr<DeviceTier> device;
  std::unique_ptr<HierarchicalCache> cache;
};

// A cache whose storage tier is the shared host pool `name`, attached by this process.
TestCache MakeCache(const std::string& name, const StorageNamespace& ns) {
  TestCache s;
  KvGeometry g{KvLayout::kLayerFirst, kLayers, 16 * kPage, kSlotBytes, kPage, 1};
  auto dev = DeviceTier::Create(TransferBackend::kCpu, g, false);
  EXPECT_TRUE(dev.ok()) << dev.status().ToString();
  s.device = std::move(*dev);
  auto pool = SharedHostPool::Attach(name);
  EXPECT_TRUE(pool.ok()) << pool.status().ToString();
  auto store = OpenSharedHostStorage(std::shared_ptr<SharedHostPool>(std::move(*pool)), ns);
  EXPECT_TRUE(store.ok()) << store.status().ToString();
  HierarchicalCacheConfig cfg;
  cfg.write_policy = WritePolicy::kWriteThrough;
  cfg.backup_threads = 1;
  cfg.host_capacity_bytes = 32 * kPage * kLayers * kSlotBytes * 2;
  cfg.transfer.cpu_threads = 1;
  cfg.storage.backend = std::shared_ptr<StorageBackend>(std::move(*store));
  cfg.storage.prefetch_threshold_tokens = 0;
  auto engine = MakeTransferEngine(TransferBackend::kCpu, cfg.transfer);
  EXPECT_TRUE(engine.ok());
  auto c = HierarchicalCache::Create(cfg, s.device->region(), std::move(*engine));
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  if (c.ok()) s.cache = std::move(*c);
  return s;
}

std::vector<Token> Seq(int64_t n, Token base) {
  std::vector<Token> t(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) t[static_cast<size_t>(i)] = base + static_cast<Token>(i);
  return t;
}

// The engine's prefill: match, compute (pattern) the uncached rest, insert, release.
Status Prefill(TestCache& s, std::span<const Token> tokens, std::string_view ns) {
  KVTIER_ASSIGN_OR_RETURN(MatchResult m, s.cache->Match(tokens, ns));
  const auto hashes = Hashes(tokens, ns);
  std::vector<int64_t> slots = m.device_slots;
  const int64_t rest = static_cast<int64_t>(tokens.size()) - m.device_tokens;
  KVTIER_ASSIGN_OR_RETURN(std::vector<int64_t> fresh, s.cache->AllocateDeviceSlots(rest));
  KVTIER_RETURN_IF_ERROR(
      s.device->Fill(fresh, std::span<const uint64_t>(hashes).subspan(m.device_tokens)));
  slots.insert(slots.end(), fresh.begin(), fresh.end());
  KVTIER_RETURN_IF_ERROR(s.cache->Insert(tokens, slots, ns).status());
  KVTIER_RETURN_IF_ERROR(s.cache->Release(m.handle));
  return s.cache->WaitForBackups();
}

TEST(SharedHostPoolCacheTest, AnotherProcessesBackupsAreHitsHereByteExact) {
  testing::ScopedSegmentName name("cache");
  std::shared_ptr<SharedHostPool> pool = CreatePool(name.get());
  ASSERT_NE(pool, nullptr);
  const std::vector<Token> a = Seq(36, 7);  // 9 pages
  // Another engine process computes `a` for tenant "t1" and backs it up into the segment.
  const pid_t child = fork();
  if (child == 0) {
    TestCache other = MakeCache(name.get(), Deployment());
    const Status s = other.cache != nullptr ? Prefill(other, a, "t1") : Status::Internal("cache");
    if (!s.ok()) std::fprintf(stderr, "child: %s\n", s.ToString().c_str());
    other.cache.reset();
    std::fflush(nullptr);
    _exit(s.ok() ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  auto info = pool->Inspect();
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->ready_pages, 9);
  EXPECT_EQ(info->processes.size(), 1u);  // the child detached

  TestCache here = MakeCache(name.get(), Deployment());
  ASSERT_NE(here.cache, nullptr);
  // Other tenants and other deployments find nothing.
  TestCache other_model = MakeCache(name.get(), Deployment("another-model"));
  ASSERT_NE(other_model.cache, nullptr);
  for (const auto& [tenant, c] : {std::pair<std::string, TestCache*>("t2", &here),
                                  std::pair<std::string, TestCache*>("t1", &other_model)}) {
    auto m = c->cache->Match(a, tenant);
    ASSERT_TRUE(m.ok());
    auto q = c->cache->QueryStorage(m->handle);
    ASSERT_TRUE(q.ok()) << q.status().ToString();
    EXPECT_EQ(q->storage_tokens, 0) << tenant;
    ASSERT_TRUE(c->cache->Release(m->handle).ok());
  }

  // The same tenant: a miss in the local tree, then every page by key, loaded byte-exact.
  std::vector<Token> longer = a;
  longer.insert(longer.end(), {1, 2, 3, 4, 5});
  auto m = here.cache->Match(longer, "t1");
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->device_tokens + m->host_tokens, 0);
  auto q = here.cache->QueryStorage(m->handle);
  ASSERT_TRUE(q.ok()) << q.status().ToString();
  EXPECT_EQ(q->storage_tokens, 36);
  ASSERT_TRUE(here.cache->Prefetch(m->handle, PrefetchPolicy::kWaitComplete).ok());
  auto l = here.cache->LoadBack(m->handle);
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  EXPECT_EQ(l->loaded_tokens, 36);
  ASSERT_TRUE(here.device->Verify(l->device_slots, Hashes(a, "t1")).ok());
  ASSERT_TRUE(here.cache->Release(m->handle).ok());
  ASSERT_TRUE(here.cache->CheckConsistency().ok());

  // This engine extends the prompt: only the new pages are published (9 were there already).
  std::vector<Token> extended = a;
  for (Token t = 0; t < 8; ++t) extended.push_back(1000 + t);  // 2 more pages
  ASSERT_TRUE(Prefill(here, extended, "t1").ok());
  info = pool->Inspect();
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->ready_pages, 11);
  EXPECT_EQ(info->writing_pages, 0);
  EXPECT_EQ(info->pinned_pages, 0);
  ASSERT_TRUE(pool->CheckInvariants().ok());
  // And the segment's pages hold exactly the pattern of their keys.
  auto keys = ComputePromptPageKeys(extended, kPage, "t1");
  ASSERT_TRUE(keys.ok());
  auto pinned = pool->PinPrefix(Deployment().Hash(), *keys);
  ASSERT_TRUE(pinned.ok());
  ASSERT_EQ(pinned->size(), 11u);
  const auto hashes = Hashes(extended, "t1");
  ASSERT_TRUE(VerifyKvPattern(pool->region(), pool->PageSlots(*pinned), hashes).ok());
  ASSERT_TRUE(pool->Unpin(*pinned).ok());
}

TEST(SharedHostPoolCacheTest, StorageOverTheSharedTierChecksTheGeometry) {
  testing::ScopedSegmentName name("cachegeom");
  std::shared_ptr<SharedHostPool> pool = CreatePool(name.get());
  ASSERT_NE(pool, nullptr);
  StorageNamespace ns = Deployment();
  ns.slot_bytes = 16;
  auto store = OpenSharedHostStorage(pool, ns);
  ASSERT_FALSE(store.ok());
  EXPECT_TRUE(store.status().IsInvalidArgument());
  EXPECT_NE(store.status().message().find("slot_bytes is 8 in shared host pool"), std::string::npos)
      << store.status().message();
  EXPECT_TRUE(OpenSharedHostStorage(nullptr, Deployment()).status().IsInvalidArgument());
  auto ok = OpenSharedHostStorage(pool, Deployment());
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_EQ((*ok)->url(), "shm://" + name.get());
}

}  // namespace
}  // namespace kvtier
