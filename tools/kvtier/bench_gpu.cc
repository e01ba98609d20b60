// tools/kvtier/bench_gpu.cc — the GPU rows of `kvtier bench` (backends kernel, dma, auto).
//
// Follows docs/performance.md "How to measure (GPU)":
//   1. The ceiling first, every run: one 1 GiB cudaMemcpyAsync pinned host -> device and
//      device -> host (warm-up, then the median of `repeats`, timed by CUDA events). Every row's
//      "% of ceiling" is against the direction it moves, measured here; but where the median
//      of the DMA rates measured right after the rows (below) is higher, the rows are compared
//      with that median instead (RaiseCeilingToRowMedian): on the lent VMs the start
//      measurement was sometimes 5-15 % low, and rows then read above 100 %. The bar is only
//      ever raised.
//   2. Every case of the reference workload (bench.h: MHA Llama-3-8B and MLA DeepSeek-V3 shapes,
//      page sizes, every host layout; per-layer load host -> device and all-layer backup
//      device -> host) on every asked GPU backend. GPU ms: CUDA events around each call on the
//      copy stream, median of `repeats` after `warmup` calls; the stream is held by a host gate
//      (StreamGate) until the call is submitted, so the events time the device work alone and
//      not the host's submission. Calls of under 2 ms are timed in bursts of back-to-back calls
//      (events around the burst, divided by its length; up to 32 calls, ~4 ms a burst), so a
//      row is the rate of repeated calls, as a layer-by-layer load issues them. Host submit:
//      wall clock around each Transfer call alone (no synchronisation inside it), median of
//      `repeats` calls each made on an idle stream right after Synchronize, with no gate queued
//      before it (the wall clock of the timed calls is kept as host_submit_timed_us). After the
//      row, the copy engines' rate in its direction is measured again (dma_now_gbps: 64 MiB,
//      median of 3), so a slow row can be told from a slow link at that moment.
//   3. Every row is checked byte for byte against the cpu backend (itself tested against
//      testing::ReferenceTransfer): loads compare the whole destination layer (K and V) with a
//      poisoned layer into which the cpu backend copied the same slots; backups compare the whole
//      host pool with a poisoned copy into which the cpu backend copied from a host mirror of
//      the device pool.
//   4. "Both directions at once": per-layer loads of every layer on one stream while an
//      all-layer backup runs on another; reported as the sum of the two directions' bytes over
//      the time both took, against 1.6 x the one-way ceiling (docs/performance.md target 5).
//
// Indices: the kernel backend gets int64 device indices (as engines hand them over); dma and
// auto get host indices (dma plans on the host; with device indices auto always picks kernel).
// The dma backend is not run where one copy per slot and layer would be needed (all-layer
// backups at page 1 — over a million copies; page_head backups — a copy per head chunk): the
// row says so in its note.
//
// Memory: per shape one pinned host pool (cudaHostAlloc; --host-pages thp: an mmap on
// transparent huge pages, registered), one device pool, a pageable mirror of the device pool
// and a pageable expected buffer, each the reference pool size (4 GiB for MHA at 16,384 tokens).
//
// Thread safety: called from the one benchmark thread (helper threads only fill and compare).
#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "bench.h"

#if defined(KVTIER_WITH_CUDA)
#include <cuda_runtime.h>
#include <sys/mman.h>

#include "kvtier/cuda_check.h"
#include "kvtier/device.h"
#include "kvtier/testing/engine_stats.h"
#endif

