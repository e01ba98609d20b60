// python/src/compat_binding.cc — `_kvtier.sgl_kernel`, `_kvtier.sgl_direct`: the bodies of
// kvtier.compat.sgl_kernel's functions (argument reading, checks, regions, backend choice) in
// C++, so that a call costs about what the copy's own submission costs. The Python functions
// keep SGLang's names and signatures and forward their arguments here unchanged.
//
// Regions are rebuilt on every call from the buffers' addresses and sizes (a few stores); what
// is costly to find out is cached: per-layer pointer tables that live on a GPU (read back once
// per tensor version, py_args.cc) and, per table contents and geometry, where the pointees live
// and how far their allocations reach (`TableInfo`, below). Every table entry is bounded by its
// CUDA allocation (device memory, pinned or registered host memory: AllocationBytesFrom in
// py_args.h), so an index past it is an InvalidArgument (host indices) or a skipped, reported
// pair (device indices); pageable host memory (every table in a build without CUDA too) is
// bounded by the run of this process's mappings that holds it (MappedBytesFrom in
// kvtier/host_memory.h: writable ones for a destination), so an index past it is an
// InvalidArgument rather than a crash, though it may reach other objects of the same mapping
// (malloc's heap). The extents are measured
// once per table contents: memory freed and allocated again, smaller, at the very same addresses
// while a table still names them is not noticed (PyTorch's caching allocator keeps its segments).
//
// Thread safety: REQUIRES the GIL except around the copy itself; the cache is guarded by it.
#include <fmt/format.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <limits>
#include <map>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "errors.h"
#include "kvtier/engine_stats.h"
#include "kvtier/host_memory.h"
#include "kvtier/layout.h"
#include "kvtier/transfer.h"
#include "py_args.h"
#include "transfer_binding.h"

namespace py = pybind11;

namespace kvtier::python {
namespace {

constexpr int64_t kMaxInt = std::numeric_limits<int32_t>::max();
constexpr int64_t kMaxItemBytes = int64_t{1} << 40;
// Slots assumed behind a pointer table whose allocations cannot be measured: as many as any real
// pool has, few enough that offsets stay far from overflow.
constexpr int64_t kUnboundedTableSlots = int64_t{1} << 31;

enum class Kernel : int {
  kPerLayer = 0,
  kPerLayerPfLf = 1,
  kPerLayerPhLf = 2,
  kAllLayer = 3,
  kAllLayerLfPf = 4,
  kAllLayerLfPh = 5,
};

enum class Direct : int { kDirect = 0, kPerLayerPfLf = 1, kAllLayerLfPf = 2 };

void* Ptr(uint64_t a) { return reinterpret_cast<void*>(static_cast<uintptr_t>(a)); }

std::string Where(int device) {
  return device == kHostDevice ? "host memory" : fmt::format("cuda:{}", device);
}

// One side of a copy: the region and the tables its spans point into.
struct Side {
  KvRegion region;
  std::vector<void*> k_layers;
  std::vector<void*> v_layers;
  bool table_on_gpu = false;  // the pointer table itself lives on a GPU
  // Set when the region claims more slots than its buffers hold rows (per-layer views described
  // by base pointers, below): indices must also be below this.
  int64_t index_bound = -1;

