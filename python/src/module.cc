// python/src/module.cc — the `kvtier._kvtier` extension module.
//
// The only place in kvtier that knows Python. Importing it needs neither a GPU nor PyTorch:
// features that need CUDA raise kvtier.UnavailableError when kvtier was built without it.
// Thread safety: see the individual bindings; every long C++ call runs with the GIL released.
#include <pybind11/pybind11.h>

#include "errors.h"
#include "transfer_binding.h"

namespace py = pybind11;

namespace kvtier::python {
// device_binding.cc
void RegisterDevice(py::module_& m);
LayerEvents* CastLayerEvents(py::handle h);
void RegisterStorage(py::module_& m);     // storage_binding.cc
void RegisterPageStore(py::module_& m);   // page_store_binding.cc
void RegisterDensePaged(py::module_& m);  // dense_paged_binding.cc
#if defined(KVTIER_PY_WITH_CACHE)
// cache_binding.cc
void RegisterCache(py::module_& m);
void RegisterTp(py::module_& m);  // tp_binding.cc
#endif
}  // namespace kvtier::python

PYBIND11_MODULE(_kvtier, m) {
  using namespace kvtier::python;
  m.doc() = "kvtier: hierarchical KV cache for LLM inference (C++ core binding)";
  RegisterErrors(m);
  RegisterTransfer(m, &CastLayerEvents);
  RegisterCompat(m);
  RegisterDevice(m);
  RegisterStorage(m);
  RegisterPageStore(m);
  RegisterDensePaged(m);
#if defined(KVTIER_PY_WITH_CACHE)
  RegisterCache(m);
  RegisterTp(m);
  m.attr("has_cache") = true;
#else
  m.attr("has_cache") = false;
#endif
}
