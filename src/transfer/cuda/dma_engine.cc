// The `dma` transfer backend: the copy engines only, no SM.
//
// A request is planned on the host into the fewest copy operations the layouts allow:
//   1. slot runs: consecutive pairs whose source and destination indices both advance by one,
//      cut where a page-based side (page_first_direct, page_head) starts a new page;
//   2. pieces, walked in the order of the host-side layout (as the cpu backend does); a run of
//      slots that is contiguous within a layer on both sides is one piece;
//   3. pieces contiguous on both sides merge into runs; at least
//      TransferEngineConfig::dma_min_strided_rows consecutive runs of equal width whose source
//      and destination addresses both advance by a constant pitch, within one allocation on each
//      side (a buffer, or one layer of a per-layer table: a copy may not span allocations),
//      become one strided copy (e.g. a page across all layers for layer_first <->
//      page_first_direct). With base pointers on both sides and several layers, each (run,
//      buffer) is planned directly as one strided copy across the layers, and with
//      dma_join_kv the V copy of a run joins the K copy as its second block (one depth-2
//      operation) when V lies a whole number of rows after K on both sides (dma_plan.h holds
//      the rules);
//   4. with dma_batch and a runtime and driver that offer it (CUDA >= 12.8, detected at run
//      time; the 12.8 and 13.x signatures are both handled at compile time), the strided copies
//      go out in one cudaMemcpy3DBatchAsync and the single runs in cudaMemcpyBatchAsync calls
//      of 16, 32, ... copies (BatchPieces, dma_plan.h: the copy engines start on a batch only
//      when its call returns, so the first copies move while the rest is submitted), or in one
//      call per lane (TransferEngineConfig::dma_batch_split: always, or when the stream already
//      has work pending, so that the copies could not start early anyway);
//      otherwise one cudaMemcpy2DAsync / cudaMemcpyAsync each.
// All plan buffers are engine members reused across calls: no per-call allocation once they
// have grown to the largest request.
//
// Lanes: a plan of more than dma_ops_per_lane operations is split into up to dma_lanes slices,
// the first on the request's stream and the others on the engine's private lane streams, forked
// from and joined back to the request's stream by events (so to the caller it is one copy in
// stream order). One stream's queue in the driver holds a bounded number of copies, beyond
// which the submitting thread waits for the copy engines; separate streams have separate
// queues. With dma_submit_threads the lanes are submitted in parallel, one thread each
// (util::ThreadPool), since the driver's cost per operation is host time. BENCHMARKS.md (GPU) and
// docs/perf-notes/dma-direct-path.md have the measurements behind the defaults.
//
// Streams: cudaMemcpyBatchAsync refuses the legacy default stream, so for `stream == nullptr`
// the operations run on the engine's private non-blocking stream, fenced by events to the legacy
// stream on entry and exit: to the caller, the copy is ordered on the legacy stream as usual.
//
// Indices: host indices are read in place. Device indices are first copied to the host, which
// synchronises `stream` (the host blocks until earlier work on it finished), and then checked:
// an out-of-range device index makes Transfer itself return InvalidArgument, before any copy.
// Synchronize(stream) only waits; the dma backend has no deferred errors.
//
// Thread safety: Transfer and Synchronize may be called from several threads; Transfer holds the
// engine's mutex while it plans and submits.
#include <cuda_runtime.h>
#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <memory>
#include <mutex>
#include <vector>

#include "kvtier/cuda_check.h"
#include "kvtier/device.h"
#include "transfer/backends.h"
#include "transfer/cuda/device_guard.h"
#include "transfer/cuda/dma_plan.h"
#include "transfer/cuda/gpu_engine.h"
#include "transfer/plan_rules.h"
#include "util/log.h"
#include "util/thread_pool.h"

