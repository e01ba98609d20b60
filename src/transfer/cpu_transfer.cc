// The cpu transfer backend: gather/scatter over host memory with memcpy of contiguous runs.
//
// A request is a set of elementary copies ("pieces"): one per (buffer, slot pair, layer, head
// chunk). The copier walks them in the loop order that makes consecutive pieces adjacent in
// memory for the layouts involved and merges adjacent pieces into one memcpy, so a run of slots
// in one layer (layer_first), all layers of a slot (page_first) or of a page (page_first_direct),
// or a head's page (page_head) moves as one block whenever both sides allow it. Large requests are
// split by slot ranges across a thread pool.
#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <thread>

#include "transfer/backends.h"
#include "util/thread_pool.h"

namespace kvtier::transfer {
namespace {

// Loop nests, named by the layout whose contiguity they follow.
enum class LoopOrder {
  kLayerSlot,       // for layer, for slot: runs of slots within a layer (layer_first)
  kSlotLayer,       // for slot, for layer: all layers of one slot (page_first)
  kPageLayerSlot,   // for page run, for layer, for slot in run: one page of one layer, or all
                    // layers of a page (page_first_direct)
  kPageHeadSlotLayer  // for page run, for head, for slot in run, for layer (page_head)
};

LoopOrder OrderFor(KvLayout layout) {
  switch (layout) {
    case KvLayout::kLayerFirst: return LoopOrder::kLayerSlot;
    case KvLayout::kPageFirst: return LoopOrder::kSlotLayer;
    case KvLayout::kPageFirstDirect: return LoopOrder::kPageLayerSlot;
    case KvLayout::kPageHead: return LoopOrder::kPageHeadSlotLayer;
  }
  return LoopOrder::kLayerSlot;
}

// Collects pieces and issues one memcpy per maximal run that is contiguous on both sides.
class RunMerger {
 public:
  void Add(const std::byte* src, std::byte* dst, int64_t n) {
    if (len_ > 0 && src == src_ + len_ && dst == dst_ + len_) {
      len_ += n;
      return;
    }
    Flush();
    src_ = src;
    dst_ = dst;
    len_ = n;
  }
  void Flush() {
    if (len_ > 0) std::memcpy(dst_, src_, static_cast<size_t>(len_));
    len_ = 0;
  }

 private:
  const std::byte* src_ = nullptr;
  std::byte* dst_ = nullptr;
  int64_t len_ = 0;
};

// Everything the copy loops need, resolved once per request.
struct CopyPlan {
  const TransferRequest* req;
  KvGeometry src_geo;  // head_num set to `heads` on both sides
  KvGeometry dst_geo;
  int64_t heads;       // head chunks per slot: the page_head side's head_num, else 1
  int64_t chunk_bytes; // slot_bytes / heads
  int64_t src_page;    // page size that splits runs on the source side (1 = no split)
  int64_t dst_page;
  LoopOrder order;

