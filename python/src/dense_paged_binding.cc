// python/src/dense_paged_binding.cc — `_kvtier.dense_paged` and `_kvtier.dense_paged_errors`, the
// native half of kvtier.ops.scatter_dense / gather_dense (kvtier/dense_paged.h).
//
// The dense tensors are described by the Python layer (kvtier/ops.py reads address, shape and
// byte strides of torch tensors and numpy arrays once per call) and arrive as lists of
// (address, batch_stride, head_stride, seq_stride, dim_stride) per layer; the slot list is read
// here (py_args.h). The copy runs with the GIL released.
//
// `_kvtier.DensePagedPlan` is the same copy prepared once for a request whose slots and dense
// tensors stay put (kvtier.ops.DensePagedPlan): its arguments are read and checked at
// construction and each run(first, count, ...) is one native call over a range of its layers,
// without reading a Python object again (an engine's per-layer gathers cost a few microseconds).
//
// Thread safety: dense_paged is stateless; a DensePagedPlan may be run from several threads (it
// is immutable after construction), but runs that write the same bytes must not overlap.
#include <fmt/format.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <tuple>
#include <vector>

#include "errors.h"
#include "kvtier/dense_paged.h"
#include "py_args.h"
#include "transfer_binding.h"

namespace py = pybind11;

namespace kvtier::python {
namespace {

using TensorArg = std::tuple<uint64_t, int64_t, int64_t, int64_t, int64_t>;

std::vector<DenseTensor> Tensors(const std::vector<TensorArg>& args) {
  std::vector<DenseTensor> out;
  out.reserve(args.size());
  for (const auto& [address, sb, sh, st, sd] : args) {
    out.push_back({reinterpret_cast<void*>(static_cast<uintptr_t>(address)), {sb, sh, st, sd}});
  }
  return out;
}

using Shape = std::tuple<int64_t, int64_t, int64_t, int64_t>;

DenseKv MakeDense(const Shape& shape, int64_t elem_bytes, int device) {
  DenseKv dense;
  std::tie(dense.batch, dense.heads, dense.seq, dense.head_dim) = shape;
  dense.elem_bytes = elem_bytes;
  dense.memory = device == kHostDevice ? MemoryKind::kHost : MemoryKind::kDevice;
  dense.device = device;
  return dense;
}

// A prepared copy between fixed pool slots and fixed dense tensors (see the file comment). The
// Python objects it reads from (the pool region, the slot list) are held; the dense tensors are
// held by kvtier.ops.DensePagedPlan.
class PyDensePagedPlan {
 public:
  PyDensePagedPlan(py::object pool, py::object slots, const std::vector<TensorArg>& k,
                   const std::vector<TensorArg>& v, const Shape& shape, int64_t elem_bytes,
                   int device, int64_t first_layer)
      : pool_(std::move(pool)),
        slots_obj_(std::move(slots)),
        k_(Tensors(k)),
        v_(Tensors(v)),
        dense_(MakeDense(shape, elem_bytes, device)),
        first_layer_(first_layer) {
    region_ = pool_.cast<const PyRegion&>().Get();
    slots_ = ReadIndices(slots_obj_, "slots");
    if (k_.empty()) ThrowInvalid("k is an empty list of layers");
    if (!v_.empty() && v_.size() != k_.size()) {
      ThrowInvalid(fmt::format("v has {} layers, k has {}", v_.size(), k_.size()));
    }
    // CopyDensePaged checks the rest (shapes against the pool, layers, slots) on every run.
  }

  int64_t num_layers() const { return static_cast<int64_t>(k_.size()); }