namespace kvtier::tools {

#if !defined(KVTIER_WITH_CUDA)

Status RunGpuBench(const BenchOptions& options, std::vector<BenchRow>* rows) {
  (void)options;
  (void)rows;
  return Status::Unavailable(
      "GPU backends are unavailable: kvtier was built without CUDA (KVTIER_CUDA=OFF or no nvcc)");
}

#else

namespace {

constexpr uint8_t kPoisonByte = 0xA5;

// ---- host helpers (parallel over the machine's cores: the pools are GiBs) ---------------------

template <typename Fn>
void ParallelChunks(int64_t bytes, Fn fn) {
  const int threads = std::max(1u, std::min(16u, std::thread::hardware_concurrency()));
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    const int64_t b = bytes * t / threads, e = bytes * (t + 1) / threads;
    pool.emplace_back([=] { fn(b, e); });
  }
  for (auto& th : pool) th.join();
}

void ParallelFill(std::byte* p, int64_t bytes, uint8_t value) {
  ParallelChunks(bytes, [&](int64_t b, int64_t e) { std::memset(p + b, value, size_t(e - b)); });
}

void ParallelRandom(std::byte* p, int64_t bytes, uint64_t seed) {
  ParallelChunks(bytes, [&](int64_t b, int64_t e) {
    uint64_t state = seed ^ (static_cast<uint64_t>(b) * 0x9E3779B97F4A7C15ull);
    int64_t i = b;
    for (; i + 8 <= e; i += 8) {
      uint64_t z = (state += 0x9E3779B97F4A7C15ull);
      z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
      z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
      z ^= z >> 31;
      std::memcpy(p + i, &z, 8);
    }
    for (; i < e; ++i) p[i] = std::byte{0x5A};
  });
}

// Offset of the first differing byte, or -1.
int64_t ParallelFirstDifference(const std::byte* a, const std::byte* b, int64_t bytes) {
  std::vector<int64_t> first(64, -1);
  int slot = 0;
  std::vector<std::pair<int64_t, int64_t> > ranges;
  const int threads = std::max(1u, std::min(16u, std::thread::hardware_concurrency()));
  for (int t = 0; t < threads; ++t)
    ranges.emplace_back(bytes * t / threads, bytes * (t + 1) / threads);
  std::vector<std::thread> pool;
  for (auto [lo, hi] : ranges) {
    const int s = slot++;
    pool.emplace_back([&, lo, hi, s] {
      if (std::memcmp(a + lo, b + lo, size_t(hi - lo)) == 0) return;
      for (int64_t i = lo; i < hi; ++i) {
        if (a[i] != b[i]) {
          first[s] = i;
          return;
        }
      }
    });
  }
  for (auto& th : pool) th.join();
  for (int64_t f : first) {
    if (f >= 0) return f;
  }
  return -1;
}

// Holds a stream at a point until the host opens it (cudaLaunchHostFunc), so that the CUDA events
// of a row time the device work of a call, not the host's submission of it: the start event is
// recorded behind the gate, the call is submitted, the stop event recorded, then the gate opens.
// The host submission is timed separately (wall clock). Never held longer than 0.5 s.
struct StreamGate {
  std::atomic<int> open{0};
  static void CUDART_CB Wait(void* p) {
    auto* gate = static_cast<StreamGate*>(p);
    const auto t0 = std::chrono::steady_clock::now();
    while (gate->open.load(std::memory_order_acquire) == 0 &&
           std::chrono::steady_clock::now() - t0 < std::chrono::milliseconds(500)) {
    }
  }
  Status Close(cudaStream_t stream) {
    open.store(0, std::memory_order_release);
    KVTIER_CUDA_RETURN_IF_ERROR(cudaLaunchHostFunc(stream, &StreamGate::Wait, this));
    return Status::OK();
  }
  void Open() { open.store(1, std::memory_order_release); }
};

double WallUs(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
}

struct HostBytes {
  std::unique_ptr<std::byte[]> data;
  int64_t bytes = 0;
  static HostBytes Allocate(int64_t n) {
    return HostBytes{std::unique_ptr<std::byte[]>(new std::byte[static_cast<size_t>(n)]), n};
  }
  std::byte* get() const { return data.get(); }
};

// A region over `bytes` of memory split into K then V (or one MLA buffer).
KvRegion RegionOver(std::byte* base, const KvGeometry& g, bool mla, MemoryKind memory) {
  KvRegion r;
  r.geometry = g;
  r.mla = mla;
  r.memory = memory;
  r.device = memory == MemoryKind::kDevice ? 0 : -1;
  r.k = base;
  r.v = mla ? nullptr : base + g.buffer_bytes();
  return r;
}

// The pinned host pool: cudaHostAlloc, or an anonymous mmap registered with cudaHostRegister —
// on transparent huge pages (--host-pages thp, madvise) or on reserved 2 MiB huge pages
// (--host-pages hugetlb, MAP_HUGETLB: needs /proc/sys/vm/nr_hugepages) — to measure how much
// the host's page size matters to scattered SM accesses.
class PinnedPool {
 public:
  // `host_pages` (BenchOptions): "thp" and "hugetlb" map and register; anything else is
  // cudaHostAlloc.
  static Result<PinnedPool> Allocate(int64_t bytes, const std::string& host_pages) {
    PinnedPool p;
    const int mode = host_pages == "thp" ? 1 : host_pages == "hugetlb" ? 2 : 0;
    if (mode == 0) {
      KVTIER_ASSIGN_OR_RETURN(p.alloc_, PinnedHostBuffer::Allocate(bytes));
      p.data_ = p.alloc_.data();
      return p;
    }
    constexpr size_t kHuge = size_t{2} << 20;
    const size_t n = (static_cast<size_t>(bytes) + kHuge - 1) / kHuge * kHuge;
    // hugetlb mappings are 2 MiB-aligned already; the THP one is over-allocated and aligned.
    const size_t mapped = mode == 2 ? n : n + kHuge;
    void* raw = mmap(nullptr, mapped, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | (mode == 2 ? MAP_HUGETLB : 0), -1, 0);
    if (raw == MAP_FAILED) {
      return Status::OutOfMemory(
          fmt::format("mmap of {} bytes{} failed: {}", n,
                      mode == 2 ? " on reserved huge pages (see /proc/sys/vm/nr_hugepages)" : "",
                      std::strerror(errno)));
    }
    p.map_.reset(new Mapping{raw, mapped});
    auto* aligned = reinterpret_cast<std::byte*>((reinterpret_cast<uintptr_t>(raw) + kHuge - 1) /
                                                 kHuge * kHuge);
    if (mode == 1) (void)madvise(aligned, n, MADV_HUGEPAGE);
    KVTIER_ASSIGN_OR_RETURN(p.registration_,
                            PinnedRegistration::Register(aligned, static_cast<int64_t>(n)));
    p.data_ = aligned;
    return p;
  }
  void* data() const { return data_; }

 private:
  struct Mapping {
    void* base;
    size_t bytes;
    ~Mapping() { munmap(base, bytes); }
  };
  // Destroyed in reverse order: the registration goes before the mapping.
  std::unique_ptr<Mapping> map_;
  PinnedHostBuffer alloc_;
  PinnedRegistration registration_;
  void* data_ = nullptr;
};

// ---- the GPU state of one shape ---------------------------------------------------------------

struct ShapeBuffers {
  int64_t bytes = 0;         // of each pool (all buffers)
  PinnedPool host_pool;      // the host pool (any layout), pinned
  PinnedPool host_pool2;     // the backup destination of "both directions at once"
  DeviceKvPool device_pool;  // layer_first
  HostBytes device_mirror;   // what the device pool holds before a backup
  HostBytes expected;        // the cpu backend's result of the row
  bool device_dirty = true;  // device pool != device_mirror
};

struct Engines {
  std::vector<std::pair<TransferBackend, std::unique_ptr<TransferEngine> > > gpu;
  std::unique_ptr<TransferEngine> cpu;
};

class GpuBench {
 public:
  GpuBench(const BenchOptions& options, std::vector<BenchRow>* rows)
      : options_(options), rows_(rows) {}

  Status Run();

 private:
  Status MeasureCeiling();
  Status RunCase(const BenchCase& c, ShapeBuffers& buf, size_t* index, size_t total);
  Status RunBoth(const BenchCase& c, ShapeBuffers& buf, TransferBackend backend,
                 TransferEngine& engine);
  Result<BenchRow> TimeRow(const BenchCase& c, TransferBackend backend, TransferEngine& engine,
                           const TransferRequest& request);
  // The copy engines' rate right now in one direction (GB/s): kNowBytes, median of 3.
  Result<double> DmaNow(bool h2d);
  // After the last row: per direction, the higher of the start ceiling and the median of the
  // rows' DMA rates measured right after them; rows from `first_row` on are compared with it.
  void RaiseCeilingToRowMedian(size_t first_row);