  const std::byte* Src(int b, int64_t l, int64_t slot, int64_t h) const {
    const KvRegion& r = *req->src;
    const int64_t layer = req->src_layer + l;
    return r.LayerBase(b, layer) + (r.has_layer_table() ? src_geo.OffsetInLayer(slot, h)
                                                        : src_geo.HeadOffset(layer, slot, h));
  }
  std::byte* Dst(int b, int64_t l, int64_t slot, int64_t h) const {
    const KvRegion& r = *req->dst;
    const int64_t layer = req->dst_layer + l;
    return r.LayerBase(b, layer) + (r.has_layer_table() ? dst_geo.OffsetInLayer(slot, h)
                                                        : dst_geo.HeadOffset(layer, slot, h));
  }
};

int64_t RunSplitPage(const KvGeometry& g) {
  return (g.layout == KvLayout::kPageFirstDirect || g.layout == KvLayout::kPageHead) ? g.page_size
                                                                                      : 0;
}

CopyPlan MakePlan(const TransferRequest& r) {
  CopyPlan p;
  p.req = &r;
  p.src_geo = r.src->geometry;
  p.dst_geo = r.dst->geometry;
  const KvLayout sl = p.src_geo.layout, dl = p.dst_geo.layout;
  p.heads = sl == KvLayout::kPageHead   ? p.src_geo.head_num
            : dl == KvLayout::kPageHead ? p.dst_geo.head_num
                                        : 1;
  p.src_geo.head_num = p.heads;
  p.dst_geo.head_num = p.heads;
  p.chunk_bytes = p.src_geo.slot_bytes / p.heads;
  p.src_page = RunSplitPage(p.src_geo);
  p.dst_page = RunSplitPage(p.dst_geo);
  // Follow the side that is not layer_first (the host side of a load or backup); when both are
  // something else, the destination, whose writes are the costlier stream.
  const KvLayout lead = dl != KvLayout::kLayerFirst ? dl : sl;
  p.order = OrderFor(lead);
  return p;
}

// Copies slot pairs [k0, k1) of the request.
void CopyRange(const CopyPlan& p, int64_t k0, int64_t k1) {
  const TransferRequest& r = *p.req;
  const SlotIndices& si = r.src_slots;
  const SlotIndices& di = r.dst_slots;
  const int64_t L = r.num_layers;
  const int64_t H = p.heads;
  const int64_t C = p.chunk_bytes;
  RunMerger merger;
  for (int b = 0; b < r.src->num_buffers(); ++b) {
    switch (p.order) {
      case LoopOrder::kLayerSlot:
        for (int64_t l = 0; l < L; ++l) {
          for (int64_t k = k0; k < k1; ++k) {
            const int64_t s = si.at(k), d = di.at(k);
            for (int64_t h = 0; h < H; ++h) merger.Add(p.Src(b, l, s, h), p.Dst(b, l, d, h), C);
          }
        }
        break;
      case LoopOrder::kSlotLayer:
        for (int64_t k = k0; k < k1; ++k) {
          const int64_t s = si.at(k), d = di.at(k);
          for (int64_t l = 0; l < L; ++l) {
            for (int64_t h = 0; h < H; ++h) merger.Add(p.Src(b, l, s, h), p.Dst(b, l, d, h), C);
          }
        }
        break;
      case LoopOrder::kPageLayerSlot:
      case LoopOrder::kPageHeadSlotLayer: {
        // Page runs: consecutive pairs with both indices advancing by one, cut where either
        // side enters a new page of a page-based layout.
        int64_t run_begin = k0;
        while (run_begin < k1) {
          int64_t run_end = run_begin + 1;
          while (run_end < k1) {
            const int64_t s = si.at(run_end), d = di.at(run_end);
            if (s != si.at(run_end - 1) + 1 || d != di.at(run_end - 1) + 1) break;
            if (p.src_page > 0 && s % p.src_page == 0) break;
            if (p.dst_page > 0 && d % p.dst_page == 0) break;
            ++run_end;
          }
          if (p.order == LoopOrder::kPageLayerSlot) {
            for (int64_t l = 0; l < L; ++l) {
              for (int64_t k = run_begin; k < run_end; ++k) {
                const int64_t s = si.at(k), d = di.at(k);
                for (int64_t h = 0; h < H; ++h) {
                  merger.Add(p.Src(b, l, s, h), p.Dst(b, l, d, h), C);
                }
              }
            }
          } else {
            for (int64_t h = 0; h < H; ++h) {
              for (int64_t k = run_begin; k < run_end; ++k) {
                const int64_t s = si.at(k), d = di.at(k);
                for (int64_t l = 0; l < L; ++l) {
                  merger.Add(p.Src(b, l, s, h), p.Dst(b, l, d, h), C);
                }
              }
            }
          }
          run_begin = run_end;
        }
        break;
      }
    }
  }
  merger.Flush();
}

class CpuTransferEngine final : public TransferEngine {
 public:
  explicit CpuTransferEngine(const TransferEngineConfig& config)
      : threshold_bytes_(config.cpu_parallel_threshold_bytes),
        pool_(config.cpu_threads > 0
                  ? config.cpu_threads
                  : std::max(1, static_cast<int>(std::thread::hardware_concurrency()))) {}

  TransferBackend backend() const override { return TransferBackend::kCpu; }

 protected:
  Status DoTransfer(const TransferRequest& r, const TransferOptions&) override {
    if (r.src->memory != MemoryKind::kHost || r.dst->memory != MemoryKind::kHost) {
      return Status::InvalidArgument(fmt::format(
          "the cpu backend copies host memory only; src is {} memory and dst is {} memory",
          MemoryKindName(r.src->memory), MemoryKindName(r.dst->memory)));
    }
    if (r.src_slots.memory != MemoryKind::kHost || r.dst_slots.memory != MemoryKind::kHost) {
      return Status::InvalidArgument("the cpu backend needs src_slots and dst_slots in host memory");
    }
    const int64_t n = r.num_slots();
    if (n == 0) return Status::OK();
    const CopyPlan plan = MakePlan(r);
    const int64_t bytes = r.bytes();
    const int64_t tasks =
        std::min<int64_t>({static_cast<int64_t>(pool_.num_threads()) * 4, n,
                           threshold_bytes_ > 0 ? (bytes + threshold_bytes_ - 1) / threshold_bytes_
                                                : static_cast<int64_t>(pool_.num_threads()) * 4});
    if (tasks <= 1) {
      CopyRange(plan, 0, n);
      return Status::OK();
    }
    pool_.ParallelFor(tasks, [&](int64_t t) {
      CopyRange(plan, n * t / tasks, n * (t + 1) / tasks);
    });
    return Status::OK();
  }

 private:
  int64_t threshold_bytes_;
  util::ThreadPool pool_;
};

}  // namespace

Result<std::unique_ptr<TransferEngine>> MakeCpuTransferEngine(const TransferEngineConfig& config) {
  return std::unique_ptr<TransferEngine>(new CpuTransferEngine(config));
}

}  // namespace kvtier::transfer