  int device() const { return region.memory == MemoryKind::kHost ? kHostDevice : region.device; }
  // Points the region's spans at the vectors; call once the Side is in its final place.
  const KvRegion& Get() {
    region.k_layers = std::span<void* const>(k_layers);
    region.v_layers = std::span<void* const>(v_layers);
    return region;
  }
};

void SetMemory(Side* side, int device) {
  side->region.memory = device == kHostDevice ? MemoryKind::kHost : MemoryKind::kDevice;
  side->region.device = device;
}

int64_t SlotsIn(const BufferArg& b, int64_t unit, std::string_view label, int64_t page_size) {
  int64_t n = b.nbytes / unit;
  n -= n % page_size;
  if (n <= 0) {
    ThrowInvalid(fmt::format("{} holds {} bytes, less than one {} of {} bytes", label, b.nbytes,
                             page_size > 1 ? "page" : "token", unit * page_size));
  }
  return n;
}

void CheckWritable(const BufferArg& b, std::string_view label) {
  if (b.readonly) ThrowInvalid(fmt::format("dst buffer {} is read-only", label));
}

// A region over K and V buffers (one buffer for MLA) holding as many slots as every buffer can.
Side BufferSide(py::handle k, py::handle v, bool mla, const std::string& role, KvLayout layout,
                int64_t num_layers, int64_t item, int64_t unit, int64_t page_size,
                int64_t head_num) {
  const std::string k_label = mla ? role : role + "_k";
  const std::string v_label = role + "_v";
  const BufferArg kb = ReadBuffer(k, k_label);
  int64_t num_slots = SlotsIn(kb, unit, k_label, page_size);
  BufferArg vb;
  if (!mla) {
    vb = ReadBuffer(v, v_label);
    num_slots = std::min(num_slots, SlotsIn(vb, unit, v_label, page_size));
    if (vb.device != kb.device) {
      ThrowInvalid(fmt::format("{} mixes memories: {} in {}, {} in {}", role, k_label,
                               Where(kb.device), v_label, Where(vb.device)));
    }
  }
  if (role == "dst") {
    CheckWritable(kb, k_label);
    if (!mla) CheckWritable(vb, v_label);
  }
  Side s;
  s.region.geometry = {layout, num_layers, num_slots, item, page_size, head_num};
  s.region.mla = mla;
  s.region.k = Ptr(kb.address);
  s.region.v = mla ? nullptr : Ptr(vb.address);
  SetMemory(&s, kb.device);
  return s;
}

// What is known about the pointees of a pair of tables: where they live and how many slots of
// `item` bytes every one of them can hold.
struct TableInfo {
  int device = kHostDevice;
  int64_t num_slots = kUnboundedTableSlots;
};

// (item, K table, V table, whether the tables are written: a destination's).
using TableKey = std::tuple<int64_t, std::vector<uint64_t>, std::vector<uint64_t>, bool>;
std::map<TableKey, TableInfo>& TableInfos() {
  static auto* cache = new std::map<TableKey, TableInfo>();
  return *cache;
}
constexpr size_t kTableInfoCapacity = 256;

TableInfo Measure(const std::vector<uint64_t>& k, const std::vector<uint64_t>& v,
                  const std::string& k_name, const std::string& v_name, int64_t item, bool on_gpu,
                  bool written) {
  if (on_gpu && !BuiltWithCuda()) {
    ThrowStatus(Status::Unavailable(fmt::format(
        "{} is a CUDA tensor, and kvtier was built without CUDA (KVTIER_CUDA=OFF)", k_name)));
  }
  TableInfo info;
  info.device = PointerDevice(k[0]);
  int64_t bound = -1;
  for (const auto* table : {&k, &v}) {
    const std::string& name = table == &k ? k_name : v_name;
    for (size_t i = 0; i < table->size(); ++i) {
      const int device = PointerDevice((*table)[i]);
      if (device != info.device) {
        ThrowInvalid(fmt::format("{}[{}] points into {} but {}[0] into {}", name, i, Where(device),
                                 k_name, Where(info.device)));
      }
      int64_t bytes = AllocationBytesFrom((*table)[i]);
      if (bytes < 0 && device == kHostDevice) {
        // Pageable host memory: bounded by the process's mappings (issue 36: an index past a
        // host table's memory crashed), writable ones for a destination.
        bytes = MappedBytesFrom(Ptr((*table)[i]), written);
        if (bytes < 0) {
          ThrowInvalid(
              fmt::format("{}[{}] = {:#x} points to memory that is not mapped{} in this "
                          "process",
                          name, i, (*table)[i], written ? " writable" : ""));
        }
      }
      if (bytes < 0) continue;
      if (bytes < item) {
        ThrowInvalid(
            fmt::format("{}[{}] lies {} bytes before the end of its allocation, less "
                        "than one item of {} bytes",
                        name, i, bytes, item));
      }
      bound = bound < 0 ? bytes / item : std::min(bound, bytes / item);
    }
  }
  if (bound > 0) info.num_slots = std::min(bound, kUnboundedTableSlots);
  return info;
}

// A layer_first region over per-layer pointer tables (v_table None: MLA).
Side TableSide(py::handle k_table, py::handle v_table, bool mla, const std::string& role,
               int64_t num_layers, int64_t item) {
  const std::string k_name = mla ? role + "_layers" : role + "_k_layers";
  const std::string v_name = role + "_v_layers";
  bool k_gpu = false, v_gpu = false;
  std::vector<uint64_t> k = ReadAddressTable(k_table, k_name, num_layers, &k_gpu);
  std::vector<uint64_t> v;
  if (!mla) v = ReadAddressTable(v_table, v_name, num_layers, &v_gpu);
  auto& cache = TableInfos();
  TableKey key{item, std::move(k), std::move(v), role == "dst"};
  auto it = cache.find(key);
  if (it == cache.end()) {
    TableInfo info = Measure(std::get<1>(key), std::get<2>(key), k_name, v_name, item,
                             k_gpu || v_gpu, std::get<3>(key));
    if (cache.size() >= kTableInfoCapacity) cache.clear();
    it = cache.emplace(key, info).first;
  }
  Side s;
  s.table_on_gpu = k_gpu || v_gpu;
  s.region.geometry = {KvLayout::kLayerFirst,
                       num_layers,
                       std::min(it->second.num_slots,
                                std::max<int64_t>(1, (int64_t{1} << 62) / (num_layers * item))),
                       item,
                       1,
                       1};
  s.region.mla = mla;
  for (uint64_t a : std::get<1>(key)) s.k_layers.push_back(Ptr(a));
  for (uint64_t a : std::get<2>(key)) s.v_layers.push_back(Ptr(a));
  SetMemory(&s, it->second.device);
  return s;
}

void CheckBound(const IndexArg& idx, int64_t bound, const char* name);

// Picks the backend (cpu when everything is in host memory), the device and PyTorch's current
// stream, and runs the requests: every request is validated before any of them moves a byte.
void Launch(std::vector<std::pair<Side*, Side*>> pairs, IndexArg si, IndexArg di, py::handle si_obj,
            py::handle di_obj, int64_t src_layer, int64_t dst_layer,
            std::vector<int64_t> num_layers, TransferBackend gpu_backend) {
  bool host_only = true;
  std::vector<std::pair<std::string, int>> placed;
  for (auto& [src, dst] : pairs) {
    host_only = host_only && src->device() == kHostDevice && dst->device() == kHostDevice &&
                !src->table_on_gpu && !dst->table_on_gpu;
    placed.emplace_back("src", src->device());
    placed.emplace_back("dst", dst->device());
  }
  TransferBackend backend = gpu_backend;
  if (host_only) {
    si = HostIndices(std::move(si), si_obj, "src_indices");
    di = HostIndices(std::move(di), di_obj, "dst_indices");
    backend = TransferBackend::kCpu;
  }
  placed.emplace_back("src_indices", si.device);
  placed.emplace_back("dst_indices", di.device);
  const int device = CommonDevice(placed);
  for (auto& [src, dst] : pairs) {
    CheckBound(si, src->index_bound, "src_indices");
    CheckBound(di, dst->index_bound, "dst_indices");
  }
  TransferOptions options;
  if (backend != TransferBackend::kCpu) options.stream = ResolveStreamArg(py::none(), device);
  std::vector<TransferRequest> requests;
  for (size_t i = 0; i < pairs.size(); ++i) {
    requests.push_back({&pairs[i].first->Get(), &pairs[i].second->Get(), si.Get(), di.Get(),
                        src_layer, dst_layer, num_layers[i]});
    if (pairs.size() > 1) ThrowIfError(RenameSlots(ValidateTransfer(requests.back())));
  }
  RunTransfers(backend, device == kHostDevice ? 0 : device, requests, options);
}

int64_t ItemSize(py::handle item_size) {
  const int64_t item = ReadInt(item_size, "item_size", 1, kMaxItemBytes);
  if (item % 4 != 0)
    ThrowInvalid(fmt::format("item_size = {} must be a multiple of 4 bytes", item));
  return item;
}

int64_t LayoutDim(py::handle value, const char* name, int64_t item) {
  const int64_t dim = ReadInt(value, name, 1, std::numeric_limits<int64_t>::max());
  if (dim % item != 0) {
    ThrowInvalid(
        fmt::format("{} = {} is not a multiple of item_size = {} (it is num_layers * "
                    "item_size)",
                    name, dim, item));
  }
  return dim;
}

std::pair<IndexArg, IndexArg> Indices(py::handle src_indices, py::handle dst_indices) {
  IndexArg si = ReadIndices(src_indices, "src_indices");
  IndexArg di = ReadIndices(dst_indices, "dst_indices");
  if (si.count != di.count) {
    ThrowInvalid(
        fmt::format("src_indices and dst_indices differ in length: {} vs {}", si.count, di.count));
  }
  return {std::move(si), std::move(di)};
}

void SglKernel(int kind_value, bool mla, py::handle src_k, py::handle dst_k, py::handle src_v,
               py::handle dst_v, py::handle src_indices, py::handle dst_indices,
               py::handle layer_id, py::handle item_size, py::handle layout_dim,
               py::handle num_layers, py::handle page_size, py::handle head_num) {
  const auto kind = static_cast<Kernel>(kind_value);
  const int64_t item = ItemSize(item_size);
  const bool per_layer =
      kind == Kernel::kPerLayer || kind == Kernel::kPerLayerPfLf || kind == Kernel::kPerLayerPhLf;
  int64_t dim = item;
  int64_t layers = 1;
  if (kind != Kernel::kPerLayer && kind != Kernel::kAllLayer) {
    dim = LayoutDim(layout_dim, per_layer ? "src_layout_dim" : "dst_layout_dim", item);
  }
  if (!per_layer) {
    layers = ReadInt(num_layers, "num_layers", 1, kMaxInt);
    if (kind != Kernel::kAllLayer && layers > dim / item) {
      ThrowInvalid(
          fmt::format("num_layers = {} exceeds the {} layers that dst_layout_dim "
                      "describes",
                      layers, dim / item));
    }
  }
  const int64_t layer = kind == Kernel::kPerLayerPfLf || kind == Kernel::kPerLayerPhLf
                            ? ReadInt(layer_id, "layer_id", 0, std::numeric_limits<int64_t>::max())
                            : 0;
  int64_t p = 1, h = 1;
  if (kind == Kernel::kPerLayerPhLf || kind == Kernel::kAllLayerLfPh) {
    p = ReadInt(page_size, "page_size", 1, kMaxInt);
    h = ReadInt(head_num, "head_num", 1, kMaxInt);
  }
  auto [si, di] = Indices(src_indices, dst_indices);
  Side src, dst;
  switch (kind) {
    case Kernel::kPerLayer:
      src = BufferSide(src_k, src_v, mla, "src", KvLayout::kLayerFirst, 1, item, item, 1, 1);
      break;
    case Kernel::kPerLayerPfLf:
      src = BufferSide(src_k, src_v, mla, "src", KvLayout::kPageFirst, dim / item, item, dim, 1, 1);
      break;
    case Kernel::kPerLayerPhLf:
      src = BufferSide(src_k, src_v, mla, "src", KvLayout::kPageHead, dim / item, item, dim, p, h);
      break;
    default:
      src = TableSide(src_k, src_v, mla, "src", layers, item);
  }
  switch (kind) {
    case Kernel::kAllLayer:
      dst = TableSide(dst_k, dst_v, mla, "dst", layers, item);
      break;
    case Kernel::kAllLayerLfPf:
      dst = BufferSide(dst_k, dst_v, mla, "dst", KvLayout::kPageFirst, dim / item, item, dim, 1, 1);
      break;
    case Kernel::kAllLayerLfPh:
      dst = BufferSide(dst_k, dst_v, mla, "dst", KvLayout::kPageHead, dim / item, item, dim, p, h);
      break;
    default:
      dst = BufferSide(dst_k, dst_v, mla, "dst", KvLayout::kLayerFirst, 1, item, item, 1, 1);
  }
  Launch({{&src, &dst}}, std::move(si), std::move(di), src_indices, dst_indices, layer, 0,
         {per_layer ? 1 : layers}, TransferBackend::kKernel);
}

// ---- direct functions ---------------------------------------------------------------------------

py::list AsList(py::handle value, const char* name) {
  if (!py::isinstance<py::list>(value) && !py::isinstance<py::tuple>(value)) {
    ThrowInvalid(
        fmt::format("{} must be a list of tensors, not {}", name, Py_TYPE(value.ptr())->tp_name));
  }
  py::list list(py::reinterpret_borrow<py::object>(value));
  if (list.empty()) ThrowInvalid(fmt::format("{} is empty", name));
  return list;
}

std::string ShapeOf(const BufferArg& b) {
  std::string s = "(";
  for (int i = 0; i < std::min(b.ndim, 3); ++i) s += (i ? ", " : "") + std::to_string(b.shape[i]);
  return s + (b.ndim > 3 ? ", ...)" : b.ndim == 1 ? ",)" : ")");
}

// Bytes of one token row of a per-layer tensor whose first dimension is the token.
int64_t RowBytes(const BufferArg& b, const std::string& name) {
  if (b.ndim == 0 || b.shape[0] <= 0) {
    ThrowInvalid(fmt::format("{} has shape {}; expected [tokens, ...]", name, ShapeOf(b)));
  }
  return b.nbytes / b.shape[0];
}

// The stride of n buffers that follow each other at one constant stride, a multiple of `row`
// and at least `bytes` (no overlap), inside one CUDA allocation where CUDA can tell (device
// or pinned memory); 0 otherwise.
int64_t ConstantStride(const std::vector<BufferArg>& bufs, size_t first, int64_t n, int64_t row,
                       int64_t bytes) {
  if (n < 2) return 0;
  const int64_t stride = static_cast<int64_t>(bufs[first + 1].address - bufs[first].address);
  if (bufs[first + 1].address <= bufs[first].address || stride % row != 0 || stride < bytes) {
    return 0;
  }
  for (int64_t j = 1; j < n; ++j) {
    if (bufs[first + static_cast<size_t>(j)].address != bufs[first].address + j * stride) return 0;
  }
  const int64_t reach = AllocationBytesFrom(bufs[first].address);
  if (reach >= 0 && reach < (n - 1) * stride + bytes) return 0;
  return stride;
}

// A layer_first region over per-layer buffers: k = bufs[first, first + n), v = the n after them
// (none for MLA). The buffers must share one memory; the region holds the rows all of them hold.
// Views of one allocation at a constant stride (a pool allocated [L, N, ...] and handed out per
// layer) are described by base pointers, with num_slots = stride / row: then the dma backend
// plans a run of slots across all layers as one strided copy instead of one copy per layer.
Side LayerListSide(const std::vector<BufferArg>& bufs, size_t first, int64_t n, bool mla,
                   int64_t row, const char* list_name, bool dst) {
  Side s;
  const int64_t count = mla ? n : 2 * n;
  int64_t num_slots = std::numeric_limits<int64_t>::max();
  for (int64_t j = 0; j < count; ++j) {
    const BufferArg& b = bufs[first + static_cast<size_t>(j)];
    const std::string name = fmt::format("{}[{}]", list_name, first + static_cast<size_t>(j));
    num_slots = std::min(num_slots, SlotsIn(b, row, name, 1));
    if (b.device != bufs[first].device) {
      ThrowInvalid(fmt::format("{} mixes memories: {}[{}] in {}, {} in {}", list_name, list_name,
                               first, Where(bufs[first].device), name, Where(b.device)));
    }
    if (dst) CheckWritable(b, name);
    (j < n ? s.k_layers : s.v_layers).push_back(Ptr(b.address));
  }
  s.region.geometry = {KvLayout::kLayerFirst, n, num_slots, row, 1, 1};
  s.region.mla = mla;
  SetMemory(&s, bufs[first].device);
  const int64_t bytes = num_slots * row;
  const int64_t k_stride = ConstantStride(bufs, first, n, row, bytes);
  const int64_t v_stride = mla ? k_stride : ConstantStride(bufs, first + n, n, row, bytes);
  if (k_stride > 0 && v_stride == k_stride) {
    s.region.k = s.k_layers[0];
    s.region.v = mla ? nullptr : s.v_layers[0];
    s.k_layers.clear();
    s.v_layers.clear();
    s.region.geometry.num_slots = k_stride / row;
    if (s.region.geometry.num_slots != num_slots) s.index_bound = num_slots;
  }
  return s;
}

void CheckBound(const IndexArg& idx, int64_t bound, const char* name) {
  if (bound < 0 || idx.device != kHostDevice) return;
  const SlotIndices s = idx.Get();
  for (int64_t k = 0; k < s.count; ++k) {
    const int64_t v = s.at(k);
    if (v < 0 || v >= bound) {
      ThrowInvalid(fmt::format("{}[{}] = {} is out of range [0, {})", name, k, v, bound));
    }
  }
}

std::vector<BufferArg> ReadList(const py::list& list, const char* name) {
  std::vector<BufferArg> out;
  out.reserve(list.size());
  for (size_t j = 0; j < list.size(); ++j) {
    out.push_back(ReadBuffer(list[j], fmt::format("{}[{}]", name, j)));
  }
  return out;
}

// A page_first_direct region over [K, V] (or [buffer]) of shape [pages, L, P, ...].
Side PageFirstDirectSide(const py::list& list, const char* name, int64_t page_size, bool dst) {
  const std::vector<BufferArg> bufs = ReadList(list, name);
  const BufferArg& first = bufs[0];
  if (first.ndim < 3) {
    ThrowInvalid(
        fmt::format("{}[0] has shape {}; a page_first_direct pool is [pages, layers, "
                    "page_size, ...]",
                    name, ShapeOf(first)));
  }
  const int64_t pages = first.shape[0], layers = first.shape[1], p = first.shape[2];
  if (p != page_size) {
    ThrowInvalid(
        fmt::format("page_size = {} does not match {}[0].shape[2] = {}", page_size, name, p));
  }
  for (size_t i = 1; i < bufs.size(); ++i) {
    if (bufs[i].ndim < 3 || bufs[i].shape != first.shape || bufs[i].nbytes != first.nbytes) {
      ThrowInvalid(fmt::format("{}[{}] has shape {} but {}[0] has {}", name, i, ShapeOf(bufs[i]),
                               name, ShapeOf(first)));
    }
    if (bufs[i].device != first.device) {
      ThrowInvalid(fmt::format("{} mixes memories: {}[0] in {}, {}[{}] in {}", name, name,
                               Where(first.device), name, i, Where(bufs[i].device)));
    }
  }
  if (pages * layers * p == 0 || first.nbytes % (pages * layers * p) != 0) {
    ThrowInvalid(
        fmt::format("{}[0] of shape {} does not split into whole tokens", name, ShapeOf(first)));
  }
  if (dst) {
    for (size_t i = 0; i < bufs.size(); ++i) CheckWritable(bufs[i], fmt::format("{}[{}]", name, i));
  }
  Side s;
  s.region.geometry = {KvLayout::kPageFirstDirect,          layers, pages * p,
                       first.nbytes / (pages * layers * p), p,      1};
  s.region.mla = bufs.size() == 1;
  s.region.k = Ptr(first.address);
  s.region.v = bufs.size() == 2 ? Ptr(bufs[1].address) : nullptr;
  SetMemory(&s, first.device);
  return s;
}

Side PerLayerSide(const py::list& list, const char* name, bool mla, bool dst) {
  if (!mla && list.size() % 2 != 0) {
    ThrowInvalid(
        fmt::format("{} has {} tensors; an MHA pool passes K layers then V layers (an "
                    "even count)",
                    name, list.size()));
  }
  const std::vector<BufferArg> bufs = ReadList(list, name);
  const int64_t n = static_cast<int64_t>(mla ? bufs.size() : bufs.size() / 2);
  return LayerListSide(bufs, 0, n, mla, RowBytes(bufs[0], fmt::format("{}[0]", name)), name, dst);
}

void SglDirect(int kind_value, py::handle src_list, py::handle dst_list, py::handle src_indices,
               py::handle dst_indices, py::handle layer_id, py::handle page_size) {
  const auto kind = static_cast<Direct>(kind_value);
  const bool layers_named = kind == Direct::kDirect;
  const char* src_name = layers_named ? "src_layers" : "src_ptrs";
  const char* dst_name = layers_named ? "dst_layers" : "dst_ptrs";
  const py::list src = AsList(src_list, src_name);
  const py::list dst = AsList(dst_list, dst_name);
  if (kind == Direct::kDirect && src.size() != dst.size()) {
    ThrowInvalid(
        fmt::format("src_layers has {} tensors but dst_layers has {}", src.size(), dst.size()));
  }
  if (kind == Direct::kPerLayerPfLf && src.size() != 1 && src.size() != 2) {
    ThrowInvalid(
        fmt::format("src_ptrs has {} tensors; expected [K, V] or [buffer] (MLA)", src.size()));
  }
  if (kind == Direct::kAllLayerLfPf && dst.size() != 1 && dst.size() != 2) {
    ThrowInvalid(
        fmt::format("dst_ptrs has {} tensors; expected [K, V] or [buffer] (MLA)", dst.size()));
  }
  const int64_t layer = kind == Direct::kPerLayerPfLf
                            ? ReadInt(layer_id, "layer_id", 0, std::numeric_limits<int64_t>::max())
                            : 0;
  const int64_t p = ReadInt(page_size, "page_size", 1, kMaxInt);
  auto [si, di] = Indices(src_indices, dst_indices);
  if (si.count % p != 0) {
    ThrowInvalid(
        fmt::format("src_indices has {} entries, not a multiple of page_size = {}", si.count, p));
  }
  // The copy engines are driven from the host: device indices come over first (as in SGLang).
  si = HostIndices(std::move(si), src_indices, "src_indices");
  di = HostIndices(std::move(di), dst_indices, "dst_indices");

  if (kind == Direct::kDirect) {
    // Consecutive tensors with equal row sizes form one request (one layer each).
    const std::vector<BufferArg> sb = ReadList(src, "src_layers");
    const std::vector<BufferArg> db = ReadList(dst, "dst_layers");
    std::vector<int64_t> rows;
    for (size_t j = 0; j < sb.size(); ++j) {
      const int64_t s_row = RowBytes(sb[j], fmt::format("src_layers[{}]", j));
      const int64_t d_row = RowBytes(db[j], fmt::format("dst_layers[{}]", j));
      if (s_row != d_row) {
        ThrowInvalid(
            fmt::format("src_layers[{}] has {}-byte rows but dst_layers[{}] has {}-byte "
                        "rows",
                        j, s_row, j, d_row));
      }
      rows.push_back(s_row);
    }
    std::vector<Side> sides;  // src, dst, src, dst, ...
    std::vector<int64_t> counts;
    sides.reserve(2 * sb.size());
    for (size_t start = 0; start < sb.size();) {
      size_t end = start + 1;
      while (end < sb.size() && rows[end] == rows[start]) ++end;
      const auto n = static_cast<int64_t>(end - start);
      sides.push_back(LayerListSide(sb, start, n, true, rows[start], "src_layers", false));
      sides.push_back(LayerListSide(db, start, n, true, rows[start], "dst_layers", true));
      counts.push_back(n);
      start = end;
    }
    std::vector<std::pair<Side*, Side*>> pairs;
    for (size_t i = 0; i < sides.size(); i += 2) pairs.emplace_back(&sides[i], &sides[i + 1]);
    Launch(std::move(pairs), std::move(si), std::move(di), src_indices, dst_indices, 0, 0,
           std::move(counts), TransferBackend::kDma);
    return;
  }
  Side s, d;
  if (kind == Direct::kPerLayerPfLf) {
    s = PageFirstDirectSide(src, "src_ptrs", p, false);
    d = PerLayerSide(dst, "dst_ptrs", src.size() == 1, true);
  } else {
    s = PerLayerSide(src, "src_ptrs", dst.size() == 1, false);
    d = PageFirstDirectSide(dst, "dst_ptrs", p, true);
  }
  const int64_t layers =
      kind == Direct::kPerLayerPfLf ? d.region.geometry.num_layers : s.region.geometry.num_layers;
  Launch({{&s, &d}}, std::move(si), std::move(di), src_indices, dst_indices, layer, 0, {layers},
         TransferBackend::kDma);
}

// What the dma engine of `device` did in this thread's last direct call (engine_stats.h), for
// python/bench/sglang_kernels.py; None in a build without CUDA or before the engine exists.
py::object LastDirectStats(int device) {
  const Result<std::shared_ptr<TransferEngine>> engine = GetEngine(TransferBackend::kDma, device);
  if (!engine.ok()) return py::none();
  const testing::GpuTransferStats* st = testing::LastTransferStats(**engine);
  if (st == nullptr) return py::none();
  py::dict d;
  d["copy_ops"] = st->copy_ops;
  d["batch_calls"] = st->batch_calls;
  d["copies_2d"] = st->copies_2d;
  d["lanes"] = st->lanes;
  d["kv_merged"] = st->kv_merged;
  d["whole_batch"] = st->whole_batch;
  return d;
}

}  // namespace

void RegisterCompat(py::module_& m) {
  m.def("sgl_kernel", &SglKernel,
        "The body of kvtier.compat.sgl_kernel's kernel functions: (kind, mla, src_k, dst_k, "
        "src_v, dst_v, src_indices, dst_indices, layer_id, item_size, layout_dim, num_layers, "
        "page_size, head_num).");
  m.def("sgl_direct", &SglDirect,
        "The body of kvtier.compat.sgl_kernel's direct functions: (kind, src, dst, src_indices, "
        "dst_indices, layer_id, page_size).");
  m.def("sgl_direct_last_stats", &LastDirectStats, py::arg("device") = 0,
        "What the dma engine of `device` did in this thread's last call (copy_ops, batch_calls, "
        "copies_2d, lanes, kv_merged, whole_batch), or None without CUDA: a diagnostic for the "
        "benches.");
}

}  // namespace kvtier::python
