// Request validation shared by every backend, and the backend factory.
#include "kvtier/transfer.h"

#include <fmt/format.h>

#include <algorithm>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "transfer/backends.h"

namespace kvtier {
namespace {

Status CheckIndices(const SlotIndices& idx, std::string_view name, int64_t num_slots) {
  if (idx.count < 0) {
    return Status::InvalidArgument(
        fmt::format("{}.count = {} must not be negative", name, idx.count));
  }
  if (idx.count > 0 && idx.data == nullptr) {
    return Status::InvalidArgument(fmt::format("{} is null but its count is {}", name, idx.count));
  }
  if (idx.type != IndexType::kInt32 && idx.type != IndexType::kInt64) {
    return Status::InvalidArgument(
        fmt::format("{} has unknown index type {}", name, static_cast<int>(idx.type)));
  }
  if (idx.memory != MemoryKind::kHost) return Status::OK();  // checked inside the kernels
  auto check = [&](const auto* p) -> Status {
    // The range first, in a loop without early exit (vectorised: on every copy's path); the
    // first bad index only when there is one.
    int64_t lo = 0, hi = -1;
    for (int64_t k = 0; k < idx.count; ++k) {
      const int64_t s = static_cast<int64_t>(p[k]);
      lo = std::min(lo, s);
      hi = std::max(hi, s);
    }
    if (lo >= 0 && hi < num_slots) return Status::OK();
    for (int64_t k = 0; k < idx.count; ++k) {
      const int64_t s = static_cast<int64_t>(p[k]);
      if (s < 0 || s >= num_slots) {
        return Status::InvalidArgument(
            fmt::format("{}[{}] = {} is out of range [0, {})", name, k, s, num_slots));
      }
    }
    return Status::OK();
  };
  return idx.type == IndexType::kInt64 ? check(static_cast<const int64_t*>(idx.data))
                                       : check(static_cast<const int32_t*>(idx.data));
}

Status CheckLayerRange(const KvRegion& r, std::string_view name, int64_t first, int64_t count) {
  const int64_t L = r.geometry.num_layers;
  if (first < 0 || first >= L || count > L - first) {
    return Status::InvalidArgument(
        fmt::format("{}_layer = {} with num_layers = {} is out of range for {} with {} layers",
                    name, first, count, name, L));
  }
  return Status::OK();
}

bool SameRegion(const KvRegion& a, const KvRegion& b) {
  const KvGeometry& x = a.geometry;
  const KvGeometry& y = b.geometry;
  return x.layout == y.layout && x.num_layers == y.num_layers && x.num_slots == y.num_slots &&
         x.slot_bytes == y.slot_bytes && x.page_size == y.page_size && x.head_num == y.head_num &&
         a.mla == b.mla && a.k == b.k && a.v == b.v &&
         std::equal(a.k_layers.begin(), a.k_layers.end(), b.k_layers.begin(), b.k_layers.end()) &&
         std::equal(a.v_layers.begin(), a.v_layers.end(), b.v_layers.begin(), b.v_layers.end());
}

// Copies inside one memory: the backends copy slot by slot in no set order, so a slot that is
// both read and written would come out as either its old or its new bytes. Refused:
//   - two different regions over overlapping base buffers (the geometry tells their sizes);
//   - within one region (same geometry and pointers) and overlapping layer ranges, a slot
//     named in both lists (host indices; device indices are not read on the host).
// Regions over per-layer tables of different addresses are not compared (tables carry no sizes).
Status CheckOverlap(const TransferRequest& r) {
  const KvRegion& s = *r.src;
  const KvRegion& d = *r.dst;
  if (s.memory != d.memory) return Status::OK();
  if (SameRegion(s, d)) {
    const bool layers_overlap =
        r.src_layer < r.dst_layer + r.num_layers && r.dst_layer < r.src_layer + r.num_layers;
    if (!layers_overlap || r.src_slots.memory != MemoryKind::kHost ||
        r.dst_slots.memory != MemoryKind::kHost) {
      return Status::OK();
    }
    std::vector<std::pair<int64_t, int64_t>> read(static_cast<size_t>(r.src_slots.count));
    for (int64_t k = 0; k < r.src_slots.count; ++k) read[k] = {r.src_slots.at(k), k};
    std::sort(read.begin(), read.end());
    for (int64_t k = 0; k < r.dst_slots.count; ++k) {
      const int64_t slot = r.dst_slots.at(k);
      auto it = std::lower_bound(read.begin(), read.end(), std::pair<int64_t, int64_t>{slot, 0});
      if (it != read.end() && it->first == slot) {
        return Status::InvalidArgument(fmt::format(
            "dst_slots[{}] = {} is also read (src_slots[{}]) in the same region and layers; "
            "a copy must not read and write one slot",
            k, slot, it->second));
      }
    }
    return Status::OK();
  }
  if (s.has_layer_table() || d.has_layer_table()) return Status::OK();
  const int64_t bytes_s = s.geometry.buffer_bytes();
  const int64_t bytes_d = d.geometry.buffer_bytes();
  for (int bs = 0; bs < s.num_buffers(); ++bs) {
    for (int bd = 0; bd < d.num_buffers(); ++bd) {
      const auto a = reinterpret_cast<uintptr_t>(s.LayerBase(bs, 0));
      const auto b = reinterpret_cast<uintptr_t>(d.LayerBase(bd, 0));
      if (a < b + static_cast<uintptr_t>(bytes_d) && b < a + static_cast<uintptr_t>(bytes_s)) {
        return Status::InvalidArgument(fmt::format(
            "src and dst are different regions over overlapping memory (src buffer {}, dst "
            "buffer {}); copy within one buffer through one region",
            bs, bd));
      }
    }
  }
  return Status::OK();
}

}  // namespace

Status KvRegion::Validate(std::string_view name) const {
  KVTIER_RETURN_IF_ERROR(geometry.Validate(name));
  const KvGeometry& g = geometry;
  if (memory != MemoryKind::kHost && memory != MemoryKind::kDevice) {
    return Status::InvalidArgument(
        fmt::format("{}.memory = {} is not host or device", name, static_cast<int>(memory)));
  }
  if (has_layer_table() || !v_layers.empty()) {
    if (g.layout != KvLayout::kLayerFirst) {
      return Status::InvalidArgument(fmt::format(
          "{} has a per-layer pointer table but layout {}; tables are for layer_first only", name,
          LayoutName(g.layout)));
    }
    if (k != nullptr || v != nullptr) {
      return Status::InvalidArgument(
          fmt::format("{} has both base pointers and a per-layer pointer table", name));
    }
    if (static_cast<int64_t>(k_layers.size()) != g.num_layers) {
      return Status::InvalidArgument(
          fmt::format("{}.k_layers has {} entries, expected num_layers = {}", name, k_layers.size(),
                      g.num_layers));
    }
    const int64_t want_v = mla ? 0 : g.num_layers;
    if (static_cast<int64_t>(v_layers.size()) != want_v) {
      return Status::InvalidArgument(fmt::format("{}.v_layers has {} entries, expected {}{}", name,
                                                 v_layers.size(), want_v, mla ? " for MLA" : ""));
    }
    for (int b = 0; b < num_buffers(); ++b) {
      const auto table = b == 0 ? k_layers : v_layers;
      for (size_t l = 0; l < table.size(); ++l) {
        if (table[l] == nullptr) {
          return Status::InvalidArgument(
              fmt::format("{}.{}_layers[{}] is null", name, b == 0 ? "k" : "v", l));
        }
      }
    }
    return Status::OK();
  }
  if (k == nullptr) {
    return Status::InvalidArgument(fmt::format("{}.k is null{}", name, mla ? " (MLA buffer)" : ""));
  }
  if (!mla && v == nullptr) return Status::InvalidArgument(fmt::format("{}.v is null", name));
  if (mla && v != nullptr) {
    return Status::InvalidArgument(fmt::format("{}.v must be null for an MLA region", name));
  }
  return Status::OK();
}

int64_t TransferRequest::bytes() const {
  if (src == nullptr) return 0;
  return src_slots.count * num_layers * src->geometry.slot_bytes * src->num_buffers();
}

Status ValidateTransfer(const TransferRequest& r) {
  if (r.src == nullptr) return Status::InvalidArgument("src region is null");
  if (r.dst == nullptr) return Status::InvalidArgument("dst region is null");
  KVTIER_RETURN_IF_ERROR(r.src->Validate("src"));
  KVTIER_RETURN_IF_ERROR(r.dst->Validate("dst"));
  const KvGeometry& sg = r.src->geometry;
  const KvGeometry& dg = r.dst->geometry;
  if (r.src->mla != r.dst->mla) {
    return Status::InvalidArgument(fmt::format(
        "src is {} but dst is {}", r.src->mla ? "MLA" : "MHA", r.dst->mla ? "MLA" : "MHA"));
  }
  if (sg.slot_bytes != dg.slot_bytes) {
    return Status::InvalidArgument(
        fmt::format("slot_bytes differ: src.slot_bytes = {}, dst.slot_bytes = {}", sg.slot_bytes,
                    dg.slot_bytes));
  }
  if (sg.layout == KvLayout::kPageHead && dg.layout == KvLayout::kPageHead &&
      sg.head_num != dg.head_num) {
    return Status::InvalidArgument(fmt::format(
        "head_num differ between page_head regions: src.head_num = {}, dst.head_num = {}",
        sg.head_num, dg.head_num));
  }
  if (r.src_slots.count != r.dst_slots.count) {
    return Status::InvalidArgument(fmt::format("src_slots and dst_slots differ in length: {} vs {}",
                                               r.src_slots.count, r.dst_slots.count));
  }
  if (r.num_layers <= 0) {
    return Status::InvalidArgument(fmt::format("num_layers = {} must be positive", r.num_layers));
  }
  KVTIER_RETURN_IF_ERROR(CheckLayerRange(*r.src, "src", r.src_layer, r.num_layers));
  KVTIER_RETURN_IF_ERROR(CheckLayerRange(*r.dst, "dst", r.dst_layer, r.num_layers));
  KVTIER_RETURN_IF_ERROR(CheckIndices(r.src_slots, "src_slots", sg.num_slots));
  KVTIER_RETURN_IF_ERROR(CheckIndices(r.dst_slots, "dst_slots", dg.num_slots));
  return CheckOverlap(r);
}

Status TransferEngine::Transfer(const TransferRequest& request, const TransferOptions& options) {
  KVTIER_RETURN_IF_ERROR(ValidateTransfer(request));
  if (options.max_sms < 0) {
    return Status::InvalidArgument(
        fmt::format("TransferOptions::max_sms = {} must not be negative", options.max_sms));
  }
  return DoTransfer(request, options);
}

Status TransferEngine::Synchronize(CudaStream) { return Status::OK(); }

const ConfigSchema<TransferEngineConfig>& TransferEngineConfigSchema() {
  using C = TransferEngineConfig;
  static const ConfigSchema<C> schema = [] {
    constexpr int64_t kMany = int64_t{1} << 20;
    ConfigSchema<C> s;
    s.push_back(IntField<C>("cpu_threads", Member(&C::cpu_threads), 0, 1024,
                            "cpu backend: copy threads for large requests; 0 = one per core"));
    s.push_back(IntField<C>("cpu_parallel_threshold_bytes",
                            Member(&C::cpu_parallel_threshold_bytes), 0,
                            "cpu backend: smaller requests run on the calling thread"));
    s.push_back(IntField<C>("max_sms", Member(&C::max_sms), 1, 1024,
                            "kernel backend: most SMs one copy occupies"));
    s.push_back(IntField<C>("max_sms_to_host", Member(&C::max_sms_to_host), 0, 1024,
                            "kernel backend: SMs of device -> host copies (backups), within "
                            "max_sms; 0 = max_sms"));
    s.push_back(IntField<C>("max_sms_beside_backup", Member(&C::max_sms_beside_backup), 0, 1024,
                            "kernel backend: SMs of host -> device copies (loads) while a backup "
                            "runs; 0 = off (max_sms)"));
    s.push_back(IntField<C>("device", Member(&C::device), 0, 1023,
                            "kernel / dma backends: CUDA device ordinal"));
    s.push_back(BoolField<C>("dma_batch", Member(&C::dma_batch),
                             "dma backend: batched submission (cudaMemcpyBatchAsync / 3DBatch) "
                             "where the driver offers it"));
    s.push_back(BoolField<C>("dma_join_kv", Member(&C::dma_join_kv),
                             "dma backend: K and V strided copies of a page as one depth-2 "
                             "operation"));
    s.push_back(BoolField<C>("dma_stride_layers", Member(&C::dma_stride_layers),
                             "dma backend: a run's layers as one strided copy per buffer "
                             "(base pointers on both sides); false: one plain copy per run, "
                             "layer and buffer"));
    s.push_back(BoolField<C>("dma_overlap_hint", Member(&C::dma_overlap_hint),
                             "dma backend: cudaMemcpyFlagPreferOverlapWithCompute on the strided "
                             "copies' batch"));
    s.push_back(ChoiceField<C>("dma_batch_split", Member(&C::dma_batch_split), kNumDmaBatchSplits,
                               DmaBatchSplitName,
                               "dma backend: single copies over batch calls: growing pieces, "
                               "whole (one call per lane), or whole_when_busy (whole when the "
                               "stream has work pending, else growing)"));
    s.push_back(IntField<C>("dma_first_batch_piece", Member(&C::dma_first_batch_piece), 1, kMany,
                            "dma backend: copies in the first of growing batch calls (each next "
                            "twice the one before)"));
    s.push_back(IntField<C>("dma_lanes", Member(&C::dma_lanes), 1, 16,
                            "dma backend: most streams one plan is split over"));
    s.push_back(IntField<C>("dma_ops_per_lane", Member(&C::dma_ops_per_lane), 16, kMany,
                            "dma backend: operations per lane before a plan is split"));
    s.push_back(BoolField<C>("dma_submit_threads", Member(&C::dma_submit_threads),
                             "dma backend: submit each lane from its own thread"));
    s.push_back(IntField<C>("dma_min_strided_rows", Member(&C::dma_min_strided_rows), 2, kMany,
                            "dma backend: fewest equal-width runs at a constant pitch sent as one "
                            "strided copy"));
    return s;
  }();
  return schema;
}

// No rule spans two fields: the bounds are the whole check.
Status TransferEngineConfig::Validate(const FieldNamer& name_of) const {
  return CheckFields(TransferEngineConfigSchema(), *this, name_of);
}

const char* DmaBatchSplitName(DmaBatchSplit split) {
  switch (split) {
    case DmaBatchSplit::kGrowing:
      return "growing";
    case DmaBatchSplit::kWhole:
      return "whole";
    case DmaBatchSplit::kWholeWhenBusy:
      return "whole_when_busy";
  }
  return "unknown_batch_split";
}

const char* TransferBackendName(TransferBackend backend) {
  switch (backend) {
    case TransferBackend::kCpu:
      return "cpu";
    case TransferBackend::kKernel:
      return "kernel";
    case TransferBackend::kDma:
      return "dma";
    case TransferBackend::kAuto:
      return "auto";
  }
  return "unknown_backend";
}

Result<TransferBackend> ParseTransferBackend(std::string_view name) {
  for (auto b : {TransferBackend::kCpu, TransferBackend::kKernel, TransferBackend::kDma,
                 TransferBackend::kAuto}) {
    if (name == TransferBackendName(b)) return b;
  }
  return Status::InvalidArgument("transfer backend '" + std::string(name) +
                                 "' is not one of cpu, kernel, dma, auto");
}

bool BuiltWithCuda() {
#if defined(KVTIER_WITH_CUDA)
  return true;
#else
  return false;
#endif
}

Result<std::unique_ptr<TransferEngine>> MakeTransferEngine(TransferBackend backend,
                                                           const TransferEngineConfig& config) {
  KVTIER_RETURN_IF_ERROR(config.Validate());
  switch (backend) {
    case TransferBackend::kCpu:
      return transfer::MakeCpuTransferEngine(config);
#if defined(KVTIER_WITH_CUDA)
    case TransferBackend::kKernel:
      return transfer::MakeKernelTransferEngine(config);
    case TransferBackend::kDma:
      return transfer::MakeDmaTransferEngine(config);
    case TransferBackend::kAuto:
      return transfer::MakeAutoTransferEngine(config);
#else
    case TransferBackend::kKernel:
    case TransferBackend::kDma:
    case TransferBackend::kAuto:
      return Status::Unavailable(
          fmt::format("transfer backend '{}' needs CUDA, and kvtier was built without it "
                      "(KVTIER_CUDA=OFF or no "
                      "nvcc)",
                      TransferBackendName(backend)));
#endif
  }
  return Status::InvalidArgument(
      fmt::format("unknown transfer backend {}", static_cast<int>(backend)));
}

}  // namespace kvtier
