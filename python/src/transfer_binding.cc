// python/src/transfer_binding.cc — `_kvtier.Region`, `_kvtier.Indices`, `_kvtier.transfer`,
// `_kvtier.transfer_objects` and the engine registry.
//
// kvtier.ops.KvRegion describes its buffers once, in Python (kvtier/_buffers.py), and keeps a
// `Region`. A copy (`transfer_objects`) reads its per-call arguments here in C++ (py_args.h):
// the index lists, integers, stream and backend, checks that the destination's buffers are still
// writable, builds the C++ request, picks a cached TransferEngine for (backend, device) and runs
// it with the GIL released. Every Status becomes a Python exception (errors.h).
//
// Thread safety: engines are shared between Python threads (TransferEngine is thread-safe); the
// registry is guarded by a mutex and hands out shared_ptr so reconfiguring never frees an engine a
// call is still using.
#include "transfer_binding.h"

#include <fmt/format.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>
#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "cache_config_table.h"
#include "errors.h"
#include "kvtier/layout.h"
#include "kvtier/transfer.h"
#include "py_args.h"

namespace py = pybind11;

namespace kvtier::python {
namespace {

void* AsPointer(uint64_t address) {
  return reinterpret_cast<void*>(static_cast<uintptr_t>(address));
}

Result<MemoryKind> ParseMemory(std::string_view name, std::string_view what) {
  if (name == "host") return MemoryKind::kHost;
  if (name == "device") return MemoryKind::kDevice;
  return Status::InvalidArgument(fmt::format("{} = '{}' is not 'host' or 'device'", what, name));
}

// Transfer engines, one per (backend, CUDA device), created on first use.
class EngineRegistry {
 public:
  Result<std::shared_ptr<TransferEngine>> Get(TransferBackend backend, int device) {
    std::lock_guard<std::mutex> lock(mu_);
    auto key = std::make_pair(backend, backend == TransferBackend::kCpu ? 0 : device);
    auto it = engines_.find(key);
    if (it != engines_.end()) return it->second;
    TransferEngineConfig config = config_;
    config.device = key.second;
    KVTIER_ASSIGN_OR_RETURN(std::unique_ptr<TransferEngine> engine,
                            MakeTransferEngine(backend, config));
    std::shared_ptr<TransferEngine> shared(std::move(engine));
    engines_.emplace(key, shared);
    return shared;
  }

  // Replaces the configuration; engines made under the old one are dropped (calls in flight keep
  // theirs alive until they return).
  Status Configure(const TransferEngineConfig& config) {
    KVTIER_RETURN_IF_ERROR(config.Validate());
    std::lock_guard<std::mutex> lock(mu_);
    config_ = config;
    engines_.clear();
    return Status::OK();
  }

  TransferEngineConfig config() {
    std::lock_guard<std::mutex> lock(mu_);
    return config_;
  }

