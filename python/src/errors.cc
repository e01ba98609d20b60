// python/src/errors.cc — the kvtier exception classes and the StatusError translator.
// Thread safety: RegisterErrors runs once at import, under the GIL.
#include "errors.h"

#include <array>

namespace py = pybind11;

namespace kvtier::python {
namespace {

constexpr int kNumCodes = static_cast<int>(StatusCode::kInternal) + 1;

// One class per status code (index = code); index 0 (OK) holds the base class. Created once and
// never released: the translator can run until the interpreter is gone.
std::array<PyObject*, kNumCodes> g_classes{};

PyObject* NewClass(py::module_& m, const char* name, PyObject* bases, const char* doc) {
  const std::string qualified = std::string("kvtier.") + name;
  PyObject* cls = PyErr_NewExceptionWithDoc(qualified.c_str(), doc, bases, nullptr);
  if (cls == nullptr) throw py::error_already_set();
  m.add_object(name, py::handle(cls));  // add_object steals nothing; it increments
  return cls;
}

PyObject* Bases(PyObject* a, PyObject* b) {
  PyObject* t = PyTuple_Pack(2, a, b);
  if (t == nullptr) throw py::error_already_set();
  return t;
}

}  // namespace

void RegisterErrors(py::module_& m) {
  PyObject* base =
      NewClass(m, "KvtierError", PyExc_RuntimeError, "Base class of every error kvtier reports.");
  g_classes[0] = base;
  auto simple = [&](StatusCode code, const char* name, const char* doc) {
    g_classes[static_cast<int>(code)] = NewClass(m, name, base, doc);
  };
  auto dual = [&](StatusCode code, const char* name, PyObject* builtin, const char* doc) {
    PyObject* bases = Bases(base, builtin);
    g_classes[static_cast<int>(code)] = NewClass(m, name, bases, doc);
    Py_DECREF(bases);
  };
  dual(StatusCode::kInvalidArgument, "InvalidArgumentError", PyExc_ValueError,
       "A bad argument; the message names it and its value.");
  dual(StatusCode::kOutOfMemory, "OutOfMemoryError", PyExc_MemoryError,
       "A pool or allocation ran out of memory.");
  dual(StatusCode::kNotFound, "NotFoundError", PyExc_LookupError, "Something was not found.");
  simple(StatusCode::kIOError, "KvtierIOError", "An I/O operation failed.");
  simple(StatusCode::kCorruption, "CorruptionError", "Stored data failed an integrity check.");
  simple(StatusCode::kCudaError, "CudaError", "A CUDA call failed.");
  simple(StatusCode::kUnavailable, "UnavailableError",
         "A feature or resource is not available (for example a GPU backend without CUDA).");
  simple(StatusCode::kFailedPrecondition, "FailedPreconditionError",
         "The object is not in a state that allows the call.");
  simple(StatusCode::kInternal, "InternalError", "An internal invariant was broken.");

  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const StatusError& e) {
      const int code = static_cast<int>(e.status().code());
      PyObject* cls = (code > 0 && code < kNumCodes && g_classes[code] != nullptr) ? g_classes[code]
                                                                                   : g_classes[0];
      PyErr_SetString(cls, e.status().message().c_str());
    }
  });
}

}  // namespace kvtier::python