  const BenchOptions& options_;
  std::vector<BenchRow>* rows_;
  Engines engines_;
  CudaStreamHandle stream_;
  CudaStreamHandle stream2_;
  double ceiling_h2d_ = 0, ceiling_d2h_ = 0;
  static constexpr int64_t kNowBytes = int64_t{64} << 20;
  PinnedHostBuffer now_host_;  // kNowBytes each, random: DmaNow's buffers
  DeviceBuffer now_device_;
};

Result<double> GpuBench::DmaNow(bool h2d) {
  if (now_host_.bytes() < kNowBytes) {
    KVTIER_ASSIGN_OR_RETURN(now_host_, PinnedHostBuffer::Allocate(kNowBytes));
    KVTIER_ASSIGN_OR_RETURN(now_device_,
                            DeviceBuffer::Allocate(kNowBytes, options_.transfer.device));
    ParallelRandom(static_cast<std::byte*>(now_host_.data()), kNowBytes, options_.seed + 17);
    KVTIER_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(now_device_.data(), now_host_.data(), kNowBytes,
                                                cudaMemcpyHostToDevice, stream_.get()));
  }
  KVTIER_ASSIGN_OR_RETURN(CudaEventHandle start,
                          CudaEventHandle::Create(options_.transfer.device, true));
  KVTIER_ASSIGN_OR_RETURN(CudaEventHandle stop,
                          CudaEventHandle::Create(options_.transfer.device, true));
  std::vector<double> ms;
  for (int r = 0; r < 4; ++r) {  // one warm-up
    KVTIER_RETURN_IF_ERROR(start.Record(stream_.get()));
    KVTIER_CUDA_RETURN_IF_ERROR(
        h2d ? cudaMemcpyAsync(now_device_.data(), now_host_.data(), kNowBytes,
                              cudaMemcpyHostToDevice, stream_.get())
            : cudaMemcpyAsync(now_host_.data(), now_device_.data(), kNowBytes,
                              cudaMemcpyDeviceToHost, stream_.get()));
    KVTIER_RETURN_IF_ERROR(stop.Record(stream_.get()));
    KVTIER_RETURN_IF_ERROR(stop.Synchronize());
    KVTIER_ASSIGN_OR_RETURN(float t, stop.ElapsedMsSince(start));
    if (r > 0) ms.push_back(t);
  }
  return static_cast<double>(kNowBytes) / (Median(ms) * 1e-3) / 1e9;
}

Status GpuBench::MeasureCeiling() {
  constexpr int64_t kBytes = int64_t{1} << 30;
  KVTIER_ASSIGN_OR_RETURN(PinnedHostBuffer host, PinnedHostBuffer::Allocate(kBytes));
  KVTIER_ASSIGN_OR_RETURN(DeviceBuffer device,
                          DeviceBuffer::Allocate(kBytes, options_.transfer.device));
  ParallelRandom(static_cast<std::byte*>(host.data()), kBytes, options_.seed);
  KVTIER_ASSIGN_OR_RETURN(CudaEventHandle start,
                          CudaEventHandle::Create(options_.transfer.device, true));
  KVTIER_ASSIGN_OR_RETURN(CudaEventHandle stop,
                          CudaEventHandle::Create(options_.transfer.device, true));
  for (int dir = 0; dir < 2; ++dir) {
    std::vector<double> ms;
    for (int r = 0; r < options_.warmup + options_.repeats; ++r) {
      KVTIER_RETURN_IF_ERROR(start.Record(stream_.get()));
      if (dir == 0) {
        KVTIER_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(device.data(), host.data(), kBytes,
                                                    cudaMemcpyHostToDevice, stream_.get()));
      } else {
        KVTIER_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(host.data(), device.data(), kBytes,
                                                    cudaMemcpyDeviceToHost, stream_.get()));
      }
      KVTIER_RETURN_IF_ERROR(stop.Record(stream_.get()));
      KVTIER_RETURN_IF_ERROR(stop.Synchronize());
      KVTIER_ASSIGN_OR_RETURN(float t, stop.ElapsedMsSince(start));
      if (r >= options_.warmup) ms.push_back(t);
    }
    const double med = Median(ms);
    const double gbps = static_cast<double>(kBytes) / (med * 1e-3) / 1e9;
    (dir == 0 ? ceiling_h2d_ : ceiling_d2h_) = gbps;
    BenchRow row;
    row.shape = "-";
    row.op = "ceiling";
    row.layout = dir == 0 ? "h2d" : "d2h";
    row.backend = "memcpy";
    row.bytes = kBytes;
    row.ms = med;
    row.gbps = gbps;
    row.ceiling_gbps = gbps;
    row.ceiling = dir == 0 ? "dma_h2d" : "dma_d2h";
    row.pct_of_ceiling = 100.0;
    row.check_ok = true;
    row.note = fmt::format("ceiling: one 1 GiB cudaMemcpyAsync {} (pinned host)",
                           dir == 0 ? "host->device" : "device->host");
    rows_->push_back(row);
    std::fprintf(stderr, "ceiling %s: %.2f GB/s (1 GiB cudaMemcpyAsync, median of %d)\n",
                 dir == 0 ? "H2D" : "D2H", gbps, options_.repeats);
  }
  // Both directions at once on the copy engines: what the link gives a load and a backup that
  // overlap perfectly (the reference for target 5's 1.6 x).
  KVTIER_ASSIGN_OR_RETURN(PinnedHostBuffer host2, PinnedHostBuffer::Allocate(kBytes));
  KVTIER_ASSIGN_OR_RETURN(DeviceBuffer device2,
                          DeviceBuffer::Allocate(kBytes, options_.transfer.device));
  KVTIER_ASSIGN_OR_RETURN(CudaEventHandle stop2,
                          CudaEventHandle::Create(options_.transfer.device, true));
  std::vector<double> ms;
  for (int r = 0; r < options_.warmup + options_.repeats; ++r) {
    KVTIER_RETURN_IF_ERROR(start.Record(stream_.get()));
    KVTIER_RETURN_IF_ERROR(start.WaitOn(stream2_.get()));
    KVTIER_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(device.data(), host.data(), kBytes, cudaMemcpyHostToDevice, stream_.get()));
    KVTIER_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(host2.data(), device2.data(), kBytes,
                                                cudaMemcpyDeviceToHost, stream2_.get()));
    KVTIER_RETURN_IF_ERROR(stop.Record(stream_.get()));
    KVTIER_RETURN_IF_ERROR(stop2.Record(stream2_.get()));
    KVTIER_RETURN_IF_ERROR(stop.Synchronize());
    KVTIER_RETURN_IF_ERROR(stop2.Synchronize());
    KVTIER_ASSIGN_OR_RETURN(float t1, stop.ElapsedMsSince(start));
    KVTIER_ASSIGN_OR_RETURN(float t2, stop2.ElapsedMsSince(start));
    if (r >= options_.warmup) ms.push_back(std::max(t1, t2));
  }
  BenchRow row;
  row.shape = "-";
  row.op = "ceiling";
  row.layout = "both";
  row.backend = "memcpy";
  row.bytes = 2 * kBytes;
  row.ms = Median(ms);
  row.gbps = static_cast<double>(row.bytes) / (row.ms * 1e-3) / 1e9;
  row.ceiling = "dma_h2d+d2h/2*1.6";
  row.ceiling_gbps = std::min(ceiling_h2d_, ceiling_d2h_);
  row.pct_of_ceiling = 100.0 * row.gbps / row.ceiling_gbps;
  row.check_ok = true;
  row.note =
      "ceiling both ways: 1 GiB cudaMemcpyAsync host->device and 1 GiB device->host on two "
      "streams at once; % is of the one-way ceiling";
  rows_->push_back(row);
  std::fprintf(stderr, "ceiling both ways at once: %.2f GB/s (%.2f x one way)\n", row.gbps,
               row.pct_of_ceiling / 100.0);
  return Status::OK();
}