 private:
  std::mutex mu_;
  TransferEngineConfig config_;
  std::map<std::pair<TransferBackend, int>, std::shared_ptr<TransferEngine>> engines_;
};

EngineRegistry& Engines() {
  // Never destroyed: GPU engines must not be torn down after the CUDA runtime at process exit.
  static EngineRegistry* registry = new EngineRegistry();
  return *registry;
}

std::string ReplaceAll(std::string_view s, std::string_view from, std::string_view to) {
  std::string out;
  size_t begin = 0;
  for (size_t at = s.find(from); at != std::string_view::npos; at = s.find(from, begin)) {
    out.append(s.substr(begin, at - begin)).append(to);
    begin = at + from.size();
  }
  return out.append(s.substr(begin));
}

// kvtier.ops.transfer after its type checks: everything else is read and checked here.
void TransferObjects(const PyRegion& src, const PyRegion& dst, py::handle src_indices,
                     py::handle dst_indices, py::handle src_layer_arg, py::handle dst_layer_arg,
                     py::handle num_layers_arg, const std::string& backend_name, py::handle stream,
                     py::handle layer_events, py::handle max_sms_arg,
                     LayerEventsCaster layer_events_caster) {
  for (size_t i = 0; i < dst.buffers.size(); ++i) {
    if (IsReadOnly(dst.buffers[i])) {
      ThrowInvalid(fmt::format("dst buffer {} is read-only", dst.labels[i]));
    }
  }
  auto backend_or = ParseTransferBackend(backend_name);
  if (!backend_or.ok()) {
    ThrowInvalid(fmt::format("backend = '{}' is not one of cpu, kernel, dma, auto", backend_name));
  }
  TransferBackend backend = *backend_or;
  constexpr int64_t kMin = std::numeric_limits<int64_t>::min();
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  const int64_t src_layer = ReadInt(src_layer_arg, "src_layer", kMin, kMax);
  const int64_t dst_layer = ReadInt(dst_layer_arg, "dst_layer", kMin, kMax);
  const int64_t num_layers = ReadInt(num_layers_arg, "num_layers", kMin, kMax);
  TransferOptions options;
  options.max_sms =
      static_cast<int>(ReadInt(max_sms_arg, "max_sms", 0, std::numeric_limits<int32_t>::max()));
  IndexArg si = ReadIndices(src_indices, "src_indices");
  IndexArg di = ReadIndices(dst_indices, "dst_indices");

  auto device_of = [](const PyRegion& r) {
    return r.region.memory == MemoryKind::kHost ? kHostDevice : r.region.device;
  };
  const std::pair<std::string, int> placed[] = {{"src", device_of(src)},
                                                {"dst", device_of(dst)},
                                                {"src_indices", si.device},
                                                {"dst_indices", di.device}};
  const int device = CommonDevice(placed);
  if (backend == TransferBackend::kAuto && device == kHostDevice && layer_events.is_none()) {
    backend = TransferBackend::kCpu;
  }
  if (backend == TransferBackend::kCpu) {
    for (const auto& [name, d] : placed) {
      if (d != kHostDevice) {
        ThrowInvalid(
            fmt::format("backend='cpu' copies host memory only, but {} is on cuda:{}", name, d));
      }
    }
  } else {
    options.stream = ResolveStreamArg(stream, device);
  }
  if (!layer_events.is_none()) {
    if (layer_events_caster == nullptr) {
      ThrowStatus(Status::Unavailable("layer_events needs CUDA, and kvtier was built without it"));
    }
    options.layer_events = layer_events_caster(layer_events);
  }
  const KvRegion s = src.Get();
  const KvRegion d = dst.Get();
  RunTransfers(backend, device == kHostDevice ? 0 : device,
               {TransferRequest{&s, &d, si.Get(), di.Get(), src_layer, dst_layer, num_layers}},
               options);
}

}  // namespace

Status RenameSlots(const Status& status) {
  if (status.ok()) return status;
  std::string message = ReplaceAll(status.message(), "src_slots", "src_indices");
  message = ReplaceAll(std::move(message), "dst_slots", "dst_indices");
  return Status(status.code(), std::move(message));
}

namespace {
thread_local double g_last_engine_us = 0;  // see last_engine_us
}  // namespace

void RunTransfers(TransferBackend backend, int device, const std::vector<TransferRequest>& requests,
                  const TransferOptions& options) {
  std::shared_ptr<TransferEngine> engine = Unwrap(GetEngine(backend, device));
  Status status;
  {
    py::gil_scoped_release release;
    const auto t0 = std::chrono::steady_clock::now();
    for (const TransferRequest& request : requests) {
      status = engine->Transfer(request, options);
      if (!status.ok()) break;
    }
    g_last_engine_us =
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
  }
  ThrowIfError(RenameSlots(status));
}

Result<std::shared_ptr<TransferEngine>> GetEngine(TransferBackend backend, int device) {
  return Engines().Get(backend, device);
}

KvRegion PyRegion::Get() const {
  KvRegion r = region;
  r.k_layers = std::span<void* const>(k_layers);
  r.v_layers = std::span<void* const>(v_layers);
  return r;
}

SlotIndices PyIndices::Get() const {
  SlotIndices s;
  s.data = AsPointer(address);
  s.count = count;
  s.type = int64 ? IndexType::kInt64 : IndexType::kInt32;
  s.memory = device ? MemoryKind::kDevice : MemoryKind::kHost;
  return s;
}

namespace {

// kvtier.Region (a region as the C++ core sees it) and kvtier.Indices (slot indices as raw
// memory).
void RegisterRegionClasses(py::module_& m) {
  py::class_<PyRegion>(m, "Region", R"doc(
A KV region as the C++ core sees it: geometry, residency and raw addresses. Build regions with
kvtier.ops.region(), which checks buffer sizes; this class does not (it cannot see the buffers).)doc")
      .def(py::init([](const std::string& layout, int64_t num_layers, int64_t num_slots,
                       int64_t slot_bytes, int64_t page_size, int64_t head_num, bool mla,
                       const std::string& memory, int device, uint64_t k, uint64_t v,
                       const std::vector<uint64_t>& k_layers, const std::vector<uint64_t>& v_layers,
                       const std::string& name) {
             auto r = std::make_unique<PyRegion>();
             r->region.geometry.layout = Unwrap(ParseLayout(layout));
             r->region.geometry.num_layers = num_layers;
             r->region.geometry.num_slots = num_slots;
             r->region.geometry.slot_bytes = slot_bytes;
             r->region.geometry.page_size = page_size;
             r->region.geometry.head_num = head_num;
             r->region.mla = mla;
             r->region.memory = Unwrap(ParseMemory(memory, "memory"));
             r->region.device = device;
             r->region.k = AsPointer(k);
             r->region.v = AsPointer(v);
             for (uint64_t a : k_layers) r->k_layers.push_back(AsPointer(a));
             for (uint64_t a : v_layers) r->v_layers.push_back(AsPointer(a));
             ThrowIfError(r->Get().Validate(name));
             return r;
           }),
           py::kw_only(), py::arg("layout"), py::arg("num_layers"), py::arg("num_slots"),
           py::arg("slot_bytes"), py::arg("page_size") = 1, py::arg("head_num") = 1,
           py::arg("mla") = false, py::arg("memory") = "host", py::arg("device") = -1,
           py::arg("k") = 0, py::arg("v") = 0, py::arg("k_layers") = std::vector<uint64_t>{},
           py::arg("v_layers") = std::vector<uint64_t>{}, py::arg("name") = "region")
      .def_property_readonly("layout",
                             [](const PyRegion& r) { return LayoutName(r.region.geometry.layout); })
      .def_property_readonly("num_layers",
                             [](const PyRegion& r) { return r.region.geometry.num_layers; })
      .def_property_readonly("num_slots",
                             [](const PyRegion& r) { return r.region.geometry.num_slots; })
      .def_property_readonly("slot_bytes",
                             [](const PyRegion& r) { return r.region.geometry.slot_bytes; })
      .def_property_readonly("page_size",
                             [](const PyRegion& r) { return r.region.geometry.page_size; })
      .def_property_readonly("head_num",
                             [](const PyRegion& r) { return r.region.geometry.head_num; })
      .def_property_readonly("mla", [](const PyRegion& r) { return r.region.mla; })
      .def_property_readonly("memory",
                             [](const PyRegion& r) { return MemoryKindName(r.region.memory); })
      .def_property_readonly("device", [](const PyRegion& r) { return r.region.device; })
      .def_property_readonly("buffer_bytes",
                             [](const PyRegion& r) { return r.region.geometry.buffer_bytes(); })
      .def(
          "_watch",
          [](PyRegion& r, std::vector<py::object> buffers, std::vector<std::string> labels) {
            if (buffers.size() != labels.size()) {
              ThrowInvalid("_watch: buffers and labels differ in length");
            }
            r.buffers = std::move(buffers);
            r.labels = std::move(labels);
          },
          py::arg("buffers"), py::arg("labels"),
          "The buffers under the region and their names; a copy into the region checks that "
          "they are still writable.")
      .def("__repr__", [](const PyRegion& r) {
        const KvGeometry& g = r.region.geometry;
        return fmt::format(
            "Region(layout={}, num_layers={}, num_slots={}, slot_bytes={}, page_size={}, "
            "head_num={}, mla={}, memory={}{})",
            LayoutName(g.layout), g.num_layers, g.num_slots, g.slot_bytes, g.page_size, g.head_num,
            r.region.mla ? "True" : "False", MemoryKindName(r.region.memory),
            r.k_layers.empty() ? "" : ", per-layer tables");
      });

  py::class_<PyIndices>(m, "Indices", "A list of slot indices as raw memory (see kvtier.ops).")
      .def(py::init([](uint64_t address, int64_t count, bool int64, bool device) {
             return PyIndices{address, count, int64, device};
           }),
           py::arg("address"), py::arg("count"), py::arg("int64"), py::arg("device"))
      .def_readonly("address", &PyIndices::address)
      .def_readonly("count", &PyIndices::count)
      .def_readonly("int64", &PyIndices::int64)
      .def_readonly("device", &PyIndices::device);
}

// The copies: transfer (raw arguments), transfer_objects (kvtier.ops.transfer's body) and
// synchronize.
void RegisterTransferCalls(py::module_& m, LayerEventsCaster layer_events_caster) {
  m.def(
      "transfer",
      [layer_events_caster](const PyRegion& src, const PyRegion& dst, const PyIndices& src_indices,
                            const PyIndices& dst_indices, int64_t src_layer, int64_t dst_layer,
                            int64_t num_layers, const std::string& backend_name, uint64_t stream,
                            int device, py::object layer_events, int max_sms) {
        const TransferBackend backend = Unwrap(ParseTransferBackend(backend_name));
        TransferOptions options;
        options.stream = reinterpret_cast<CudaStream>(static_cast<uintptr_t>(stream));
        options.max_sms = max_sms;
        if (!layer_events.is_none()) {
          if (layer_events_caster == nullptr) {
            ThrowStatus(
                Status::Unavailable("layer_events needs CUDA, and kvtier was built without it"));
          }
          options.layer_events = layer_events_caster(layer_events);
        }
        std::shared_ptr<TransferEngine> engine = Unwrap(GetEngine(backend, device));
        const KvRegion s = src.Get();
        const KvRegion d = dst.Get();
        TransferRequest request{&s,        &d,        src_indices.Get(), dst_indices.Get(),
                                src_layer, dst_layer, num_layers};
        Status status;
        {
          py::gil_scoped_release release;
          status = engine->Transfer(request, options);
        }
        ThrowIfError(status);
      },
      py::arg("src"), py::arg("dst"), py::arg("src_indices"), py::arg("dst_indices"), py::kw_only(),
      py::arg("src_layer") = 0, py::arg("dst_layer") = 0, py::arg("num_layers") = 1,
      py::arg("backend") = "cpu", py::arg("stream") = 0, py::arg("device") = 0,
      py::arg("layer_events") = py::none(), py::arg("max_sms") = 0,
      R"doc(Copies layers [src_layer, src_layer + num_layers) of the slots src_indices of src to
layers [dst_layer, ...) of the slots dst_indices of dst with the named backend (cpu, kernel, dma,
auto) on CUDA stream `stream` (an address; 0 = the legacy default stream) of CUDA device `device`.
max_sms: at most this many SMs for the kernel backend (0 = the engine's default).
GPU backends return once the copy is enqueued; cpu once the bytes are in place.)doc");

  m.def(
      "transfer_objects",
      [layer_events_caster](const PyRegion& src, const PyRegion& dst, py::handle src_indices,
                            py::handle dst_indices, py::handle src_layer, py::handle dst_layer,
                            py::handle num_layers, const std::string& backend, py::handle stream,
                            py::handle layer_events, py::handle max_sms) {
        TransferObjects(src, dst, src_indices, dst_indices, src_layer, dst_layer, num_layers,
                        backend, stream, layer_events, max_sms, layer_events_caster);
      },
      "kvtier.ops.transfer's body: (src, dst, src_indices, dst_indices, src_layer, dst_layer, "
      "num_layers, backend, stream, layer_events, max_sms); indices as numpy / torch / CUDA "
      "arrays or lists of ints.");

  m.def(
      "synchronize",
      [](const std::string& backend_name, uint64_t stream, int device) {
        const TransferBackend backend = Unwrap(ParseTransferBackend(backend_name));
        std::shared_ptr<TransferEngine> engine = Unwrap(GetEngine(backend, device));
        Status status;
        {
          py::gil_scoped_release release;
          status =
              engine->Synchronize(reinterpret_cast<CudaStream>(static_cast<uintptr_t>(stream)));
        }
        ThrowIfError(status);
      },
      py::arg("backend"), py::arg("stream") = 0, py::arg("device") = 0,
      "Waits for the backend's copies on `stream` and raises the first deferred device error "
      "(for example an out-of-range device index that a kernel skipped).");
}

// The settings of kvtier.ops's engines and what they report.
void RegisterEngineSettings(py::module_& m) {
  m.def(
      "configure",
      [](py::kwargs settings) {
        ThrowIfError(Engines().Configure(TransferConfigFromDict(Engines().config(), settings)));
      },
      "Sets fields of the configuration of the transfer engines kvtier.ops uses (the others keep "
      "their value; the engines are re-created): any field of transfer_config_fields().");

  m.def("transfer_config_fields", &TransferConfigTable,
        "The kvtier.ops engine settings: [{name, kind, default, min, max, min_exclusive, "
        "choices, help}], read from the C++ TransferEngineConfig schema.");

  m.def("engine_config", []() { return TransferConfigValues(Engines().config()); });

  m.def(
      "last_engine_us", []() { return g_last_engine_us; },
      "Microseconds the last transfer call of this thread spent inside the C++ engine "
      "(TransferEngine::Transfer); the rest of the call's time is argument handling. For "
      "benchmarks (python/bench/).");

  m.def("built_with_cuda", &BuiltWithCuda, "True when kvtier was built with the CUDA backends.");
}

}  // namespace

void RegisterTransfer(py::module_& m, LayerEventsCaster layer_events_caster) {
  RegisterRegionClasses(m);
  RegisterTransferCalls(m, layer_events_caster);
  RegisterEngineSettings(m);
}

}  // namespace kvtier::python