namespace kvtier::transfer::cuda {
namespace {

// Addresses of one request: the two regions with head_num set to the request's head chunks on
// both sides (so a head index means the same chunk on each side), addressed through
// KvRegion::LayerBase + LayerOffset.
struct Sides {
  KvRegion src;
  KvRegion dst;
  const KvGeometry& sg() const { return src.geometry; }
  const KvGeometry& dg() const { return dst.geometry; }
  const std::byte* Src(int b, int64_t layer, int64_t slot, int64_t h) const {
    return src.LayerBase(b, layer) + src.LayerOffset(layer, slot, h);
  }
  std::byte* Dst(int b, int64_t layer, int64_t slot, int64_t h) const {
    return dst.LayerBase(b, layer) + dst.LayerOffset(layer, slot, h);
  }
  // One key for the pair of allocations (source, destination) that (b, layers) lie in: a buffer
  // is one allocation, a per-layer table has one per layer.
  int64_t Alloc(int b, int64_t src_layer, int64_t dst_layer) const {
    const int64_t s = src.has_layer_table() ? b * sg().num_layers + src_layer : b;
    const int64_t d = dst.has_layer_table() ? b * dg().num_layers + dst_layer : b;
    return s * (2 * dg().num_layers + 2) + d;
  }
};

// A run of slots (within one page for page-based layouts) is contiguous within one layer.
bool RunContiguous(KvLayout l) {
  return l == KvLayout::kLayerFirst || l == KvLayout::kPageFirstDirect;
}

bool IsLegacyStream(CudaStream s) { return s == nullptr || s == cudaStreamLegacy; }

// Whether `stream` still has work pending (cudaStreamQuery answers cudaErrorNotReady); an error
// of earlier asynchronous work that the query reports is returned.
Result<bool> StreamBusy(CudaStream stream) {
  const cudaError_t e = cudaStreamQuery(stream);
  if (e == cudaSuccess) return false;
  if (e == cudaErrorNotReady) {
    (void)cudaGetLastError();  // not an error: keep it out of later checks
    return true;
  }
  KVTIER_CUDA_RETURN_IF_ERROR(e);
  return false;
}

}  // namespace

class DmaTransferEngine final : public GpuTransferEngine {
 public:
  static Result<std::unique_ptr<DmaTransferEngine>> Create(const TransferEngineConfig& config) {
    KVTIER_RETURN_IF_ERROR(RequireDevice("dma", config.device));
    std::unique_ptr<DmaTransferEngine> e(new DmaTransferEngine(config));
    KVTIER_RETURN_IF_ERROR(e->Init());
    return e;
  }

  TransferBackend backend() const override { return TransferBackend::kDma; }

  Status Synchronize(CudaStream stream) override {
    DeviceGuard guard;
    KVTIER_RETURN_IF_ERROR(guard.Set(config_.device));
    KVTIER_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
    return Status::OK();
  }

 protected:
  Status DoTransfer(const TransferRequest& r, const TransferOptions& options) override;

 private:
  explicit DmaTransferEngine(const TransferEngineConfig& config) : config_(config) {}

  Status Init() {
    DeviceGuard guard;
    KVTIER_RETURN_IF_ERROR(guard.Set(config_.device));
    int pitch = 0;
    KVTIER_CUDA_RETURN_IF_ERROR(
        cudaDeviceGetAttribute(&pitch, cudaDevAttrMaxPitch, config_.device));
    max_pitch_ = static_cast<size_t>(pitch);
    int runtime = 0, driver = 0;
    KVTIER_CUDA_RETURN_IF_ERROR(cudaRuntimeGetVersion(&runtime));
    KVTIER_CUDA_RETURN_IF_ERROR(cudaDriverGetVersion(&driver));
    batch_available_ = config_.dma_batch && runtime >= 12080 && driver >= 12080;
    merge_kv_ = config_.dma_join_kv;
    KVTIER_ASSIGN_OR_RETURN(private_stream_, CudaStreamHandle::Create(config_.device, true));
    KVTIER_ASSIGN_OR_RETURN(fence_in_, CudaEventHandle::Create(config_.device, false));
    KVTIER_ASSIGN_OR_RETURN(fence_out_, CudaEventHandle::Create(config_.device, false));
    max_lanes_ = config_.dma_lanes;
    ops_per_lane_ = static_cast<size_t>(config_.dma_ops_per_lane);
    first_batch_piece_ = static_cast<size_t>(config_.dma_first_batch_piece);
    KVTIER_ASSIGN_OR_RETURN(fork_, CudaEventHandle::Create(config_.device, false));
    lane_work_.resize(static_cast<size_t>(max_lanes_));
    // Each lane submits from its own thread (the caller's for the first lane).
    if (max_lanes_ > 1 && config_.dma_submit_threads) {
      submit_pool_ = std::make_unique<util::ThreadPool>(max_lanes_);
    }
    for (int i = 1; i < max_lanes_; ++i) {
      Lane lane;
      KVTIER_ASSIGN_OR_RETURN(lane.stream, CudaStreamHandle::Create(config_.device, true));
      KVTIER_ASSIGN_OR_RETURN(lane.join, CudaEventHandle::Create(config_.device, false));
      lanes_.push_back(std::move(lane));
    }
    return Status::OK();
  }

