// Cache manager micro-benchmarks (page size 16): Match of an 8,192-token prompt against a tree of
// 100,000 pages, Insert (8,192 new tokens with their page keys; a request after a cached system
// prompt), and evicting 1,000 pages from the device tier. The device tier is a host-memory region
// (cpu backend); the KV bytes play no part in these paths except where a benchmark says it copies.
// The caches have a memory:// storage tier, so Insert computes the chained SHA-256 page keys of
// what it inserts (the label says "keys" when the cache has a storage tier).
//
//   kvtier_bench_cache [--benchmark_filter=...]
#include <benchmark/benchmark.h>
#include <fmt/format.h>
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>
#include <vector>

#include "kvtier/hierarchical_cache.h"
#include "kvtier/page_key.h"

namespace kvtier {
namespace {

constexpr int64_t kPage = 16;
constexpr int64_t kTreePages = 100'000;
constexpr int64_t kSystemPromptTokens = 1024;  // 64 pages, shared by many requests
constexpr int64_t kNumSystemPrompts = 16;
constexpr int64_t kRequestTokens = 512;  // unique part of a request: 32 pages
constexpr int64_t kPromptTokens = 8192;

void Die(const Status& st, const char* what) {
  if (st.ok()) return;
  std::fprintf(stderr, "%s: %s\n", what, st.ToString().c_str());
  std::abort();
}

// A cache whose device tier holds kTreePages pages of cached requests plus headroom.
struct World {
  std::vector<std::byte> k, v;
  KvRegion region;
  std::unique_ptr<HierarchicalCache> cache;
  std::mt19937_64 rng{42};
  std::vector<std::vector<Token>> system_prompts;
  std::vector<Token> long_prompt;  // 8,192 tokens, cached in full

  World(WritePolicy policy, int64_t threshold, int64_t host_pages, int64_t headroom_pages,
        bool with_storage = true) {
    const int64_t pages = kTreePages + headroom_pages;
    region.geometry = {KvLayout::kLayerFirst, 1, pages * kPage, 4, kPage, 1};
    k.resize(static_cast<size_t>(region.geometry.buffer_bytes()));
    v.resize(k.size());
    region.k = k.data();
    region.v = v.data();
    HierarchicalCacheConfig cfg;
    cfg.write_policy = policy;
    cfg.write_through_threshold = threshold;
    cfg.backup_threads = 0;
    cfg.host_capacity_bytes = host_pages * kPage * 4 * 2;
    // Storage is written only when a node leaves host memory (write_back) or after a host backup;
    // these benchmarks time tree work and key computation, not storage I/O.
    if (with_storage) {
      cfg.storage.url = "memory://?capacity=256MiB";
      cfg.storage.model_id = "cache_bench";
    }
    auto c = HierarchicalCache::Create(cfg, region);
    Die(c.status(), "create");
    cache = std::move(*c);
    for (int64_t s = 0; s < kNumSystemPrompts; ++s) {
      system_prompts.push_back(Random(kSystemPromptTokens));
    }
    long_prompt = system_prompts[0];
    const auto rest = Random(kPromptTokens - kSystemPromptTokens);
    long_prompt.insert(long_prompt.end(), rest.begin(), rest.end());
    Insert(long_prompt);
    for (const auto& sp : system_prompts) Insert(sp);
    while (cache->stats().device_cached_tokens < kTreePages * kPage) InsertRequest();
  }

  std::vector<Token> Random(int64_t n) {
    std::vector<Token> t(static_cast<size_t>(n));
    for (auto& x : t) x = static_cast<Token>(rng() % 128000);
    return t;
  }

  // Inserts `tokens` the way an engine does (match, allocate the rest, insert, release).
  void Insert(const std::vector<Token>& tokens) {
    auto m = cache->Match(tokens);
    Die(m.status(), "match");
    std::vector<int64_t> slots = m->device_slots;
    auto fresh = cache->AllocateDeviceSlots(static_cast<int64_t>(tokens.size()) - m->device_tokens);
    Die(fresh.status(), "allocate");
    slots.insert(slots.end(), fresh->begin(), fresh->end());
    Die(cache->Insert(tokens, slots).status(), "insert");
    Die(cache->Release(m->handle), "release");
  }

