// Randomised model-based test of HierarchicalCache.
//
// The cache and a reference model see the same random sequence of engine operations (Match,
// LoadBack, AllocateDeviceSlots + pattern fill + Insert, Release, FreeDeviceSlots, explicit
// evictions, waiting for backups) under memory pressure, for every write policy and page sizes
// 1, 16 and 64. The model is a map from (namespace, page prefix) to the tier holding it; the cache
// reports every eviction through its listener, and the model checks each one (the page was in
// that tier and not pinned by a live handle). After every step: the cache's consistency check,
// and agreement of the cached token count. Every Match is compared exactly with the model (device
// prefix length, then host length), and every device and host slot it returns is checked
// byte-for-byte with the KV pattern. Every 200 steps all sequences ever inserted are matched
// again: nothing inserted and not evicted is lost. The no_host cases run the same sequence on a
// cache without a host tier: every device eviction forgets, nothing is backed up, no host hits.
//
// Environment: KVTIER_TEST_BACKEND=cpu|kernel|dma (GPU backends skip without a GPU),
// KVTIER_TEST_SEED (run one seed), KVTIER_TEST_STEPS (steps per run, default 3000). Four seeds per
// case cover every host layout, eviction policy, MHA and MLA, sync and async backups, with and
// without a load-back minimum.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <optional>
#include <random>
#include <unordered_map>

#include "cache/cache_test_util.h"
#include "kvtier/device.h"
#include "kvtier/hierarchical_cache.h"

namespace kvtier {
namespace {

using testing::DeviceTier;

struct Params {
  WritePolicy policy;
  int64_t page;
  bool no_host = false;  // host_capacity_bytes = 0 and host_ratio = 0: no host tier
};

struct Live {
  std::string ns;
  std::vector<Token> tokens;
  MatchHandle handle;
  int64_t matched;
};

class Model {
 public:
  // Page state: 'D' on the device (perhaps also in host memory), 'H' in host memory only.
  std::unordered_map<uint64_t, char> pages;
  std::unordered_map<uint64_t, int> pins;
  std::vector<std::string> errors;
  int64_t P = 1;
  bool no_host = false;

  static uint64_t Key(const std::vector<uint64_t>& hashes, int64_t page, int64_t P) {
    return hashes[static_cast<size_t>((page + 1) * P - 1)];
  }

  void OnEvict(const EvictionEvent& e) {
    const auto hashes = KvPatternHashes(e.prefix, KvPatternSalt(e.name_space));
    const int64_t end = static_cast<int64_t>(e.prefix.size()) / P;
    for (int64_t p = end - e.num_tokens / P; p < end; ++p) {
      const uint64_t k = Key(hashes, p, P);
      auto it = pages.find(k);
      const char want = e.tier == CacheTier::kDevice ? 'D' : 'H';
      if (it == pages.end() || it->second != want) {
        errors.push_back(
            fmt::format("{} eviction of page {} (prefix {} tokens) found model state {}",
                        e.tier == CacheTier::kDevice ? "device" : "host", p, e.prefix.size(),
                        it == pages.end() ? '-' : it->second));
        continue;
      }
      if (no_host && (e.tier != CacheTier::kDevice || e.kept_in_host)) {
        errors.push_back(fmt::format("no host tier, yet a {} eviction kept_in_host {} (page {})",
                                     CacheTierName(e.tier), e.kept_in_host, p));
      }
      if (pins.count(k) && pins[k] > 0) {
        errors.push_back(
            fmt::format("evicted pinned page {} (prefix {} tokens)", p, e.prefix.size()));
      }
      if (e.tier == CacheTier::kDevice && e.kept_in_host) {
        it->second = 'H';
      } else {
        pages.erase(it);
      }
    }
  }

  // Expected (device, host) token counts of a match.
  std::pair<int64_t, int64_t> Expect(const std::vector<uint64_t>& hashes, int64_t n) {
    int64_t dev = 0, host = 0;
    for (int64_t p = 0; p < n / P; ++p) {
      auto it = pages.find(Key(hashes, p, P));
      if (it == pages.end()) break;
      if (it->second == 'D' && host == 0) {
        dev += P;
      } else if (it->second == 'H') {
        host += P;
      } else {
        errors.push_back(fmt::format("model: device page {} below a host-only page", p));
        break;
      }
    }
    return {dev, host};
  }