  // Copies the plan's layers [first, first + count) in `direction` on `stream`.
  void Run(int64_t first, int64_t count, bool to_pool, uint64_t stream) const {
    const int64_t n = num_layers();
    if (first < 0 || first >= n) {
      ThrowInvalid(fmt::format("layer = {} is outside the plan's {} layers", first, n));
    }
    if (count < 1 || count > n - first) {
      ThrowInvalid(
          fmt::format("num_layers = {} must be in [1, {}] from layer {}", count, n - first, first));
    }
    DenseKv dense = dense_;
    dense.k = std::span<const DenseTensor>(k_).subspan(static_cast<size_t>(first),
                                                       static_cast<size_t>(count));
    if (!v_.empty()) {
      dense.v = std::span<const DenseTensor>(v_).subspan(static_cast<size_t>(first),
                                                         static_cast<size_t>(count));
    }
    Status status;
    {
      py::gil_scoped_release release;
      status = CopyDensePaged(region_, slots_.Get(), dense, first_layer_ + first,
                              to_pool ? DenseDirection::kToPool : DenseDirection::kFromPool,
                              reinterpret_cast<CudaStream>(static_cast<uintptr_t>(stream)));
    }
    ThrowIfError(status);
  }

 private:
  py::object pool_;       // the PyRegion: its buffers stay alive
  py::object slots_obj_;  // the slot list slots_ points into
  KvRegion region_;
  IndexArg slots_;
  std::vector<DenseTensor> k_;
  std::vector<DenseTensor> v_;
  DenseKv dense_;  // shape and memory; spans set per run
  int64_t first_layer_ = 0;
};

}  // namespace

void RegisterDensePaged(py::module_& m) {
  m.def(
      "dense_paged",
      [](const PyRegion& pool, py::handle slots_obj, const std::vector<TensorArg>& k,
         const std::vector<TensorArg>& v, std::tuple<int64_t, int64_t, int64_t, int64_t> shape,
         int64_t elem_bytes, int device, int64_t first_layer, bool to_pool, uint64_t stream) {
        const IndexArg slots = ReadIndices(slots_obj, "slots");
        const std::vector<DenseTensor> k_tensors = Tensors(k);
        const std::vector<DenseTensor> v_tensors = Tensors(v);
        DenseKv dense;
        std::tie(dense.batch, dense.heads, dense.seq, dense.head_dim) = shape;
        dense.elem_bytes = elem_bytes;
        dense.memory = device == kHostDevice ? MemoryKind::kHost : MemoryKind::kDevice;
        dense.device = device;
        dense.k = k_tensors;
        dense.v = v_tensors;
        const KvRegion region = pool.Get();
        Status status;
        {
          py::gil_scoped_release release;
          status = CopyDensePaged(region, slots.Get(), dense, first_layer,
                                  to_pool ? DenseDirection::kToPool : DenseDirection::kFromPool,
                                  reinterpret_cast<CudaStream>(static_cast<uintptr_t>(stream)));
        }
        ThrowIfError(status);
      },
      py::arg("pool"), py::arg("slots"), py::arg("k"), py::arg("v"), py::arg("shape"),
      py::arg("elem_bytes"), py::arg("device"), py::arg("first_layer"), py::arg("to_pool"),
      py::arg("stream"),
      "Copies dense per-layer K/V tensors to (to_pool) or from pool slots; see kvtier.ops.");
  py::class_<PyDensePagedPlan>(m, "DensePagedPlan",
                               "A prepared dense <-> paged copy; see kvtier.ops.DensePagedPlan.")
      .def(py::init<py::object, py::object, const std::vector<TensorArg>&,
                    const std::vector<TensorArg>&, const Shape&, int64_t, int, int64_t>(),
           py::arg("pool"), py::arg("slots"), py::arg("k"), py::arg("v"), py::arg("shape"),
           py::arg("elem_bytes"), py::arg("device"), py::arg("first_layer"))
      .def_property_readonly("num_layers", &PyDensePagedPlan::num_layers)
      .def("run", &PyDensePagedPlan::Run, py::arg("first"), py::arg("count"), py::arg("to_pool"),
           py::arg("stream"),
           "Copies the plan's layers [first, first + count) to (to_pool) or from the pool.");
  m.def(
      "dense_paged_errors",
      [](int device) {
        Result<int64_t> r = [&] {
          py::gil_scoped_release release;
          return TakeDensePagedErrors(device);
        }();
        return Unwrap(std::move(r));
      },
      py::arg("device"),
      "Device slots outside the pool that dense <-> paged kernels skipped since the last call.");
}

}  // namespace kvtier::python