  struct Lane {
    CudaStreamHandle stream;
    CudaEventHandle join;  // recorded behind the lane's slice; the request's stream waits on it
  };
  // Per lane: the strided copies of its batch call, its counters and its status.
  struct LaneWork {
    std::vector<cudaMemcpy3DBatchOp> ops_3d;
    GpuTransferStats stats;
    Status status;
  };

  // Host copies of the index lists (device lists are downloaded; host lists used in place).
  Status HostIndices(const SlotIndices& idx, const char* name, int64_t num_slots, CudaStream stream,
                     PinnedHostBuffer* staging, SlotIndices* out);
  void Plan(const TransferRequest& r, const SlotIndices& si, const SlotIndices& di, int64_t layer0,
            int64_t layers);
  // Submits the whole plan on `stream`, split over lanes when it is long.
  Status Submit(CudaStream stream);
  // Strided copies [c0, c1) and single runs [r0, r1) of the plan on `stream`, the single runs in
  // one batch call when `whole_batch` (else growing pieces); counts into work->stats and uses
  // work->ops_3d (one LaneWork per lane, so lanes may run in parallel).
  Status SubmitSlice(CudaStream stream, size_t c0, size_t c1, size_t r0, size_t r1,
                     bool whole_batch, LaneWork* work);

  const TransferEngineConfig config_;
  std::mutex mu_;
  size_t max_pitch_ = 0;
  // Cleared when the runtime refuses a batch call (atomic: lanes may submit from several
  // threads).
  std::atomic<bool> batch_available_{false};
  std::atomic<bool> use_batch_{false};          // this call: batch available, no pageable side
  std::atomic<bool> batch_3d_available_{true};  // cleared when cudaMemcpy3DBatchAsync is refused
  // K and V of a page in one depth-2 copy (Plan): config_.dma_join_kv, cleared when the driver
  // refuses such a copy.
  std::atomic<bool> merge_kv_{true};
  CudaStreamHandle private_stream_;
  CudaEventHandle fence_in_;
  CudaEventHandle fence_out_;
  PinnedHostBuffer src_index_staging_;
  PinnedHostBuffer dst_index_staging_;
  CopyPlanner planner_;
  std::vector<LaneWork> lane_work_;                // max_lanes_ entries, made in Init
  std::unique_ptr<util::ThreadPool> submit_pool_;  // null: lanes submit from the caller's thread
  std::vector<int64_t> run_starts_;                // slot runs: [run_starts_[i], run_starts_[i+1])
  int max_lanes_ = 1;                              // request's stream + lanes_.size()
  size_t ops_per_lane_ = 256;
  size_t first_batch_piece_ = 0;  // config_.dma_first_batch_piece (Open)
  CudaEventHandle fork_;          // recorded on the request's stream, lanes wait
  std::vector<Lane> lanes_;
};

Status DmaTransferEngine::HostIndices(const SlotIndices& idx, const char* name, int64_t num_slots,
                                      CudaStream stream, PinnedHostBuffer* staging,
                                      SlotIndices* out) {
  *out = idx;
  if (idx.memory == MemoryKind::kHost || idx.count == 0) return Status::OK();
  const int64_t bytes = idx.count * (idx.type == IndexType::kInt64 ? 8 : 4);
  if (staging->bytes() < bytes) {
    KVTIER_ASSIGN_OR_RETURN(*staging,
                            PinnedHostBuffer::Allocate(std::max(bytes, 2 * staging->bytes())));
  }
  KVTIER_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(staging->data(), idx.data, static_cast<size_t>(bytes),
                                              cudaMemcpyDeviceToHost, stream));
  KVTIER_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  out->data = staging->data();
  out->memory = MemoryKind::kHost;
  for (int64_t k = 0; k < out->count; ++k) {
    const int64_t s = out->at(k);
    if (s < 0 || s >= num_slots) {
      return Status::InvalidArgument(fmt::format(
          "dma backend: device {}[{}] = {} is out of range [0, {})", name, k, s, num_slots));
    }
  }
  return Status::OK();
}

