// HierarchicalCache on a GPU (kernel and dma backends) with a storage tier: a prefix evicted from
// the device and host memory comes back through QueryStorage -> Prefetch -> LoadBack, and a
// kernel on another stream consumes it layer by layer after WaitLayer, comparing every byte with
// the KV pattern. The load is held behind a gate on its stream, so a consumer that did not wait
// for the right layer would read the poison the device pool was filled with; the same with a
// streamed storage hit whose pieces arrive out of order (WaitLayer covers every piece). Also: a
// LoadBack into slots the engine just wrote (reused after eviction) is ordered after those writes.
// Every test skips itself without a GPU.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <future>
#include <limits>
#include <mutex>
#include <random>
#include <thread>

#include "cache/cache_test_util.h"
#include "kvtier/device.h"
#include "kvtier/hierarchical_cache.h"
#include "kvtier/storage.h"
#include "kvtier/testing/kv_pattern.h"
#include "kvtier/testing/storage_fault.h"

namespace kvtier {
namespace {

using testing::DeviceTier;
using testing::Hashes;

constexpr int64_t kLayers = 4;
constexpr int64_t kSlotBytes = 64;
constexpr int64_t kPage = 16;

#define REQUIRE_GPU()                                                     \
  do {                                                                    \
    if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device present"; \
  } while (0)

// Counts the bytes of layer `layer` of `slots` (in a layer_first region with `num_slots` slots)
// that differ from `want` (layer_first, slot i of `want` for slots[i]); K and V.
__global__ void CountMismatches(const unsigned char* k, const unsigned char* v,
                                const unsigned char* want_k, const unsigned char* want_v,
                                const int64_t* slots, int64_t n, int64_t num_slots,
                                int64_t want_slots, int64_t slot_bytes, int64_t layer,
                                unsigned long long* wrong) {
  const int64_t total = n * slot_bytes;
  unsigned long long mine = 0;
  for (int64_t x = blockIdx.x * blockDim.x + threadIdx.x; x < total;
       x += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t i = x / slot_bytes, b = x % slot_bytes;
    const int64_t got = (layer * num_slots + slots[i]) * slot_bytes + b;
    const int64_t exp = (layer * want_slots + i) * slot_bytes + b;
    mine += (k[got] != want_k[exp]) + (v[got] != want_v[exp]);
  }
  if (mine != 0) atomicAdd(wrong, mine);
}

// Every byte of the device pool `d` (K and V of geometry `g`) to 0xEE: a consumer that reads a
// layer before it arrived sees it.
void Poison(const KvRegion& d, const KvGeometry& g) {
  ASSERT_EQ(cudaMemset(d.k, 0xEE, static_cast<size_t>(g.buffer_bytes())), cudaSuccess);
  ASSERT_EQ(cudaMemset(d.v, 0xEE, static_cast<size_t>(g.buffer_bytes())), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

// The consumer of a load-back: the KV pattern of `hashes` laid out layer_first over slots
// 0..n-1, the device slots the load filled (slot i holds hashes[i]) and a count of wrong bytes,
// all in device memory (freed at the end).
class LayerConsumer {
 public:
  ~LayerConsumer() {
    cudaFree(dk);
    cudaFree(dv);
    cudaFree(dslots);
    cudaFree(wrong);
  }

  // The expected bytes and `device_slots` on the device; the count at 0.
  void Prepare(const std::vector<uint64_t>& hashes, const std::vector<int64_t>& device_slots) {
    n = static_cast<int64_t>(device_slots.size());
    KvGeometry wg{KvLayout::kLayerFirst, kLayers, n, kSlotBytes, kPage, 1};
    std::vector<std::byte> want_k(static_cast<size_t>(wg.buffer_bytes()));
    std::vector<std::byte> want_v(want_k.size());
    KvRegion want;
    want.geometry = wg;
    want.k = want_k.data();
    want.v = want_v.data();
    std::vector<int64_t> iota(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) iota[static_cast<size_t>(i)] = i;
    ASSERT_TRUE(FillKvPattern(want, iota, hashes).ok());
    ASSERT_EQ(cudaMalloc(&dk, want_k.size()), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&dv, want_v.size()), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&dslots, static_cast<size_t>(n) * sizeof(int64_t)), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&wrong, sizeof(unsigned long long)), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(dk, want_k.data(), want_k.size(), cudaMemcpyHostToDevice), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(dv, want_v.data(), want_v.size(), cudaMemcpyHostToDevice), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(dslots, device_slots.data(), static_cast<size_t>(n) * sizeof(int64_t),
                         cudaMemcpyHostToDevice),
              cudaSuccess);
    ASSERT_EQ(cudaMemset(wrong, 0, sizeof(unsigned long long)), cudaSuccess);
  }

  // Per layer: WaitLayer on `stream`, then a kernel on `stream` that counts the bytes of the
  // device pool `d` (`num_slots` slots) that differ from the expected ones.
  void ConsumeEveryLayer(HierarchicalCache& cache, MatchHandle handle, cudaStream_t stream,
                         const KvRegion& d, int64_t num_slots) {
    for (int64_t l = 0; l < kLayers; ++l) {
      ASSERT_TRUE(cache.WaitLayer(handle, l, stream).ok());
      CountMismatches<<<32, 256, 0, stream>>>(static_cast<const unsigned char*>(d.k),
                                              static_cast<const unsigned char*>(d.v), dk, dv,
                                              dslots, n, num_slots, n, kSlotBytes, l, wrong);
      ASSERT_EQ(cudaGetLastError(), cudaSuccess);
    }
  }

  // The count so far (REQUIRES: the consumer stream synchronized).
  void ReadWrong(unsigned long long* bad) {
    ASSERT_EQ(cudaMemcpy(bad, wrong, sizeof(*bad), cudaMemcpyDeviceToHost), cudaSuccess);
  }

 private:
  unsigned char *dk = nullptr, *dv = nullptr;
  int64_t* dslots = nullptr;
  unsigned long long* wrong = nullptr;
  int64_t n = 0;
};

// A host function that holds its stream until Open().
struct Gate {
  std::mutex mu;
  std::condition_variable cv;
  bool open = false;
  static void CUDART_CB Wait(void* p) {
    auto* g = static_cast<Gate*>(p);
    std::unique_lock<std::mutex> lk(g->mu);
    g->cv.wait_for(lk, std::chrono::seconds(30), [&] { return g->open; });
  }
  void Open() {
    {
      std::lock_guard<std::mutex> lk(mu);
      open = true;
    }
    cv.notify_all();
  }
};

class GpuCacheTest : public ::testing::TestWithParam<TransferBackend> {};

TEST_P(GpuCacheTest, PrefetchLoadBackWaitLayerFeedsAKernelOnAnotherStream) {
  REQUIRE_GPU();
  const TransferBackend backend = GetParam();
  KvGeometry g{KvLayout::kLayerFirst, kLayers, 32 * kPage, kSlotBytes, kPage, 1};
  auto dev = DeviceTier::Create(backend, g, false);
  ASSERT_TRUE(dev.ok()) << dev.status().ToString();
  StorageNamespace ns;
  ns.model_id = "gpu-cache-test";
  ns.layout = KvLayout::kPageFirst;
  ns.num_layers = kLayers;
  ns.slot_bytes = kSlotBytes;
  ns.page_size = kPage;
  auto store = OpenStorage("memory://?capacity=64MiB", ns);
  ASSERT_TRUE(store.ok()) << store.status().ToString();

  HierarchicalCacheConfig cfg;
  cfg.write_policy = WritePolicy::kWriteThrough;
  cfg.transfer_backend = backend;
  cfg.host_capacity_bytes = 64 * kPage * kLayers * kSlotBytes * 2;
  cfg.storage.backend = std::shared_ptr<StorageBackend>(std::move(*store));
  cfg.storage.prefetch_threshold_tokens = 0;
  cfg.storage.stream_load_back = false;  // one copy (StreamedStorageHit... streams)
  auto cache_r = HierarchicalCache::Create(cfg, (*dev)->region());
  ASSERT_TRUE(cache_r.ok()) << cache_r.status().ToString();
  HierarchicalCache& cache = **cache_r;

  std::vector<Token> a(static_cast<size_t>(12 * kPage));
  for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<Token>(40000 + i);
  const auto hashes = Hashes(a, "");
  auto fresh = cache.AllocateDeviceSlots(static_cast<int64_t>(a.size()));
  ASSERT_TRUE(fresh.ok());
  ASSERT_TRUE((*dev)->Fill(*fresh, hashes).ok());
  ASSERT_TRUE(cache.Insert(a, *fresh).ok());
  ASSERT_TRUE(cache.WaitForBackups().ok());
  ASSERT_TRUE(cache.EvictDevice(std::numeric_limits<int64_t>::max()).ok());
  ASSERT_TRUE(cache.EvictHost(std::numeric_limits<int64_t>::max()).ok());
  ASSERT_TRUE(cache.CheckConsistency().ok()) << cache.CheckConsistency().ToString();
  // Poison the device pool: a consumer that reads before its layer arrived sees 0xEE.
  const KvRegion& d = (*dev)->region();
  ASSERT_NO_FATAL_FAILURE(Poison(d, g));

  auto m = cache.Match(a);
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->storage_tokens, static_cast<int64_t>(a.size()));
  ASSERT_TRUE(cache.QueryStorage(m->handle).ok());
  auto p = cache.Prefetch(m->handle, PrefetchPolicy::kWaitComplete);
  ASSERT_TRUE(p.ok()) << p.status().ToString();