  void Pin(const std::vector<uint64_t>& hashes, int64_t tokens, int delta) {
    for (int64_t p = 0; p < tokens / P; ++p) pins[Key(hashes, p, P)] += delta;
  }
  void Set(const std::vector<uint64_t>& hashes, int64_t from, int64_t to, char state) {
    for (int64_t p = from / P; p < to / P; ++p) pages[Key(hashes, p, P)] = state;
  }
  int64_t Count(char state) const {
    int64_t n = 0;
    for (auto& [k, s] : pages) n += s == state;
    return n;
  }
};

class CacheModelTest : public ::testing::TestWithParam<Params> {};

void RunModel(const Params& prm, uint64_t seed, int64_t steps, TransferBackend backend) {
  const int64_t P = prm.page;
  SCOPED_TRACE(fmt::format("seed {} page_size {} policy {} backend {} (rerun: KVTIER_TEST_SEED={})",
                           seed, P, WritePolicyName(prm.policy), TransferBackendName(backend),
                           seed));
  std::mt19937_64 rng(seed * 7919 + static_cast<uint64_t>(P) * 31 +
                      static_cast<uint64_t>(prm.policy));
  const int64_t device_pages = P == 1 ? 48 : (P == 16 ? 24 : 16);
  const int64_t host_pages = device_pages * 2;
  const int64_t max_pages = P == 1 ? 20 : (P == 16 ? 6 : 4);
  const bool mla = seed % 3 == 2;
  const int64_t slot_bytes = 8;
  const KvLayout host_layouts[] = {KvLayout::kPageFirst, KvLayout::kLayerFirst,
                                   KvLayout::kPageFirstDirect, KvLayout::kPageHead};

  Model model;
  model.P = P;
  model.no_host = prm.no_host;
  HierarchicalCacheConfig cfg;
  cfg.write_policy = prm.policy;
  cfg.device_eviction = static_cast<EvictionPolicyKind>(seed % 4);
  cfg.host_eviction = static_cast<EvictionPolicyKind>((seed / 4) % 4);
  cfg.host_layout = host_layouts[seed % 4];
  cfg.backup_threads = static_cast<int>(seed % 2);  // odd seeds: async backups
  cfg.load_back_min_tokens = seed % 2 == 0 ? 2 * P : 0;
  cfg.transfer.cpu_threads = 1;
  cfg.host_capacity_bytes = host_pages * P * 2 * slot_bytes * (mla ? 1 : 2);
  if (prm.no_host) {
    cfg.host_capacity_bytes = 0;
    cfg.host_ratio = 0;
  }
  cfg.eviction_listener = [&model](const EvictionEvent& e) { model.OnEvict(e); };
  KvGeometry g{KvLayout::kLayerFirst, 2, device_pages * P, slot_bytes, P, 2};
  auto dev_r = DeviceTier::Create(backend, g, mla);
  ASSERT_TRUE(dev_r.ok()) << dev_r.status().ToString();
  DeviceTier& dev = **dev_r;
  cfg.transfer_backend = backend;
  auto cache_r = HierarchicalCache::Create(cfg, dev.region());
  ASSERT_TRUE(cache_r.ok()) << cache_r.status().ToString();
  HierarchicalCache& cache = **cache_r;

  const std::vector<std::string> namespaces = {"", "tenant"};
  std::vector<std::pair<std::string, std::vector<Token>>> history;
  std::vector<Live> live;

  auto random_seq = [&](std::string* ns) {
    std::vector<Token> t;
    if (!history.empty() && rng() % 3 != 0) {
      // Mostly recent sequences (they are still cached somewhere), sometimes any.
      const size_t window = rng() % 4 == 0 ? history.size() : std::min<size_t>(history.size(), 24);
      const auto& [hns, base] = history[history.size() - 1 - rng() % window];
      *ns = hns;
      t.assign(base.begin(), base.begin() + static_cast<std::ptrdiff_t>(rng() % (base.size() + 1)));
    } else {
      *ns = namespaces[rng() % namespaces.size()];
    }
    const int64_t max_len = max_pages * P + P - 1;
    const int64_t extra = static_cast<int64_t>(rng() % static_cast<uint64_t>(2 * P + 2));
    for (int64_t i = 0; i < extra && static_cast<int64_t>(t.size()) < max_len; ++i) {
      t.push_back(static_cast<Token>(rng() % 4));
    }
    return t;
  };

  // Match + exact comparison + byte check. Leaves the handle live and pinned in the model.
  auto match = [&](const std::string& ns, const std::vector<Token>& t,
                   const std::vector<uint64_t>& h) -> Result<MatchResult> {
    auto m = cache.Match(t, ns);
    if (!m.ok()) return m.status();
    auto [edev, ehost] = model.Expect(h, static_cast<int64_t>(t.size()));
    EXPECT_EQ(m->device_tokens, edev);
    EXPECT_EQ(m->host_tokens, ehost);
    EXPECT_EQ(static_cast<int64_t>(m->device_slots.size()), m->device_tokens);
    EXPECT_EQ(static_cast<int64_t>(m->host_slots.size()), m->host_tokens);
    const std::span<const uint64_t> hs(h);
    Status st = dev.Verify(m->device_slots, hs.first(m->device_slots.size()));
    EXPECT_TRUE(st.ok()) << "device slots: " << st.ToString();
    if (!m->host_slots.empty()) {
      st = VerifyKvPattern(cache.host_region(), m->host_slots,
                           hs.subspan(m->device_slots.size(), m->host_slots.size()));
      EXPECT_TRUE(st.ok()) << "host slots: " << st.ToString();
    }
    model.Pin(h, m->device_tokens + m->host_tokens, +1);
    return m;
  };
  auto release = [&](size_t i) {
    const Live& l = live[i];
    model.Pin(KvPatternHashes(l.tokens, KvPatternSalt(l.ns)), l.matched, -1);
    EXPECT_TRUE(cache.Release(l.handle).ok());
    live.erase(live.begin() + static_cast<std::ptrdiff_t>(i));
  };
  // LoadBack of a live handle, checked against the model.
  auto load_back = [&](const Live& l) -> std::optional<LoadBackResult> {
    const auto h = KvPatternHashes(l.tokens, KvPatternSalt(l.ns));
    auto [edev, ehost] = model.Expect(h, l.matched);
    EXPECT_EQ(edev + ehost, l.matched) << "a pinned page left the cache";
    auto lb = cache.LoadBack(l.handle);
    if (!lb.ok()) {
      EXPECT_TRUE(lb.status().IsOutOfMemory()) << lb.status().ToString();
      return std::nullopt;
    }
    if (ehost > 0 && ehost < cfg.load_back_min_tokens) {
      EXPECT_EQ(lb->skipped_tokens, ehost);
      EXPECT_EQ(lb->loaded_tokens, 0);
      return std::nullopt;
    }
    EXPECT_EQ(lb->loaded_tokens, ehost);
    model.Set(h, edev, l.matched, 'D');
    EXPECT_EQ(static_cast<int64_t>(lb->device_slots.size()), l.matched);
    Status st =
        dev.Verify(lb->device_slots, std::span<const uint64_t>(h).first(lb->device_slots.size()));
    EXPECT_TRUE(st.ok()) << "loaded slots: " << st.ToString();
    return std::move(*lb);
  };
  auto sweep = [&] {
    const size_t from = history.size() > 300 ? history.size() - 300 : 0;
    for (size_t i = from; i < history.size(); ++i) {
      const auto& [ns, t] = history[i];
      const auto h = KvPatternHashes(t, KvPatternSalt(ns));
      auto m = match(ns, t, h);
      ASSERT_TRUE(m.ok()) << m.status().ToString();
      model.Pin(h, m->device_tokens + m->host_tokens, -1);
      ASSERT_TRUE(cache.Release(m->handle).ok());
    }
  };

  for (int64_t step = 0; step < steps; ++step) {
    SCOPED_TRACE(fmt::format("step {}", step));
    const int op = static_cast<int>(rng() % 100);
    if (op < 40) {  // a request: match, maybe load back, maybe compute and insert
      std::string ns;
      const std::vector<Token> t = random_seq(&ns);
      const auto h = KvPatternHashes(t, KvPatternSalt(ns));
      auto m = match(ns, t, h);
      ASSERT_TRUE(m.ok()) << m.status().ToString();
      live.push_back({ns, t, m->handle, m->device_tokens + m->host_tokens});
      int64_t have = m->device_tokens;
      std::vector<int64_t> prefix_slots = m->device_slots;
      int64_t host_part = m->host_tokens;
      if (rng() % 2 == 0 && m->host_tokens > 0) {
        std::optional<LoadBackResult> lb = load_back(live.back());
        if (lb.has_value()) {
          have = static_cast<int64_t>(lb->device_slots.size());
          prefix_slots = lb->device_slots;
          host_part = 0;
        }
      }
      const int64_t aligned = static_cast<int64_t>(t.size()) / P * P;
      if (rng() % 10 < 7 && aligned > 0) {
        const bool dup = rng() % 7 == 0;
        const int64_t from = dup ? 0 : have;
        auto fresh = cache.AllocateDeviceSlots(aligned - from);
        if (fresh.ok()) {
          ASSERT_EQ(static_cast<int64_t>(fresh->size()), aligned - from);
          ASSERT_TRUE(
              dev.Fill(*fresh, std::span<const uint64_t>(h).subspan(from, aligned - from)).ok());
          std::vector<int64_t> slots;
          if (!dup) slots = prefix_slots;
          slots.insert(slots.end(), fresh->begin(), fresh->end());
          const bool pin = rng() % 5 == 0;  // a request that keeps decoding on its KV
          auto ins = cache.Insert(std::span<const Token>(t).first(aligned), slots, ns,
                                  InsertOptions{.pin = pin});
          ASSERT_TRUE(ins.ok()) << ins.status().ToString();
          EXPECT_EQ(ins->cached_tokens, have);
          EXPECT_EQ(ins->revived_tokens, std::min(host_part, aligned - have));
          EXPECT_EQ(ins->new_tokens, aligned - have - ins->revived_tokens);
          EXPECT_EQ(ins->duplicate_tokens, dup ? have : 0);
          model.Set(h, 0, aligned, 'D');
          if (pin) {
            model.Pin(h, aligned, +1);
            live.push_back(
                {ns, std::vector<Token>(t.begin(), t.begin() + aligned), ins->handle, aligned});
          }
          history.push_back({ns, std::vector<Token>(t.begin(), t.begin() + aligned)});
          if (static_cast<int64_t>(t.size()) > aligned) {  // the partial page: computed, not cached
            auto tail = cache.AllocateDeviceSlots(static_cast<int64_t>(t.size()) - aligned);
            if (tail.ok()) {
              ASSERT_TRUE(cache.FreeDeviceSlots(*tail).ok());
            }
          }
        } else {
          ASSERT_TRUE(fresh.status().IsOutOfMemory()) << fresh.status().ToString();
        }
      }
      while (live.size() > 3) release(rng() % live.size());
      if (!live.empty() && rng() % 10 < 7) release(live.size() - 1);
    } else if (op < 52) {
      if (!live.empty()) release(rng() % live.size());
    } else if (op < 62) {
      if (!live.empty()) load_back(live[rng() % live.size()]);
    } else if (op < 70) {
      auto r = cache.EvictDevice(static_cast<int64_t>(rng() % (device_pages / 2 + 1)) * P);
      ASSERT_TRUE(r.ok()) << r.status().ToString();
    } else if (op < 76) {
      auto r = cache.EvictHost(static_cast<int64_t>(rng() % (host_pages / 4 + 1)) * P);
      ASSERT_TRUE(r.ok()) << r.status().ToString();
      if (prm.no_host) {
        ASSERT_EQ(*r, 0);
      }
    } else if (op < 80) {
      ASSERT_TRUE(cache.WaitForBackups().ok());
    } else if (op < 88) {  // an aborted request: slots taken and given back
      auto s = cache.AllocateDeviceSlots(static_cast<int64_t>(rng() % (3 * P)) + 1);
      if (s.ok()) {
        ASSERT_TRUE(cache.FreeDeviceSlots(*s).ok());
      } else {
        ASSERT_TRUE(s.status().IsOutOfMemory()) << s.status().ToString();
      }
    } else {  // a lookup only
      std::string ns;
      const std::vector<Token> t = random_seq(&ns);
      const auto h = KvPatternHashes(t, KvPatternSalt(ns));
      auto m = match(ns, t, h);
      ASSERT_TRUE(m.ok());
      model.Pin(h, m->device_tokens + m->host_tokens, -1);
      ASSERT_TRUE(cache.Release(m->handle).ok());
    }
    if (step % 200 == 199) sweep();
    const Status st = cache.CheckConsistency();
    ASSERT_TRUE(st.ok()) << st.ToString();
    const CacheStats stats = cache.stats();
    ASSERT_EQ(stats.device_cached_tokens, model.Count('D') * P);
    ASSERT_EQ(stats.live_handles, static_cast<int64_t>(live.size()));
    ASSERT_EQ(stats.device_engine_tokens, 0);
    ASSERT_TRUE(model.errors.empty()) << model.errors.front();
    if (::testing::Test::HasFailure()) return;
  }
  while (!live.empty()) release(live.size() - 1);
  ASSERT_TRUE(cache.WaitForBackups().ok());
  sweep();
  ASSERT_TRUE(model.errors.empty()) << model.errors.front();
  const CacheStats stats = cache.stats();
  if (testing::EnvInt("KVTIER_TEST_VERBOSE", 0) != 0) {
    fmt::print(
        "seed {} P {} {}: inserted {} dup {} device hits {} host hits {} loaded {} skipped {} "
        "backups {} skipped {} write_back {} dev evicted {} dropped {} host evicted {} "
        "history {}\n",
        seed, P, WritePolicyName(prm.policy), stats.inserted_tokens, stats.duplicate_tokens,
        stats.device_hit_tokens, stats.host_hit_tokens, stats.load_back_tokens,
        stats.load_back_skipped_tokens, stats.backup_tokens, stats.backup_skipped_tokens,
        stats.write_back_tokens, stats.device_evicted_tokens, stats.dropped_tokens,
        stats.host_evicted_tokens, history.size());
  }
  // The run must have exercised the tiers, or it proved nothing.
  EXPECT_GT(stats.device_evicted_tokens, 0);
  EXPECT_GT(stats.device_hit_tokens, 0);
  if (prm.no_host) {
    // Nothing ever went to host memory, and every eviction forgot its tokens.
    EXPECT_EQ(stats.host_total_tokens, 0);
    EXPECT_EQ(stats.host_total_bytes, 0);
    EXPECT_EQ(stats.host_used_tokens, 0);
    EXPECT_EQ(stats.host_hit_tokens, 0);
    EXPECT_EQ(stats.backup_tokens + stats.backup_skipped_tokens + stats.write_back_tokens, 0);
    EXPECT_EQ(stats.load_back_tokens, 0);
    EXPECT_EQ(stats.dropped_tokens, stats.device_evicted_tokens);
    EXPECT_EQ(stats.host_evicted_tokens, 0);
    EXPECT_EQ(cache.host_region().geometry.num_slots, 0);
    EXPECT_NE(cache.Metrics().find("kvtier:hicache_host_total_tokens 0\n"), std::string::npos);
  } else if (prm.policy != WritePolicy::kWriteBack || stats.write_back_tokens > 0) {
    EXPECT_GT(stats.backup_tokens, 0);
  }
}

TEST_P(CacheModelTest, AgreesWithReferenceModel) {
  const TransferBackend backend = testing::BackendFromEnv();
  if (backend != TransferBackend::kCpu && CudaDeviceCount() == 0) {
    GTEST_SKIP() << "KVTIER_TEST_BACKEND=" << TransferBackendName(backend) << " needs a GPU";
  }
  const int64_t steps = testing::EnvInt("KVTIER_TEST_STEPS", 3000);
  const int64_t one_seed = testing::EnvInt("KVTIER_TEST_SEED", 0);
  for (uint64_t seed = 1; seed <= 4; ++seed) {
    RunModel(GetParam(), one_seed > 0 ? static_cast<uint64_t>(one_seed) : seed, steps, backend);
    if (HasFailure() || one_seed > 0) return;
  }
}

INSTANTIATE_TEST_SUITE_P(
    PoliciesAndPages, CacheModelTest,
    ::testing::Values(Params{WritePolicy::kWriteThrough, 1}, Params{WritePolicy::kWriteThrough, 16},
                      Params{WritePolicy::kWriteThrough, 64},
                      Params{WritePolicy::kWriteThroughSelective, 1},
                      Params{WritePolicy::kWriteThroughSelective, 16},
                      Params{WritePolicy::kWriteThroughSelective, 64},
                      Params{WritePolicy::kWriteBack, 1}, Params{WritePolicy::kWriteBack, 16},
                      Params{WritePolicy::kWriteBack, 64},
                      Params{WritePolicy::kWriteThrough, 16, /*no_host=*/true},
                      Params{WritePolicy::kWriteThroughSelective, 1, /*no_host=*/true},
                      Params{WritePolicy::kWriteBack, 16, /*no_host=*/true}),
    [](const auto& info) {
      return fmt::format("{}_page{}{}", WritePolicyName(info.param.policy), info.param.page,
                         info.param.no_host ? "_no_host" : "");
    });

}  // namespace
}  // namespace kvtier
