// The CUDA transfer backends (kernel, dma, auto) against the independent reference
// (testing::ReferenceTransfer on host mirrors): every layout pair x per-layer/all-layer x
// MHA/MLA x page sizes {1, 16, 64, 256} x backends x directions (host->device, device->host;
// device->device and host->host on a subset), on random data with poisoned destinations; whole
// destination buffers are compared, so stray writes show. Also: int32/int64 device indices, host
// indices, per-layer tables, 0 and 1 indices, each access width (16/8/4 bytes), realistic slot
// sizes, out-of-range device indices (reported, nothing else disturbed, no illegal access), layer
// events seen by a consumer kernel on another stream, and the legacy default stream.
//
// Every test skips itself when no GPU is present (CudaDeviceCount() == 0), so CI without a GPU
// passes; scripts/gpu_check.sh runs them on a GPU machine.
// nvcc 13.0 warns (#2810) inside status.h for assigning a [[nodiscard]] class; deliberate there.
#pragma nv_diag_suppress 2810
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "kvtier/device.h"
#include "kvtier/testing/reference_copy.h"
#include "kvtier/transfer.h"
#include "support/kv_test_util.h"
#include "transfer/cuda/gpu_engine.h"

namespace kvtier {
namespace {

constexpr KvLayout kLayouts[] = {KvLayout::kLayerFirst, KvLayout::kPageFirst,
                                 KvLayout::kPageFirstDirect, KvLayout::kPageHead};
constexpr TransferBackend kGpuBackends[] = {TransferBackend::kKernel, TransferBackend::kDma,
                                            TransferBackend::kAuto};

#define REQUIRE_GPU()                                                     \
  do {                                                                    \
    if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device present"; \
  } while (0)

#define ASSERT_OK(expr)                                     \
  do {                                                      \
    const ::kvtier::Status s_ = (expr);                     \
    ASSERT_TRUE(s_.ok()) << #expr << ": " << s_.ToString(); \
  } while (0)

#define ASSERT_CUDA(expr) ASSERT_EQ((expr), cudaSuccess) << #expr

// A TransferEngineConfig change by name: "strided-pairs" (dma_min_strided_rows = 2), "no-join-kv",
// "one-lane" (dma_lanes = 1), "caller-thread" (dma_submit_threads = false), "no-batch"
// (dma_batch = false), "layer-copies" (dma_stride_layers = false), "no-overlap-hint"
// (dma_overlap_hint = false), "first-piece-64" (dma_first_batch_piece = 64), "whole-batch"
// (dma_batch_split = whole), "whole-when-busy" (dma_batch_split = whole_when_busy); null or "" =
// the defaults.
TransferEngineConfig ConfigFor(const char* variant) {
  TransferEngineConfig config;
  const std::string v = variant == nullptr ? "" : variant;
  if (v == "strided-pairs") config.dma_min_strided_rows = 2;
  if (v == "no-join-kv") config.dma_join_kv = false;
  if (v == "one-lane") config.dma_lanes = 1;
  if (v == "caller-thread") config.dma_submit_threads = false;
  if (v == "no-batch") config.dma_batch = false;
  if (v == "layer-copies") config.dma_stride_layers = false;
  if (v == "no-overlap-hint") config.dma_overlap_hint = false;
  if (v == "first-piece-64") config.dma_first_batch_piece = 64;
  if (v == "whole-batch") config.dma_batch_split = DmaBatchSplit::kWhole;
  if (v == "whole-when-busy") config.dma_batch_split = DmaBatchSplit::kWholeWhenBusy;
  return config;
}

// One engine per (backend, configuration variant) for the whole binary (creation allocates;
// tests share them, as an engine is meant to be shared). `variant`: see ConfigFor.
TransferEngine* Engine(TransferBackend backend, const char* variant = nullptr) {
  static std::map<std::pair<TransferBackend, std::string>, std::unique_ptr<TransferEngine>> engines;
  const auto key = std::pair(backend, std::string(variant == nullptr ? "" : variant));
  auto it = engines.find(key);
  if (it == engines.end()) {
    auto e = MakeTransferEngine(backend, ConfigFor(variant));
    EXPECT_TRUE(e.ok()) << e.status().ToString();
    if (!e.ok()) return nullptr;
    it = engines.emplace(key, std::move(e).value()).first;
  }
  return it->second.get();
}

// Holds a stream behind a host function until Release(), so that what is queued behind it is
// certainly still running when the test looks. Gives up after 30 s (TimedOut() then says so)
// rather than hang the test. The destructor releases it and waits for its host function to
// finish, so a failed ASSERT between Hold and Release leaves nothing pointing at a dead gate.
class HostGate {
 public:
  HostGate() = default;
  HostGate(const HostGate&) = delete;
  HostGate& operator=(const HostGate&) = delete;
  ~HostGate() {
    Release();
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (pending_.load() > 0 && std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }

  cudaError_t Hold(cudaStream_t stream) {
    release_ = false;
    timed_out_ = false;
    ++pending_;
    const cudaError_t e = cudaLaunchHostFunc(stream, &HostGate::Wait, this);
    if (e != cudaSuccess) --pending_;
    return e;
  }
  void Release() { release_ = true; }
  bool TimedOut() const { return timed_out_.load(); }

 private:
  static void CUDART_CB Wait(void* p) {
    auto* gate = static_cast<HostGate*>(p);
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (!gate->release_.load()) {
      if (std::chrono::steady_clock::now() > until) {
        gate->timed_out_ = true;
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    --gate->pending_;  // last touch of *gate
  }

  std::atomic<bool> release_{false};
  std::atomic<bool> timed_out_{false};
  std::atomic<int> pending_{0};
};

// A KV region on the GPU side (device memory or pinned host memory), optionally as per-layer
// allocations, with a host mirror of identical structure that the reference runs on.
class TestRegion {
 public:
  TestRegion(const KvGeometry& g, bool mla, MemoryKind memory, bool layer_table)
      : g_(g),
        mla_(mla),
        memory_(memory),
        table_(layer_table && g.layout == KvLayout::kLayerFirst) {
    const int buffers = mla ? 1 : 2;
    const int allocs_per_buffer = table_ ? static_cast<int>(g.num_layers) : 1;
    const int64_t bytes = table_ ? g.layer_bytes() : g.buffer_bytes();
    for (int b = 0; b < buffers; ++b) {
      for (int a = 0; a < allocs_per_buffer; ++a) {
        mirror_.emplace_back(static_cast<size_t>(bytes));
        if (memory == MemoryKind::kDevice) {
          auto d = DeviceBuffer::Allocate(bytes);
          EXPECT_TRUE(d.ok()) << d.status().ToString();
          gpu_ptrs_.push_back(d->data());
          device_.push_back(std::move(d).value());
        } else {
          auto h = PinnedHostBuffer::Allocate(bytes);
          EXPECT_TRUE(h.ok()) << h.status().ToString();
          gpu_ptrs_.push_back(h->data());
          pinned_.push_back(std::move(h).value());
        }
      }
    }
    for (auto& m : mirror_) mirror_ptrs_.push_back(m.data());
  }

  KvRegion gpu_region() const { return MakeRegion(gpu_ptrs_, memory_, &gpu_k_, &gpu_v_); }
  KvRegion mirror_region() const {
    return MakeRegion(mirror_ptrs_, MemoryKind::kHost, &mirror_k_, &mirror_v_);
  }

  void FillRandom(std::mt19937_64& rng) {
    for (auto& m : mirror_) {
      for (size_t i = 0; i + 8 <= m.size(); i += 8) {
        const uint64_t x = rng();
        std::memcpy(m.data() + i, &x, 8);
      }
    }
  }
  void Fill(std::byte v) {
    for (auto& m : mirror_) std::fill(m.begin(), m.end(), v);
  }
  // Mirror -> GPU side. cudaMemcpy from pageable memory may return before the bytes reach the
  // device, and the copies under test run on non-blocking streams: synchronise the device.
  void Upload() {
    for (size_t i = 0; i < mirror_.size(); ++i) {
      ASSERT_EQ(cudaMemcpy(gpu_ptrs_[i], mirror_[i].data(), mirror_[i].size(), cudaMemcpyDefault),
                cudaSuccess);
    }
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  }
  // OK when the GPU side equals the mirror byte for byte; else the first difference.
  ::testing::AssertionResult MatchesMirror() const {
    std::vector<std::byte> got;
    for (size_t i = 0; i < mirror_.size(); ++i) {
      got.resize(mirror_[i].size());
      if (cudaMemcpy(got.data(), gpu_ptrs_[i], got.size(), cudaMemcpyDefault) != cudaSuccess) {
        return ::testing::AssertionFailure() << "cudaMemcpy back failed";
      }
      if (std::memcmp(got.data(), mirror_[i].data(), got.size()) != 0) {
        size_t j = 0;
        while (got[j] == mirror_[i][j]) ++j;
        return ::testing::AssertionFailure()
               << "allocation " << i << " differs first at byte " << j << ": got "
               << static_cast<int>(got[j]) << ", expected " << static_cast<int>(mirror_[i][j]);
      }
    }
    return ::testing::AssertionSuccess();
  }

 private:
  KvRegion MakeRegion(const std::vector<void*>& ptrs, MemoryKind memory, std::vector<void*>* kt,
                      std::vector<void*>* vt) const {
    KvRegion r;
    r.geometry = g_;
    r.mla = mla_;
    r.memory = memory;
    r.device = memory == MemoryKind::kDevice ? 0 : -1;
    if (table_) {
      const size_t L = static_cast<size_t>(g_.num_layers);
      kt->assign(ptrs.begin(), ptrs.begin() + static_cast<ptrdiff_t>(L));
      r.k_layers = *kt;
      if (!mla_) {
        vt->assign(ptrs.begin() + static_cast<ptrdiff_t>(L), ptrs.end());
        r.v_layers = *vt;
      }
    } else {
      r.k = ptrs[0];
      r.v = mla_ ? nullptr : ptrs[1];
    }
    return r;
  }

  KvGeometry g_;
  bool mla_;
  MemoryKind memory_;
  bool table_;
  std::vector<std::vector<std::byte>> mirror_;
  std::vector<void*> mirror_ptrs_;
  std::vector<void*> gpu_ptrs_;
  std::vector<DeviceBuffer> device_;
  std::vector<PinnedHostBuffer> pinned_;
  mutable std::vector<void*> gpu_k_, gpu_v_, mirror_k_, mirror_v_;
};

KvGeometry MakeGeometry(KvLayout layout, bool mla, int64_t page_size, int64_t pages,
                        int64_t layers = 3, int64_t slot_bytes = 0, int64_t heads = 0) {
  KvGeometry g;
  g.layout = layout;
  g.num_layers = layers;
  g.page_size = page_size;
  g.num_slots = pages * page_size;
  g.slot_bytes = slot_bytes > 0 ? slot_bytes : (mla ? 72 : 64);
  g.head_num = heads > 0 ? heads : (mla ? 1 : 4);
  return g;
}

// Device copies of index lists.
class DeviceIndices {
 public:
  template <typename T>
  DeviceIndices(const std::vector<int64_t>& values, T /*type tag*/) {
    std::vector<T> narrow(values.begin(), values.end());
    auto b = DeviceBuffer::Allocate(static_cast<int64_t>(narrow.size() * sizeof(T)) + 16);
    EXPECT_TRUE(b.ok());
    buffer_ = std::move(b).value();
    if (!narrow.empty()) {
      EXPECT_EQ(cudaMemcpy(buffer_.data(), narrow.data(), narrow.size() * sizeof(T),
                           cudaMemcpyHostToDevice),
                cudaSuccess);
    }
    indices_ = SlotIndices::Device(static_cast<const T*>(buffer_.data()),
                                   static_cast<int64_t>(values.size()));
  }
  SlotIndices get() const { return indices_; }

 private:
  DeviceBuffer buffer_;
  SlotIndices indices_;
};

struct Copy {
  TransferBackend backend;
  const char* variant = nullptr;  // kernel variant, see Engine()
  MemoryKind src_memory, dst_memory;
  bool all_layers = false;
  bool src_table = false, dst_table = false;
  int index_mode = 0;  // 0 host int64, 1 host int32, 2 device int64, 3 device int32
  CudaStream stream = nullptr;
  TransferEngine* engine = nullptr;  // null: the shared Engine(backend, variant)
};

// Runs `c` for `pairs` between fresh regions of the two geometries and compares the whole
// destination with the reference.
void RunAndCompare(const KvGeometry& sg, const KvGeometry& dg, bool mla, const Copy& c,
                   const testing::SlotPairs& pairs, std::mt19937_64& rng) {
  TestRegion src(sg, mla, c.src_memory, c.src_table);
  TestRegion dst(dg, mla, c.dst_memory, c.dst_table);
  src.FillRandom(rng);
  dst.Fill(testing::kPoison);
  src.Upload();
  dst.Upload();
  const KvRegion src_mirror = src.mirror_region(), dst_mirror = dst.mirror_region();
  const KvRegion src_gpu = src.gpu_region(), dst_gpu = dst.gpu_region();
  const int64_t layers = c.all_layers ? sg.num_layers : 1;
  const int64_t layer = c.all_layers ? 0 : sg.num_layers - 1;

  TransferRequest ref{
      &src_mirror, &dst_mirror, SlotIndices::Host(pairs.src), SlotIndices::Host(pairs.dst), layer,
      layer,       layers};
  ASSERT_OK(testing::ReferenceTransfer(ref));

  std::vector<int32_t> src32(pairs.src.begin(), pairs.src.end());
  std::vector<int32_t> dst32(pairs.dst.begin(), pairs.dst.end());
  std::unique_ptr<DeviceIndices> dsrc, ddst;
  SlotIndices si, di;
  switch (c.index_mode) {
    case 0:
      si = SlotIndices::Host(pairs.src);
      di = SlotIndices::Host(pairs.dst);
      break;
    case 1:
      si = SlotIndices::Host(src32);
      di = SlotIndices::Host(dst32);
      break;
    case 2:
      dsrc = std::make_unique<DeviceIndices>(pairs.src, int64_t{});
      ddst = std::make_unique<DeviceIndices>(pairs.dst, int64_t{});
      si = dsrc->get();
      di = ddst->get();
      break;
    default:
      dsrc = std::make_unique<DeviceIndices>(pairs.src, int32_t{});
      ddst = std::make_unique<DeviceIndices>(pairs.dst, int32_t{});
      si = dsrc->get();
      di = ddst->get();
      break;
  }
  TransferEngine* engine = c.engine != nullptr ? c.engine : Engine(c.backend, c.variant);
  ASSERT_NE(engine, nullptr);
  TransferRequest req{&src_gpu, &dst_gpu, si, di, layer, layer, layers};
  ASSERT_OK(engine->Transfer(req, {.stream = c.stream}));
  ASSERT_OK(engine->Synchronize(c.stream));
  EXPECT_TRUE(dst.MatchesMirror());
}

// ---- the matrix ------------------------------------------------------------------------------

// (src layout, dst layout, all layers, mla, page size)
using Case = std::tuple<KvLayout, KvLayout, bool, bool, int64_t>;

class CudaTransferMatrixTest : public ::testing::TestWithParam<Case> {};

TEST_P(CudaTransferMatrixTest, MatchesReferenceByteForByte) {
  REQUIRE_GPU();
  const auto [src_layout, dst_layout, all_layers, mla, page_size] = GetParam();
  const uint64_t seed = testing::TestSeed() ^ (static_cast<uint64_t>(src_layout) << 8) ^
                        (static_cast<uint64_t>(dst_layout) << 12) ^ (all_layers << 16) ^
                        (mla << 17) ^ (page_size << 20);
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  const KvGeometry sg = MakeGeometry(src_layout, mla, page_size, 6);
  const KvGeometry dg = MakeGeometry(dst_layout, mla, page_size, 5);
  CudaStreamHandle stream = std::move(CudaStreamHandle::Create(0, true)).value();
  int variant = 0;
  const std::pair<TransferBackend, const char*> engines[] = {
      {TransferBackend::kKernel, nullptr},
      {TransferBackend::kDma, nullptr},
      {TransferBackend::kDma, "strided-pairs"},
      {TransferBackend::kDma, "no-batch"},
      {TransferBackend::kAuto, nullptr}};
  for (auto [backend, kernel_variant] : engines) {
    // host -> device (a load) and device -> host (a backup).
    for (int dir = 0; dir < 2; ++dir) {
      SCOPED_TRACE(::testing::Message()
                   << TransferBackendName(backend) << " " << (kernel_variant ? kernel_variant : "")
                   << (dir == 0 ? " h2d" : " d2h"));
      Copy c;
      c.backend = backend;
      c.variant = kernel_variant;
      c.src_memory = dir == 0 ? MemoryKind::kHost : MemoryKind::kDevice;
      c.dst_memory = dir == 0 ? MemoryKind::kDevice : MemoryKind::kHost;
      c.all_layers = all_layers;
      // Rotate the secondary dimensions so every one is covered across the matrix.
      c.src_table = (variant % 3) == 1;
      c.dst_table = (variant % 3) == 2;
      c.index_mode = variant % 4;
      c.stream = ((variant / 2) % 2) == 0 ? stream.get() : nullptr;
      ++variant;
      const auto pages = testing::RandomPagePairs(rng, sg.num_slots, dg.num_slots, page_size, 4);
      RunAndCompare(sg, dg, mla, c, pages, rng);
      if (::testing::Test::HasFatalFailure()) return;
      // Token-level random slots (runs broken everywhere).
      const auto tokens = testing::RandomTokenPairs(rng, sg.num_slots, dg.num_slots,
                                                    std::min<int64_t>(37, dg.num_slots));
      RunAndCompare(sg, dg, mla, c, tokens, rng);
      if (::testing::Test::HasFatalFailure()) return;
    }
  }
}

std::string CaseName(const ::testing::TestParamInfo<Case>& info) {
  const auto [s, d, all, mla, p] = info.param;
  return std::string(LayoutName(s)) + "_to_" + LayoutName(d) + (all ? "_all" : "_one") +
         (mla ? "_mla" : "_mha") + "_p" + std::to_string(p);
}

INSTANTIATE_TEST_SUITE_P(
    AllPairs, CudaTransferMatrixTest,
    ::testing::Combine(::testing::ValuesIn(kLayouts), ::testing::ValuesIn(kLayouts),
                       ::testing::Bool(), ::testing::Bool(),
                       ::testing::Values(int64_t{1}, int64_t{16}, int64_t{64}, int64_t{256})),
    CaseName);

// ---- further dimensions ----------------------------------------------------------------------

// Device->device and host->host, every backend, a few layout pairs.
TEST(CudaTransferTest, DeviceToDeviceAndHostToHost) {
  REQUIRE_GPU();
  std::mt19937_64 rng(testing::TestSeed() + 11);
  for (TransferBackend backend : kGpuBackends) {
    for (auto [sl, dl] : {std::pair{KvLayout::kLayerFirst, KvLayout::kLayerFirst},
                          std::pair{KvLayout::kPageFirst, KvLayout::kPageHead},
                          std::pair{KvLayout::kPageFirstDirect, KvLayout::kLayerFirst}}) {
      for (MemoryKind m : {MemoryKind::kDevice, MemoryKind::kHost}) {
        SCOPED_TRACE(::testing::Message() << TransferBackendName(backend) << " " << LayoutName(sl)
                                          << "->" << LayoutName(dl) << " " << MemoryKindName(m));
        const KvGeometry sg = MakeGeometry(sl, false, 16, 6);
        const KvGeometry dg = MakeGeometry(dl, false, 16, 5);
        Copy c{.backend = backend, .src_memory = m, .dst_memory = m, .all_layers = true};
        RunAndCompare(sg, dg, false, c,
                      testing::RandomPagePairs(rng, sg.num_slots, dg.num_slots, 16, 3), rng);
      }
    }
  }
}

// Every index type and residency, on every backend.
TEST(CudaTransferTest, IndexTypesAndResidency) {
  REQUIRE_GPU();
  std::mt19937_64 rng(testing::TestSeed() + 12);
  for (TransferBackend backend : kGpuBackends) {
    for (int mode = 0; mode < 4; ++mode) {
      SCOPED_TRACE(::testing::Message() << TransferBackendName(backend) << " mode " << mode);
      const KvGeometry sg = MakeGeometry(KvLayout::kPageFirst, false, 16, 6);
      const KvGeometry dg = MakeGeometry(KvLayout::kLayerFirst, false, 16, 5);
      Copy c{.backend = backend,
             .src_memory = MemoryKind::kHost,
             .dst_memory = MemoryKind::kDevice,
             .all_layers = false};
      c.index_mode = mode;
      RunAndCompare(sg, dg, false, c,
                    testing::RandomPagePairs(rng, sg.num_slots, dg.num_slots, 16, 3), rng);
    }
  }
}

// 0 and 1 indices.
TEST(CudaTransferTest, ZeroAndOneIndex) {
  REQUIRE_GPU();
  std::mt19937_64 rng(testing::TestSeed() + 13);
  for (TransferBackend backend : kGpuBackends) {
    for (int mode : {0, 2}) {
      const KvGeometry sg = MakeGeometry(KvLayout::kLayerFirst, false, 4, 6);
      const KvGeometry dg = MakeGeometry(KvLayout::kPageHead, false, 4, 5);
      Copy c{.backend = backend,
             .src_memory = MemoryKind::kDevice,
             .dst_memory = MemoryKind::kHost,
             .all_layers = true};
      c.index_mode = mode;
      RunAndCompare(sg, dg, false, c, testing::SlotPairs{}, rng);
      RunAndCompare(sg, dg, false, c, testing::SlotPairs{{5}, {19}}, rng);
    }
  }
}

// Pages come off the tiers' free lists in falling order as often as rising (a prefix evicted and
// brought back reverses them): contiguous pages falling on both sides, falling on one and rising
// on the other, and rising, each loaded and backed up byte for byte (the dma plan groups the
// falling rows into strided copies too: dma_plan_test.cc).
TEST(CudaTransferTest, PagesInFallingOrderCopyByteForByte) {
  REQUIRE_GPU();
  std::mt19937_64 rng(testing::TestSeed() + 23);
  constexpr int64_t kPage = 4, kPages = 12, kRun = 9;
  auto run = [](int64_t first, bool falling) {
    std::vector<int64_t> pages(kRun);
    for (int64_t i = 0; i < kRun; ++i) pages[i] = falling ? first + kRun - 1 - i : first + i;
    return pages;
  };
  struct Order {
    bool src_falling, dst_falling;
  };
  for (Order o : {Order{true, true}, Order{true, false}, Order{false, true}, Order{false, false}}) {
    for (KvLayout host : kLayouts) {
      for (auto [backend, variant] :
           {std::pair{TransferBackend::kKernel, ""}, std::pair{TransferBackend::kDma, ""},
            std::pair{TransferBackend::kDma, "no-join-kv"},
            std::pair{TransferBackend::kDma, "layer-copies"}}) {
        SCOPED_TRACE(::testing::Message()
                     << "src " << (o.src_falling ? "falling" : "rising") << ", dst "
                     << (o.dst_falling ? "falling" : "rising") << ", " << LayoutName(host) << " "
                     << TransferBackendName(backend) << " " << variant);
        const KvGeometry hg = MakeGeometry(host, false, kPage, kPages, 3, 2048, 8);
        const KvGeometry dg = MakeGeometry(KvLayout::kLayerFirst, false, kPage, kPages, 3, 2048, 8);
        const char* v = variant[0] != '\0' ? variant : nullptr;
        testing::SlotPairs pairs;
        const std::vector<int64_t> sp = run(1, o.src_falling), dp = run(2, o.dst_falling);
        for (int64_t i = 0; i < kRun; ++i) {
          for (int64_t t = 0; t < kPage; ++t) {
            pairs.src.push_back(sp[i] * kPage + t);
            pairs.dst.push_back(dp[i] * kPage + t);
          }
        }
        RunAndCompare(hg, dg, false,
                      Copy{.backend = backend,
                           .variant = v,
                           .src_memory = MemoryKind::kHost,
                           .dst_memory = MemoryKind::kDevice,
                           .all_layers = false},
                      pairs, rng);
        std::swap(pairs.src, pairs.dst);
        RunAndCompare(dg, hg, false,
                      Copy{.backend = backend,
                           .variant = v,
                           .src_memory = MemoryKind::kDevice,
                           .dst_memory = MemoryKind::kHost,
                           .all_layers = true},
                      pairs, rng);
      }
    }
  }
}

// Slot sizes that select each access width (16, 8, 4 bytes) and realistic shapes whose chunks
// span many vectors (Llama-3-8B: 2048 B in 8 heads; DeepSeek-V3 MLA: 1152 B).
TEST(CudaTransferTest, AccessWidthsAndRealisticSlots) {
  REQUIRE_GPU();
  std::mt19937_64 rng(testing::TestSeed() + 14);
  struct Shape {
    int64_t slot_bytes, heads;
    bool mla;
  };
  for (Shape sh : {Shape{2048, 8, false}, Shape{1152, 1, true}, Shape{40, 2, false},
                   Shape{20, 1, true}, Shape{24, 2, false}}) {
    for (KvLayout host : kLayouts) {
      for (auto [backend, variant] :
           {std::pair{TransferBackend::kKernel, ""}, std::pair{TransferBackend::kDma, ""},
            std::pair{TransferBackend::kDma, "strided-pairs"},
            std::pair{TransferBackend::kDma, "no-join-kv"},
            std::pair{TransferBackend::kDma, "layer-copies"},
            std::pair{TransferBackend::kDma, "no-overlap-hint"},
            std::pair{TransferBackend::kDma, "first-piece-64"},
            std::pair{TransferBackend::kDma, "whole-batch"},
            std::pair{TransferBackend::kDma, "whole-when-busy"}}) {
        SCOPED_TRACE(::testing::Message() << sh.slot_bytes << " B " << LayoutName(host) << " "
                                          << TransferBackendName(backend) << " " << variant);
        const KvGeometry hg = MakeGeometry(host, sh.mla, 16, 4, 4, sh.slot_bytes, sh.heads);
        const KvGeometry dg =
            MakeGeometry(KvLayout::kLayerFirst, sh.mla, 16, 5, 4, sh.slot_bytes, sh.heads);
        const char* v = variant[0] != '\0' ? variant : nullptr;
        Copy load{.backend = backend,
                  .variant = v,
                  .src_memory = MemoryKind::kHost,
                  .dst_memory = MemoryKind::kDevice,
                  .all_layers = false};
        RunAndCompare(hg, dg, sh.mla, load,
                      testing::RandomPagePairs(rng, hg.num_slots, dg.num_slots, 16, 3), rng);
        Copy backup{.backend = backend,
                    .variant = v,
                    .src_memory = MemoryKind::kDevice,
                    .dst_memory = MemoryKind::kHost,
                    .all_layers = true};
        RunAndCompare(dg, hg, sh.mla, backup,
                      testing::RandomPagePairs(rng, dg.num_slots, hg.num_slots, 16, 3), rng);
      }
    }
  }
}

// A dma plan of thousands of operations is split over several streams (dma_engine.cc, lanes)
// and joined back to the caller's stream: the bytes are the same as the reference, on a
// non-blocking stream and on the legacy default stream, with and without per-layer events.
TEST(CudaTransferTest, DmaPlansSplitOverStreamsMatchTheReference) {
  REQUIRE_GPU();
  std::mt19937_64 rng(testing::TestSeed() + 19);
  const KvGeometry dg = MakeGeometry(KvLayout::kLayerFirst, false, 1, 4096, 3, 256, 1);
  const KvGeometry hg = MakeGeometry(KvLayout::kPageFirst, false, 1, 4096, 3, 256, 1);
  CudaStreamHandle stream = std::move(CudaStreamHandle::Create(0, true)).value();
  // The lanes submitted from the calling thread and from a thread each (the default).
  std::vector<std::unique_ptr<TransferEngine>> engines;
  for (bool threads : {false, true}) {
    TransferEngineConfig config;
    config.dma_submit_threads = threads;
    auto made = MakeTransferEngine(TransferBackend::kDma, config);
    ASSERT_TRUE(made.ok()) << made.status().ToString();
    engines.push_back(std::move(made).value());
  }
  for (size_t e = 0; e < engines.size(); ++e) {
    for (CudaStream s : {stream.get(), CudaStream{nullptr}}) {
      for (bool events : {false, true}) {
        SCOPED_TRACE(::testing::Message()
                     << (s == nullptr ? "legacy stream" : "stream")
                     << (events ? ", layer events" : "") << (e == 1 ? ", submit threads" : ""));
        TestRegion src(dg, false, MemoryKind::kDevice, false);
        TestRegion dst(hg, false, MemoryKind::kHost, false);
        src.FillRandom(rng);
        dst.Fill(testing::kPoison);
        src.Upload();
        dst.Upload();
        // 1,500 random single slots x 3 layers x K/V: about 9,000 runs, no two adjacent.
        const auto pairs = testing::RandomTokenPairs(rng, dg.num_slots, hg.num_slots, 1500);
        const KvRegion sm = src.mirror_region(), dm = dst.mirror_region();
        ASSERT_OK(testing::ReferenceTransfer(TransferRequest::AllLayers(
            sm, dm, SlotIndices::Host(pairs.src), SlotIndices::Host(pairs.dst))));
        const KvRegion sgpu = src.gpu_region(), dgpu = dst.gpu_region();
        auto layer_events = LayerEvents::Create(3, 0);
        ASSERT_TRUE(layer_events.ok()) << layer_events.status().ToString();
        TransferEngine* engine = engines[e].get();
        ASSERT_OK(engine->Transfer(
            TransferRequest::AllLayers(sgpu, dgpu, SlotIndices::Host(pairs.src),
                                       SlotIndices::Host(pairs.dst)),
            {.stream = s, .layer_events = events ? &layer_events.value() : nullptr}));
        const auto* stats = testing::LastTransferStats(*engine);
        ASSERT_NE(stats, nullptr);
        EXPECT_GT(stats->lanes, 1) << stats->copy_ops << " copy ops";
        ASSERT_OK(engine->Synchronize(s));
        EXPECT_TRUE(dst.MatchesMirror());
      }
    }
  }
}

// dma_batch_split: a per-layer load's single copies (page_first_direct -> layer_first, over 3
// lanes) go in growing pieces on an idle stream, and in one batch call per lane where the split
// says so: always (whole), or when the stream still has work pending as they are submitted
// (whole_when_busy; the stream held by a HostGate, so "busy" is certain, not a matter of timing).
// Every byte against the reference in each case.
TEST(CudaTransferTest, DmaBatchSplitFollowsTheStreamAndCopiesByteForByte) {
  REQUIRE_GPU();
  std::mt19937_64 rng(testing::TestSeed() + 27);
  const KvGeometry hg = MakeGeometry(KvLayout::kPageFirstDirect, false, 4, 512, 3, 256, 2);
  const KvGeometry dg = MakeGeometry(KvLayout::kLayerFirst, false, 4, 512, 3, 256, 2);
  CudaStreamHandle stream = std::move(CudaStreamHandle::Create(0, true)).value();
  struct Case {
    DmaBatchSplit split;
    int first_piece;
    bool hold;  // the stream busy (held) when the call is made
    bool want_whole;
  };
  for (const Case c :
       {Case{DmaBatchSplit::kGrowing, 16, false, false},
        Case{DmaBatchSplit::kGrowing, 16, true, false},
        Case{DmaBatchSplit::kGrowing, 64, false, false},
        Case{DmaBatchSplit::kWhole, 16, false, true}, Case{DmaBatchSplit::kWhole, 16, true, true},
        Case{DmaBatchSplit::kWholeWhenBusy, 16, false, false},
        Case{DmaBatchSplit::kWholeWhenBusy, 16, true, true}}) {
    SCOPED_TRACE(::testing::Message() << DmaBatchSplitName(c.split) << ", first piece "
                                      << c.first_piece << (c.hold ? ", stream held" : ""));
    TransferEngineConfig config;
    config.dma_batch_split = c.split;
    config.dma_first_batch_piece = c.first_piece;
    config.dma_min_strided_rows = 1 << 20;  // single copies only: batch calls count pieces
    auto made = MakeTransferEngine(TransferBackend::kDma, config);
    ASSERT_TRUE(made.ok()) << made.status().ToString();
    TransferEngine& engine = *made.value();
    TestRegion src(hg, false, MemoryKind::kHost, false);
    TestRegion dst(dg, false, MemoryKind::kDevice, false);
    src.FillRandom(rng);
    dst.Fill(testing::kPoison);
    src.Upload();
    dst.Upload();
    // 300 random pages x K/V: about 600 single copies, 3 lanes of dma_ops_per_lane 256.
    const auto pairs = testing::RandomPagePairs(rng, hg.num_slots, dg.num_slots, 4, 300);
    const KvRegion sm = src.mirror_region(), dm = dst.mirror_region();
    ASSERT_OK(testing::ReferenceTransfer(TransferRequest::PerLayer(
        sm, dm, SlotIndices::Host(pairs.src), SlotIndices::Host(pairs.dst), 1)));
    const KvRegion sgpu = src.gpu_region(), dgpu = dst.gpu_region();
    HostGate gate;
    if (c.hold) ASSERT_CUDA(gate.Hold(stream.get()));
    const Status st =
        engine.Transfer(TransferRequest::PerLayer(sgpu, dgpu, SlotIndices::Host(pairs.src),
                                                  SlotIndices::Host(pairs.dst), 1),
                        {.stream = stream.get()});
    const testing::GpuTransferStats stats = *testing::LastTransferStats(engine);
    gate.Release();
    ASSERT_OK(st);
    ASSERT_OK(engine.Synchronize(stream.get()));
    EXPECT_FALSE(gate.TimedOut());
    EXPECT_TRUE(dst.MatchesMirror());
    if (stats.batch_calls == 0) GTEST_SKIP() << "cudaMemcpyBatchAsync is not offered here";
    EXPECT_EQ(stats.copies_2d, 0);
    EXPECT_GT(stats.lanes, 1) << stats.copy_ops << " copy ops";
    EXPECT_EQ(stats.whole_batch, c.want_whole);
    if (c.want_whole) {
      EXPECT_EQ(stats.batch_calls, stats.lanes);
    } else {
      EXPECT_GT(stats.batch_calls, stats.lanes);
    }
  }
}

// The dma backend joins K and V of a page into one depth-2 strided copy when each side holds V a
// whole number of layer strides after K (one allocation, K then V: DeviceKvPool, HostKvPool):
// an all-layer copy at page 16 is then one copy operation per page run instead of two. Both
// directions, host layer_first and page_first_direct; bytes against the reference.
TEST(CudaTransferTest, DmaJoinsKAndVOfAPageInOneCopy) {
  REQUIRE_GPU();
  std::mt19937_64 rng(testing::TestSeed() + 21);
  auto made = MakeTransferEngine(TransferBackend::kDma, TransferEngineConfig{});
  ASSERT_TRUE(made.ok()) << made.status().ToString();
  TransferEngine& engine = *made.value();
  for (const KvLayout host_layout : {KvLayout::kLayerFirst, KvLayout::kPageFirstDirect}) {
    for (const bool to_host : {true, false}) {
      SCOPED_TRACE(::testing::Message()
                   << LayoutName(host_layout) << (to_host ? " backup" : " load"));
      const KvGeometry dg = MakeGeometry(KvLayout::kLayerFirst, false, 16, 64, 6, 256, 2);
      const KvGeometry hg = MakeGeometry(host_layout, false, 16, 64, 6, 256, 2);
      auto pool = DeviceKvPool::Create(dg, false, 0);
      ASSERT_TRUE(pool.ok()) << pool.status().ToString();
      auto pinned = PinnedHostBuffer::Allocate(2 * hg.buffer_bytes());
      ASSERT_TRUE(pinned.ok()) << pinned.status().ToString();
      // Mirrors, K then V, like the GPU side.
      std::vector<std::byte> dev_mirror(static_cast<size_t>(2 * dg.buffer_bytes()));
      std::vector<std::byte> host_mirror(static_cast<size_t>(2 * hg.buffer_bytes()));
      auto fill = [&](std::vector<std::byte>& v, bool random) {
        for (auto& b : v) b = random ? static_cast<std::byte>(rng()) : testing::kPoison;
      };
      fill(dev_mirror, to_host);  // the source side random, the destination poisoned
      fill(host_mirror, !to_host);
      ASSERT_EQ(cudaMemcpy(pool->k(), dev_mirror.data(), dev_mirror.size(), cudaMemcpyHostToDevice),
                cudaSuccess);
      std::memcpy(pinned->data(), host_mirror.data(), host_mirror.size());
      auto region = [](const KvGeometry& g, void* base, MemoryKind memory) {
        KvRegion r;
        r.geometry = g;
        r.mla = false;
        r.memory = memory;
        r.device = memory == MemoryKind::kDevice ? 0 : -1;
        r.k = base;
        r.v = static_cast<std::byte*>(base) + g.buffer_bytes();
        return r;
      };
      const KvRegion dev = region(dg, pool->k(), MemoryKind::kDevice);
      const KvRegion host = region(hg, pinned->data(), MemoryKind::kHost);
      const KvRegion dev_m = region(dg, dev_mirror.data(), MemoryKind::kHost);
      const KvRegion host_m = region(hg, host_mirror.data(), MemoryKind::kHost);
      const auto pairs = testing::RandomPagePairs(rng, dg.num_slots, hg.num_slots, 16, 24);
      const std::vector<int64_t>& src_idx = to_host ? pairs.src : pairs.dst;
      const std::vector<int64_t>& dst_idx = to_host ? pairs.dst : pairs.src;
      ASSERT_OK(testing::ReferenceTransfer(
          TransferRequest::AllLayers(to_host ? dev_m : host_m, to_host ? host_m : dev_m,
                                     SlotIndices::Host(src_idx), SlotIndices::Host(dst_idx))));
      ASSERT_OK(engine.Transfer(
          TransferRequest::AllLayers(to_host ? dev : host, to_host ? host : dev,
                                     SlotIndices::Host(src_idx), SlotIndices::Host(dst_idx))));
      ASSERT_OK(engine.Synchronize(nullptr));
      const auto* stats = testing::LastTransferStats(engine);
      ASSERT_NE(stats, nullptr);
      EXPECT_GE(stats->copy_ops, 1);
      EXPECT_EQ(stats->kv_merged, stats->copy_ops) << "every page run should be one K+V copy";
      std::vector<std::byte> got(to_host ? host_mirror.size() : dev_mirror.size());
      ASSERT_EQ(cudaMemcpy(got.data(), to_host ? pinned->data() : pool->k(), got.size(),
                           cudaMemcpyDefault),
                cudaSuccess);
      EXPECT_TRUE(got == (to_host ? host_mirror : dev_mirror)) << "bytes differ from the reference";
    }
  }
}

// TransferOptions::max_sms bounds the kernel backend's grid for one call (the engine's
// TransferEngineConfig::max_sms otherwise); the bytes are the same either way.
TEST(CudaTransferTest, PerCallMaxSmsBoundsTheGrid) {
  REQUIRE_GPU();
  std::mt19937_64 rng(testing::TestSeed() + 18);
  const KvGeometry dg = MakeGeometry(KvLayout::kLayerFirst, false, 16, 256, 4, 2048, 8);
  const KvGeometry hg = MakeGeometry(KvLayout::kPageFirst, false, 16, 256, 4, 2048, 8);
  TransferEngineConfig config;
  config.max_sms = 3;
  config.max_sms_to_host = 0;  // = max_sms (the default engine's split is tested below)
  auto made = MakeTransferEngine(TransferBackend::kKernel, config);
  ASSERT_TRUE(made.ok()) << made.status().ToString();
  for (int sms : {0, 1, 2, 8}) {
    SCOPED_TRACE(::testing::Message() << "max_sms " << sms);
    TestRegion src(dg, false, MemoryKind::kDevice, false);
    TestRegion dst(hg, false, MemoryKind::kHost, false);
    src.FillRandom(rng);
    dst.Fill(testing::kPoison);
    src.Upload();
    dst.Upload();
    const auto pairs = testing::RandomPagePairs(rng, dg.num_slots, hg.num_slots, 16, 64);
    const KvRegion sm = src.mirror_region(), dm = dst.mirror_region();
    ASSERT_OK(testing::ReferenceTransfer(TransferRequest::AllLayers(
        sm, dm, SlotIndices::Host(pairs.src), SlotIndices::Host(pairs.dst))));
    const KvRegion sgpu = src.gpu_region(), dgpu = dst.gpu_region();
    ASSERT_OK(
        made.value()->Transfer(TransferRequest::AllLayers(sgpu, dgpu, SlotIndices::Host(pairs.src),
                                                          SlotIndices::Host(pairs.dst)),
                               {.max_sms = sms}));
    ASSERT_OK(made.value()->Synchronize(nullptr));
    const auto* stats = testing::LastTransferStats(*made.value());
    ASSERT_NE(stats, nullptr);
    EXPECT_EQ(stats->blocks, sms == 0 ? 3 : sms);  // 16 MiB: enough work for every block
    EXPECT_TRUE(dst.MatchesMirror());
  }
}

// The default configuration gives device -> host copies (backups) max_sms_to_host = 3 SMs and
// host -> device copies max_sms = 4; a per-call max_sms overrides both.
TEST(CudaTransferTest, BackupsDefaultToFewerSmsThanLoads) {
  REQUIRE_GPU();
  std::mt19937_64 rng(testing::TestSeed() + 19);
  const KvGeometry dg = MakeGeometry(KvLayout::kLayerFirst, false, 16, 256, 4, 2048, 8);
  const KvGeometry hg = MakeGeometry(KvLayout::kPageFirst, false, 16, 256, 4, 2048, 8);
  const TransferEngineConfig config;
  ASSERT_EQ(config.max_sms, 4);
  ASSERT_EQ(config.max_sms_to_host, 3);
  auto made = MakeTransferEngine(TransferBackend::kKernel, config);
  ASSERT_TRUE(made.ok()) << made.status().ToString();
  TestRegion device(dg, false, MemoryKind::kDevice, false);
  TestRegion host(hg, false, MemoryKind::kHost, false);
  const KvRegion dgpu = device.gpu_region(), hgpu = host.gpu_region();
  const KvRegion dm = device.mirror_region(), hm = host.mirror_region();
  struct Case {
    bool to_host;
    int per_call;
    int expected_blocks;
  };
  for (const Case& c : {Case{true, 0, 3}, Case{false, 0, 4}, Case{true, 2, 2}, Case{false, 1, 1}}) {
    SCOPED_TRACE(::testing::Message()
                 << (c.to_host ? "to host" : "to device") << ", max_sms " << c.per_call);
    TestRegion& src = c.to_host ? device : host;
    TestRegion& dst = c.to_host ? host : device;
    src.FillRandom(rng);
    dst.Fill(testing::kPoison);
    src.Upload();
    dst.Upload();
    const auto pairs = testing::RandomPagePairs(rng, (c.to_host ? dg : hg).num_slots,
                                                (c.to_host ? hg : dg).num_slots, 16, 64);
    ASSERT_OK(testing::ReferenceTransfer(
        TransferRequest::AllLayers(c.to_host ? dm : hm, c.to_host ? hm : dm,
                                   SlotIndices::Host(pairs.src), SlotIndices::Host(pairs.dst))));
    ASSERT_OK(made.value()->Transfer(
        TransferRequest::AllLayers(c.to_host ? dgpu : hgpu, c.to_host ? hgpu : dgpu,
                                   SlotIndices::Host(pairs.src), SlotIndices::Host(pairs.dst)),
        {.max_sms = c.per_call}));
    ASSERT_OK(made.value()->Synchronize(nullptr));
    const auto* stats = testing::LastTransferStats(*made.value());
    ASSERT_NE(stats, nullptr);
    EXPECT_EQ(stats->blocks, c.expected_blocks);
    EXPECT_TRUE(dst.MatchesMirror());
  }
}

// A load (host -> device) while a backup this engine launched on another stream is still
// running gets max_sms_beside_backup SMs (default 8); once the backup has finished, or beside a
// backup on its own stream, or with the setting off, max_sms. The backup is held back by a host
// gate on its stream, so it is certainly running (queued) while the loads are submitted. Every
// copy's bytes are checked against the reference copy. Run as the first test of its process (as
// ctest runs it), it also checks that the engine loaded its kernels when it was made: before
// PreloadCopyKernels, the first load's lazy kernel load waited for the held backup, i.e. for
// the gate to time out.
TEST(CudaTransferTest, LoadsBesideABackupGetMoreSms) {
  REQUIRE_GPU();
  std::mt19937_64 rng(testing::TestSeed() + 23);
  const KvGeometry dg = MakeGeometry(KvLayout::kLayerFirst, false, 16, 128, 4, 2048, 8);
  const KvGeometry hg = MakeGeometry(KvLayout::kPageFirst, false, 16, 128, 4, 2048, 8);
  ASSERT_EQ(TransferEngineConfig{}.max_sms_beside_backup, 8);
  TestRegion backup_src(dg, false, MemoryKind::kDevice, false);
  TestRegion backup_dst(hg, false, MemoryKind::kHost, false);
  TestRegion load_src(hg, false, MemoryKind::kHost, false);
  TestRegion load_dst(dg, false, MemoryKind::kDevice, false);
  // TransferRequest holds pointers to its regions: keep them alive for the whole test.
  const KvRegion backup_from = backup_src.gpu_region(), backup_to = backup_dst.gpu_region();
  const KvRegion load_from = load_src.gpu_region(), load_to = load_dst.gpu_region();
  const KvRegion backup_from_m = backup_src.mirror_region();
  const KvRegion backup_to_m = backup_dst.mirror_region();
  const KvRegion load_from_m = load_src.mirror_region(), load_to_m = load_dst.mirror_region();
  CudaStreamHandle backup_stream = std::move(CudaStreamHandle::Create(0, true)).value();
  CudaStreamHandle load_stream = std::move(CudaStreamHandle::Create(0, true)).value();
  HostGate gate;
  struct Case {
    int beside_backup;    // TransferEngineConfig::max_sms_beside_backup
    bool held;            // a backup on backup_stream is held back while the load is submitted
    bool same_stream;     // the load goes on backup_stream
    int per_call;         // TransferOptions::max_sms
    int expected_blocks;  // of the load
  };
  for (const Case& c :
       {Case{8, true, false, 0, 8}, Case{8, false, false, 0, 4}, Case{8, true, true, 0, 4},
        Case{8, true, false, 2, 2}, Case{0, true, false, 0, 4}, Case{6, true, false, 0, 6}}) {
    SCOPED_TRACE(::testing::Message()
                 << "max_sms_beside_backup " << c.beside_backup << ", held " << c.held
                 << ", same stream " << c.same_stream << ", max_sms " << c.per_call);
    TransferEngineConfig config;
    config.max_sms_beside_backup = c.beside_backup;
    auto made = MakeTransferEngine(TransferBackend::kKernel, config);
    ASSERT_TRUE(made.ok()) << made.status().ToString();
    TransferEngine& engine = *made.value();
    for (TestRegion* r : {&backup_src, &load_src}) r->FillRandom(rng);
    for (TestRegion* r : {&backup_dst, &load_dst}) r->Fill(testing::kPoison);
    for (TestRegion* r : {&backup_src, &backup_dst, &load_src, &load_dst}) r->Upload();
    const auto backup_pairs = testing::RandomPagePairs(rng, dg.num_slots, hg.num_slots, 16, 64);
    const auto load_pairs = testing::RandomPagePairs(rng, hg.num_slots, dg.num_slots, 16, 64);
    const TransferRequest backup =
        TransferRequest::AllLayers(backup_from, backup_to, SlotIndices::Host(backup_pairs.src),
                                   SlotIndices::Host(backup_pairs.dst));
    const TransferRequest load = TransferRequest::AllLayers(
        load_from, load_to, SlotIndices::Host(load_pairs.src), SlotIndices::Host(load_pairs.dst));
    if (c.held) ASSERT_CUDA(gate.Hold(backup_stream.get()));
    ASSERT_OK(engine.Transfer(backup, {.stream = backup_stream.get()}));
    if (!c.held) ASSERT_OK(engine.Synchronize(backup_stream.get()));
    const CudaStream load_on = c.same_stream ? backup_stream.get() : load_stream.get();
    ASSERT_OK(engine.Transfer(load, {.stream = load_on, .max_sms = c.per_call}));
    const auto* stats = testing::LastTransferStats(engine);
    ASSERT_NE(stats, nullptr);
    EXPECT_EQ(stats->blocks, c.expected_blocks);
    gate.Release();
    ASSERT_OK(engine.Synchronize(load_on));
    ASSERT_OK(engine.Synchronize(backup_stream.get()));
    EXPECT_FALSE(gate.TimedOut());
    ASSERT_OK(testing::ReferenceTransfer(
        TransferRequest::AllLayers(backup_from_m, backup_to_m, SlotIndices::Host(backup_pairs.src),
                                   SlotIndices::Host(backup_pairs.dst))));
    ASSERT_OK(testing::ReferenceTransfer(
        TransferRequest::AllLayers(load_from_m, load_to_m, SlotIndices::Host(load_pairs.src),
                                   SlotIndices::Host(load_pairs.dst))));
    EXPECT_TRUE(backup_dst.MatchesMirror());
    EXPECT_TRUE(load_dst.MatchesMirror());
    if (c.held) {
      // The backup has finished: the next load on the other stream is back to max_sms.
      ASSERT_OK(engine.Transfer(load, {.stream = load_stream.get()}));
      ASSERT_OK(engine.Synchronize(load_stream.get()));
      EXPECT_EQ(testing::LastTransferStats(engine)->blocks, 4);
    }
  }
}

// Per-layer tables on both sides of one request (SGLang's transfer_kv_all_layer: device layer
// tables to host layer tables), each call with tables the engine has not seen, on a fresh engine
// so its table cache grows from empty: the cache must not move an entry of the request while it
// adds the second (it did: the first call with two new tables used a dangling entry).
TEST(CudaTransferTest, LayerTablesOnBothSidesOnAFreshEngine) {
  REQUIRE_GPU();
  std::mt19937_64 rng(testing::TestSeed() + 17);
  for (TransferBackend backend : kGpuBackends) {
    auto engine = MakeTransferEngine(backend, TransferEngineConfig{});
    ASSERT_TRUE(engine.ok()) << engine.status().ToString();
    for (bool mla : {false, true}) {
      for (int call = 0; call < 10; ++call) {  // > the kernel engine's 8 cached tables
        const KvGeometry dg = MakeGeometry(KvLayout::kLayerFirst, mla, 4, 16, 3);
        const KvGeometry hg = MakeGeometry(KvLayout::kLayerFirst, mla, 4, 16, 3);
        Copy c{.backend = backend,
               .src_memory = MemoryKind::kDevice,
               .dst_memory = MemoryKind::kHost,
               .all_layers = true,
               .src_table = true,
               .dst_table = true,
               .index_mode = call % 2 == 0 ? 2 : 0,
               .engine = engine->get()};
        RunAndCompare(dg, hg, mla, c, testing::RandomPagePairs(rng, 64, 64, 4, 5), rng);
        if (HasFatalFailure()) return;
      }
    }
  }
}

// Many consecutive calls with host indices on one stream, without synchronising in between:
// staging buffers are reused only once their copy finished, so every call sees its own indices.
TEST(CudaTransferTest, HostIndexStagingIsNotOverwrittenInFlight) {
  REQUIRE_GPU();
  std::mt19937_64 rng(testing::TestSeed() + 15);
  const KvGeometry sg = MakeGeometry(KvLayout::kPageFirstDirect, false, 16, 64, 8, 512, 1);
  const KvGeometry dg = MakeGeometry(KvLayout::kLayerFirst, false, 16, 64, 8, 512, 1);
  TestRegion src(sg, false, MemoryKind::kHost, false);
  TestRegion dst(dg, false, MemoryKind::kDevice, false);
  src.FillRandom(rng);
  dst.Fill(testing::kPoison);
  src.Upload();
  dst.Upload();
  const KvRegion sm = src.mirror_region(), dm = dst.mirror_region();
  const KvRegion sgpu = src.gpu_region(), dgpu = dst.gpu_region();
  CudaStreamHandle stream = std::move(CudaStreamHandle::Create(0, true)).value();
  TransferEngine* engine = Engine(TransferBackend::kKernel);
  // 12 calls, each moving 4 pages of one layer, index lists overwritten right after each call.
  std::vector<int64_t> s_idx, d_idx;
  for (int call = 0; call < 12; ++call) {
    const auto pairs = testing::RandomPagePairs(rng, sg.num_slots, dg.num_slots, 16, 4);
    const int64_t layer = call % sg.num_layers;
    ASSERT_OK(testing::ReferenceTransfer(TransferRequest::PerLayer(
        sm, dm, SlotIndices::Host(pairs.src), SlotIndices::Host(pairs.dst), layer)));
    s_idx = pairs.src;
    d_idx = pairs.dst;
    ASSERT_OK(engine->Transfer(TransferRequest::PerLayer(sgpu, dgpu, SlotIndices::Host(s_idx),
                                                         SlotIndices::Host(d_idx), layer),
                               {.stream = stream.get()}));
    std::fill(s_idx.begin(), s_idx.end(), 0);  // the caller may reuse its lists at once
    std::fill(d_idx.begin(), d_idx.end(), 0);
  }
  ASSERT_OK(engine->Synchronize(stream.get()));
  EXPECT_TRUE(dst.MatchesMirror());
}

// Staging slots are reused oldest-first and skip streams known to be busy: many calls on three
// streams (more than the engine's 64 slots), index lists overwritten after each call, each
// stream writing its own destination, must all land.
TEST(CudaTransferTest, HostIndexStagingAcrossStreams) {
  REQUIRE_GPU();
  std::mt19937_64 rng(testing::TestSeed() + 17);
  const KvGeometry sg = MakeGeometry(KvLayout::kPageFirst, false, 16, 64, 4, 256, 1);
  const KvGeometry dg = MakeGeometry(KvLayout::kLayerFirst, false, 16, 64, 4, 256, 1);
  constexpr int kStreams = 3;
  constexpr int kCalls = 150;
  TestRegion src(sg, false, MemoryKind::kHost, false);
  src.FillRandom(rng);
  src.Upload();
  std::vector<std::unique_ptr<TestRegion>> dsts;
  std::vector<CudaStreamHandle> streams;
  for (int i = 0; i < kStreams; ++i) {
    dsts.push_back(std::make_unique<TestRegion>(dg, false, MemoryKind::kDevice, false));
    dsts.back()->Fill(testing::kPoison);
    dsts.back()->Upload();
    streams.push_back(std::move(CudaStreamHandle::Create(0, true)).value());
  }
  const KvRegion sgpu = src.gpu_region(), sm = src.mirror_region();
  TransferEngine* engine = Engine(TransferBackend::kKernel);
  std::vector<int64_t> s_idx, d_idx;
  for (int call = 0; call < kCalls; ++call) {
    const int k = call % kStreams;
    // Uneven sizes, so a stream's copies finish at different times from the others'.
    const int pages = 1 + static_cast<int>(rng() % (k == 0 ? 16 : 3));
    const auto pairs = testing::RandomPagePairs(rng, sg.num_slots, dg.num_slots, 16, pages);
    const int64_t layer = (call / kStreams) % sg.num_layers;
    ASSERT_OK(testing::ReferenceTransfer(
        TransferRequest::PerLayer(sm, dsts[k]->mirror_region(), SlotIndices::Host(pairs.src),
                                  SlotIndices::Host(pairs.dst), layer)));
    s_idx = pairs.src;
    d_idx = pairs.dst;
    ASSERT_OK(engine->Transfer(
        TransferRequest::PerLayer(sgpu, dsts[k]->gpu_region(), SlotIndices::Host(s_idx),
                                  SlotIndices::Host(d_idx), layer),
        {.stream = streams[k].get()}));
    std::fill(s_idx.begin(), s_idx.end(), 0);
    std::fill(d_idx.begin(), d_idx.end(), 0);
  }
  for (int i = 0; i < kStreams; ++i) {
    ASSERT_OK(engine->Synchronize(streams[i].get()));
    EXPECT_TRUE(dsts[i]->MatchesMirror()) << "stream " << i;
  }
}

// A copy that cannot start yet on one stream (held by a host function until the test releases
// it) must not hold up calls for another stream: the kernel engine's index staging waits for a
// busy slot only when it has no free one to give. With a fixed ring of staging slots, the call
// that came back to the held copy's slot waited for it, so a long all-layer backup serialised
// the per-layer loads issued beside it ("both directions at once").
//
// The gate opens by itself after 30 s, so a regression fails the test instead of hanging it. The
// engine is warmed up first, so that no staging buffer is allocated while the stream is held.
TEST(CudaTransferTest, CallsOnOneStreamDoNotWaitForAnotherStream) {
  REQUIRE_GPU();
  std::mt19937_64 rng(testing::TestSeed() + 16);
  const KvGeometry hg = MakeGeometry(KvLayout::kPageFirst, false, 16, 64, 4, 256, 1);
  const KvGeometry dg = MakeGeometry(KvLayout::kLayerFirst, false, 16, 64, 4, 256, 1);
  TestRegion held_src(hg, false, MemoryKind::kHost, false);
  TestRegion src(hg, false, MemoryKind::kHost, false);
  TestRegion held_dst(dg, false, MemoryKind::kDevice, false);
  TestRegion dst(dg, false, MemoryKind::kDevice, false);
  for (TestRegion* r : {&held_src, &src}) r->FillRandom(rng);
  for (TestRegion* r : {&held_dst, &dst}) r->Fill(testing::kPoison);
  for (TestRegion* r : {&held_src, &src, &held_dst, &dst}) r->Upload();
  const KvRegion held_src_gpu = held_src.gpu_region(), held_dst_gpu = held_dst.gpu_region();
  const KvRegion src_gpu = src.gpu_region(), dst_gpu = dst.gpu_region();
  const KvRegion src_mirror = src.mirror_region(), dst_mirror = dst.mirror_region();
  CudaStreamHandle held = std::move(CudaStreamHandle::Create(0, true)).value();
  CudaStreamHandle free_stream = std::move(CudaStreamHandle::Create(0, true)).value();
  auto made = MakeTransferEngine(TransferBackend::kKernel, TransferEngineConfig{});
  ASSERT_TRUE(made.ok()) << made.status().ToString();
  TransferEngine* engine = made->get();

  constexpr int kCalls = 12;  // more than any small fixed ring of staging slots
  const auto held_pairs = testing::RandomPagePairs(rng, hg.num_slots, dg.num_slots, 16, 2);
  std::vector<testing::SlotPairs> pairs;
  for (int call = 0; call < kCalls; ++call) {
    pairs.push_back(testing::RandomPagePairs(rng, hg.num_slots, dg.num_slots, 16, 2));
  }
  const TransferRequest held_request =
      TransferRequest::AllLayers(held_src_gpu, held_dst_gpu, SlotIndices::Host(held_pairs.src),
                                 SlotIndices::Host(held_pairs.dst));
  auto call_request = [&](int call) {
    return TransferRequest::PerLayer(src_gpu, dst_gpu, SlotIndices::Host(pairs[call].src),
                                     SlotIndices::Host(pairs[call].dst), call % hg.num_layers);
  };
  // Warm-up: the same calls, nothing held (the engine's staging buffers grow here).
  ASSERT_OK(engine->Transfer(held_request, {.stream = held.get()}));
  for (int call = 0; call < kCalls; ++call) {
    ASSERT_OK(engine->Transfer(call_request(call), {.stream = free_stream.get()}));
    ASSERT_OK(engine->Synchronize(free_stream.get()));
  }
  ASSERT_OK(engine->Synchronize(held.get()));

  HostGate gate;
  ASSERT_CUDA(gate.Hold(held.get()));
  ASSERT_OK(engine->Transfer(held_request, {.stream = held.get()}));
  // The calls for the free stream, from another thread; each waits for its own stream only.
  Status worker_status;
  std::thread worker([&] {
    for (int call = 0; call < kCalls && worker_status.ok(); ++call) {
      worker_status = engine->Transfer(call_request(call), {.stream = free_stream.get()});
      if (worker_status.ok()) worker_status = engine->Synchronize(free_stream.get());
    }
  });
  worker.join();
  gate.Release();
  ASSERT_OK(engine->Synchronize(held.get()));
  EXPECT_FALSE(gate.TimedOut())
      << "calls on a free stream waited for a copy held back on another stream";
  ASSERT_OK(worker_status);
  for (int call = 0; call < kCalls; ++call) {
    ASSERT_OK(testing::ReferenceTransfer(
        TransferRequest::PerLayer(src_mirror, dst_mirror, SlotIndices::Host(pairs[call].src),
                                  SlotIndices::Host(pairs[call].dst), call % hg.num_layers)));
  }
  EXPECT_TRUE(dst.MatchesMirror());
}

// Out-of-range device indices: skipped by the kernel (no illegal access; run this test under
// compute-sanitizer), reported by Synchronize as InvalidArgument naming the count and an
// example; every valid pair is still copied and nothing else is touched. The dma backend reports
// them from Transfer, before copying anything.
TEST(CudaTransferTest, OutOfRangeDeviceIndicesAreReported) {
  REQUIRE_GPU();
  std::mt19937_64 rng(testing::TestSeed() + 16);
  // Small slots (a warp's tile spans many chunks: per-lane resolve), and 1,152-byte slots and
  // 256-byte page_head heads (2..9 chunks per tile: the cooperative resolve).
  struct Shape {
    KvLayout host;
    int64_t slot_bytes, heads;
  };
  for (Shape sh : {Shape{KvLayout::kPageFirst, 64, 4}, Shape{KvLayout::kPageFirst, 1152, 1},
                   Shape{KvLayout::kPageHead, 2048, 8}}) {
    const KvGeometry hg = MakeGeometry(sh.host, false, 1, 32, 3, sh.slot_bytes, sh.heads);
    const KvGeometry dg =
        MakeGeometry(KvLayout::kLayerFirst, false, 1, 32, 3, sh.slot_bytes, sh.heads);
    for (int width : {32, 64}) {
      for (auto [backend, variant] :
           {std::pair{TransferBackend::kKernel, ""}, std::pair{TransferBackend::kAuto, ""}}) {
        SCOPED_TRACE(::testing::Message()
                     << TransferBackendName(backend) << " " << variant << " int" << width << " "
                     << LayoutName(sh.host) << " " << sh.slot_bytes << " B");
        TestRegion src(hg, false, MemoryKind::kHost, false);
        TestRegion dst(dg, false, MemoryKind::kDevice, false);
        src.FillRandom(rng);
        dst.Fill(testing::kPoison);
        src.Upload();
        dst.Upload();
        std::vector<int64_t> s = {3, 4, 1000000, 7, -5, 9}, d = {0, 1, 2, 3, 4, 99};
        // Expected: the valid pairs (0, 1, 3) copied, the rest skipped.
        const KvRegion sm = src.mirror_region(), dm = dst.mirror_region();
        std::vector<int64_t> vs = {3, 4, 7}, vd = {0, 1, 3};
        ASSERT_OK(testing::ReferenceTransfer(
            TransferRequest::AllLayers(sm, dm, SlotIndices::Host(vs), SlotIndices::Host(vd))));
        DeviceIndices ds = width == 64 ? DeviceIndices(s, int64_t{}) : DeviceIndices(s, int32_t{});
        DeviceIndices dd = width == 64 ? DeviceIndices(d, int64_t{}) : DeviceIndices(d, int32_t{});
        const KvRegion sgpu = src.gpu_region(), dgpu = dst.gpu_region();
        TransferEngine* engine = Engine(backend, variant[0] != '\0' ? variant : nullptr);
        ASSERT_OK(engine->Transfer(TransferRequest::AllLayers(sgpu, dgpu, ds.get(), dd.get())));
        const Status st = engine->Synchronize(nullptr);
        ASSERT_TRUE(st.IsInvalidArgument()) << st.ToString();
        EXPECT_NE(st.message().find("3 slot pair(s)"), std::string::npos) << st.message();
        EXPECT_NE(st.message().find("not in [0, 32)"), std::string::npos) << st.message();
        EXPECT_TRUE(dst.MatchesMirror());
        // Reported once: the next Synchronize is clean.
        ASSERT_OK(engine->Synchronize(nullptr));
      }
    }
  }
  const KvGeometry hg = MakeGeometry(KvLayout::kPageFirst, false, 1, 32);
  const KvGeometry dg = MakeGeometry(KvLayout::kLayerFirst, false, 1, 32);
  // dma: Transfer refuses before any copy.
  TestRegion src(hg, false, MemoryKind::kHost, false);
  TestRegion dst(dg, false, MemoryKind::kDevice, false);
  dst.Fill(testing::kPoison);
  dst.Upload();
  DeviceIndices ds(std::vector<int64_t>{1, 40}, int64_t{});
  DeviceIndices dd(std::vector<int64_t>{1, 2}, int64_t{});
  const KvRegion sgpu = src.gpu_region(), dgpu = dst.gpu_region();
  const Status st = Engine(TransferBackend::kDma)
                        ->Transfer(TransferRequest::AllLayers(sgpu, dgpu, ds.get(), dd.get()));
  ASSERT_TRUE(st.IsInvalidArgument()) << st.ToString();
  EXPECT_NE(st.message().find("src_slots[1] = 40"), std::string::npos) << st.message();
  EXPECT_TRUE(dst.MatchesMirror());
}

TEST(CudaTransferTest, PageableHostMemoryIsRefusedByTheKernelBackend) {
  REQUIRE_GPU();
  const KvGeometry g = MakeGeometry(KvLayout::kLayerFirst, true, 1, 8);
  std::vector<std::byte> pageable(static_cast<size_t>(g.buffer_bytes()));
  auto dev = DeviceKvPool::Create(g, true);
  ASSERT_OK(dev.status());
  KvRegion host;
  host.geometry = g;
  host.mla = true;
  host.k = pageable.data();
  const KvRegion device = dev->region();
  std::vector<int64_t> idx = {1, 2};
  const Status st = Engine(TransferBackend::kKernel)
                        ->Transfer(TransferRequest::AllLayers(host, device, SlotIndices::Host(idx),
                                                              SlotIndices::Host(idx)));
  ASSERT_TRUE(st.IsInvalidArgument()) << st.ToString();
  EXPECT_NE(st.message().find("pageable"), std::string::npos) << st.message();
  // The dma backend copies pageable memory.
  ASSERT_OK(Engine(TransferBackend::kDma)
                ->Transfer(TransferRequest::AllLayers(host, device, SlotIndices::Host(idx),
                                                      SlotIndices::Host(idx))));
  ASSERT_OK(Engine(TransferBackend::kDma)->Synchronize(nullptr));
}

// ---- layer events ----------------------------------------------------------------------------

// Copies layer `layer` of a device layer_first buffer's slots `slots` into `out` (what an
// attention kernel reading the freshly loaded KV would see).
__global__ void ConsumeLayer(const uint32_t* buffer, int64_t num_slots, int64_t slot_words,
                             int64_t layer, const int64_t* slots, int64_t count, uint32_t* out) {
  for (int64_t i = blockIdx.x * blockDim.x + threadIdx.x; i < count * slot_words;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t k = i / slot_words, w = i % slot_words;
    out[i] = buffer[(layer * num_slots + slots[k]) * slot_words + w];
  }
}

TEST(CudaTransferTest, ConsumerStreamSeesLayerAfterWaitingOnItsEvent) {
  REQUIRE_GPU();
  std::mt19937_64 rng(testing::TestSeed() + 17);
  // Large enough (8 layers x 16 MiB x K/V) that the consumer would overtake an unordered copy.
  const int64_t L = 8, pages = 512, P = 16, S = 2048;
  const KvGeometry hg = MakeGeometry(KvLayout::kPageFirst, false, P, pages, L, S, 8);
  const KvGeometry dg = MakeGeometry(KvLayout::kLayerFirst, false, P, pages, L, S, 8);
  for (TransferBackend backend : kGpuBackends) {
    SCOPED_TRACE(TransferBackendName(backend));
    TestRegion host(hg, false, MemoryKind::kHost, false);
    host.FillRandom(rng);
    host.Upload();
    auto pool = DeviceKvPool::Create(dg, false);
    ASSERT_OK(pool.status());
    ASSERT_CUDA(cudaMemset(pool->k(), 0xA5, static_cast<size_t>(pool->bytes())));
    const auto pairs = testing::RandomPagePairs(rng, hg.num_slots, dg.num_slots, P, pages / 2);
    DeviceIndices dslots(pairs.dst, int64_t{});
    auto events = LayerEvents::Create(static_cast<int>(L));
    ASSERT_OK(events.status());
    auto copy_stream = CudaStreamHandle::Create(0, true);
    auto consumer = CudaStreamHandle::Create(0, true);
    ASSERT_OK(copy_stream.status());
    ASSERT_OK(consumer.status());
    const KvRegion src = host.gpu_region(), dst = pool->region();
    const int64_t count = static_cast<int64_t>(pairs.src.size());
    const int64_t words = S / 4;
    auto out = DeviceBuffer::Allocate(L * count * S);
    ASSERT_OK(out.status());
    ASSERT_CUDA(cudaDeviceSynchronize());
    ASSERT_OK(
        Engine(backend)->Transfer(TransferRequest::AllLayers(src, dst, SlotIndices::Host(pairs.src),
                                                             SlotIndices::Host(pairs.dst)),
                                  {.stream = copy_stream->get(), .layer_events = &*events}));
    for (int64_t l = 0; l < L; ++l) {
      ASSERT_OK(events->Wait(static_cast<int>(l), consumer->get()));
      ConsumeLayer<<<64, 256, 0, consumer->get()>>>(
          static_cast<const uint32_t*>(pool->k()), dg.num_slots, words, l,
          static_cast<const int64_t*>(dslots.get().data), count,
          static_cast<uint32_t*>(out->data()) + l * count * words);
      ASSERT_CUDA(cudaGetLastError());
    }
    ASSERT_OK(consumer->Synchronize());
    for (int l = 0; l < L; ++l) {
      auto done = events->Query(l);
      ASSERT_OK(done.status());
      EXPECT_TRUE(*done);
    }
    ASSERT_OK(Engine(backend)->Synchronize(copy_stream->get()));
    // What the consumer saw must be the host bytes of K, layer by layer.
    std::vector<uint32_t> seen(static_cast<size_t>(L * count * words));
    ASSERT_CUDA(cudaMemcpy(seen.data(), out->data(), seen.size() * 4, cudaMemcpyDeviceToHost));
    const KvRegion hm = host.mirror_region();
    for (int64_t l = 0; l < L; ++l) {
      for (int64_t k = 0; k < count; ++k) {
        const std::byte* want =
            static_cast<const std::byte*>(hm.k) + hg.SlotOffset(l, pairs.src[k]);
        ASSERT_EQ(std::memcmp(&seen[static_cast<size_t>((l * count + k) * words)], want, S), 0)
            << "layer " << l << " pair " << k;
      }
    }
  }
}

TEST(CudaTransferTest, TooFewLayerEventsIsAnError) {
  REQUIRE_GPU();
  const KvGeometry g = MakeGeometry(KvLayout::kLayerFirst, true, 1, 8);
  auto a = DeviceKvPool::Create(g, true);
  auto b = DeviceKvPool::Create(g, true);
  auto events = LayerEvents::Create(2);
  ASSERT_OK(events.status());
  const KvRegion ra = a->region(), rb = b->region();
  std::vector<int64_t> idx = {1};
  for (TransferBackend backend : kGpuBackends) {
    const Status st = Engine(backend)->Transfer(
        TransferRequest::AllLayers(ra, rb, SlotIndices::Host(idx), SlotIndices::Host(idx)),
        {.layer_events = &*events});
    EXPECT_TRUE(st.IsInvalidArgument()) << st.ToString();
  }
}

// ---- device helpers --------------------------------------------------------------------------

TEST(CudaDeviceTest, HelpersWork) {
  REQUIRE_GPU();
  auto pool = DeviceKvPool::Create(MakeGeometry(KvLayout::kLayerFirst, false, 16, 4), false);
  ASSERT_OK(pool.status());
  const KvRegion r = pool->region();
  EXPECT_EQ(r.memory, MemoryKind::kDevice);
  EXPECT_EQ(static_cast<std::byte*>(r.v) - static_cast<std::byte*>(r.k), r.geometry.buffer_bytes());
  ASSERT_OK(r.Validate("pool"));
  EXPECT_TRUE(DeviceKvPool::Create(MakeGeometry(KvLayout::kPageFirst, false, 16, 4), false)
                  .status()
                  .IsInvalidArgument());

  std::vector<std::byte> mem(1 << 20);
  {
    auto reg = PinnedRegistration::Register(mem.data(), static_cast<int64_t>(mem.size()));
    ASSERT_OK(reg.status());
    cudaPointerAttributes attr{};
    ASSERT_CUDA(cudaPointerGetAttributes(&attr, mem.data()));
    EXPECT_EQ(attr.type, cudaMemoryTypeHost);
    auto again = PinnedRegistration::Register(mem.data(), static_cast<int64_t>(mem.size()));
    EXPECT_FALSE(again.ok());
  }
  cudaPointerAttributes attr{};
  ASSERT_CUDA(cudaPointerGetAttributes(&attr, mem.data()));
  EXPECT_EQ(attr.type, cudaMemoryTypeUnregistered);

  auto events = LayerEvents::Create(3);
  ASSERT_OK(events.status());
  EXPECT_TRUE(events->Record(3, nullptr).IsInvalidArgument());
  ASSERT_OK(events->Record(1, nullptr));
  ASSERT_OK(events->Synchronize(1));
  auto q = events->Query(1);
  ASSERT_OK(q.status());
  EXPECT_TRUE(*q);
  EXPECT_TRUE(LayerEvents::Create(0).status().IsInvalidArgument());
}

}  // namespace
}  // namespace kvtier