void DmaTransferEngine::Plan(const TransferRequest& r, const SlotIndices& si, const SlotIndices& di,
                             int64_t layer0, int64_t layers) {
  const int64_t heads = r.head_chunks();
  Sides x{*r.src, *r.dst};
  x.src.geometry.head_num = heads;
  x.dst.geometry.head_num = heads;
  const KvLayout sl = x.sg().layout, dl = x.dg().layout;
  const int64_t chunk = x.sg().slot_bytes / heads;
  const int64_t S = x.sg().slot_bytes;  // run pieces only (heads == 1)
  const int64_t n = si.count;
  const KvLayout lead = LeadLayout(r);  // plan_rules.h
  const bool run_pieces = heads == 1 && RunContiguous(sl) && RunContiguous(dl);

  // Slot runs, shared by every buffer and layer.
  run_starts_.clear();
  FindSlotRuns(si, di, RunCutPage(x.sg()), RunCutPage(x.dg()), &run_starts_);  // plan_rules.h
  const size_t runs = run_starts_.size() - 1;

  // layer_first / page_first_direct on both sides, base pointers, several layers: a run's layers
  // are rows a constant pitch apart on each side, so each (run, buffer) is one strided copy,
  // planned whole (O(runs), not O(runs x layers) pieces). K and V of a run go one after the
  // other, so the planner can join them into one depth-2 copy. Without dma_stride_layers each
  // (run, buffer, layer) is one plain copy instead, in that order.
  if (run_pieces && layers >= 2 && !r.src->has_layer_table() && !r.dst->has_layer_table()) {
    const int64_t ls0 = r.src_layer + layer0, ld0 = r.dst_layer + layer0;
    const bool merge = merge_kv_ && batch_3d_available_ && use_batch_;
    for (size_t i = 0; i < runs; ++i) {
      const int64_t k0 = run_starts_[i], k1 = run_starts_[i + 1];
      const int64_t s0 = si.at(k0), d0 = di.at(k0);
      const auto width = static_cast<size_t>((k1 - k0) * S);
      for (int b = 0; b < r.src->num_buffers(); ++b) {
        const std::byte* src = x.Src(b, ls0, s0, 0);
        std::byte* dst = x.Dst(b, ld0, d0, 0);
        const auto spitch = static_cast<size_t>(x.Src(b, ls0 + 1, s0, 0) - src);
        const auto dpitch = static_cast<size_t>(x.Dst(b, ld0 + 1, d0, 0) - dst);
        const int64_t alloc = x.Alloc(b, ls0, ld0);
        if (spitch == width && dpitch == width) {
          planner_.Add(src, dst, static_cast<int64_t>(width) * layers, alloc);  // contiguous
        } else if (!config_.dma_stride_layers) {
          for (int64_t l = 0; l < layers; ++l) {  // one plain copy per layer (SGLang's shape)
            planner_.AddSingle(src + static_cast<size_t>(l) * spitch,
                               dst + static_cast<size_t>(l) * dpitch, width);
          }
        } else if (spitch >= width && dpitch >= width && spitch < max_pitch_ &&
                   dpitch < max_pitch_) {
          const auto h = static_cast<size_t>(layers);
          planner_.AddStrided(Copy2D{src, dst, width, spitch, dpitch, h, 1, h, h}, merge);
        } else {
          for (int64_t l = 0; l < layers; ++l) {
            planner_.Add(x.Src(b, ls0 + l, s0, 0), x.Dst(b, ld0 + l, d0, 0),
                         static_cast<int64_t>(width), x.Alloc(b, ls0 + l, ld0 + l));
          }
        }
      }
    }
    planner_.Finish();
    return;
  }

  for (int b = 0; b < r.src->num_buffers(); ++b) {
    if (lead == KvLayout::kPageFirst) {
      // All layers of a slot are contiguous on the page_first side.
      for (int64_t k = 0; k < n; ++k) {
        const int64_t s = si.at(k), d = di.at(k);
        for (int64_t l = 0; l < layers; ++l) {
          for (int64_t h = 0; h < heads; ++h) {
            const int64_t ls = r.src_layer + layer0 + l, ld = r.dst_layer + layer0 + l;
            planner_.Add(x.Src(b, ls, s, h), x.Dst(b, ld, d, h), chunk, x.Alloc(b, ls, ld));
          }
        }
      }
    } else if (lead == KvLayout::kPageHead) {
      // A head's page holds (slot, layer) contiguously.
      for (size_t i = 0; i < runs; ++i) {
        for (int64_t h = 0; h < heads; ++h) {
          for (int64_t k = run_starts_[i]; k < run_starts_[i + 1]; ++k) {
            const int64_t s = si.at(k), d = di.at(k);
            for (int64_t l = 0; l < layers; ++l) {
              const int64_t ls = r.src_layer + layer0 + l, ld = r.dst_layer + layer0 + l;
              planner_.Add(x.Src(b, ls, s, h), x.Dst(b, ld, d, h), chunk, x.Alloc(b, ls, ld));
            }
          }
        }
      }
    } else {
      // layer_first / page_first_direct: a run of slots within a layer, layers of a page next.
      for (size_t i = 0; i < runs; ++i) {
        const int64_t k0 = run_starts_[i], k1 = run_starts_[i + 1];
        const int64_t s0 = si.at(k0), d0 = di.at(k0);
        for (int64_t l = 0; l < layers; ++l) {
          const int64_t ls = r.src_layer + layer0 + l, ld = r.dst_layer + layer0 + l;
          const int64_t alloc = x.Alloc(b, ls, ld);
          if (run_pieces) {
            planner_.Add(x.Src(b, ls, s0, 0), x.Dst(b, ld, d0, 0), (k1 - k0) * S, alloc);
            continue;
          }
          for (int64_t k = k0; k < k1; ++k) {
            const int64_t s = si.at(k), d = di.at(k);
            for (int64_t h = 0; h < heads; ++h) {
              planner_.Add(x.Src(b, ls, s, h), x.Dst(b, ld, d, h), chunk, alloc);
            }
          }
        }
      }
    }
  }
  planner_.Finish();
}

