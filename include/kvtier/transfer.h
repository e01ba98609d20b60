// kvtier/transfer.h — the transfer API: copy the KV of a list of slots between two regions.
//
// One request shape covers every copy kvtier makes (docs/architecture.md §3): a source region, a
// destination region, equal-length lists of source and destination slot indices, and a layer
// range. Every layout pair, both directions, MHA (K and V) and MLA (one buffer) go through the
// same call. Backends:
//   cpu    multi-threaded gather/scatter with memcpy of contiguous runs; host memory only;
//          synchronous. The reference every other backend is tested against.
//   kernel CUDA kernels over pinned host memory (UVA) and device memory.
//   dma    copy engines only (cudaMemcpyBatchAsync / 2D / per-run cudaMemcpyAsync).
//   auto   picks kernel or dma per request by a fixed rule (auto_engine.cc), from measurements.
// The GPU backends exist only when kvtier is built with CUDA (`KVTIER_CUDA=ON`); asking for one
// otherwise gives `Unavailable`.
//
// Validation happens before any byte moves (`ValidateTransfer`): a bad request gets an
// InvalidArgument whose message names the argument and the offending value, and the destination
// is left untouched.
//
// Thread safety: a `TransferEngine` may be used from several threads at once; the regions and
// index lists of one request must not change while that request runs.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "kvtier/config_schema.h"
#include "kvtier/layout.h"
#include "kvtier/status.h"

// cudaStream_t is `CUstream_st*`; declaring the struct keeps CUDA headers out of this header.
struct CUstream_st;

namespace kvtier {

using CudaStream = CUstream_st*;  // nullptr = the legacy default stream

// A KV region: the K and V buffers (or the one MLA buffer) of a pool, with their shared geometry.
// The region does not own memory.
struct KvRegion {
  KvGeometry geometry;
  bool mla = false;                       // one buffer (`k`) when true; K and V otherwise
  MemoryKind memory = MemoryKind::kHost;  // where the bytes live
  int device = -1;                        // CUDA device ordinal when memory == kDevice

  // Base of each buffer ([L, N, S] etc., per `geometry.layout`). Null when per-layer tables are
  // given instead.
  void* k = nullptr;  // K, or the MLA buffer
  void* v = nullptr;  // V; null for MLA

  // layer_first only: per-layer base addresses (num_layers entries each, in host memory), for
  // engines whose layers are separate allocations. When set, `k`/`v` must be null.
  std::span<void* const> k_layers;
  std::span<void* const> v_layers;

  int num_buffers() const { return mla ? 1 : 2; }
  bool has_layer_table() const { return !k_layers.empty(); }

  // Base of buffer `b` (0 = K/MLA, 1 = V) for layer `layer`, such that the byte of (layer, slot,
  // head) is at `LayerBase(b, layer) + LayerOffset(layer, slot, head)`.
  std::byte* LayerBase(int b, int64_t layer) const {
    if (has_layer_table()) return static_cast<std::byte*>((b == 0 ? k_layers : v_layers)[layer]);
    return static_cast<std::byte*>(b == 0 ? k : v);
  }
  int64_t LayerOffset(int64_t layer, int64_t slot, int64_t head) const {
    return has_layer_table() ? geometry.OffsetInLayer(slot, head)
                             : geometry.HeadOffset(layer, slot, head);
  }

  // Checks the geometry and the pointers. `name` ("src", "dst") prefixes every message.
  Status Validate(std::string_view name = "region") const;
};

enum class IndexType : uint8_t { kInt32 = 0, kInt64 = 1 };

// A list of slot (token) indices, in host or device memory. Does not own the data.
struct SlotIndices {
  const void* data = nullptr;
  int64_t count = 0;
  IndexType type = IndexType::kInt64;
  MemoryKind memory = MemoryKind::kHost;

  static SlotIndices Host(std::span<const int64_t> s) {
    return {s.data(), static_cast<int64_t>(s.size()), IndexType::kInt64, MemoryKind::kHost};
  }
  static SlotIndices Host(std::span<const int32_t> s) {
    return {s.data(), static_cast<int64_t>(s.size()), IndexType::kInt32, MemoryKind::kHost};
  }
  static SlotIndices Device(const int64_t* d, int64_t n) {
    return {d, n, IndexType::kInt64, MemoryKind::kDevice};
  }
  static SlotIndices Device(const int32_t* d, int64_t n) {
    return {d, n, IndexType::kInt32, MemoryKind::kDevice};
  }

  // REQUIRES: memory == kHost, 0 <= i < count.
  int64_t at(int64_t i) const {
    return type == IndexType::kInt64 ? static_cast<const int64_t*>(data)[i]
                                     : static_cast<const int32_t*>(data)[i];
  }
};

// Copy layers [src_layer, src_layer + num_layers) of the slots `src_slots` of `src` to layers
// [dst_layer, dst_layer + num_layers) of the slots `dst_slots` of `dst`. Slot k of the lists goes
// to slot k. REQUIRES: the destination slots are distinct (else which copy lands is undefined).
struct TransferRequest {
  const KvRegion* src = nullptr;
  const KvRegion* dst = nullptr;
  SlotIndices src_slots;
  SlotIndices dst_slots;
  int64_t src_layer = 0;
  int64_t dst_layer = 0;
  int64_t num_layers = 1;

