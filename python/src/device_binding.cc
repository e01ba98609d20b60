// python/src/device_binding.cc — kvtier.LayerEvents, kvtier.PinnedRegistration and
// _kvtier.pointer_info.
//
// kvtier/device.h compiles in every build; without CUDA its factories answer Unavailable, which
// surfaces here as kvtier.UnavailableError, so these classes exist in every build and say why
// they cannot be created when CUDA is missing. pointer_info (cudaPointerGetAttributes) exists in
// CUDA builds only.
//
// Thread safety: as kvtier/device.h — one object may be used from several threads as long as a
// layer's Record does not race with Wait/Query/Synchronize of the same layer. Blocking calls
// release the GIL.
#include <fmt/format.h>
#include <pybind11/pybind11.h>

#include <cstdint>
#include <utility>

#if defined(KVTIER_PY_WITH_CUDA)
#include <cuda_runtime_api.h>
#endif

#include "errors.h"
#include "kvtier/device.h"
#include "transfer_binding.h"

namespace py = pybind11;

namespace kvtier::python {
namespace {

struct PyLayerEvents {
  LayerEvents events;
  int device = 0;
};

struct PyPinnedRegistration {
  PinnedRegistration registration;
  py::object buffer;  // keeps the registered memory alive
};

// The stream address for `stream` (None: PyTorch's current stream of `device` when torch is
// imported, else the legacy default stream) — the rule kvtier.ops uses.
CudaStream ResolveStream(const py::object& stream, int device) {
  const auto address = py::module_::import("kvtier._buffers")
                           .attr("resolve_stream")(stream, device)
                           .cast<uint64_t>();
  return reinterpret_cast<CudaStream>(static_cast<uintptr_t>(address));
}

}  // namespace

LayerEvents* CastLayerEvents(py::handle h) {
  if (!py::isinstance<PyLayerEvents>(h)) {
    ThrowStatus(Status::InvalidArgument(
        fmt::format("layer_events must be a kvtier.LayerEvents, not {}",
                    py::str(py::type::handle_of(h).attr("__name__")).cast<std::string>())));
  }
  return &h.cast<PyLayerEvents&>().events;
}

namespace {

// kvtier.LayerEvents: one reusable CUDA event per layer of a multi-layer copy.
void RegisterLayerEvents(py::module_& m) {
  py::class_<PyLayerEvents>(m, "LayerEvents", R"doc(
One reusable CUDA event per layer of a multi-layer copy. Pass it as `layer_events=` to a GPU
transfer (kvtier.ops.transfer / transfer_all_layers): event k is recorded on the copy's stream once
layer k of the request is in place. A consumer then calls wait(k) to make its stream wait on the
device (no host blocking) before using layer k. Needs kvtier built with CUDA.)doc")
      .def(py::init([](int num_layers, int device) {
             if (num_layers <= 0) {
               ThrowStatus(Status::InvalidArgument(
                   fmt::format("num_layers = {} must be positive", num_layers)));
             }
             if (device < 0) {
               ThrowStatus(Status::InvalidArgument(
                   fmt::format("device = {} must not be negative", device)));
             }
             auto e = std::make_unique<PyLayerEvents>();
             e->events = Unwrap(LayerEvents::Create(num_layers, device));
             e->device = device;
             return e;
           }),
           py::arg("num_layers"), py::arg("device") = 0)
      .def("__len__", [](const PyLayerEvents& e) { return e.events.size(); })
      .def_property_readonly("device", [](const PyLayerEvents& e) { return e.device; })
      .def(
          "wait",
          [](const PyLayerEvents& e, int layer, py::object stream) {
            const CudaStream s = ResolveStream(stream, e.device);
            ThrowIfError(e.events.Wait(layer, s));
          },
          py::arg("layer"), py::arg("stream") = py::none(),
          "Makes `stream` (default: PyTorch's current stream, else the legacy default stream) "
          "wait on the device until layer `layer` is in place. Does not block the host.")
      .def(
          "record",
          [](PyLayerEvents& e, int layer, py::object stream) {
            const CudaStream s = ResolveStream(stream, e.device);
            ThrowIfError(e.events.Record(layer, s));
          },
          py::arg("layer"), py::arg("stream") = py::none(),
          "Records layer `layer`'s event on `stream` (transfers do this themselves).")
      .def(
          "synchronize",
          [](const PyLayerEvents& e, int layer) {
            Status status;
            {
              py::gil_scoped_release release;
              status = e.events.Synchronize(layer);
            }
            ThrowIfError(status);
          },
          py::arg("layer"), "Blocks the host until layer `layer` is in place.")
      .def(
          "query", [](const PyLayerEvents& e, int layer) { return Unwrap(e.events.Query(layer)); },
          py::arg("layer"), "True once layer `layer` is in place (or was never recorded).")
      .def(
          "event_handle",
          [](const PyLayerEvents& e, int layer) {
            if (layer < 0 || layer >= e.events.size()) {
              ThrowStatus(Status::InvalidArgument(
                  fmt::format("layer = {} is out of range [0, {})", layer, e.events.size())));
            }
            return reinterpret_cast<uintptr_t>(e.events.event(layer));
          },
          py::arg("layer"), "The raw cudaEvent_t of layer `layer`, as an integer.");
}

// kvtier.PinnedRegistration: an existing host buffer page-locked while the object lives.
void RegisterPinnedRegistration(py::module_& m) {
  py::class_<PyPinnedRegistration>(m, "PinnedRegistration", R"doc(
Page-locks an existing host buffer (cudaHostRegister) while the object lives, so the kernel
backend can read and write it; close() (or leaving a `with` block) unregisters it. The object keeps
the buffer alive. Needs kvtier built with CUDA.)doc")
      .def(py::init([](py::object buffer) {
             const py::tuple info =
                 py::module_::import("kvtier._buffers").attr("describe_buffer")(buffer, "buffer");
             const auto address = info[0].cast<uint64_t>();
             const auto nbytes = info[1].cast<int64_t>();
             if (info[2].cast<int>() != -1) {
               ThrowStatus(
                   Status::InvalidArgument("buffer is device memory; only host memory "
                                           "can be pinned"));
             }
             auto r = std::make_unique<PyPinnedRegistration>();
             r->registration = Unwrap(PinnedRegistration::Register(
                 reinterpret_cast<void*>(static_cast<uintptr_t>(address)), nbytes));
             r->buffer = std::move(buffer);
             return r;
           }),
           py::arg("buffer"))
      .def_property_readonly("nbytes",
                             [](const PyPinnedRegistration& r) { return r.registration.bytes(); })
      .def("close",
           [](PyPinnedRegistration& r) {
             r.registration = PinnedRegistration();
             r.buffer = py::none();
           })
      .def("__enter__", [](py::object self) { return self; })
      .def("__exit__", [](PyPinnedRegistration& r, py::args) {
        r.registration = PinnedRegistration();
        r.buffer = py::none();
        return false;
      });
}

}  // namespace

void RegisterDevice(py::module_& m) {
  m.def("cuda_device_count", &CudaDeviceCount,
        "CUDA devices visible to kvtier (0 without CUDA, a driver or a GPU).");

  RegisterLayerEvents(m);
  RegisterPinnedRegistration(m);

#if defined(KVTIER_PY_WITH_CUDA)
  m.def(
      "pointer_info",
      [](uint64_t address) -> py::tuple {
        cudaPointerAttributes attr{};
        const cudaError_t e = cudaPointerGetAttributes(
            &attr, reinterpret_cast<const void*>(static_cast<uintptr_t>(address)));
        if (e != cudaSuccess) {
          (void)cudaGetLastError();  // clear the sticky-free error state of this call
          return py::make_tuple("host", -1);
        }
        if (attr.type == cudaMemoryTypeDevice || attr.type == cudaMemoryTypeManaged) {
          return py::make_tuple("device", attr.device);
        }
        return py::make_tuple("host", -1);
      },
      py::arg("address"),
      "('device', ordinal) for CUDA device or managed memory, ('host', -1) otherwise.");
#endif
}

}  // namespace kvtier::python