Status DmaTransferEngine::Submit(CudaStream stream) {
  const size_t strided = planner_.copies_2d().size();
  const size_t runs = planner_.sizes().size();
  const size_t ops = strided + runs;
  const int lanes = static_cast<int>(
      std::min<size_t>(static_cast<size_t>(max_lanes_), (ops + ops_per_lane_ - 1) / ops_per_lane_));
  // The single runs' batch split (DmaBatchSplit), decided once for every lane: the lanes fork
  // from `stream`, so they are busy when it is. The stream may drain between this query and the
  // batch calls (or while they are made): the copies then start only when their one call
  // returns, which costs this call the early start of growing pieces, never correctness (the
  // same copies, in the same order, on the same streams).
  bool whole_batch = false;
  if (runs >= 2 && use_batch_) {
    bool busy = false;
    if (config_.dma_batch_split == DmaBatchSplit::kWholeWhenBusy) {
      KVTIER_ASSIGN_OR_RETURN(busy, StreamBusy(stream));
    }
    whole_batch = WholeBatch(config_.dma_batch_split, busy);
  }
  stats_.whole_batch = stats_.whole_batch || whole_batch;  // any layer's (layer_events)
  auto add_stats = [&](const GpuTransferStats& st) {
    stats_.copy_ops += st.copy_ops;
    stats_.copies_2d += st.copies_2d;
    stats_.batch_calls += st.batch_calls;
    stats_.kv_merged += st.kv_merged;
  };
  if (lanes <= 1) {
    LaneWork& work = lane_work_[0];
    work.stats = GpuTransferStats{};
    const Status st = SubmitSlice(stream, 0, strided, 0, runs, whole_batch, &work);
    add_stats(work.stats);
    return st;
  }
  KVTIER_RETURN_IF_ERROR(fork_.Record(stream));
  auto run_lane = [&](int64_t i) {
    LaneWork& work = lane_work_[static_cast<size_t>(i)];
    work.stats = GpuTransferStats{};
    const CudaStream s = i == 0 ? stream : lanes_[static_cast<size_t>(i - 1)].stream.get();
    DeviceGuard guard;  // a pool thread starts on device 0
    work.status = guard.Set(config_.device);
    if (work.status.ok() && i > 0) work.status = fork_.WaitOn(s);
    if (work.status.ok()) {
      work.status = SubmitSlice(s, strided * i / lanes, strided * (i + 1) / lanes, runs * i / lanes,
                                runs * (i + 1) / lanes, whole_batch, &work);
    }
  };
  if (submit_pool_ != nullptr) {
    submit_pool_->ParallelFor(lanes, run_lane);
  } else {
    for (int i = 0; i < lanes; ++i) run_lane(i);
  }
  Status first_error;
  for (int i = 0; i < lanes; ++i) {
    LaneWork& work = lane_work_[static_cast<size_t>(i)];
    add_stats(work.stats);
    if (first_error.ok() && !work.status.ok()) first_error = work.status;
  }
  // Join every lane that got its fork, even after an error, so that no lane is left unordered
  // with the caller's stream.
  for (int i = 1; i < lanes; ++i) {
    Lane& lane = lanes_[static_cast<size_t>(i - 1)];
    KVTIER_RETURN_IF_ERROR(lane.join.Record(lane.stream.get()));
    KVTIER_RETURN_IF_ERROR(lane.join.WaitOn(stream));
  }
  stats_.lanes = lanes;
  return first_error;
}

