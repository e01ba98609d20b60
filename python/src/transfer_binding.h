// python/src/transfer_binding.h — shared pieces of the transfer binding.
// Thread safety: PyRegion/PyIndices are plain values; GetEngine is thread-safe.
#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "kvtier/transfer.h"

namespace kvtier::python {

// A KvRegion that owns the per-layer pointer tables its spans point into.
struct PyRegion {
  KvRegion region;  // spans left empty; Get() points them at the vectors below
  std::vector<void*> k_layers;
  std::vector<void*> v_layers;

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

// Turns a Python LayerEvents object into the C++ one (null when CUDA is not built in).
// REQUIRES: the GIL is held.
using LayerEventsCaster = LayerEvents* (*)(pybind11::handle);

void RegisterTransfer(pybind11::module_& m, LayerEventsCaster layer_events_caster);

}  // namespace kvtier::python