  std::vector<Token> NewRequest(int64_t unique_tokens) {
    std::vector<Token> t = system_prompts[rng() % system_prompts.size()];
    const auto rest = Random(unique_tokens);
    t.insert(t.end(), rest.begin(), rest.end());
    return t;
  }
  void InsertRequest() { Insert(NewRequest(kRequestTokens)); }
};

// CPU time of the calling thread: on a shared machine the wall time of a timed region includes
// waiting for a core; this does not.
double ThreadCpuSeconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

// Wall time (the benchmark's manual time) and thread CPU time (counter "cpu_us") of timed
// regions.
class RegionTimer {
 public:
  explicit RegionTimer(benchmark::State& state) : state_(state) {}
  void Start() {
    cpu_start_ = ThreadCpuSeconds();
    wall_start_ = std::chrono::steady_clock::now();
  }
  void Stop() {
    const auto wall_end = std::chrono::steady_clock::now();
    cpu_seconds_ += ThreadCpuSeconds() - cpu_start_;
    state_.SetIterationTime(std::chrono::duration<double>(wall_end - wall_start_).count());
  }
  void Report() {
    state_.counters["cpu_us"] = benchmark::Counter(
        cpu_seconds_ * 1e6 / static_cast<double>(std::max<int64_t>(1, state_.iterations())));
  }