Status DmaTransferEngine::SubmitSlice(CudaStream stream, size_t c0, size_t c1, size_t r0, size_t r1,
                                      bool whole_batch, LaneWork* work) {
  std::vector<cudaMemcpy3DBatchOp>& ops_3d = work->ops_3d;
  GpuTransferStats& stats = work->stats;
  const Copy2D* copies = planner_.copies_2d().data() + c0;
  const size_t num_copies = c1 - c0;
  bool strided_done = false;
  size_t submitted_ops = 0;  // copy operations the strided copies took
  if (use_batch_ && batch_3d_available_ && num_copies >= 2 && !IsLegacyStream(stream)) {
    // All strided copies in one cudaMemcpy3DBatchAsync (depth 1): one driver call instead of one
    // per copy, and no stall when thousands are queued.
    // split_depth: each block of a depth-2 copy as an operation of its own (after a refusal).
    auto fill_ops = [&](bool split_depth) {
      ops_3d.clear();
      for (size_t i = 0; i < num_copies; ++i) {
        const Copy2D& c = copies[i];
        const size_t blocks = split_depth ? c.depth : 1;
        for (size_t z = 0; z < blocks; ++z) {
          cudaMemcpy3DBatchOp op{};
          op.src.type = cudaMemcpyOperandTypePointer;
          op.src.op.ptr.ptr = const_cast<std::byte*>(c.BlockSrc(z));
          op.src.op.ptr.rowLength = c.spitch;
          op.src.op.ptr.layerHeight = c.depth > 1 ? c.s_layer_height : c.height;
          op.dst.type = cudaMemcpyOperandTypePointer;
          op.dst.op.ptr.ptr = c.BlockDst(z);
          op.dst.op.ptr.rowLength = c.dpitch;
          op.dst.op.ptr.layerHeight = c.depth > 1 ? c.d_layer_height : c.height;
          op.extent = make_cudaExtent(c.width, c.height, split_depth ? 1 : c.depth);
          op.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
          op.flags = config_.dma_overlap_hint
                         ? static_cast<unsigned int>(cudaMemcpyFlagPreferOverlapWithCompute)
                         : 0u;
          ops_3d.push_back(op);
        }
      }
    };
    const auto depth2 = static_cast<int64_t>(
        std::count_if(copies, copies + num_copies, [](const Copy2D& c) { return c.depth > 1; }));
    const bool has_depth = depth2 > 0;
    fill_ops(false);
    cudaError_t e = cudaMemcpy3DBatchAsync(ops_3d.size(), ops_3d.data(), 0, stream);
    if (e != cudaSuccess && has_depth) {
      // The driver refuses K and V in one operation (e.g. when they are separate allocations):
      // stop joining them and submit the blocks one by one.
      (void)cudaGetLastError();
      merge_kv_ = false;
      util::Log(util::LogLevel::kWarning,
                "dma backend: a depth-2 cudaMemcpy3DBatchAsync operation was refused ({}); K and "
                "V go as separate copies from now on",
                cudaGetErrorString(e));
      fill_ops(true);
      e = cudaMemcpy3DBatchAsync(ops_3d.size(), ops_3d.data(), 0, stream);
    }
    if (e == cudaSuccess) {
      submitted_ops = ops_3d.size();
      if (submitted_ops == num_copies) stats.kv_merged += depth2;
      strided_done = true;
      ++stats.batch_calls;
    } else {
      (void)cudaGetLastError();
      batch_3d_available_ = false;
      util::Log(util::LogLevel::kWarning,
                "dma backend: cudaMemcpy3DBatchAsync failed ({}); using cudaMemcpy2DAsync",
                cudaGetErrorString(e));
    }
  }
  if (!strided_done) {
    submitted_ops = 0;
    for (size_t i = 0; i < num_copies; ++i) {
      const Copy2D& c = copies[i];
      for (size_t z = 0; z < c.depth; ++z) {
        KVTIER_CUDA_RETURN_IF_ERROR(cudaMemcpy2DAsync(c.BlockDst(z), c.dpitch, c.BlockSrc(z),
                                                      c.spitch, c.width, c.height,
                                                      cudaMemcpyDefault, stream));
        ++submitted_ops;
      }
    }
  }
  stats.copies_2d += static_cast<int64_t>(submitted_ops);
  stats.copy_ops += static_cast<int64_t>(submitted_ops);
  const size_t count = r1 - r0;
  void** dsts = planner_.dsts().data() + r0;
  const void** srcs = planner_.srcs().data() + r0;
  size_t* sizes = planner_.sizes().data() + r0;
  stats.copy_ops += static_cast<int64_t>(count);
  size_t done = 0;  // single copies submitted
  if (use_batch_ && count >= 2 && !IsLegacyStream(stream)) {
    // No cudaMemcpyFlagPreferOverlapWithCompute here: with it the driver took 1.5x as long to
    // submit 2,048 single copies (docs/perf-notes/dma-direct-path.md).
    cudaMemcpyAttributes attr{};
    attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
    size_t attr_index = 0;
    // In pieces (BatchPieces, dma_plan.h): the copies start after the first; or all at once.
    BatchPieces pieces =
        whole_batch ? BatchPieces::Whole(count) : BatchPieces(count, first_batch_piece_);
    cudaError_t e = cudaSuccess;
    while (done < count) {
      const size_t n = pieces.Next();
#if CUDART_VERSION >= 13000
      e = cudaMemcpyBatchAsync(dsts + done, srcs + done, sizes + done, n, &attr, &attr_index, 1,
                               stream);
#else
      size_t fail_index = 0;
      e = cudaMemcpyBatchAsync(dsts + done, const_cast<void**>(srcs + done), sizes + done, n, &attr,
                               &attr_index, 1, &fail_index, stream);
#endif
      if (e != cudaSuccess) break;
      done += n;
      ++stats.batch_calls;
    }
    if (e == cudaSuccess) return Status::OK();
    // Not offered after all (driver, platform): remember, fall back to single copies for what
    // the batch calls did not submit (a refused call submits nothing).
    (void)cudaGetLastError();
    batch_available_ = false;
    use_batch_ = false;
    util::Log(util::LogLevel::kWarning,
              "dma backend: cudaMemcpyBatchAsync failed ({}); using one cudaMemcpyAsync per run",
              cudaGetErrorString(e));
  }
  for (size_t i = done; i < count; ++i) {
    KVTIER_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(dsts[i], srcs[i], sizes[i], cudaMemcpyDefault, stream));
  }
  return Status::OK();
}