Result<BenchRow> GpuBench::TimeRow(const BenchCase& c, TransferBackend backend,
                                   TransferEngine& engine, const TransferRequest& request) {
  BenchRow row = RowOf(c, backend);
  const bool load = c.op == BenchOp::kLoad;
  row.ceiling = load ? "dma_h2d" : "dma_d2h";
  row.ceiling_gbps = load ? ceiling_h2d_ : ceiling_d2h_;
  KVTIER_ASSIGN_OR_RETURN(CudaEventHandle start,
                          CudaEventHandle::Create(options_.transfer.device, true));
  KVTIER_ASSIGN_OR_RETURN(CudaEventHandle stop,
                          CudaEventHandle::Create(options_.transfer.device, true));
  std::vector<double> gpu_ms, host_us;
  const TransferOptions topts{.stream = stream_.get()};
  // The gate is used only for short submissions: kernel launches, or at most kMaxGatedCopyOps
  // copy operations submitted in < 2 ms in the warm-up. More copy operations can fill the
  // driver's queue so that submission waits for the device, which the gate holds (seen on an
  // H200 with 1,024 strided copies in one cudaMemcpy3DBatchAsync); those calls are timed
  // ungated, and their GPU time then includes the submission.
  constexpr int64_t kMaxGatedCopyOps = 256;
  // Short calls are timed in bursts of back-to-back calls (events around the burst, divided by
  // its length), as docs/performance.md asks ("CUDA events around repeated calls"): a lone call of
  // a few hundred microseconds also times the stream's start-up after the gate and the launch, tens
  // of microseconds that back-to-back calls (a layer-by-layer load) overlap.
  constexpr double kBurstMs = 4.0;
  constexpr int kMaxBurst = 32;
  StreamGate gate;
  bool gated = false;
  int burst = 1;
  double warmup_ms = 0;
  // --warmup-ms: before the warm-up calls, keep calling (each call waited for) until that much
  // wall time has passed, so the row starts on a GPU that has been busy (measurements).
  if (options_.warmup_ms > 0) {
    const auto t0 = std::chrono::steady_clock::now();
    while (WallUs(t0) < 1000.0 * options_.warmup_ms) {
      KVTIER_RETURN_IF_ERROR(engine.Transfer(request, topts).WithContext(c.Label()));
      KVTIER_RETURN_IF_ERROR(engine.Synchronize(stream_.get()).WithContext(c.Label()));
    }
  }
  for (int r = 0; r < options_.warmup + options_.repeats; ++r) {
    if (r == options_.warmup) {
      const auto* stats = testing::LastTransferStats(engine);
      const bool few_ops = stats == nullptr || stats->backend == TransferBackend::kKernel ||
                           stats->copy_ops <= kMaxGatedCopyOps;
      gated = options_.warmup > 0 && few_ops && Median(host_us) < 2000.0;
      if (gated && warmup_ms > 0 && warmup_ms < kBurstMs / 2) {
        burst = std::clamp(static_cast<int>(kBurstMs / warmup_ms), 2, kMaxBurst);
        // One untimed, ungated burst first: the engine's per-call buffers (index staging) grow
        // to a burst's needs here, not while the gate holds the stream.
        for (int b = 0; b < burst; ++b) {
          KVTIER_RETURN_IF_ERROR(engine.Transfer(request, topts).WithContext(c.Label()));
        }
        KVTIER_RETURN_IF_ERROR(engine.Synchronize(stream_.get()).WithContext(c.Label()));
      }
    }
    if (r == options_.warmup) host_us.clear();
    if (gated) KVTIER_RETURN_IF_ERROR(gate.Close(stream_.get()));
    KVTIER_RETURN_IF_ERROR(start.Record(stream_.get()));
    Status submitted;
    for (int b = 0; b < burst && submitted.ok(); ++b) {
      const auto t0 = std::chrono::steady_clock::now();
      submitted = engine.Transfer(request, topts).WithContext(c.Label());
      host_us.push_back(WallUs(t0));
    }
    const Status recorded = stop.Record(stream_.get());
    gate.Open();
    KVTIER_RETURN_IF_ERROR(submitted);
    KVTIER_RETURN_IF_ERROR(recorded);
    KVTIER_RETURN_IF_ERROR(engine.Synchronize(stream_.get()).WithContext(c.Label()));
    KVTIER_ASSIGN_OR_RETURN(float ms, stop.ElapsedMsSince(start));
    if (r >= options_.warmup) gpu_ms.push_back(ms / burst);
    if (r < options_.warmup) warmup_ms = ms;
  }
  if (!gated) row.note = "GPU time includes host submission (long submission: not gated)";
  if (burst > 1) {
    row.note = fmt::format("GPU time per call from {} bursts of {} back-to-back calls{}",
                           options_.repeats, burst, row.note.empty() ? "" : "; " + row.note);
  }
  row.ms = Median(gpu_ms);
  row.gbps = static_cast<double>(row.bytes) / (row.ms * 1e-3) / 1e9;
  row.pct_of_ceiling = 100.0 * row.gbps / row.ceiling_gbps;
  row.host_submit_timed_us = Median(host_us);
  // Host submission of a call alone on an idle stream: no gate (a host function) queued just
  // before it and no burst, i.e. what an engine's thread pays per call.
  host_us.clear();
  std::vector<double> launch_us;
  for (int r = 0; r < options_.repeats; ++r) {
    KVTIER_RETURN_IF_ERROR(engine.Synchronize(stream_.get()).WithContext(c.Label()));
    const auto t0 = std::chrono::steady_clock::now();
    const Status submitted = engine.Transfer(request, topts).WithContext(c.Label());
    host_us.push_back(WallUs(t0));
    KVTIER_RETURN_IF_ERROR(submitted);
    if (const auto* stats = testing::LastTransferStats(engine)) {
      launch_us.push_back(stats->launch_us);
    }
  }
  KVTIER_RETURN_IF_ERROR(engine.Synchronize(stream_.get()).WithContext(c.Label()));
  row.host_submit_us = Median(host_us);
  if (!launch_us.empty()) row.host_launch_us = Median(launch_us);
  KVTIER_ASSIGN_OR_RETURN(row.dma_now_gbps, DmaNow(load));
  if (const auto* stats = testing::LastTransferStats(engine)) {
    if (stats->backend == TransferBackend::kKernel) {
      row.sms_used = stats->blocks;
      if (backend == TransferBackend::kAuto) {
        row.note = "auto chose kernel" + (row.note.empty() ? "" : "; " + row.note);
      }
    } else {
      row.note = fmt::format(
          "{}dma: {} copy ops ({} 2D of which {} carry K and V, {} batch call(s), {} stream(s)){}",
          backend == TransferBackend::kAuto ? "auto chose " : "", stats->copy_ops, stats->copies_2d,
          stats->kv_merged, stats->batch_calls, stats->lanes,
          row.note.empty() ? "" : "; " + row.note);
    }
  }
  return row;
}