 private:
  benchmark::State& state_;
  double cpu_start_ = 0;
  double cpu_seconds_ = 0;
  std::chrono::steady_clock::time_point wall_start_;
};

void ReportTree(benchmark::State& state, const World& w) {
  const CacheStats s = w.cache->stats();
  state.counters["tree_pages"] = static_cast<double>(s.device_cached_tokens / kPage);
  state.counters["nodes"] = static_cast<double>(s.nodes);
  if (w.cache->storage() != nullptr) state.SetLabel("keys");
}

// Match (full hit of 8,192 tokens = 512 pages: compare every token, return every slot, pin) and
// the Release that unpins it.
void BM_Match8192(benchmark::State& state) {
  static World w(WritePolicy::kWriteBack, 2, 1024, 1024);
  for (auto _ : state) {
    auto m = w.cache->Match(w.long_prompt);
    benchmark::DoNotOptimize(m->device_slots.data());
    if (m->device_tokens != kPromptTokens) state.SkipWithError("not a full hit");
    (void)w.cache->Release(m->handle);
  }
  ReportTree(state, w);
}
BENCHMARK(BM_Match8192)->Unit(benchmark::kMicrosecond);

// Match of an 8,192-token prompt of which only the shared 1,024-token system prompt is cached.
void BM_Match8192PartialHit(benchmark::State& state) {
  static World w(WritePolicy::kWriteBack, 2, 1024, 1024);
  std::vector<Token> prompt = w.NewRequest(kPromptTokens - kSystemPromptTokens);
  for (auto _ : state) {
    auto m = w.cache->Match(prompt);
    benchmark::DoNotOptimize(m->device_slots.data());
    (void)w.cache->Release(m->handle);
  }
  ReportTree(state, w);
}
BENCHMARK(BM_Match8192PartialHit)->Unit(benchmark::kMicrosecond);

// Insert of a request: a cached 1,024-token system prompt plus `range(0)` new tokens (engine
// slots already allocated; timed: Insert alone). Slots are made by evicting LRU requests
// (untimed), so the tree stays at 100,000 pages.
void BM_Insert(benchmark::State& state) {
  static World w(WritePolicy::kWriteBack, 2, 1024, 512);
  const int64_t fresh_tokens = state.range(0);
  RegionTimer timer(state);
  for (auto _ : state) {
    const std::vector<Token> t = w.NewRequest(fresh_tokens);
    auto m = w.cache->Match(t);
    std::vector<int64_t> slots = m->device_slots;
    // Usually the system prompt is cached and only `fresh_tokens` are new; when eviction took
    // the system prompt too, its tokens are computed (and inserted) again.
    auto fresh = w.cache->AllocateDeviceSlots(static_cast<int64_t>(t.size()) - m->device_tokens);
    Die(fresh.status(), "allocate");
    slots.insert(slots.end(), fresh->begin(), fresh->end());
    timer.Start();
    auto r = w.cache->Insert(t, slots);
    timer.Stop();
    Die(r.status(), "insert");
    (void)w.cache->Release(m->handle);
  }
  timer.Report();
  ReportTree(state, w);
}
BENCHMARK(BM_Insert)
    ->Arg(kRequestTokens)
    ->Arg(kPromptTokens - kSystemPromptTokens)
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);

// Insert of 8,192 new tokens (512 pages, no cached prefix) into a tree of 100,000 pages, page keys
// included (range(0) = 1; 0: a cache without a storage tier, so no keys, to show their share);
// engine slots already allocated (untimed: allocation evicts LRU requests, so the tree stays at
// 100,000 pages).
void BM_Insert8192New(benchmark::State& state) {
  static World keyed(WritePolicy::kWriteBack, 2, 1024, 1024);
  static World* unkeyed = nullptr;
  if (state.range(0) == 0 && unkeyed == nullptr) {
    unkeyed = new World(WritePolicy::kWriteBack, 2, 1024, 1024, /*with_storage=*/false);
  }
  World& w = state.range(0) == 0 ? *unkeyed : keyed;
  double keys_cpu_seconds = 0;
  RegionTimer timer(state);
  for (auto _ : state) {
    const std::vector<Token> t = w.Random(kPromptTokens);
    auto slots = w.cache->AllocateDeviceSlots(kPromptTokens);
    Die(slots.status(), "allocate");
    // The evictions of that allocation may queue storage writes (write_back stores what leaves
    // host memory); let them finish so that their completion is not billed to Insert.
    Die(w.cache->WaitForBackups(), "wait for backups");
    timer.Start();
    auto r = w.cache->Insert(t, *slots);
    timer.Stop();
    Die(r.status(), "insert");
    if (r->new_tokens != kPromptTokens) state.SkipWithError("not all tokens were new");
    // The same keys computed alone (untimed; reported as keys_cpu_us): Insert's share for them.
    const double keys_start = ThreadCpuSeconds();
    auto keys = ComputePromptPageKeys(t, kPage);
    keys_cpu_seconds += ThreadCpuSeconds() - keys_start;
    Die(keys.status(), "keys");
  }
  timer.Report();
  state.counters["keys_cpu_us"] = keys_cpu_seconds * 1e6 / static_cast<double>(state.iterations());
  ReportTree(state, w);
}
BENCHMARK(BM_Insert8192New)->Arg(1)->Arg(0)->UseManualTime()->Unit(benchmark::kMicrosecond);

// EvictDevice of 1,000 pages (timed), then refill and wait for the refill's backups (untimed).
//   dropped:   nodes without a host copy are removed from the tree (write_through_selective,
//              never reaching its threshold);
//   kept_host: every node has a host copy (write_through), so eviction keeps it cached in host
//              memory.
void BM_EvictDevice1000Pages(benchmark::State& state) {
  const bool backed_up = state.range(0) == 1;
  static World dropped(WritePolicy::kWriteThroughSelective, 1 << 30, 1024, 1024);
  static World* kept = nullptr;
  if (backed_up && kept == nullptr) {
    kept = new World(WritePolicy::kWriteThrough, 1, 2 * kTreePages, 1024);
  }
  World& w = backed_up ? *kept : dropped;
  state.SetLabel(backed_up ? "kept_host" : "dropped");
  RegionTimer timer(state);
  for (auto _ : state) {
    timer.Start();
    auto r = w.cache->EvictDevice(1000 * kPage);
    timer.Stop();
    Die(r.status(), "evict");
    if (*r < 1000 * kPage) state.SkipWithError("evicted fewer than 1,000 pages");
    while (w.cache->stats().device_cached_tokens < kTreePages * kPage) w.InsertRequest();
    // The refill's backups (and, with the storage tier, their writes to storage) complete and
    // are reaped here, untimed, not inside the next timed EvictDevice.
    Die(w.cache->WaitForBackups(), "wait for backups");
  }
  timer.Report();
  ReportTree(state, w);
}
BENCHMARK(BM_EvictDevice1000Pages)->Arg(0)->Arg(1)->UseManualTime()->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace kvtier

BENCHMARK_MAIN();