Status DmaTransferEngine::DoTransfer(const TransferRequest& r, const TransferOptions& options) {
  std::lock_guard<std::mutex> lock(mu_);
  stats_ = GpuTransferStats{};
  stats_.backend = TransferBackend::kDma;
  DeviceGuard guard;
  KVTIER_RETURN_IF_ERROR(guard.Set(config_.device));
  bool src_pageable = false, dst_pageable = false;
  KVTIER_RETURN_IF_ERROR(CheckResidency(*r.src, "src", /*need_pinned_host=*/false, &src_pageable));
  KVTIER_RETURN_IF_ERROR(CheckResidency(*r.dst, "dst", /*need_pinned_host=*/false, &dst_pageable));
  // Pageable host memory goes through plain cudaMemcpyAsync (staged by the driver).
  use_batch_ = batch_available_ && !src_pageable && !dst_pageable;
  if (options.layer_events != nullptr && options.layer_events->size() < r.num_layers) {
    return Status::InvalidArgument(
        fmt::format("layer_events has {} events but the request copies {} layers",
                    options.layer_events->size(), r.num_layers));
  }
  SlotIndices si, di;
  KVTIER_RETURN_IF_ERROR(HostIndices(r.src_slots, "src_slots", r.src->geometry.num_slots,
                                     options.stream, &src_index_staging_, &si));
  KVTIER_RETURN_IF_ERROR(HostIndices(r.dst_slots, "dst_slots", r.dst->geometry.num_slots,
                                     options.stream, &dst_index_staging_, &di));
  // The stream the copies go on; the legacy stream is fenced to the private one.
  const bool fenced = IsLegacyStream(options.stream) && use_batch_;
  const CudaStream exec = fenced ? private_stream_.get() : options.stream;
  if (fenced) {
    KVTIER_RETURN_IF_ERROR(fence_in_.Record(options.stream));
    KVTIER_RETURN_IF_ERROR(fence_in_.WaitOn(exec));
  }
  const int64_t step = options.layer_events != nullptr ? 1 : r.num_layers;
  for (int64_t l0 = 0; l0 < r.num_layers; l0 += step) {
    planner_.Reset(max_pitch_, static_cast<size_t>(config_.dma_min_strided_rows));
    Plan(r, si, di, l0, step);
    KVTIER_RETURN_IF_ERROR(Submit(exec));
    if (options.layer_events != nullptr) {
      KVTIER_RETURN_IF_ERROR(options.layer_events->Record(static_cast<int>(l0), exec));
    }
  }
  if (fenced) {
    KVTIER_RETURN_IF_ERROR(fence_out_.Record(exec));
    KVTIER_RETURN_IF_ERROR(fence_out_.WaitOn(options.stream));
  }
  return Status::OK();
}

Result<std::unique_ptr<GpuTransferEngine>> CreateDmaEngine(const TransferEngineConfig& config) {
  KVTIER_ASSIGN_OR_RETURN(auto engine, DmaTransferEngine::Create(config));
  return std::unique_ptr<GpuTransferEngine>(std::move(engine));
}

}  // namespace kvtier::transfer::cuda

namespace kvtier::transfer {

Result<std::unique_ptr<TransferEngine>> MakeDmaTransferEngine(const TransferEngineConfig& config) {
  KVTIER_ASSIGN_OR_RETURN(auto engine, cuda::CreateDmaEngine(config));
  return std::unique_ptr<TransferEngine>(std::move(engine));
}

}  // namespace kvtier::transfer