Status GpuBench::RunCase(const BenchCase& c, ShapeBuffers& buf, size_t* index, size_t total) {
  const bool load = c.op == BenchOp::kLoad;
  const KvGeometry hg = c.HostGeometry(), dg = c.DeviceGeometry();
  auto* host_base = static_cast<std::byte*>(buf.host_pool.data());
  auto* dev_base = static_cast<std::byte*>(buf.device_pool.k());
  const KvRegion host = RegionOver(host_base, hg, c.mla, MemoryKind::kHost);
  const KvRegion device = RegionOver(dev_base, dg, c.mla, MemoryKind::kDevice);
  const KvRegion mirror = RegionOver(buf.device_mirror.get(), dg, c.mla, MemoryKind::kHost);
  const uint64_t row_seed = options_.seed * 1000003ull + *index;
  const BenchSlots slots = DrawSlots(c, row_seed);
  const std::vector<int64_t>& src_idx = load ? slots.host : slots.device;
  const std::vector<int64_t>& dst_idx = load ? slots.device : slots.host;
  KVTIER_ASSIGN_OR_RETURN(DeviceBuffer dev_idx,
                          DeviceBuffer::Allocate(2 * c.tokens * 8 + 16, options_.transfer.device));
  auto* d_src = static_cast<int64_t*>(dev_idx.data());
  int64_t* d_dst = d_src + c.tokens;
  KVTIER_CUDA_RETURN_IF_ERROR(
      cudaMemcpy(d_src, src_idx.data(), src_idx.size() * 8, cudaMemcpyHostToDevice));
  KVTIER_CUDA_RETURN_IF_ERROR(
      cudaMemcpy(d_dst, dst_idx.data(), dst_idx.size() * 8, cudaMemcpyHostToDevice));
  // Legacy-stream copies from pageable memory and cudaMemset may still be in flight when they
  // return; the timed copies run on a non-blocking stream. Here and below: synchronise first.
  KVTIER_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());

  // Expected result by the cpu backend, and the state the GPU destination starts from.
  const int64_t layer_bytes = dg.layer_bytes();
  std::vector<void*> table_k, table_v;
  KvRegion expected;
  if (load) {
    // The loaded layer only: a per-layer table whose every entry is one poisoned layer per
    // buffer (the request touches only `load_layer`).
    auto* e = buf.expected.get();
    ParallelFill(e, layer_bytes * (c.mla ? 1 : 2), kPoisonByte);
    table_k.assign(static_cast<size_t>(dg.num_layers), e);
    if (!c.mla) table_v.assign(static_cast<size_t>(dg.num_layers), e + layer_bytes);
    expected.geometry = dg;
    expected.mla = c.mla;
    expected.k_layers = table_k;
    expected.v_layers = table_v;
    buf.device_dirty = true;
  } else {
    if (buf.device_dirty) {
      KVTIER_CUDA_RETURN_IF_ERROR(cudaMemcpy(dev_base, buf.device_mirror.get(),
                                             static_cast<size_t>(buf.bytes),
                                             cudaMemcpyHostToDevice));
      KVTIER_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
      buf.device_dirty = false;
    }
    ParallelFill(buf.expected.get(), buf.bytes, kPoisonByte);
    expected = RegionOver(buf.expected.get(), hg, c.mla, MemoryKind::kHost);
    KVTIER_RETURN_IF_ERROR(engines_.cpu->Transfer(TransferRequest::AllLayers(
        mirror, expected, SlotIndices::Host(src_idx), SlotIndices::Host(dst_idx))));
  }

  bool load_expected_ready = false;
  if (load && options_.reference_first) {
    // The order before this change, for measurements: the reference first.
    KVTIER_RETURN_IF_ERROR(engines_.cpu->Transfer(TransferRequest::PerLayer(
        host, expected, SlotIndices::Host(src_idx), SlotIndices::Host(dst_idx), c.load_layer)));
    load_expected_ready = true;
  }
  for (auto& [backend, engine] : engines_.gpu) {
    const bool device_indices = backend == TransferBackend::kKernel;
    const SlotIndices si =
        device_indices ? SlotIndices::Device(d_src, c.tokens) : SlotIndices::Host(src_idx);
    const SlotIndices di =
        device_indices ? SlotIndices::Device(d_dst, c.tokens) : SlotIndices::Host(dst_idx);
    const TransferRequest request =
        load ? TransferRequest::PerLayer(host, device, si, di, c.load_layer)
             : TransferRequest::AllLayers(device, host, si, di);
    BenchRow row;
    const bool dma_hopeless = backend == TransferBackend::kDma && !load &&
                              (c.page_size == 1 || c.host_layout == KvLayout::kPageHead);
    if (dma_hopeless) {
      row = RowOf(c, backend);
      row.check_ok = true;
      row.note = "not run: one copy per slot (and head) per layer, >= 1M copy ops";
    } else {
      // Poison the destination, time (warm-up + repeats), then compare the last result.
      if (load) {
        KVTIER_CUDA_RETURN_IF_ERROR(
            cudaMemset(dev_base, kPoisonByte, static_cast<size_t>(buf.bytes)));
        KVTIER_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
      } else {
        ParallelFill(host_base, buf.bytes, kPoisonByte);
      }
      KVTIER_ASSIGN_OR_RETURN(row, TimeRow(c, backend, *engine, request));
      int64_t diff = -1;
      std::string where;
      if (load && !load_expected_ready) {
        // The cpu backend's copy of the same slots, made after the GPU copies were timed: made
        // before, it leaves the source slots in the CPU's caches while the GPU reads them
        // (--reference-first keeps that order; `git show c489830:BENCHMARKS.md` compares).
        KVTIER_RETURN_IF_ERROR(engines_.cpu->Transfer(TransferRequest::PerLayer(
            host, expected, SlotIndices::Host(src_idx), SlotIndices::Host(dst_idx), c.load_layer)));
        load_expected_ready = true;
      }
      if (load) {
        HostBytes got = HostBytes::Allocate(layer_bytes * (c.mla ? 1 : 2));
        for (int b = 0; b < (c.mla ? 1 : 2); ++b) {
          const std::byte* layer = dev_base + b * dg.buffer_bytes() + c.load_layer * layer_bytes;
          KVTIER_CUDA_RETURN_IF_ERROR(cudaMemcpy(got.get() + b * layer_bytes, layer,
                                                 static_cast<size_t>(layer_bytes),
                                                 cudaMemcpyDeviceToHost));
        }
        diff = ParallelFirstDifference(got.get(), buf.expected.get(), got.bytes);
        if (diff >= 0) {
          where = fmt::format("{} layer {} slot {}", diff >= layer_bytes ? "V" : "K", c.load_layer,
                              diff % layer_bytes / dg.slot_bytes);
        }
      } else {
        diff = ParallelFirstDifference(host_base, buf.expected.get(), buf.bytes);
        if (diff >= 0) where = fmt::format("host pool byte {}", diff);
      }
      row.check_ok = diff < 0;
      if (diff >= 0) {
        row.note = fmt::format("MISMATCH vs cpu backend at {}", where) +
                   (row.note.empty() ? "" : "; " + row.note);
      }
    }
    PrintProgress(row, *index, total);
    rows_->push_back(std::move(row));
  }
  ++*index;
  return Status::OK();
}

