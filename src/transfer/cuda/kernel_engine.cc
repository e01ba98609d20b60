// The `kernel` transfer backend: one persistent copy kernel (copy_kernels.cuh) over device
// memory and pinned host memory (UVA), for every layout pair, both directions, MHA and MLA.
//
// Host side of a call (docs/performance.md, target 4, bounds its host time):
//   1. residency checks (cudaPointerGetAttributes on each region's first base);
//   2. host indices are copied into a staging slot (pinned host buffer -> device buffer on the
//      request's stream). A slot is reused only once the event recorded behind its last kernel
//      has completed (cudaEventQuery, no waiting), so a staging buffer is never overwritten while
//      a copy still reads it. When every slot is still in flight a new one is made, up to
//      kMaxStagingSlots; only beyond that does the call wait for the oldest. So a long copy on
//      one stream (an all-layer backup) never holds up calls for other streams (the per-layer
//      loads beside it): with a fixed round-robin of 4 slots the fifth call waited for the
//      backup, which serialised "both directions at once". Buffers grow (never shrink) to the
//      largest list seen, so steady-state calls allocate nothing. Device indices are used in
//      place;
//   3. per-layer tables (KvRegion::k_layers/v_layers) are uploaded once and cached by content
//      (kTableCacheEntries entries, LRU; an entry is evicted only after its last use completed);
//   4. the SMs: max_sms, max_sms_to_host for a backup (device -> host), or max_sms_beside_backup
//      for a load (host -> device) while a backup this engine launched on another stream is
//      still running (one cudaEventQuery per stream with a backup in flight);
//   5. one launch (or, with TransferOptions::layer_events, one launch per layer followed by that
//      layer's event record); behind a backup, an event that marks it running.
//
// Out-of-range device indices are skipped by the kernel and counted in a DeviceErrorRecord in
// device memory; `Synchronize(stream)` waits for the stream, reads the record through the
// engine's private non-blocking stream and returns InvalidArgument naming how many slot pairs
// were skipped since the previous Synchronize and one offending index. Transfer itself never
// reports them (it does not wait for the device).
//
// Thread safety: Transfer and Synchronize may be called from several threads. Transfer holds the
// engine's mutex while it stages and launches; Synchronize waits for its stream without it and
// then reads the error record under a second mutex.
#include <cuda_runtime.h>
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <mutex>
#include <vector>

#include "kvtier/cuda_check.h"
#include "kvtier/device.h"
#include "transfer/backends.h"
#include "transfer/cuda/copy_launch.h"
#include "transfer/cuda/device_guard.h"
#include "transfer/cuda/gpu_engine.h"
#include "transfer/plan_rules.h"

namespace kvtier::transfer::cuda {
namespace {

constexpr size_t kMaxStagingSlots = 64;
constexpr size_t kTableCacheEntries = 8;
// Streams whose backups are followed for max_sms_beside_backup; a backup on a further stream
// while all of these still run changes nothing (loads already get the extra SMs).
constexpr size_t kMaxBackupStreams = 8;
// Chunks per launch stay below 2^31 so the kernel's position arithmetic fits 32 bits.
constexpr int64_t kMaxChunksPerLaunch = (int64_t{1} << 31) - 1;

int64_t IndexBytes(const SlotIndices& idx) {
  return idx.count * (idx.type == IndexType::kInt64 ? 8 : 4);
}

// The chunk order that walks the host-side (non-layer_first) layout in address order. For
// page_first_direct with pages smaller than kSmallPageBytes per layer, all layers of a slot lie
// closer together than the slots of one layer's page run (at page 1 the layout is page_first),
// so those are walked slot-major (docs/perf-notes/gpu-constants.md).
constexpr int64_t kSmallPageBytes = 4096;

ChunkOrder OrderFor(const KvGeometry& src, const KvGeometry& dst) {
  const KvGeometry& lead = LeadGeometry(src, dst);  // plan_rules.h
  switch (lead.layout) {
    case KvLayout::kPageFirst:
      return ChunkOrder::kSlotLayerHead;
    case KvLayout::kPageHead:
      return ChunkOrder::kSlotHeadLayer;
    case KvLayout::kPageFirstDirect:
      return lead.page_size * lead.slot_bytes < kSmallPageBytes ? ChunkOrder::kSlotLayerHead
                                                                : ChunkOrder::kLayerSlotHead;
    default:
      return ChunkOrder::kLayerSlotHead;
  }
}

}  // namespace

class KernelTransferEngine final : public GpuTransferEngine {
 public:
  static Result<std::unique_ptr<KernelTransferEngine>> Create(const TransferEngineConfig& config) {
    KVTIER_RETURN_IF_ERROR(RequireDevice("kernel", config.device));
    std::unique_ptr<KernelTransferEngine> e(new KernelTransferEngine(config));
    KVTIER_RETURN_IF_ERROR(e->Init());
    return e;
  }

