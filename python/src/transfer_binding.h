// python/src/transfer_binding.h — shared pieces of the transfer binding.
// Thread safety: PyRegion/PyIndices are plain values; GetEngine is thread-safe.
#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kvtier/transfer.h"

namespace kvtier::python {

// A KvRegion that owns the per-layer pointer tables its spans point into.
struct PyRegion {
  KvRegion region;  // spans left empty; Get() points them at the vectors below
  std::vector<void*> k_layers;
  std::vector<void*> v_layers;
  // The buffers under the region (kvtier.ops.KvRegion sets them) and their names: a copy into
  // the region checks again that they are writable.
  std::vector<pybind11::object> buffers;
  std::vector<std::string> labels;

  KvRegion Get() const;
};

struct PyIndices {
  uint64_t address = 0;
  int64_t count = 0;
  bool int64 = true;
  bool device = false;

  SlotIndices Get() const;
};

// The engine kvtier.ops uses for (backend, CUDA device); created on first use.
Result<std::shared_ptr<TransferEngine>> GetEngine(TransferBackend backend, int device);

// The C++ request names its index lists src_slots / dst_slots; Python callers pass src_indices /
// dst_indices. Returns `status` with the names replaced.
Status RenameSlots(const Status& status);

// Runs the requests on the engine of (backend, device) in order, with the GIL released, and
// throws the first error (renamed as above). REQUIRES: the GIL is held.
void RunTransfers(TransferBackend backend, int device, const std::vector<TransferRequest>& requests,
                  const TransferOptions& options);

// Registers _kvtier.sgl_kernel and _kvtier.sgl_direct (compat_binding.cc).
void RegisterCompat(pybind11::module_& m);

// Turns a Python LayerEvents object into the C++ one (null when CUDA is not built in).
// REQUIRES: the GIL is held.
using LayerEventsCaster = LayerEvents* (*)(pybind11::handle);

void RegisterTransfer(pybind11::module_& m, LayerEventsCaster layer_events_caster);

}  // namespace kvtier::python