// Loads of every layer (host pool -> device pool) on stream 1 while an all-layer backup (device
// pool -> second host pool) runs on stream 2; both checked against the cpu backend.
Status GpuBench::RunBoth(const BenchCase& c, ShapeBuffers& buf, TransferBackend backend,
                         TransferEngine& engine) {
  const KvGeometry hg = c.HostGeometry(), dg = c.DeviceGeometry();
  auto* host_base = static_cast<std::byte*>(buf.host_pool.data());
  auto* out_base = static_cast<std::byte*>(buf.host_pool2.data());
  auto* dev_base = static_cast<std::byte*>(buf.device_pool.k());
  const KvRegion host = RegionOver(host_base, hg, c.mla, MemoryKind::kHost);
  const KvRegion out = RegionOver(out_base, hg, c.mla, MemoryKind::kHost);
  const KvRegion device = RegionOver(dev_base, dg, c.mla, MemoryKind::kDevice);
  const BenchSlots load_slots = DrawSlots(c, options_.seed * 7 + 1);
  // The backup reads slots the loads do not write (the other half of the device pool).
  BenchSlots backup_slots = DrawSlots(c, options_.seed * 7 + 2);
  std::vector<char> loaded(static_cast<size_t>(dg.num_slots), 0);
  for (int64_t s : load_slots.device) loaded[static_cast<size_t>(s)] = 1;
  std::vector<int64_t> free_slots;
  for (int64_t p = 0; p < dg.num_slots; p += c.page_size) {
    if (!loaded[static_cast<size_t>(p)]) {
      for (int64_t o = 0; o < c.page_size; ++o) free_slots.push_back(p + o);
    }
  }
  free_slots.resize(std::min(free_slots.size(), backup_slots.device.size()));
  backup_slots.device = free_slots;
  backup_slots.host.resize(free_slots.size());

  // Device pool = mirror; the second host pool poisoned.
  KVTIER_CUDA_RETURN_IF_ERROR(cudaMemcpy(dev_base, buf.device_mirror.get(),
                                         static_cast<size_t>(buf.bytes), cudaMemcpyHostToDevice));
  KVTIER_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
  ParallelFill(out_base, buf.bytes, kPoisonByte);
  KVTIER_ASSIGN_OR_RETURN(CudaEventHandle start,
                          CudaEventHandle::Create(options_.transfer.device, true));
  KVTIER_ASSIGN_OR_RETURN(CudaEventHandle end1,
                          CudaEventHandle::Create(options_.transfer.device, true));
  KVTIER_ASSIGN_OR_RETURN(CudaEventHandle end2,
                          CudaEventHandle::Create(options_.transfer.device, true));
  const TransferRequest backup = TransferRequest::AllLayers(
      device, out, SlotIndices::Host(backup_slots.device), SlotIndices::Host(backup_slots.host));
  // --both-sms L,B: the kernel backend's SMs for the loads and for the backup
  // (TransferOptions::max_sms), for measurements. Default (0): the engine's own choice, i.e.
  // --max-sms-beside-backup for loads while the backup runs and --max-sms-to-host for it.
  const int load_sms = options_.both_load_sms, backup_sms = options_.both_backup_sms;
  int blocks_load = 0, blocks_backup = 0;
  std::vector<double> ms;
  for (int r = 0; r < options_.warmup + options_.repeats; ++r) {
    KVTIER_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
    KVTIER_RETURN_IF_ERROR(start.Record(stream_.get()));
    KVTIER_RETURN_IF_ERROR(start.WaitOn(stream2_.get()));
    KVTIER_RETURN_IF_ERROR(
        engine.Transfer(backup, {.stream = stream2_.get(), .max_sms = backup_sms}));
    if (const auto* stats = testing::LastTransferStats(engine)) {
      blocks_backup = stats->backend == TransferBackend::kKernel ? stats->blocks : 0;
    }
    for (int64_t l = 0; l < dg.num_layers; ++l) {
      KVTIER_RETURN_IF_ERROR(engine.Transfer(
          TransferRequest::PerLayer(host, device, SlotIndices::Host(load_slots.host),
                                    SlotIndices::Host(load_slots.device), l),
          {.stream = stream_.get(), .max_sms = load_sms}));
      if (const auto* stats = testing::LastTransferStats(engine)) {
        // the widest load: loads beside the running backup may get more SMs than later ones
        if (stats->backend == TransferBackend::kKernel) {
          blocks_load = std::max(blocks_load, stats->blocks);
        }
      }
    }
    KVTIER_RETURN_IF_ERROR(end1.Record(stream_.get()));
    KVTIER_RETURN_IF_ERROR(end2.Record(stream2_.get()));
    KVTIER_RETURN_IF_ERROR(engine.Synchronize(stream_.get()));
    KVTIER_RETURN_IF_ERROR(engine.Synchronize(stream2_.get()));
    KVTIER_ASSIGN_OR_RETURN(float t1, end1.ElapsedMsSince(start));
    KVTIER_ASSIGN_OR_RETURN(float t2, end2.ElapsedMsSince(start));
    if (r >= options_.warmup) ms.push_back(std::max(t1, t2));
  }
  const int64_t bytes_load = static_cast<int64_t>(load_slots.host.size()) * dg.num_layers *
                             dg.slot_bytes * (c.mla ? 1 : 2);
  const int64_t bytes_backup = static_cast<int64_t>(backup_slots.host.size()) * dg.num_layers *
                               dg.slot_bytes * (c.mla ? 1 : 2);
  BenchRow row = RowOf(c, backend);
  row.op = "both";
  row.bytes = bytes_load + bytes_backup;
  row.ms = Median(ms);
  row.gbps = static_cast<double>(row.bytes) / (row.ms * 1e-3) / 1e9;
  row.ceiling = "dma_h2d+d2h/2*1.6";
  row.ceiling_gbps = std::min(ceiling_h2d_, ceiling_d2h_);
  row.pct_of_ceiling = 100.0 * row.gbps / row.ceiling_gbps;
  row.sms_used = blocks_load + blocks_backup;
  row.note = fmt::format(
      "both directions: {} layer loads on one stream + one all-layer backup on another; "
      "% is of the one-way ceiling (target 160%); SMs: loads {}, backup {}",
      dg.num_layers, blocks_load, blocks_backup);
  // Check: the device pool = mirror with the loaded slots of every layer replaced; the second
  // host pool = poison with the backed-up slots.
  HostBytes got = HostBytes::Allocate(buf.bytes);
  KVTIER_CUDA_RETURN_IF_ERROR(
      cudaMemcpy(got.get(), dev_base, static_cast<size_t>(buf.bytes), cudaMemcpyDeviceToHost));
  const KvRegion mirror = RegionOver(buf.device_mirror.get(), dg, c.mla, MemoryKind::kHost);
  // Expected backup output first (from the untouched mirror).
  ParallelFill(buf.expected.get(), buf.bytes, kPoisonByte);
  const KvRegion expected_out = RegionOver(buf.expected.get(), hg, c.mla, MemoryKind::kHost);
  KVTIER_RETURN_IF_ERROR(engines_.cpu->Transfer(
      TransferRequest::AllLayers(mirror, expected_out, SlotIndices::Host(backup_slots.device),
                                 SlotIndices::Host(backup_slots.host))));
  int64_t diff = ParallelFirstDifference(out_base, buf.expected.get(), buf.bytes);
  std::string bad;
  if (diff >= 0) bad = fmt::format("backup output differs at byte {}", diff);
  // Expected device pool: the mirror after the loads (the mirror is restored afterwards).
  std::memcpy(buf.expected.get(), buf.device_mirror.get(), static_cast<size_t>(buf.bytes));
  const KvRegion expected_dev = RegionOver(buf.expected.get(), dg, c.mla, MemoryKind::kHost);
  KVTIER_RETURN_IF_ERROR(engines_.cpu->Transfer(
      TransferRequest::AllLayers(host, expected_dev, SlotIndices::Host(load_slots.host),
                                 SlotIndices::Host(load_slots.device))));
  diff = ParallelFirstDifference(got.get(), buf.expected.get(), buf.bytes);
  if (diff >= 0)
    bad += fmt::format("{}device pool differs at byte {}", bad.empty() ? "" : "; ", diff);
  row.check_ok = bad.empty();
  if (!bad.empty()) row.note = "MISMATCH vs cpu backend: " + bad + "; " + row.note;
  buf.device_dirty = true;
  PrintProgress(row, 0, 1);
  rows_->push_back(std::move(row));
  return Status::OK();
}