  TransferBackend backend() const override { return TransferBackend::kKernel; }

  Status Synchronize(CudaStream stream) override {
    DeviceGuard guard;
    KVTIER_RETURN_IF_ERROR(guard.Set(config_.device));
    // Wait without holding a lock, so other threads keep submitting meanwhile.
    KVTIER_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
    std::lock_guard<std::mutex> lock(error_mu_);
    auto* host = static_cast<DeviceErrorRecord*>(error_host_.data());
    auto* dev = static_cast<DeviceErrorRecord*>(error_device_.data());
    KVTIER_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(host, dev, sizeof(DeviceErrorRecord),
                                                cudaMemcpyDeviceToHost, private_stream_.get()));
    KVTIER_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(private_stream_.get()));
    if (host->count <= reported_errors_) return Status::OK();
    const unsigned long long fresh = host->count - reported_errors_;
    reported_errors_ = host->count;
    std::string example = "no example recorded";
    if (host->claimed != 0) {
      example = fmt::format("e.g. {}[{}] = {} is not in [0, {})",
                            host->side == 0 ? "src_slots" : "dst_slots", host->position,
                            host->value, host->limit);
      KVTIER_CUDA_RETURN_IF_ERROR(
          cudaMemsetAsync(&dev->claimed, 0, sizeof(int), private_stream_.get()));
      KVTIER_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(private_stream_.get()));
    }
    return Status::InvalidArgument(fmt::format(
        "kernel backend: {} slot pair(s) with out-of-range device indices were skipped since the "
        "last Synchronize ({})",
        fresh, example));
  }

 protected:
  Status DoTransfer(const TransferRequest& r, const TransferOptions& options) override;

 private:
  struct StagingSlot {
    PinnedHostBuffer host;
    DeviceBuffer device;
    CudaEventHandle done;
    bool in_use = false;  // `done` was recorded behind a copy that reads this slot
    CudaStream stream{};  // the stream of that copy (valid while in_use)
  };
  // The newest backup (device -> host copy) launched on one stream. Copies on a stream finish
  // in order, so once it has finished, every earlier backup on that stream has too.
  struct BackupMark {
    CudaStream stream{};
    CudaEventHandle done;
    bool running = false;  // `done` was recorded and had not completed when last queried
  };
  struct TableEntry {
    std::vector<void*> key;  // k_layers then v_layers
    DeviceBuffer table;
    CudaEventHandle last_use;
    bool used = false;
    uint64_t tick = 0;
  };

  explicit KernelTransferEngine(const TransferEngineConfig& config) : config_(config) {}

  Status Init() {
    DeviceGuard guard;
    KVTIER_RETURN_IF_ERROR(guard.Set(config_.device));
    KVTIER_CUDA_RETURN_IF_ERROR(
        cudaDeviceGetAttribute(&sm_count_, cudaDevAttrMultiProcessorCount, config_.device));
    // Not at the first launch, which may be beside a running backup (copy_launch.h).
    KVTIER_CUDA_RETURN_IF_ERROR(PreloadCopyKernels());
    KVTIER_ASSIGN_OR_RETURN(error_device_,
                            DeviceBuffer::Allocate(sizeof(DeviceErrorRecord), config_.device));
    KVTIER_ASSIGN_OR_RETURN(error_host_, PinnedHostBuffer::Allocate(sizeof(DeviceErrorRecord)));
    KVTIER_ASSIGN_OR_RETURN(private_stream_, CudaStreamHandle::Create(config_.device, true));
    KVTIER_CUDA_RETURN_IF_ERROR(
        cudaMemsetAsync(error_device_.data(), 0, sizeof(DeviceErrorRecord), private_stream_.get()));
    KVTIER_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(private_stream_.get()));
    // DoTransfer keeps pointers to the entries of one request (src and dst tables) while it adds
    // the second: the vector must never reallocate.
    tables_.reserve(kTableCacheEntries);
    return Status::OK();
  }

  // A staging slot no copy in flight reads: a free one, a new one, or (at kMaxStagingSlots)
  // the oldest once its copy finished. Moves it to the back of staging_ (newest).
  Result<StagingSlot*> FreeStagingSlot(CudaStream stream);
  // Copies the host index lists of `r` to the device; returns their device addresses.
  Status StageIndices(const TransferRequest& r, CudaStream stream, const void** src,
                      const void** dst, StagingSlot** used);
  // Whether a backup launched by this engine on a stream other than `stream` is still running.
  Result<bool> BackupRunningBeside(CudaStream stream);
  // Records that a backup was just launched on `stream`.
  Status MarkBackup(CudaStream stream);
  Result<std::byte* const*> DeviceLayerTable(const KvRegion& region, CudaStream stream,
                                             std::vector<TableEntry*>* used);
  Status FillRegionView(const KvRegion& region, int64_t heads, std::byte* const* table,
                        RegionView* view, bool* aligned16, bool* aligned8) const;

  const TransferEngineConfig config_;
  std::mutex mu_;
  int sm_count_ = 0;
  DeviceBuffer error_device_;
  PinnedHostBuffer error_host_;
  std::mutex error_mu_;                     // the error record's host copy and the count below
  unsigned long long reported_errors_ = 0;  // guarded by error_mu_
  CudaStreamHandle private_stream_;
  // At most kMaxStagingSlots, in the order they were last handed out (oldest first).
  std::vector<std::unique_ptr<StagingSlot>> staging_;
  std::vector<TableEntry> tables_;   // capacity kTableCacheEntries, reserved in Init
  std::vector<BackupMark> backups_;  // at most kMaxBackupStreams, one per stream
  uint64_t tick_ = 0;
};