  // One layer, the same index on both sides (a per-layer load).
  static TransferRequest PerLayer(const KvRegion& src, const KvRegion& dst, SlotIndices src_slots,
                                  SlotIndices dst_slots, int64_t layer) {
    return {&src, &dst, src_slots, dst_slots, layer, layer, 1};
  }
  // Every layer of `src` (an all-layer backup).
  static TransferRequest AllLayers(const KvRegion& src, const KvRegion& dst, SlotIndices src_slots,
                                   SlotIndices dst_slots) {
    return {&src, &dst, src_slots, dst_slots, 0, 0, src.geometry.num_layers};
  }

  int64_t num_slots() const { return src_slots.count; }
  // Pieces each slot is copied in: a page_head side stores its heads apart, so a copy to or from
  // one moves head_num chunks of slot_bytes / head_num; any other pair moves whole slots (1).
  // REQUIRES: src and dst set (a validated request).
  int64_t head_chunks() const {
    if (src->geometry.layout == KvLayout::kPageHead) return src->geometry.head_num;
    if (dst->geometry.layout == KvLayout::kPageHead) return dst->geometry.head_num;
    return 1;
  }
  // Bytes the request moves: slots * layers * slot_bytes * buffers.
  int64_t bytes() const;
};

// Defined by the CUDA part (kvtier/device.h): one CUDA event per layer of a multi-layer copy.
class LayerEvents;

struct TransferOptions {
  CudaStream stream = nullptr;  // stream the GPU backends enqueue on; ignored by cpu
  // When set, a GPU backend records layer k's event (k = 0 .. num_layers-1, relative to the
  // request) on `stream` once that layer's bytes are in place. The cpu backend is synchronous and
  // records nothing.
  LayerEvents* layer_events = nullptr;
  // kernel backend (and auto when it picks the kernel): at most this many SMs for this call;
  // 0 = TransferEngineConfig::max_sms (max_sms_to_host for device -> host copies,
  // max_sms_beside_backup for host -> device copies while a backup runs). Ignored by cpu and dma.
  int max_sms = 0;
};

enum class TransferBackend : uint8_t { kCpu = 0, kKernel = 1, kDma = 2, kAuto = 3 };
inline constexpr int kNumTransferBackends = static_cast<int>(TransferBackend::kAuto) + 1;
const char* TransferBackendName(TransferBackend backend);
Result<TransferBackend> ParseTransferBackend(std::string_view name);

// dma: how a lane's single copies are split over cudaMemcpyBatchAsync calls (dma_engine.cc).
//   kGrowing        pieces of dma_first_batch_piece, then twice that, ... (BatchPieces,
//                   transfer/cuda/dma_plan.h): the copy engines start on the first piece while
//                   the host submits the rest, but each more call costs copy-engine time.
//   kWhole          one call per lane (SGLang's shape): the copies start only once the whole
//                   batch is submitted.
//   kWholeWhenBusy  kWhole when the stream still has work pending as the copies are submitted
//                   (cudaStreamQuery: the copies could not start early anyway), else kGrowing.
enum class DmaBatchSplit : uint8_t { kGrowing = 0, kWhole = 1, kWholeWhenBusy = 2 };
inline constexpr int kNumDmaBatchSplits = static_cast<int>(DmaBatchSplit::kWholeWhenBusy) + 1;
// "growing", "whole", "whole_when_busy".
const char* DmaBatchSplitName(DmaBatchSplit split);

struct TransferEngineConfig {
  // cpu: worker threads for large requests; 0 = hardware concurrency.
  int cpu_threads = 0;
  // cpu: requests smaller than this many bytes run on the calling thread.
  int64_t cpu_parallel_threshold_bytes = 4 << 20;
  // kernel: upper bound on the SMs one copy occupies (but a load beside a running backup gets
  // max_sms_beside_backup, below).
  int max_sms = 4;
  // kernel: upper bound for copies from device memory to host memory (backups), within max_sms;
  // 0 = max_sms. A GPU writing to host memory posts its writes, so fewer SMs keep the link busy
  // and leave more of it to the per-layer loads beside a backup (BENCHMARKS.md, GPU, has the
  // measurements behind the default). TransferOptions::max_sms overrides it for one call.
  int max_sms_to_host = 3;
  // kernel: SMs for copies from host memory to device memory (loads) while a device -> host copy
  // (a backup) this engine launched on another stream is still running; 0 = off (max_sms).
  // Beside a backup's writes, SM reads of host memory slow down, and more reading SMs win part of
  // it back (BENCHMARKS.md, GPU: both directions). Only this engine's own backups count.
  // TransferOptions::max_sms overrides it for one call.
  int max_sms_beside_backup = 8;
  // kernel/dma: CUDA device ordinal.
  int device = 0;

