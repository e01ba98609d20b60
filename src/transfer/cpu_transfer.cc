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
#include <vector>

#include "transfer/backends.h"
#include "transfer/plan_rules.h"
#include "util/thread_pool.h"

namespace kvtier::transfer {
namespace {

// Loop nests, named by the layout whose contiguity they follow.
enum class LoopOrder {
  kLayerSlot,         // for layer, for slot: runs of slots within a layer (layer_first)
  kSlotLayer,         // for slot, for layer: all layers of one slot (page_first)
  kPageLayerSlot,     // for page run, for layer, for slot in run: one page of one layer, or all
                      // layers of a page (page_first_direct)
  kPageHeadSlotLayer  // for page run, for head, for slot in run, for layer (page_head)
};

LoopOrder OrderFor(KvLayout layout) {
  switch (layout) {
    case KvLayout::kLayerFirst:
      return LoopOrder::kLayerSlot;
    case KvLayout::kPageFirst:
      return LoopOrder::kSlotLayer;
    case KvLayout::kPageFirstDirect:
      return LoopOrder::kPageLayerSlot;
    case KvLayout::kPageHead:
      return LoopOrder::kPageHeadSlotLayer;
  }
  return LoopOrder::kLayerSlot;
}

// Collects pieces and issues one memcpy per maximal run that is contiguous on both sides.
class RunMerger {
 public:
  static constexpr int64_t kPrefetchBytes = 256;