Result<KernelTransferEngine::StagingSlot*> KernelTransferEngine::FreeStagingSlot(
    CudaStream stream) {
  // Oldest first. Copies on one stream finish in order, so once a slot of stream s is still
  // busy, every later slot of s is too and is not queried: a call costs about one
  // cudaEventQuery per stream with copies in flight, not one per copy in flight.
  std::array<CudaStream, 8> busy_streams{};
  size_t num_busy = 0;
  auto known_busy = [&](CudaStream s) {
    return std::find(busy_streams.begin(), busy_streams.begin() + num_busy, s) !=
           busy_streams.begin() + num_busy;
  };
  size_t pick = staging_.size();
  for (size_t i = 0; i < staging_.size() && pick == staging_.size(); ++i) {
    StagingSlot& slot = *staging_[i];
    if (slot.in_use && !known_busy(slot.stream)) {
      KVTIER_ASSIGN_OR_RETURN(const bool finished, slot.done.Query());
      if (finished) {
        slot.in_use = false;
      } else if (num_busy < busy_streams.size()) {
        busy_streams[num_busy++] = slot.stream;
      }
    }
    if (!slot.in_use) pick = i;
  }
  if (pick == staging_.size()) {
    if (staging_.size() < kMaxStagingSlots) {
      auto slot = std::make_unique<StagingSlot>();
      KVTIER_ASSIGN_OR_RETURN(slot->done, CudaEventHandle::Create(config_.device, false));
      staging_.push_back(std::move(slot));
    } else {
      pick = 0;
      KVTIER_RETURN_IF_ERROR(staging_[0]->done.Synchronize());
      staging_[0]->in_use = false;
    }
  }
  if (pick != staging_.size()) {
    std::rotate(staging_.begin() + static_cast<ptrdiff_t>(pick),
                staging_.begin() + static_cast<ptrdiff_t>(pick) + 1, staging_.end());
  }
  StagingSlot* slot = staging_.back().get();
  slot->stream = stream;
  return slot;
}