Status GpuBench::Run() {
  if (CudaDeviceCount() <= options_.transfer.device) {
    return Status::Unavailable(
        fmt::format("GPU backends are unavailable: no CUDA device {} ({} present)",
                    options_.transfer.device, CudaDeviceCount()));
  }
  const TransferEngineConfig& config = options_.transfer;
  for (TransferBackend b : options_.backends) {
    if (b == TransferBackend::kCpu) continue;
    KVTIER_ASSIGN_OR_RETURN(auto engine, MakeTransferEngine(b, config));
    engines_.gpu.emplace_back(b, std::move(engine));
  }
  if (engines_.gpu.empty()) return Status::OK();
  KVTIER_ASSIGN_OR_RETURN(engines_.cpu, MakeTransferEngine(TransferBackend::kCpu, config));
  KVTIER_ASSIGN_OR_RETURN(stream_, CudaStreamHandle::Create(options_.transfer.device, true));
  KVTIER_ASSIGN_OR_RETURN(stream2_, CudaStreamHandle::Create(options_.transfer.device, true));
  {
    cudaDeviceProp prop{};
    KVTIER_CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&prop, options_.transfer.device));
    int driver = 0, runtime = 0;
    KVTIER_CUDA_RETURN_IF_ERROR(cudaDriverGetVersion(&driver));
    KVTIER_CUDA_RETURN_IF_ERROR(cudaRuntimeGetVersion(&runtime));
    std::fprintf(stderr, "GPU %d: %s, %d SMs, PCIe %02x:%02x, CUDA driver %d, runtime %d\n",
                 options_.transfer.device, prop.name, prop.multiProcessorCount, prop.pciBusID,
                 prop.pciDeviceID, driver, runtime);
  }
  const size_t first_row = rows_->size();
  KVTIER_RETURN_IF_ERROR(MeasureCeiling());

  const std::vector<BenchCase> cases = EnumerateCases(options_);
  size_t index = 0;
  for (BenchShape shape : options_.shapes) {
    int64_t bytes = 0;
    for (const BenchCase& c : cases) {
      if (c.shape == shape) bytes = std::max(bytes, c.PoolBytes());
    }
    if (bytes == 0) continue;
    ShapeBuffers buf;
    buf.bytes = bytes;
    std::fprintf(stderr,
                 "%s: allocating pools of %.2f GiB (pinned host%s, device, 2 host mirrors)\n",
                 BenchShapeName(shape), static_cast<double>(bytes) / (1 << 30),
                 options_.host_pages == "thp"       ? " on transparent huge pages"
                 : options_.host_pages == "hugetlb" ? " on reserved 2 MiB huge pages"
                                                    : "");
    KVTIER_ASSIGN_OR_RETURN(buf.host_pool, PinnedPool::Allocate(bytes, options_.host_pages));
    const BenchCase* first = nullptr;
    for (const BenchCase& c : cases) {
      if (c.shape == shape && c.PoolBytes() == bytes) {
        first = &c;
        break;
      }
    }
    KVTIER_ASSIGN_OR_RETURN(
        buf.device_pool,
        DeviceKvPool::Create(first->DeviceGeometry(), first->mla, options_.transfer.device));
    buf.device_mirror = HostBytes::Allocate(bytes);
    buf.expected = HostBytes::Allocate(bytes);
    ParallelRandom(static_cast<std::byte*>(buf.host_pool.data()), bytes, options_.seed ^ 0x1234);
    ParallelRandom(buf.device_mirror.get(), bytes, options_.seed ^ 0x5678);
    buf.device_dirty = true;
    for (const BenchCase& c : cases) {
      if (c.shape != shape) continue;
      if (c.PoolBytes() != bytes) {
        return Status::Internal(fmt::format("{}: pool size differs within a shape", c.Label()));
      }
      KVTIER_RETURN_IF_ERROR(RunCase(c, buf, &index, cases.size()));
    }
    // Both directions at once, on the MHA shape: layer_first p16 and page_first_direct p64.
    auto both_case = [&](const BenchCase& c) {
      return c.shape == shape && c.op == BenchOp::kBackup &&
             ((c.host_layout == KvLayout::kLayerFirst && c.page_size == 16) ||
              (c.host_layout == KvLayout::kPageFirstDirect && c.page_size == 64));
    };
    if (shape == BenchShape::kMha && std::any_of(cases.begin(), cases.end(), both_case)) {
      KVTIER_ASSIGN_OR_RETURN(buf.host_pool2, PinnedPool::Allocate(bytes, options_.host_pages));
      ParallelRandom(static_cast<std::byte*>(buf.host_pool.data()), bytes, options_.seed ^ 0x9abc);
      for (const BenchCase& c : cases) {
        if (!both_case(c)) continue;
        for (auto& [backend, engine] : engines_.gpu) {
          KVTIER_RETURN_IF_ERROR(RunBoth(c, buf, backend, *engine));
        }
      }
    }
  }
  RaiseCeilingToRowMedian(first_row);
  return Status::OK();
}