  void Add(const std::byte* src, std::byte* dst, int64_t n) {
    if (len_ > 0 && src == src_ + len_ && dst == dst_ + len_) {
      len_ += n;
      return;
    }
    // A new run: start fetching its first lines (and claiming its destination lines) before the
    // previous run's memcpy, so random runs overlap their memory latency with useful work.
    for (int64_t off = 0; off < n && off < kPrefetchBytes; off += 64) {
      __builtin_prefetch(src + off, 0);
      __builtin_prefetch(dst + off, 1);
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

// One side of a request, resolved once: every address is
//   layer_base[b][l] + SlotBase(slot) + h * head_stride
// (KvGeometry's affine decomposition), so the loops below walk layers and heads by addition and
// compute SlotBase (a division for paged layouts) once per slot, or once per run of slots.
struct Side {
  KvGeometry geo;  // head_num set to the request's head-chunk count
  int64_t head_stride = 0;
  int64_t slot_step = 0;                  // SlotBase(i + 1) - SlotBase(i) within one page
  std::vector<std::byte*> layer_base[2];  // [buffer][layer relative to the request]

  void Init(const KvRegion& r, int64_t first_layer, int64_t num_layers, int64_t heads) {
    geo = r.geometry;
    geo.head_num = heads;
    head_stride = geo.head_stride();
    slot_step = geo.SlotBase(1) - geo.SlotBase(0);
    for (int b = 0; b < r.num_buffers(); ++b) {
      layer_base[b].resize(static_cast<size_t>(num_layers));
      for (int64_t l = 0; l < num_layers; ++l) {
        const int64_t layer = first_layer + l;
        layer_base[b][l] = r.has_layer_table() ? r.LayerBase(b, layer)
                                               : r.LayerBase(b, layer) + layer * geo.layer_stride();
      }
    }
  }
  // Page size that cuts runs of consecutive slots (plan_rules.h).
  int64_t run_page() const { return RunCutPage(geo); }
};

struct CopyPlan {
  const TransferRequest* req;
  Side src, dst;
  int64_t heads;        // head chunks per slot: the page_head side's head_num, else 1
  int64_t chunk_bytes;  // slot_bytes / heads
  LoopOrder order;
};

CopyPlan MakePlan(const TransferRequest& r) {
  CopyPlan p;
  p.req = &r;
  p.heads = r.head_chunks();
  p.chunk_bytes = r.src->geometry.slot_bytes / p.heads;
  p.src.Init(*r.src, r.src_layer, r.num_layers, p.heads);
  p.dst.Init(*r.dst, r.dst_layer, r.num_layers, p.heads);
  p.order = OrderFor(LeadLayout(r));  // plan_rules.h
  return p;
}

// Copies all layers and heads of one slot pair whose slot bases are `sb`/`db`, layer-major.
inline void CopySlotLayers(const CopyPlan& p, int b, int64_t sb, int64_t db, RunMerger* merger) {
  const int64_t L = p.req->num_layers, H = p.heads, C = p.chunk_bytes;
  for (int64_t l = 0; l < L; ++l) {
    const std::byte* s = p.src.layer_base[b][l] + sb;
    std::byte* d = p.dst.layer_base[b][l] + db;
    for (int64_t h = 0; h < H; ++h)
      merger->Add(s + h * p.src.head_stride, d + h * p.dst.head_stride, C);
  }
}

// Copies slot pairs [k0, k1) of the request.
void CopyRange(const CopyPlan& p, int64_t k0, int64_t k1) {
  const TransferRequest& r = *p.req;
  const SlotIndices& si = r.src_slots;
  const SlotIndices& di = r.dst_slots;
  const int64_t L = r.num_layers;
  const int64_t H = p.heads;
  const int64_t C = p.chunk_bytes;
  const int64_t src_page = p.src.run_page(), dst_page = p.dst.run_page();
  RunMerger merger;
  for (int b = 0; b < r.src->num_buffers(); ++b) {
    switch (p.order) {
      case LoopOrder::kLayerSlot:  // both sides layer_first: SlotBase is slot * S
        for (int64_t l = 0; l < L; ++l) {
          const std::byte* sl = p.src.layer_base[b][l];
          std::byte* dl = p.dst.layer_base[b][l];
          for (int64_t k = k0; k < k1; ++k) {
            const std::byte* s = sl + p.src.geo.SlotBase(si.at(k));
            std::byte* d = dl + p.dst.geo.SlotBase(di.at(k));
            for (int64_t h = 0; h < H; ++h) {
              merger.Add(s + h * p.src.head_stride, d + h * p.dst.head_stride, C);
            }
          }
        }
        break;
      case LoopOrder::kSlotLayer:
        for (int64_t k = k0; k < k1; ++k) {
          CopySlotLayers(p, b, p.src.geo.SlotBase(si.at(k)), p.dst.geo.SlotBase(di.at(k)), &merger);
        }
        break;
      case LoopOrder::kPageLayerSlot:
      case LoopOrder::kPageHeadSlotLayer: {
        // Page runs: consecutive pairs with both indices advancing by one, cut where either
        // side enters a new page of a paged layout; within a run SlotBase advances by slot_step.
        int64_t run_begin = k0;
        while (run_begin < k1) {
          int64_t run_end = run_begin + 1;
          int64_t prev_s = si.at(run_begin), prev_d = di.at(run_begin);
          while (run_end < k1) {
            const int64_t s = si.at(run_end), d = di.at(run_end);
            if (!ContinuesRun(prev_s, prev_d, s, d, src_page, dst_page)) break;
            prev_s = s;
            prev_d = d;
            ++run_end;
          }
          const int64_t n = run_end - run_begin;
          const int64_t sb0 = p.src.geo.SlotBase(si.at(run_begin));
          const int64_t db0 = p.dst.geo.SlotBase(di.at(run_begin));
          if (p.order == LoopOrder::kPageLayerSlot) {
            for (int64_t l = 0; l < L; ++l) {
              const std::byte* sl = p.src.layer_base[b][l] + sb0;
              std::byte* dl = p.dst.layer_base[b][l] + db0;
              for (int64_t j = 0; j < n; ++j) {
                const std::byte* s = sl + j * p.src.slot_step;
                std::byte* d = dl + j * p.dst.slot_step;
                for (int64_t h = 0; h < H; ++h) {
                  merger.Add(s + h * p.src.head_stride, d + h * p.dst.head_stride, C);
                }
              }
            }
          } else {
            for (int64_t h = 0; h < H; ++h) {
              for (int64_t j = 0; j < n; ++j) {
                const int64_t sb = sb0 + j * p.src.slot_step + h * p.src.head_stride;
                const int64_t db = db0 + j * p.dst.slot_step + h * p.dst.head_stride;
                for (int64_t l = 0; l < L; ++l) {
                  merger.Add(p.src.layer_base[b][l] + sb, p.dst.layer_base[b][l] + db, C);
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
      return Status::InvalidArgument(
          "the cpu backend needs src_slots and dst_slots in host memory");
    }
    const int64_t n = r.num_slots();
    if (n == 0) return Status::OK();
    const CopyPlan plan = MakePlan(r);
    const int64_t bytes = r.bytes();
    const int64_t tasks = std::min<int64_t>(
        {static_cast<int64_t>(pool_.num_threads()) * 4, n,
         threshold_bytes_ > 0 ? bytes / threshold_bytes_ + (bytes % threshold_bytes_ != 0 ? 1 : 0)
                              : static_cast<int64_t>(pool_.num_threads()) * 4});
    if (tasks <= 1) {
      CopyRange(plan, 0, n);
      return Status::OK();
    }
    pool_.ParallelFor(tasks,
                      [&](int64_t t) { CopyRange(plan, n * t / tasks, n * (t + 1) / tasks); });
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