Result<bool> KernelTransferEngine::BackupRunningBeside(CudaStream stream) {
  for (BackupMark& b : backups_) {
    if (!b.running || b.stream == stream) continue;
    KVTIER_ASSIGN_OR_RETURN(const bool finished, b.done.Query());
    if (!finished) return true;
    b.running = false;
  }
  return false;
}

Status KernelTransferEngine::MarkBackup(CudaStream stream) {
  BackupMark* mark = nullptr;
  for (BackupMark& b : backups_) {
    if (b.stream == stream) mark = &b;
  }
  for (size_t i = 0; mark == nullptr && i < backups_.size(); ++i) {
    if (!backups_[i].running) mark = &backups_[i];
  }
  if (mark == nullptr) {
    if (backups_.size() == kMaxBackupStreams) return Status::OK();
    KVTIER_ASSIGN_OR_RETURN(CudaEventHandle done, CudaEventHandle::Create(config_.device, false));
    backups_.push_back(BackupMark{.stream = stream, .done = std::move(done)});
    mark = &backups_.back();
  }
  mark->stream = stream;
  KVTIER_RETURN_IF_ERROR(mark->done.Record(stream));
  mark->running = true;
  return Status::OK();
}

Status KernelTransferEngine::StageIndices(const TransferRequest& r, CudaStream stream,
                                          const void** src, const void** dst, StagingSlot** used) {
  const bool src_host = r.src_slots.memory == MemoryKind::kHost;
  const bool dst_host = r.dst_slots.memory == MemoryKind::kHost;
  *src = r.src_slots.data;
  *dst = r.dst_slots.data;
  *used = nullptr;
  if ((!src_host && !dst_host) || r.src_slots.count == 0) return Status::OK();
  const int64_t src_bytes = src_host ? (IndexBytes(r.src_slots) + 15) / 16 * 16 : 0;
  const int64_t dst_bytes = dst_host ? IndexBytes(r.dst_slots) : 0;
  const int64_t bytes = src_bytes + dst_bytes;
  KVTIER_ASSIGN_OR_RETURN(StagingSlot * free_slot, FreeStagingSlot(stream));
  StagingSlot& slot = *free_slot;
  if (slot.host.bytes() < bytes) {
    const int64_t grown = std::max<int64_t>(bytes, 2 * slot.host.bytes());
    KVTIER_ASSIGN_OR_RETURN(slot.host, PinnedHostBuffer::Allocate(grown));
    KVTIER_ASSIGN_OR_RETURN(slot.device, DeviceBuffer::Allocate(grown, config_.device));
  }
  auto* host = static_cast<std::byte*>(slot.host.data());
  auto* device = static_cast<std::byte*>(slot.device.data());
  if (src_host) {
    std::memcpy(host, r.src_slots.data, static_cast<size_t>(IndexBytes(r.src_slots)));
    *src = device;
  }
  if (dst_host) {
    std::memcpy(host + src_bytes, r.dst_slots.data, static_cast<size_t>(dst_bytes));
    *dst = device + src_bytes;
  }
  KVTIER_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(device, host, static_cast<size_t>(bytes), cudaMemcpyHostToDevice, stream));
  // Protects the slot until the upload is done even if the launch below fails; DoTransfer
  // records `done` again behind the kernels that read it.
  KVTIER_RETURN_IF_ERROR(slot.done.Record(stream));
  slot.in_use = true;
  *used = &slot;
  return Status::OK();
}

