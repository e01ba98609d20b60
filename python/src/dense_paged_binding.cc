// python/src/dense_paged_binding.cc — `_kvtier.dense_paged` and `_kvtier.dense_paged_errors`, the
// native half of kvtier.ops.scatter_dense / gather_dense (kvtier/dense_paged.h).
//
// The dense tensors are described by the Python layer (kvtier/ops.py reads address, shape and
// byte strides of torch tensors and numpy arrays once per call) and arrive as lists of
// (address, batch_stride, head_stride, seq_stride, dim_stride) per layer; the slot list is read
// here (py_args.h). The copy runs with the GIL released.
//
// Thread safety: stateless.
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
