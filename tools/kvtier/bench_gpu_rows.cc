// One row of `kvtier bench`'s GPU half (bench_gpu.h): timed with CUDA events behind a stream gate,
// checked byte for byte against the cpu backend; and the rows of both directions at once.
#include "bench_gpu.h"

#if defined(KVTIER_WITH_CUDA)

#include <cuda_runtime.h>
#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <string>
#include <vector>

#include "kvtier/cuda_check.h"
#include "kvtier/engine_stats.h"

namespace kvtier::tools::gpu_bench {
namespace {

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

// The slots of "both directions at once": the loads' drawn as a case's; the backup's as many,
// from the pages the loads do not write.
void DrawBothSlots(const BenchCase& c, uint64_t seed, BenchSlots* load, BenchSlots* backup) {
  const KvGeometry dg = c.DeviceGeometry();
  *load = DrawSlots(c, seed * 7 + 1);
  // The backup reads slots the loads do not write (the other half of the device pool).
  *backup = DrawSlots(c, seed * 7 + 2);
  std::vector<char> loaded(static_cast<size_t>(dg.num_slots), 0);
  for (int64_t s : load->device) loaded[static_cast<size_t>(s)] = 1;
  std::vector<int64_t> free_slots;
  for (int64_t p = 0; p < dg.num_slots; p += c.page_size) {
    if (!loaded[static_cast<size_t>(p)]) {
      for (int64_t o = 0; o < c.page_size; ++o) free_slots.push_back(p + o);
    }
  }
  free_slots.resize(std::min(free_slots.size(), backup->device.size()));
  backup->device = free_slots;
  backup->host.resize(free_slots.size());
}

// What the engine did with the row's last call (the SMs of a kernel, the copies of dma; what
// auto chose), into the row's note.
void NoteEngineChoice(TransferBackend backend, TransferEngine& engine, BenchRow* row) {
  if (const auto* stats = testing::LastTransferStats(engine)) {
    if (stats->backend == TransferBackend::kKernel) {
      row->sms_used = stats->blocks;
      if (backend == TransferBackend::kAuto) {
        row->note = "auto chose kernel" + (row->note.empty() ? "" : "; " + row->note);
      }
    } else {
      row->note = fmt::format(
          "{}dma: {} copy ops ({} 2D of which {} carry K and V, {} batch call(s), {} stream(s)){}",
          backend == TransferBackend::kAuto ? "auto chose " : "", stats->copy_ops, stats->copies_2d,
          stats->kv_merged, stats->batch_calls, stats->lanes,
          row->note.empty() ? "" : "; " + row->note);
    }
  }
}

}  // namespace

Status GpuBench::WarmFor(const BenchCase& c, TransferEngine& engine,
                         const TransferRequest& request) {
  if (options_.warmup_ms <= 0) return Status::OK();
  const TransferOptions topts{.stream = stream_.get()};
  const auto t0 = std::chrono::steady_clock::now();
  while (WallUs(t0) < 1000.0 * options_.warmup_ms) {
    KVTIER_RETURN_IF_ERROR(engine.Transfer(request, topts).WithContext(c.Label()));
    KVTIER_RETURN_IF_ERROR(engine.Synchronize(stream_.get()).WithContext(c.Label()));
  }
  return Status::OK();
}

Status GpuBench::TimeSubmitAlone(const BenchCase& c, TransferEngine& engine,
                                 const TransferRequest& request, BenchRow* row) {
  // Host submission of a call alone on an idle stream: no gate (a host function) queued just
  // before it and no burst, i.e. what an engine's thread pays per call.
  const TransferOptions topts{.stream = stream_.get()};
  std::vector<double> host_us;
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
  row->host_submit_us = Median(host_us);
  if (!launch_us.empty()) row->host_launch_us = Median(launch_us);
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
  KVTIER_RETURN_IF_ERROR(WarmFor(c, engine, request));
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
  KVTIER_RETURN_IF_ERROR(TimeSubmitAlone(c, engine, request, &row));
  KVTIER_ASSIGN_OR_RETURN(row.dma_now_gbps, DmaNow(load));
  NoteEngineChoice(backend, engine, &row);
  return row;
}

Status GpuBench::RunCase(const BenchCase& c, ShapeBuffers& buf, size_t* index, size_t total) {
  const bool load = c.op == BenchOp::kLoad;
  const KvGeometry hg = c.HostGeometry(), dg = c.DeviceGeometry();
  auto* host_base = static_cast<std::byte*>(buf.host_pool.data());
  auto* dev_base = static_cast<std::byte*>(buf.device_pool.k());
  const KvRegion host = RegionOver(host_base, hg, c.mla, MemoryKind::kHost);
  const KvRegion device = RegionOver(dev_base, dg, c.mla, MemoryKind::kDevice);
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
  std::vector<void*> table_k, table_v;
  KvRegion expected;
  KVTIER_RETURN_IF_ERROR(PrepareExpected(c, buf, src_idx, dst_idx, &table_k, &table_v, &expected));

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
      if (load && !load_expected_ready) {
        // The cpu backend's copy of the same slots, made after the GPU copies were timed: made
        // before, it leaves the source slots in the CPU's caches while the GPU reads them
        // (--reference-first keeps that order; `git show c489830:BENCHMARKS.md` compares).
        KVTIER_RETURN_IF_ERROR(engines_.cpu->Transfer(TransferRequest::PerLayer(
            host, expected, SlotIndices::Host(src_idx), SlotIndices::Host(dst_idx), c.load_layer)));
        load_expected_ready = true;
      }
      KVTIER_ASSIGN_OR_RETURN(const std::string where, FirstMismatch(c, buf));
      row.check_ok = where.empty();
      if (!where.empty()) {
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

Status GpuBench::PrepareExpected(const BenchCase& c, ShapeBuffers& buf,
                                 const std::vector<int64_t>& src_idx,
                                 const std::vector<int64_t>& dst_idx, std::vector<void*>* table_k,
                                 std::vector<void*>* table_v, KvRegion* expected) {
  const bool load = c.op == BenchOp::kLoad;
  const KvGeometry hg = c.HostGeometry(), dg = c.DeviceGeometry();
  auto* dev_base = static_cast<std::byte*>(buf.device_pool.k());
  const KvRegion mirror = RegionOver(buf.device_mirror.get(), dg, c.mla, MemoryKind::kHost);
  const int64_t layer_bytes = dg.layer_bytes();
  if (load) {
    // The loaded layer only: a per-layer table whose every entry is one poisoned layer per
    // buffer (the request touches only `load_layer`).
    auto* e = buf.expected.get();
    ParallelFill(e, layer_bytes * (c.mla ? 1 : 2), kPoisonByte);
    table_k->assign(static_cast<size_t>(dg.num_layers), e);
    if (!c.mla) table_v->assign(static_cast<size_t>(dg.num_layers), e + layer_bytes);
    expected->geometry = dg;
    expected->mla = c.mla;
    expected->k_layers = *table_k;
    expected->v_layers = *table_v;
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
    *expected = RegionOver(buf.expected.get(), hg, c.mla, MemoryKind::kHost);
    KVTIER_RETURN_IF_ERROR(engines_.cpu->Transfer(TransferRequest::AllLayers(
        mirror, *expected, SlotIndices::Host(src_idx), SlotIndices::Host(dst_idx))));
  }
  return Status::OK();
}

Result<std::string> GpuBench::FirstMismatch(const BenchCase& c, ShapeBuffers& buf) {
  const bool load = c.op == BenchOp::kLoad;
  const KvGeometry dg = c.DeviceGeometry();
  auto* host_base = static_cast<std::byte*>(buf.host_pool.data());
  auto* dev_base = static_cast<std::byte*>(buf.device_pool.k());
  const int64_t layer_bytes = dg.layer_bytes();
  std::string where;
  if (load) {
    HostBytes got = HostBytes::Allocate(layer_bytes * (c.mla ? 1 : 2));
    for (int b = 0; b < (c.mla ? 1 : 2); ++b) {
      const std::byte* layer = dev_base + b * dg.buffer_bytes() + c.load_layer * layer_bytes;
      KVTIER_CUDA_RETURN_IF_ERROR(cudaMemcpy(got.get() + b * layer_bytes, layer,
                                             static_cast<size_t>(layer_bytes),
                                             cudaMemcpyDeviceToHost));
    }
    const int64_t diff = ParallelFirstDifference(got.get(), buf.expected.get(), got.bytes);
    if (diff >= 0) {
      where = fmt::format("{} layer {} slot {}", diff >= layer_bytes ? "V" : "K", c.load_layer,
                          diff % layer_bytes / dg.slot_bytes);
    }
  } else {
    const int64_t diff = ParallelFirstDifference(host_base, buf.expected.get(), buf.bytes);
    if (diff >= 0) where = fmt::format("host pool byte {}", diff);
  }
  return where;
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
  BenchSlots load_slots, backup_slots;
  DrawBothSlots(c, options_.seed, &load_slots, &backup_slots);

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
  KVTIER_ASSIGN_OR_RETURN(const std::string bad, CheckBoth(c, buf, load_slots, backup_slots));
  row.check_ok = bad.empty();
  if (!bad.empty()) row.note = "MISMATCH vs cpu backend: " + bad + "; " + row.note;
  buf.device_dirty = true;
  PrintProgress(row, 0, 1);
  rows_->push_back(std::move(row));
  return Status::OK();
}

Result<std::string> GpuBench::CheckBoth(const BenchCase& c, ShapeBuffers& buf,
                                        const BenchSlots& load_slots,
                                        const BenchSlots& backup_slots) {
  const KvGeometry hg = c.HostGeometry(), dg = c.DeviceGeometry();
  auto* host_base = static_cast<std::byte*>(buf.host_pool.data());
  auto* out_base = static_cast<std::byte*>(buf.host_pool2.data());
  auto* dev_base = static_cast<std::byte*>(buf.device_pool.k());
  const KvRegion host = RegionOver(host_base, hg, c.mla, MemoryKind::kHost);
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
  return bad;
}

}  // namespace kvtier::tools::gpu_bench

#endif  // KVTIER_WITH_CUDA