void GpuBench::RaiseCeilingToRowMedian(size_t first_row) {
  std::vector<double> now[2];  // [0] host -> device (loads), [1] device -> host (backups)
  for (size_t i = first_row; i < rows_->size(); ++i) {
    const BenchRow& row = (*rows_)[i];
    if (row.dma_now_gbps <= 0) continue;
    if (row.op == "load") now[0].push_back(row.dma_now_gbps);
    if (row.op == "backup") now[1].push_back(row.dma_now_gbps);
  }
  double ceiling[2] = {ceiling_h2d_, ceiling_d2h_};
  bool raised = false;
  for (int dir = 0; dir < 2; ++dir) {
    if (now[dir].empty()) continue;
    const double median = Median(now[dir]);
    std::fprintf(stderr,
                 "ceiling %s: %.2f GB/s at the start, %.2f GB/s the median of the DMA rate "
                 "after %zu rows%s\n",
                 dir == 0 ? "H2D" : "D2H", ceiling[dir], median, now[dir].size(),
                 median > ceiling[dir] ? "; rows are compared with the median" : "");
    if (median > ceiling[dir]) {
      ceiling[dir] = median;
      raised = true;
    }
  }
  if (!raised) return;
  for (size_t i = first_row; i < rows_->size(); ++i) {
    BenchRow& row = (*rows_)[i];
    if (row.op == "load" || row.layout == "h2d") {
      row.ceiling_gbps = ceiling[0];
    } else if (row.op == "backup" || row.layout == "d2h") {
      row.ceiling_gbps = ceiling[1];
    } else {  // both directions, and the copy engines' own both-ways row
      row.ceiling_gbps = std::min(ceiling[0], ceiling[1]);
    }
    row.pct_of_ceiling = 100.0 * row.gbps / row.ceiling_gbps;
  }
}

}  // namespace

Status RunGpuBench(const BenchOptions& options, std::vector<BenchRow>* rows) {
  KVTIER_RETURN_IF_ERROR(options.Validate());
  GpuBench bench(options, rows);
  return bench.Run();
}

#endif  // KVTIER_WITH_CUDA

}  // namespace kvtier::tools