  // dma: submit copies with cudaMemcpyBatchAsync / cudaMemcpy3DBatchAsync where the runtime and
  // driver offer them (CUDA >= 12.8); false: one cudaMemcpyAsync / cudaMemcpy2DAsync per copy.
  bool dma_batch = true;
  // dma: K and V strided copies of one page in one depth-2 operation, where V lies a whole
  // number of rows after K on both sides (a pool allocated K then V).
  bool dma_join_kv = true;
  // dma: with base pointers on both sides of a layer_first <-> page_first_direct request of
  // several layers, a run's layers go as one strided copy per buffer (rows = layers); false: one
  // plain copy per (run, layer, buffer), the shape SGLang's transfer_kv_all_layer_direct_lf_pf
  // sends (docs/perf-notes/sglang-kernels.md compares the two).
  bool dma_stride_layers = true;
  // dma: the strided copies' cudaMemcpy3DBatchAsync asks the driver to prefer overlap with
  // compute (cudaMemcpyFlagPreferOverlapWithCompute); the single copies' batch never does (it
  // made their submission 1.5x slower, docs/perf-notes/dma-direct-path.md).
  bool dma_overlap_hint = true;
  // dma: the split of single copies over batch calls (DmaBatchSplit above; the H100 runs behind
  // it: docs/perf-notes/sglang-kernels.md), and the first piece's copies where it grows.
  DmaBatchSplit dma_batch_split = DmaBatchSplit::kGrowing;
  int dma_first_batch_piece = 16;
  // dma: a plan of more than dma_ops_per_lane operations is split over up to dma_lanes streams
  // (the request's stream and the engine's own, joined back by events), each submitted from its
  // own thread when dma_submit_threads.
  int dma_lanes = 4;
  int dma_ops_per_lane = 256;
  bool dma_submit_threads = true;
  // dma: fewest equal-width runs at a constant pitch that go as one strided copy instead of
  // single copies. Two random runs that happen to be a pitch apart make a
  // two-row strided copy, which the copy engines move slower than two single copies
  // (docs/perf-notes/dma-direct-path.md).
  int dma_min_strided_rows = 3;

  // Every field within its bounds (TransferEngineConfigSchema); InvalidArgument naming the field
  // (through `name_of`, when given) and its value.
  Status Validate(const FieldNamer& name_of = nullptr) const;
};

// Every field of TransferEngineConfig: name, bounds and help, declared once
// (kvtier/config_schema.h); the defaults are the member initializers above. Validate, the `kvtier
// bench` flags and the Python `kvtier.ops.configure` keywords are read from it.
const ConfigSchema<TransferEngineConfig>& TransferEngineConfigSchema();

// Checks a request against everything the backends rely on: region geometry and pointers,
// matching kinds (MHA/MLA) and slot_bytes, equal index counts, layer ranges, host indices in
// range, and no slot both read and written: within one region (same geometry and pointers) and
// overlapping layers, a host index in both lists is refused, as are two different regions over
// overlapping base buffers. Device indices are range-checked inside the kernels instead, and not
// checked for overlap.
Status ValidateTransfer(const TransferRequest& request);

class TransferEngine {
 public:
  virtual ~TransferEngine() = default;
  TransferEngine(const TransferEngine&) = delete;
  TransferEngine& operator=(const TransferEngine&) = delete;

  virtual TransferBackend backend() const = 0;

  // Validates `request`, then copies. GPU backends return once the copy is enqueued on
  // `options.stream`; cpu returns once the bytes are in place.
  Status Transfer(const TransferRequest& request, const TransferOptions& options = {});

  // Waits until every copy this engine enqueued on `stream` has finished, and returns the first
  // error found on the device since the last call (for example an out-of-range device index that
  // a kernel skipped). cpu: nothing is ever pending; returns OK.
  virtual Status Synchronize(CudaStream stream);

 protected:
  TransferEngine() = default;
  // REQUIRES: ValidateTransfer(request).ok().
  virtual Status DoTransfer(const TransferRequest& request, const TransferOptions& options) = 0;
  // For an engine that wraps `inner` and has validated `request` in its own Transfer: `inner`'s
  // copy without validating the request a second time. REQUIRES: as DoTransfer.
  static Status TransferValidated(TransferEngine& inner, const TransferRequest& request,
                                  const TransferOptions& options) {
    return inner.DoTransfer(request, options);
  }
};

// Creates an engine of the given backend. Unavailable when the backend needs CUDA and kvtier was
// built without it, or no GPU is present.
Result<std::unique_ptr<TransferEngine>> MakeTransferEngine(TransferBackend backend,
                                                           const TransferEngineConfig& config = {});

// True when kvtier was built with CUDA support.
bool BuiltWithCuda();

}  // namespace kvtier