  auto load_stream = CudaStreamHandle::Create(0);
  auto consumer = CudaStreamHandle::Create(0);
  ASSERT_TRUE(load_stream.ok() && consumer.ok());
  Gate gate;
  ASSERT_EQ(cudaLaunchHostFunc(load_stream->get(), &Gate::Wait, &gate), cudaSuccess);
  auto lb = cache.LoadBack(m->handle, load_stream->get());
  ASSERT_TRUE(lb.ok()) << lb.status().ToString();
  EXPECT_EQ(lb->prefetch.state, PrefetchState::kComplete);
  ASSERT_EQ(lb->device_slots.size(), a.size());
  // The load-back's time counts once its copy has completed, not when it was enqueued: nothing
  // while the copy is held behind the gate.
  EXPECT_EQ(cache.stats().load_back_duration.count, 0);

  // The expected bytes on the device; per layer, after WaitLayer, a kernel on the consumer stream
  // counts the bytes of the device pool that differ.
  LayerConsumer check;
  ASSERT_NO_FATAL_FAILURE(check.Prepare(hashes, lb->device_slots));
  ASSERT_NO_FATAL_FAILURE(
      check.ConsumeEveryLayer(cache, m->handle, consumer->get(), d, g.num_slots));
  gate.Open();
  ASSERT_TRUE(consumer->Synchronize().ok());
  unsigned long long bad = 1;
  ASSERT_NO_FATAL_FAILURE(check.ReadWrong(&bad));
  EXPECT_EQ(bad, 0u) << "the consumer read bytes that had not arrived (or were wrong)";
  ASSERT_TRUE(load_stream->Synchronize().ok());
  const CacheStats loaded = cache.stats();
  EXPECT_EQ(loaded.load_back_duration.count, 1);
  EXPECT_GT(loaded.load_back_seconds, 0.0);
  ASSERT_TRUE(cache.Release(m->handle).ok());
  ASSERT_TRUE(cache.CheckConsistency().ok()) << cache.CheckConsistency().ToString();
}

// A streamed storage hit on the GPU: batches 0 and 4 of the read arrive after the others (held in
// the store), so the load goes in two pieces (batches 0-3 once batch 0 landed, then 4-7), each
// enqueued on the load stream behind a gate. A kernel on another stream reads each layer after
// WaitLayer, before the gate opens: it must find every byte of both pieces (random tokens, a
// poisoned pool), so WaitLayer covers every piece.
TEST_P(GpuCacheTest, StreamedStorageHitWaitLayerCoversEveryPiece) {
  REQUIRE_GPU();
  const TransferBackend backend = GetParam();
  constexpr int64_t kPages = 32;  // read in 8 batches of 4
  KvGeometry g{KvLayout::kLayerFirst, kLayers, 2 * kPages * kPage, kSlotBytes, kPage, 1};
  auto dev = DeviceTier::Create(backend, g, false);
  ASSERT_TRUE(dev.ok()) << dev.status().ToString();
  StorageNamespace ns;
  ns.model_id = "gpu-cache-stream-test";
  ns.layout = KvLayout::kPageFirst;
  ns.num_layers = kLayers;
  ns.slot_bytes = kSlotBytes;
  ns.page_size = kPage;
  StorageOptions options;
  options.io_threads = 4;
  options.timeout = std::chrono::seconds(30);
  auto inner = OpenStorage("memory://?capacity=64MiB", ns, options);
  ASSERT_TRUE(inner.ok()) << inner.status().ToString();
  auto wrapped = FaultInjectingStorage::Wrap(std::move(*inner), 3, options);
  ASSERT_TRUE(wrapped.ok()) << wrapped.status().ToString();
  FaultInjectingStorage* faults = wrapped->get();

  HierarchicalCacheConfig cfg;
  cfg.write_policy = WritePolicy::kWriteThrough;
  cfg.transfer_backend = backend;
  cfg.host_capacity_bytes = 4 * kPages * kPage * kLayers * kSlotBytes * 2;
  cfg.storage.backend = std::shared_ptr<StorageBackend>(std::move(*wrapped));
  cfg.storage.prefetch_threshold_tokens = 0;
  cfg.storage.max_prefetch_host_fraction = 1.0;
  auto cache_r = HierarchicalCache::Create(cfg, (*dev)->region());
  ASSERT_TRUE(cache_r.ok()) << cache_r.status().ToString();
  HierarchicalCache& cache = **cache_r;

  std::mt19937 rng(17);
  std::vector<Token> a(static_cast<size_t>(kPages * kPage));
  for (Token& t : a) t = static_cast<Token>(rng() % (Token{1} << 30));
  const auto hashes = Hashes(a, "");
  const auto keys = *ComputePromptPageKeys(a, kPage);
  auto fresh = cache.AllocateDeviceSlots(static_cast<int64_t>(a.size()));
  ASSERT_TRUE(fresh.ok());
  ASSERT_TRUE((*dev)->Fill(*fresh, hashes).ok());
  ASSERT_TRUE(cache.Insert(a, *fresh).ok());
  ASSERT_TRUE(cache.WaitForBackups().ok());
  ASSERT_TRUE(cache.EvictDevice(std::numeric_limits<int64_t>::max()).ok());
  ASSERT_TRUE(cache.EvictHost(std::numeric_limits<int64_t>::max()).ok());
  const KvRegion& d = (*dev)->region();
  ASSERT_NO_FATAL_FAILURE(Poison(d, g));

  std::vector<PageKey> held(keys.begin(), keys.begin() + 4);      // batch 0
  held.insert(held.end(), keys.begin() + 16, keys.begin() + 20);  // batch 4
  faults->HoldReads(held);
  auto m = cache.Match(a);
  ASSERT_TRUE(m.ok());
  ASSERT_EQ(m->storage_tokens, static_cast<int64_t>(a.size()));
  ASSERT_TRUE(cache.Prefetch(m->handle, PrefetchPolicy::kWaitComplete).ok());
  auto load_stream = CudaStreamHandle::Create(0);
  auto consumer = CudaStreamHandle::Create(0);
  ASSERT_TRUE(load_stream.ok() && consumer.ok());
  Gate gate;
  ASSERT_EQ(cudaLaunchHostFunc(load_stream->get(), &Gate::Wait, &gate), cudaSuccess);
  auto pending =
      std::async(std::launch::async, [&] { return cache.LoadBack(m->handle, load_stream->get()); });
  // Batches 1-3 and 5-7 arrive first, then batch 0: batches 0-3 are handed over (no longer
  // filling) and loaded; then batch 4.
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (faults->Stats().get_hit_pages < kPages - 8 && std::chrono::steady_clock::now() < give_up) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  faults->HoldReads(std::vector<PageKey>(keys.begin() + 16, keys.begin() + 20));
  while (cache.stats().host_filling_tokens > kPages / 2 * kPage &&
         std::chrono::steady_clock::now() < give_up) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_EQ(cache.stats().host_filling_tokens, kPages / 2 * kPage);
  faults->HoldReads({});
  auto lb = pending.get();
  ASSERT_TRUE(lb.ok()) << lb.status().ToString();
  EXPECT_EQ(lb->prefetch.state, PrefetchState::kComplete);
  EXPECT_EQ(lb->loaded_tokens, static_cast<int64_t>(a.size()));
  ASSERT_EQ(lb->device_slots.size(), a.size());

  // The expected bytes on the device; per layer, after WaitLayer, a kernel on the consumer stream
  // counts the bytes of the device pool that differ.
  LayerConsumer check;
  ASSERT_NO_FATAL_FAILURE(check.Prepare(hashes, lb->device_slots));
  ASSERT_NO_FATAL_FAILURE(
      check.ConsumeEveryLayer(cache, m->handle, consumer->get(), d, g.num_slots));
  gate.Open();
  ASSERT_TRUE(consumer->Synchronize().ok());
  unsigned long long bad = 1;
  ASSERT_NO_FATAL_FAILURE(check.ReadWrong(&bad));
  EXPECT_EQ(bad, 0u) << "the consumer read bytes of a piece that had not arrived (or wrong ones)";
  ASSERT_TRUE(load_stream->Synchronize().ok());
  EXPECT_EQ(cache.stats().load_back_duration.count, 2);  // one per piece
  ASSERT_TRUE(cache.Release(m->handle).ok());
  ASSERT_TRUE(cache.CheckConsistency().ok()) << cache.CheckConsistency().ToString();
}

// The engine writes new KV into slots on its stream (held back by a gate) and inserts them; the
// node is evicted at once (write_through_selective: not backed up, not busy) and its slots are
// reused by a LoadBack on another stream. The load must land after the engine's writes, or the
// engine's late writes would overwrite the loaded bytes.
TEST_P(GpuCacheTest, LoadBackIntoReusedSlotsIsOrderedAfterTheEnginesWrites) {
  REQUIRE_GPU();
  const TransferBackend backend = GetParam();
  KvGeometry g{KvLayout::kLayerFirst, kLayers, 4 * kPage, kSlotBytes, kPage, 1};
  auto dev = DeviceTier::Create(backend, g, false);
  ASSERT_TRUE(dev.ok()) << dev.status().ToString();
  HierarchicalCacheConfig cfg;
  cfg.write_policy = WritePolicy::kWriteThroughSelective;
  cfg.transfer_backend = backend;
  cfg.host_capacity_bytes = 16 * kPage * kLayers * kSlotBytes * 2;
  auto cache_r = HierarchicalCache::Create(cfg, (*dev)->region());
  ASSERT_TRUE(cache_r.ok()) << cache_r.status().ToString();
  HierarchicalCache& cache = **cache_r;

  // A prefix cached in host memory only (two hits: backed up; then evicted from the device).
  std::vector<Token> a(static_cast<size_t>(4 * kPage));
  for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<Token>(1 + i);
  auto sa = cache.AllocateDeviceSlots(static_cast<int64_t>(a.size()));
  ASSERT_TRUE((*dev)->Fill(*sa, Hashes(a, "")).ok());
  ASSERT_TRUE(cache.Insert(a, *sa).ok());
  auto hit = cache.Match(a);
  ASSERT_TRUE(cache.Release(hit->handle).ok());
  ASSERT_TRUE(cache.WaitForBackups().ok());
  ASSERT_TRUE(cache.EvictDevice(std::numeric_limits<int64_t>::max()).ok());

  // The engine's prefill of b on a gated stream: a copy of b's KV into its slots, held back.
  std::vector<Token> b(static_cast<size_t>(4 * kPage));
  for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<Token>(90000 + i);
  auto sb = cache.AllocateDeviceSlots(static_cast<int64_t>(b.size()));
  ASSERT_TRUE(sb.ok());
  auto engine_stream = CudaStreamHandle::Create(0);
  auto load_stream = CudaStreamHandle::Create(0);
  ASSERT_TRUE(engine_stream.ok() && load_stream.ok());
  const int64_t n = static_cast<int64_t>(b.size());
  KvGeometry sg{KvLayout::kLayerFirst, kLayers, n, kSlotBytes, kPage, 1};
  auto staging = PinnedHostBuffer::Allocate(sg.buffer_bytes() * 2);
  ASSERT_TRUE(staging.ok());
  KvRegion src;
  src.geometry = sg;
  src.k = staging->data();
  src.v = static_cast<std::byte*>(staging->data()) + sg.buffer_bytes();
  std::vector<int64_t> iota(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) iota[static_cast<size_t>(i)] = i;
  ASSERT_TRUE(FillKvPattern(src, iota, Hashes(b, "")).ok());
  auto writer = MakeTransferEngine(backend);
  ASSERT_TRUE(writer.ok());
  Gate gate;
  ASSERT_EQ(cudaLaunchHostFunc(engine_stream->get(), &Gate::Wait, &gate), cudaSuccess);
  ASSERT_TRUE(
      (*writer)
          ->Transfer(TransferRequest::AllLayers(src, (*dev)->region(), SlotIndices::Host(iota),
                                                SlotIndices::Host(*sb)),
                     TransferOptions{engine_stream->get(), nullptr})
          .ok());
  ASSERT_TRUE(cache.Insert(b, *sb, "", {.stream = engine_stream->get()}).ok());
  // b is not backed up (one hit) and not busy: the LoadBack of a may take its slots at once.
  auto m = cache.Match(a);
  ASSERT_EQ(m->host_tokens, static_cast<int64_t>(a.size()));
  auto lb = cache.LoadBack(m->handle, load_stream->get());
  ASSERT_TRUE(lb.ok()) << lb.status().ToString();
  gate.Open();
  ASSERT_TRUE(engine_stream->Synchronize().ok());
  ASSERT_TRUE(load_stream->Synchronize().ok());
  EXPECT_TRUE((*dev)->Verify(lb->device_slots, Hashes(a, "")).ok())
      << "the engine's queued writes landed after the load-back into the same slots";
  ASSERT_TRUE(cache.Release(m->handle).ok());
  ASSERT_TRUE(cache.CheckConsistency().ok()) << cache.CheckConsistency().ToString();
}

// A LoadBack whose copy fails after part of it was enqueued: its stream is gated, layers 0 and 1
// are queued behind the gate, the third submission fails. The LoadBack's device pages must stay
// reserved until the queued part has run: the engine's next allocation gets other pages (here:
// b's, evicted), and the bytes the engine writes there survive the gate opening. Freeing the
// pages at once would hand them to the engine and the late layers would overwrite its KV.
TEST_P(GpuCacheTest, LoadBackFailingMidwayKeepsItsPagesUntilTheQueuedPartRan) {
  REQUIRE_GPU();
  const TransferBackend backend = GetParam();
  KvGeometry g{KvLayout::kLayerFirst, kLayers, 8 * kPage, kSlotBytes, kPage, 1};
  auto dev = DeviceTier::Create(backend, g, false);
  ASSERT_TRUE(dev.ok()) << dev.status().ToString();
  HierarchicalCacheConfig cfg;
  cfg.write_policy = WritePolicy::kWriteThrough;
  cfg.transfer_backend = backend;
  cfg.host_capacity_bytes = 16 * kPage * kLayers * kSlotBytes * 2;
  auto inner = MakeTransferEngine(backend);
  ASSERT_TRUE(inner.ok()) << inner.status().ToString();
  auto engine =
      std::make_unique<testing::MidwayFailingEngine>(std::move(*inner), (*dev)->region().k, 3);
  testing::MidwayFailingEngine* failing = engine.get();
  auto cache_r = HierarchicalCache::Create(cfg, (*dev)->region(), std::move(engine));
  ASSERT_TRUE(cache_r.ok()) << cache_r.status().ToString();
  HierarchicalCache& cache = **cache_r;
  failing->cache = &cache;  // its calls fail under the cache's mutex
  auto prefill = [&](const std::vector<Token>& t) {
    auto slots = cache.AllocateDeviceSlots(static_cast<int64_t>(t.size()));
    ASSERT_TRUE(slots.ok()) << slots.status().ToString();
    ASSERT_TRUE((*dev)->Fill(*slots, Hashes(t, "")).ok());
    ASSERT_TRUE(cache.Insert(t, *slots).ok());
  };
  auto seq = [](Token base) {
    std::vector<Token> t(static_cast<size_t>(4 * kPage));
    for (size_t i = 0; i < t.size(); ++i) t[i] = base + static_cast<Token>(i);
    return t;
  };
  const auto a = seq(1), b = seq(50000), c = seq(90000);
  prefill(a);  // a: in host memory only
  ASSERT_TRUE(cache.WaitForBackups().ok());
  ASSERT_TRUE(cache.EvictDevice(std::numeric_limits<int64_t>::max()).ok());
  prefill(b);  // b: on the device (and backed up), evictable
  ASSERT_TRUE(cache.WaitForBackups().ok());

  auto load_stream = CudaStreamHandle::Create(0);
  ASSERT_TRUE(load_stream.ok());
  Gate gate;
  ASSERT_EQ(cudaLaunchHostFunc(load_stream->get(), &Gate::Wait, &gate), cudaSuccess);
  auto m = cache.Match(a);
  ASSERT_TRUE(m.ok());
  ASSERT_EQ(m->host_tokens, static_cast<int64_t>(a.size()));
  failing->armed = true;
  auto lb = cache.LoadBack(m->handle, load_stream->get());
  ASSERT_FALSE(lb.ok());
  EXPECT_NE(lb.status().message().find("injected"), std::string::npos) << lb.status().ToString();
  ASSERT_EQ(failing->enqueued_layers.load(), 2);

  // The engine computes c: the pages it gets must not be the failed load's.
  auto sc = cache.AllocateDeviceSlots(static_cast<int64_t>(c.size()));
  ASSERT_TRUE(sc.ok()) << sc.status().ToString();
  ASSERT_TRUE((*dev)->Fill(*sc, Hashes(c, "")).ok());
  gate.Open();
  ASSERT_TRUE(load_stream->Synchronize().ok());
  EXPECT_TRUE((*dev)->Verify(*sc, Hashes(c, "")).ok())
      << "the failed load-back's queued layers overwrote pages handed to the engine";
  ASSERT_TRUE(cache.Insert(c, *sc).ok());
  ASSERT_TRUE(cache.CheckConsistency().ok()) << cache.CheckConsistency().ToString();

  // The match is as before; a second LoadBack works, byte-exact, once the first's pages are back.
  auto lb2 = cache.LoadBack(m->handle, load_stream->get());
  ASSERT_TRUE(lb2.ok()) << lb2.status().ToString();
  ASSERT_TRUE(load_stream->Synchronize().ok());
  EXPECT_TRUE((*dev)->Verify(lb2->device_slots, Hashes(a, "")).ok());
  ASSERT_TRUE(cache.Release(m->handle).ok());
  ASSERT_TRUE(cache.CheckConsistency().ok()) << cache.CheckConsistency().ToString();
  EXPECT_EQ(failing->under_lock.load(), 0) << "engine calls under the cache's mutex";
}

INSTANTIATE_TEST_SUITE_P(Backends, GpuCacheTest,
                         ::testing::Values(TransferBackend::kKernel, TransferBackend::kDma),
                         [](const auto& info) {
                           return std::string(TransferBackendName(info.param));
                         });

}  // namespace
}  // namespace kvtier