Result<std::byte* const*> KernelTransferEngine::DeviceLayerTable(const KvRegion& region,
                                                                 CudaStream stream,
                                                                 std::vector<TableEntry*>* used) {
  const size_t n = region.k_layers.size() + region.v_layers.size();
  auto matches = [&](const TableEntry& e) {
    return e.key.size() == n &&
           std::equal(region.k_layers.begin(), region.k_layers.end(), e.key.begin()) &&
           std::equal(region.v_layers.begin(), region.v_layers.end(),
                      e.key.begin() + static_cast<ptrdiff_t>(region.k_layers.size()));
  };
  for (TableEntry& e : tables_) {
    if (matches(e)) {
      e.tick = ++tick_;
      used->push_back(&e);
      return static_cast<std::byte* const*>(e.table.data());
    }
  }
  TableEntry* entry = nullptr;
  if (tables_.size() < kTableCacheEntries) {
    tables_.emplace_back();
    entry = &tables_.back();
    KVTIER_ASSIGN_OR_RETURN(entry->last_use, CudaEventHandle::Create(config_.device, false));
  } else {
    entry = &*std::min_element(
        tables_.begin(), tables_.end(),
        [](const TableEntry& a, const TableEntry& b) { return a.tick < b.tick; });
    if (entry->used) KVTIER_RETURN_IF_ERROR(entry->last_use.Synchronize());
    entry->used = false;
  }
  entry->key.assign(region.k_layers.begin(), region.k_layers.end());
  entry->key.insert(entry->key.end(), region.v_layers.begin(), region.v_layers.end());
  const int64_t bytes = static_cast<int64_t>(n * sizeof(void*));
  if (entry->table.bytes() < bytes) {
    KVTIER_ASSIGN_OR_RETURN(entry->table, DeviceBuffer::Allocate(bytes, config_.device));
  }
  // From pageable memory: the runtime stages the bytes before returning, in stream order.
  KVTIER_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(entry->table.data(), entry->key.data(),
                                              static_cast<size_t>(bytes), cudaMemcpyHostToDevice,
                                              stream));
  entry->tick = ++tick_;
  used->push_back(entry);
  return static_cast<std::byte* const*>(entry->table.data());
}

Status KernelTransferEngine::FillRegionView(const KvRegion& region, int64_t heads,
                                            std::byte* const* table, RegionView* view,
                                            bool* aligned16, bool* aligned8) const {
  view->geometry = region.geometry;
  view->geometry.head_num = heads;
  view->head_stride = table != nullptr
                          ? view->geometry.OffsetInLayer(0, 1) - view->geometry.OffsetInLayer(0, 0)
                          : view->geometry.HeadOffset(0, 0, 1) - view->geometry.HeadOffset(0, 0, 0);
  view->layer_stride =
      table != nullptr ? 0
                       : view->geometry.HeadOffset(1, 0, 0) - view->geometry.HeadOffset(0, 0, 0);
  auto check = [&](const void* p) {
    const auto a = reinterpret_cast<uintptr_t>(p);
    if (a % 16 != 0) *aligned16 = false;
    if (a % 8 != 0) *aligned8 = false;
  };
  if (table != nullptr) {
    view->base[0] = view->base[1] = nullptr;
    view->layer_table = table;
    for (void* p : region.k_layers) check(p);
    for (void* p : region.v_layers) check(p);
  } else {
    view->base[0] = static_cast<std::byte*>(region.k);
    view->base[1] = static_cast<std::byte*>(region.v);
    view->layer_table = nullptr;
    check(region.k);
    if (region.v != nullptr) check(region.v);
  }
  return Status::OK();
}

Status KernelTransferEngine::DoTransfer(const TransferRequest& r, const TransferOptions& options) {
  std::lock_guard<std::mutex> lock(mu_);
  stats_ = GpuTransferStats{};
  stats_.backend = TransferBackend::kKernel;
  DeviceGuard guard;
  KVTIER_RETURN_IF_ERROR(guard.Set(config_.device));
  KVTIER_RETURN_IF_ERROR(CheckResidency(*r.src, "src", /*need_pinned_host=*/true));
  KVTIER_RETURN_IF_ERROR(CheckResidency(*r.dst, "dst", /*need_pinned_host=*/true));
  if (options.layer_events != nullptr && options.layer_events->size() < r.num_layers) {
    return Status::InvalidArgument(
        fmt::format("layer_events has {} events but the request copies {} layers",
                    options.layer_events->size(), r.num_layers));
  }
  const CudaStream stream = options.stream;
  const void* src_slots = nullptr;
  const void* dst_slots = nullptr;
  StagingSlot* staging = nullptr;
  KVTIER_RETURN_IF_ERROR(StageIndices(r, stream, &src_slots, &dst_slots, &staging));

  std::vector<TableEntry*> tables_used;
  std::byte* const* src_table = nullptr;
  std::byte* const* dst_table = nullptr;
  if (r.num_slots() > 0 && r.src->has_layer_table()) {
    KVTIER_ASSIGN_OR_RETURN(src_table, DeviceLayerTable(*r.src, stream, &tables_used));
  }
  if (r.num_slots() > 0 && r.dst->has_layer_table()) {
    KVTIER_ASSIGN_OR_RETURN(dst_table, DeviceLayerTable(*r.dst, stream, &tables_used));
  }

  const KvGeometry& sg = r.src->geometry;
  const KvGeometry& dg = r.dst->geometry;
  const int64_t heads = r.head_chunks();
  const int64_t chunk_bytes = sg.slot_bytes / heads;
  CopyView view{};
  bool aligned16 = true, aligned8 = true;
  KVTIER_RETURN_IF_ERROR(
      FillRegionView(*r.src, heads, src_table, &view.src, &aligned16, &aligned8));
  KVTIER_RETURN_IF_ERROR(
      FillRegionView(*r.dst, heads, dst_table, &view.dst, &aligned16, &aligned8));
  const int width = (aligned16 && chunk_bytes % 16 == 0) ? 16
                    : (aligned8 && chunk_bytes % 8 == 0) ? 8
                                                         : 4;
  view.src.slots_int64 = r.src_slots.type == IndexType::kInt64 ? 1 : 0;
  view.dst.slots_int64 = r.dst_slots.type == IndexType::kInt64 ? 1 : 0;
  view.num_buffers = static_cast<uint32_t>(r.src->num_buffers());
  view.heads = static_cast<uint32_t>(heads);
  view.vecs_per_chunk = static_cast<uint32_t>(chunk_bytes / width);
  view.order = OrderFor(sg, dg);
  view.error = static_cast<DeviceErrorRecord*>(error_device_.data());
  view.div_heads = FastDivmod::Make(view.heads);
  view.div_vecs = FastDivmod::Make(view.vecs_per_chunk);
  view.step32_chunks = 32u / view.vecs_per_chunk;
  view.step32_vecs = 32u % view.vecs_per_chunk;
  {
    // A warp's tile is 32 x loads-in-flight vectors. When it spans several chunks (MLA's
    // 1,152-byte slots, page_head's 256-byte heads), resolving each chunk once per tile and
    // sharing the addresses by shuffle replaces one warp-wide resolve per load step, and at
    // least halves the instructions a load issues (docs/perf-notes/gpu-constants.md).
    const int64_t tile = int64_t{32} * CopyLoadsInFlight();
    const int64_t vpc = view.vecs_per_chunk;
    const int64_t max_chunks_per_tile = 1 + (vpc - 1 + tile - 1) / vpc;
    view.cooperative = vpc < tile && max_chunks_per_tile <= 32 ? 1 : 0;
  }

  const int64_t layers_per_launch = options.layer_events != nullptr ? 1 : r.num_layers;
  const int64_t chunks_per_pair = view.num_buffers * layers_per_launch * heads;
  const int64_t max_pairs = std::max<int64_t>(1, kMaxChunksPerLaunch / chunks_per_pair);
  const int threads = CopyThreadsPerBlock();
  const int64_t vecs_per_block_pass = int64_t{threads} * CopyLoadsInFlight();
  const bool to_host = r.src->memory == MemoryKind::kDevice && r.dst->memory == MemoryKind::kHost;
  const bool to_device = r.src->memory == MemoryKind::kHost && r.dst->memory == MemoryKind::kDevice;
  int sms = options.max_sms > 0 ? options.max_sms : config_.max_sms;
  if (options.max_sms == 0 && to_host && config_.max_sms_to_host > 0) {
    sms = std::min(sms, config_.max_sms_to_host);
  }
  if (options.max_sms == 0 && to_device && config_.max_sms_beside_backup > 0) {
    KVTIER_ASSIGN_OR_RETURN(const bool beside_backup, BackupRunningBeside(stream));
    if (beside_backup) sms = config_.max_sms_beside_backup;
  }
  const int max_blocks = std::max(1, std::min(sms, sm_count_));
  const int src_index_bytes = view.src.slots_int64 ? 8 : 4;
  const int dst_index_bytes = view.dst.slots_int64 ? 8 : 4;

  for (int64_t l0 = 0; l0 < r.num_layers; l0 += layers_per_launch) {
    view.num_layers = static_cast<uint32_t>(layers_per_launch);
    view.div_layers = FastDivmod::Make(view.num_layers);
    view.src.first_layer = r.src_layer + l0;
    view.dst.first_layer = r.dst_layer + l0;
    view.src.slot_addressing =
        SlotAddressing::Make(view.src.geometry, src_table != nullptr, view.src.first_layer);
    view.dst.slot_addressing =
        SlotAddressing::Make(view.dst.geometry, dst_table != nullptr, view.dst.first_layer);
    view.report_errors = l0 == 0 ? 1 : 0;
    for (int64_t k0 = 0; k0 < r.num_slots(); k0 += max_pairs) {
      const int64_t pairs = std::min(max_pairs, r.num_slots() - k0);
      view.count = static_cast<uint32_t>(pairs);
      view.div_count = FastDivmod::Make(view.count);
      view.num_chunks = static_cast<uint32_t>(pairs * chunks_per_pair);
      view.position_base = k0;
      view.src.slots = static_cast<const std::byte*>(src_slots) + k0 * src_index_bytes;
      view.dst.slots = static_cast<const std::byte*>(dst_slots) + k0 * dst_index_bytes;
      const int64_t total_vecs = int64_t{view.num_chunks} * view.vecs_per_chunk;
      const int blocks = static_cast<int>(std::min<int64_t>(
          max_blocks, (total_vecs + vecs_per_block_pass - 1) / vecs_per_block_pass));
      const uint64_t grid_stride = uint64_t(blocks) * uint64_t(vecs_per_block_pass);
      view.grid_chunks = static_cast<uint32_t>(grid_stride / view.vecs_per_chunk);
      view.grid_vecs = static_cast<uint32_t>(grid_stride % view.vecs_per_chunk);
      const auto launch_start = std::chrono::steady_clock::now();
      const cudaError_t launched = LaunchCopyKernel(view, width, blocks, stream);
      stats_.launch_us +=
          std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - launch_start)
              .count();
      KVTIER_CUDA_RETURN_IF_ERROR(launched);
      stats_.blocks = std::max(stats_.blocks, blocks);
      ++stats_.launches;
    }
    if (options.layer_events != nullptr) {
      KVTIER_RETURN_IF_ERROR(options.layer_events->Record(static_cast<int>(l0), stream));
    }
  }
  if (to_host && config_.max_sms_beside_backup > 0 && stats_.launches > 0) {
    KVTIER_RETURN_IF_ERROR(MarkBackup(stream));
  }
  if (staging != nullptr) {
    KVTIER_RETURN_IF_ERROR(staging->done.Record(stream));
    staging->in_use = true;
  }
  for (TableEntry* e : tables_used) {
    KVTIER_RETURN_IF_ERROR(e->last_use.Record(stream));
    e->used = true;
  }
  return Status::OK();
}

Result<std::unique_ptr<GpuTransferEngine>> CreateKernelEngine(const TransferEngineConfig& config) {
  KVTIER_ASSIGN_OR_RETURN(auto engine, KernelTransferEngine::Create(config));
  return std::unique_ptr<GpuTransferEngine>(std::move(engine));
}

}  // namespace kvtier::transfer::cuda

namespace kvtier::transfer {

Result<std::unique_ptr<TransferEngine>> MakeKernelTransferEngine(
    const TransferEngineConfig& config) {
  KVTIER_ASSIGN_OR_RETURN(auto engine, cuda::CreateKernelEngine(config));
  return std::unique_ptr<TransferEngine>(std::move(engine));
}

}  // namespace kvtier::transfer
