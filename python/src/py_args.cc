// python/src/py_args.cc — see py_args.h.
// Thread safety: REQUIRES the GIL (the caches below are guarded by it).
#include "py_args.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <map>
#include <tuple>
#include <utility>

#if defined(KVTIER_PY_WITH_CUDA)
#include <cuda.h>
#include <cuda_runtime_api.h>
#endif

#include "errors.h"

namespace py = pybind11;

namespace kvtier::python {
namespace {

// Interned attribute names, created once.
struct Names {
  PyObject* data_ptr = PyUnicode_InternFromString("data_ptr");
  PyObject* is_cuda = PyUnicode_InternFromString("is_cuda");
  PyObject* is_cpu = PyUnicode_InternFromString("is_cpu");
  PyObject* is_contiguous = PyUnicode_InternFromString("is_contiguous");
  PyObject* get_device = PyUnicode_InternFromString("get_device");
  PyObject* numel = PyUnicode_InternFromString("numel");
  PyObject* element_size = PyUnicode_InternFromString("element_size");
  PyObject* shape = PyUnicode_InternFromString("shape");
  PyObject* dtype = PyUnicode_InternFromString("dtype");
  PyObject* device = PyUnicode_InternFromString("device");
  PyObject* version = PyUnicode_InternFromString("_version");
  PyObject* cpu = PyUnicode_InternFromString("cpu");
  PyObject* get = PyUnicode_InternFromString("get");
  PyObject* cuda_iface = PyUnicode_InternFromString("__cuda_array_interface__");
  PyObject* host_iface = PyUnicode_InternFromString("__array_interface__");
  PyObject* cuda_stream = PyUnicode_InternFromString("cuda_stream");
  PyObject* ptr = PyUnicode_InternFromString("ptr");
  PyObject* handle = PyUnicode_InternFromString("handle");
};

const Names& Name() {
  static const Names* names = new Names();
  return *names;
}

py::object Steal(PyObject* p) {
  if (p == nullptr) throw py::error_already_set();
  return py::reinterpret_steal<py::object>(p);
}
py::object Attr(py::handle obj, PyObject* name) { return Steal(PyObject_GetAttr(obj.ptr(), name)); }
py::object CallMethod(py::handle obj, PyObject* name) {
  return Steal(PyObject_CallMethodNoArgs(obj.ptr(), name));
}

std::string Repr(py::handle obj) { return py::repr(obj).cast<std::string>(); }

// A torch.Size (or any sequence of ints) as Python prints a plain tuple: (2,), (2, 3).
std::string TupleText(py::handle seq) {
  py::object t = py::reinterpret_steal<py::object>(PySequence_Tuple(seq.ptr()));
  if (!t) throw py::error_already_set();
  return Repr(t);
}
std::string TypeName(py::handle obj) { return Py_TYPE(obj.ptr())->tp_name; }

// torch's Tensor type and the dtypes kvtier checks, once torch has been imported by someone.
struct Torch {
  PyObject* tensor = nullptr;
  PyObject* int32 = nullptr;
  PyObject* int64 = nullptr;
  PyObject* uint64 = nullptr;      // null on torch versions without it
  PyObject* raw_stream = nullptr;  // torch._C._cuda_getCurrentRawStream, null when absent
};

const Torch* GetTorch() {
  static Torch torch;
  if (torch.tensor != nullptr) return &torch;
  PyObject* module = PyImport_GetModule(py::str("torch").ptr());
  if (module == nullptr) {
    PyErr_Clear();
    return nullptr;
  }
  py::object m = py::reinterpret_steal<py::object>(module);
  if (!py::hasattr(m, "Tensor") || !py::hasattr(m, "int64")) return nullptr;  // half-imported
  // References kept for the life of the process.
  auto keep = [&](const char* name) { return py::object(m.attr(name)).release().ptr(); };
  torch.int32 = keep("int32");
  torch.int64 = keep("int64");
  torch.uint64 = py::hasattr(m, "uint64") ? keep("uint64") : nullptr;
  py::object c = py::getattr(m, "_C", py::none());
  if (!c.is_none() && py::hasattr(c, "_cuda_getCurrentRawStream")) {
    torch.raw_stream = py::object(c.attr("_cuda_getCurrentRawStream")).release().ptr();
  }
  torch.tensor = keep("Tensor");  // last: marks the struct complete
  return &torch;
}

bool IsTensor(py::handle obj, const Torch** torch) {
  *torch = GetTorch();
  return *torch != nullptr && PyObject_TypeCheck(obj.ptr(), (PyTypeObject*)(*torch)->tensor);
}

bool Truthy(const py::object& o) {
  const int r = PyObject_IsTrue(o.ptr());
  if (r < 0) throw py::error_already_set();
  return r == 1;
}

int64_t AsInt64(const py::object& o) {
  const long long v = PyLong_AsLongLong(o.ptr());
  if (v == -1 && PyErr_Occurred()) throw py::error_already_set();
  return v;
}

std::string ShapeText(const int64_t* shape, int ndim) {
  // As Python prints a tuple: (), (3,), (2, 2).
  std::string s = "(";
  for (int i = 0; i < ndim; ++i) {
    // Appended piece by piece: GCC 12's LTO warned (-Wstringop-overflow, a false positive) on
    // the `const char* + std::string` temporary this loop used to build.
    if (i > 0) s += ", ";
    s += std::to_string(shape[i]);
  }
  s += ndim == 1 ? ",)" : ")";
  return s;
}

// Device of a torch tensor (kHostDevice for cpu); InvalidArgument for other devices.
int TensorDevice(py::handle t, std::string_view name) {
  const Names& n = Name();
  if (Truthy(Attr(t, n.is_cuda))) return static_cast<int>(AsInt64(CallMethod(t, n.get_device)));
  PyObject* is_cpu = PyObject_GetAttr(t.ptr(), n.is_cpu);
  bool cpu;
  if (is_cpu == nullptr) {
    PyErr_Clear();
    cpu = py::str(Attr(Attr(t, n.device), py::str("type").ptr())).cast<std::string>() == "cpu";
  } else {
    cpu = Truthy(Steal(is_cpu));
  }
  if (!cpu) {
    ThrowInvalid(fmt::format("{} is on device {}; kvtier copies cpu and cuda tensors", name,
                             py::str(Attr(t, n.device)).cast<std::string>()));
  }
  return kHostDevice;
}

void CheckTensorContiguous(py::handle t, std::string_view name) {
  if (!Truthy(CallMethod(t, Name().is_contiguous))) {
    ThrowInvalid(fmt::format("{} must be contiguous (shape {}, strides {})", name,
                             TupleText(Attr(t, Name().shape)), TupleText(t.attr("stride")())));
  }
}

BufferArg ReadTensor(py::handle t, std::string_view name) {
  const Names& n = Name();
  BufferArg b;
  b.device = TensorDevice(t, name);
  CheckTensorContiguous(t, name);
  b.address = static_cast<uint64_t>(AsInt64(CallMethod(t, n.data_ptr)));
  // numel() * element_size(), not Tensor.nbytes: that attribute is PyTorch 2's (Debian 12 ships
  // 1.13).
  b.nbytes = AsInt64(CallMethod(t, n.numel)) * AsInt64(CallMethod(t, n.element_size));
  py::object shape = Attr(t, n.shape);
  const Py_ssize_t ndim = PyTuple_GET_SIZE(shape.ptr());
  b.ndim = static_cast<int>(ndim);
  for (Py_ssize_t i = 0; i < std::min<Py_ssize_t>(ndim, 3); ++i) {
    b.shape[i] = PyLong_AsLongLong(PyTuple_GET_ITEM(shape.ptr(), i));
  }
  return b;
}

// Reads a buffer-protocol object. False (no error set) when the object does not export one.
bool ReadBufferProtocol(py::handle obj, std::string_view name, BufferArg* out) {
  if (!PyObject_CheckBuffer(obj.ptr())) return false;
  Py_buffer view;
  if (PyObject_GetBuffer(obj.ptr(), &view, PyBUF_STRIDES | PyBUF_FORMAT) != 0) {
    PyErr_Clear();
    return false;
  }
  const bool contiguous = PyBuffer_IsContiguous(&view, 'C') != 0;
  std::vector<int64_t> shape(view.shape, view.shape + view.ndim);
  std::vector<int64_t> strides(view.strides, view.strides + (view.strides ? view.ndim : 0));
  out->address = reinterpret_cast<uintptr_t>(view.buf);
  out->nbytes = view.len;
  out->readonly = view.readonly != 0;
  out->device = kHostDevice;
  out->ndim = view.ndim;
  for (int i = 0; i < std::min(view.ndim, 3); ++i) out->shape[i] = view.shape[i];
  if (view.ndim == 0) out->ndim = 0;
  PyBuffer_Release(&view);
  if (!contiguous) {
    ThrowInvalid(fmt::format("{} must be C-contiguous (shape {}, strides {})", name,
                             ShapeText(shape.data(), static_cast<int>(shape.size())),
                             ShapeText(strides.data(), static_cast<int>(strides.size()))));
  }
  return true;
}

struct Interface {
  std::vector<int64_t> shape;
  std::string typestr;
  int itemsize = 0;
  uint64_t address = 0;
  bool readonly = false;
  bool contiguous = true;
  std::vector<int64_t> strides;
};

// Reads __cuda_array_interface__ / __array_interface__; false when `obj` has neither. `attr`
// says which was found.
bool ReadInterface(py::handle obj, std::string_view name, Interface* out, bool* on_device) {
  const Names& n = Name();
  PyObject* iface = nullptr;
  for (auto [attr, device] : {std::pair{n.cuda_iface, true}, std::pair{n.host_iface, false}}) {
    iface = PyObject_GetAttr(obj.ptr(), attr);
    if (iface == nullptr) {
      PyErr_Clear();
      continue;
    }
    *on_device = device;
    break;
  }
  if (iface == nullptr) return false;
  py::dict d = py::reinterpret_steal<py::dict>(iface);
  for (auto dim : py::tuple(d["shape"])) out->shape.push_back(dim.cast<int64_t>());
  out->typestr = d["typestr"].cast<std::string>();
  try {
    out->itemsize = std::stoi(out->typestr.substr(2));
  } catch (const std::exception&) {
    ThrowInvalid(
        fmt::format("{}: cannot read the element size from typestr '{}'", name, out->typestr));
  }
  py::object data = d.contains("data") ? py::object(d["data"]) : py::none();
  if (!py::isinstance<py::tuple>(data)) {
    ThrowInvalid(fmt::format("{}: {} does not give a data pointer", name,
                             *on_device ? "__cuda_array_interface__" : "__array_interface__"));
  }
  py::tuple t = data;
  out->address = t[0].is_none() ? 0 : t[0].cast<uint64_t>();
  out->readonly = t[1].cast<bool>();
  if (d.contains("strides") && !d["strides"].is_none()) {
    for (auto s : py::tuple(d["strides"])) out->strides.push_back(s.cast<int64_t>());
    int64_t expected = out->itemsize;
    for (size_t i = out->shape.size(); i-- > 0;) {
      if (out->shape[i] != 1 && out->strides[i] != expected) out->contiguous = false;
      expected *= out->shape[i];
    }
  }
  return true;
}

[[noreturn]] void ThrowIndexType(std::string_view name, std::string_view type) {
  ThrowInvalid(fmt::format("{} has element type '{}'; expected int32 or int64", name, type));
}

// int32 (4) or int64 (8) from a struct-module format, or 0.
int IndexFormatBytes(const char* format, Py_ssize_t itemsize) {
  if (format == nullptr) return 0;
  const char* f = format;
  if (*f == '@' || *f == '=' || *f == '<') ++f;
  if (f[0] == '\0' || f[1] != '\0') return 0;
  switch (f[0]) {
    case 'i':
    case 'l':
    case 'q':
    case 'n':
      return (itemsize == 4 || itemsize == 8) ? static_cast<int>(itemsize) : 0;
    default:
      return 0;
  }
}

IndexArg IndicesFromSequence(py::handle obj, std::string_view name) {
  py::object seq = Steal(PySequence_Fast(obj.ptr(), "not a sequence"));
  const Py_ssize_t n = PySequence_Fast_GET_SIZE(seq.ptr());
  PyObject** items = PySequence_Fast_ITEMS(seq.ptr());
  IndexArg a;
  a.owned.resize(static_cast<size_t>(n));
  for (Py_ssize_t k = 0; k < n; ++k) {
    PyObject* item = items[k];
    long long v;
    if (PyLong_CheckExact(item)) {
      int overflow = 0;
      v = PyLong_AsLongLongAndOverflow(item, &overflow);
      if (overflow != 0) {
        ThrowInvalid(
            fmt::format("{}[{}] = {} is outside the int64 range", name, k, Repr(py::handle(item))));
      }
    } else {
      const std::string type = Py_TYPE(item)->tp_name;
      if (PyBool_Check(item) || PyFloat_Check(item) || !PyIndex_Check(item) ||
          type.find("bool") != std::string::npos) {
        ThrowInvalid(fmt::format("{} must hold integers ({}[{}] = {} is a {})", name, name, k,
                                 Repr(py::handle(item)), type));
      }
      py::object i = Steal(PyNumber_Index(item));
      int overflow = 0;
      v = PyLong_AsLongLongAndOverflow(i.ptr(), &overflow);
      if (overflow != 0) {
        ThrowInvalid(
            fmt::format("{}[{}] = {} is outside the int64 range", name, k, Repr(py::handle(item))));
      }
    }
    a.owned[static_cast<size_t>(k)] = v;
  }
  a.data = a.owned.data();
  a.count = n;
  a.int64 = true;
  return a;
}

}  // namespace

void ThrowInvalid(std::string message) { ThrowStatus(Status::InvalidArgument(std::move(message))); }

int64_t ReadInt(py::handle value, std::string_view name, int64_t min, int64_t max) {
  PyObject* o = value.ptr();
  const bool integral = !PyBool_Check(o) && !PyFloat_Check(o) && PyIndex_Check(o) &&
                        std::string_view(Py_TYPE(o)->tp_name).find("bool") == std::string::npos;
  if (!integral) ThrowInvalid(fmt::format("{} = {} must be an integer", name, Repr(value)));
  py::object i = Steal(PyNumber_Index(o));
  int overflow = 0;
  const long long v = PyLong_AsLongLongAndOverflow(i.ptr(), &overflow);
  if (overflow < 0 || (overflow == 0 && v < min)) {
    ThrowInvalid(fmt::format("{} = {} must be >= {}", name, Repr(i), min));
  }
  if (overflow > 0 || v > max) {
    ThrowInvalid(fmt::format("{} = {} must be <= {}", name, Repr(i), max));
  }
  return v;
}

std::vector<int64_t> ReadIntList(py::handle obj, std::string_view name, int64_t min, int64_t max) {
  PyObject* o = obj.ptr();
  const bool unordered_or_text = PyUnicode_Check(o) || PyBytes_Check(o) || PyByteArray_Check(o) ||
                                 PyMemoryView_Check(o) || PyAnySet_Check(o) || PyDict_Check(o);
  PyObject* iterator = unordered_or_text ? nullptr : PyObject_GetIter(o);
  if (iterator == nullptr) {
    PyErr_Clear();
    ThrowInvalid(
        fmt::format("{} must be a list, tuple or range of integers or a 1-D integer array, not {}",
                    name, Py_TYPE(o)->tp_name));
  }
  py::object it = Steal(iterator);
  std::vector<int64_t> out;
  const Py_ssize_t hint = PyObject_LengthHint(o, 0);
  if (hint > 0) out.reserve(static_cast<size_t>(hint));
  while (PyObject* item = PyIter_Next(it.ptr())) {
    py::object element = Steal(item);
    out.push_back(ReadInt(element, fmt::format("{}[{}]", name, out.size()), min, max));
  }
  if (PyErr_Occurred()) throw py::error_already_set();
  return out;
}

BufferArg ReadBuffer(py::handle obj, std::string_view name) {
  if (obj.is_none()) ThrowInvalid(fmt::format("{} is None; expected a tensor or array", name));
  const Torch* torch;
  if (IsTensor(obj, &torch)) return ReadTensor(obj, name);
  BufferArg b;
  if (ReadBufferProtocol(obj, name, &b)) return b;
  Interface iface;
  bool on_device = false;
  if (!ReadInterface(obj, name, &iface, &on_device)) {
    ThrowInvalid(
        fmt::format("{} of type {} exposes no data_ptr(), __cuda_array_interface__ or "
                    "__array_interface__",
                    name, TypeName(obj)));
  }
  if (!iface.contiguous) {
    ThrowInvalid(
        fmt::format("{} must be C-contiguous (shape {}, strides {})", name,
                    ShapeText(iface.shape.data(), static_cast<int>(iface.shape.size())),
                    ShapeText(iface.strides.data(), static_cast<int>(iface.strides.size()))));
  }
  b.address = iface.address;
  b.readonly = iface.readonly;
  b.nbytes = iface.itemsize;
  for (int64_t d : iface.shape) b.nbytes *= d;
  b.ndim = static_cast<int>(iface.shape.size());
  for (int i = 0; i < std::min(b.ndim, 3); ++i) b.shape[i] = iface.shape[i];
  b.device = on_device ? std::max(0, PointerDevice(b.address)) : kHostDevice;
  return b;
}

bool IsReadOnly(py::handle obj) {
  if (!PyObject_CheckBuffer(obj.ptr())) return false;
  Py_buffer view;
  if (PyObject_GetBuffer(obj.ptr(), &view, PyBUF_WRITABLE | PyBUF_STRIDES) != 0) {
    PyErr_Clear();
    return true;
  }
  PyBuffer_Release(&view);
  return false;
}

IndexArg ReadIndices(py::handle obj, std::string_view name) {
  if (obj.is_none()) {
    ThrowInvalid(fmt::format("{} is None; expected an int32/int64 array or tensor", name));
  }
  const Torch* torch;
  if (IsTensor(obj, &torch)) {
    const Names& n = Name();
    py::object dtype = Attr(obj, n.dtype);
    if (dtype.ptr() != torch->int64 && dtype.ptr() != torch->int32) {
      ThrowInvalid(fmt::format("{} has dtype {}; expected torch.int32 or torch.int64", name,
                               py::str(dtype).cast<std::string>()));
    }
    py::object shape = Attr(obj, n.shape);
    if (PyTuple_GET_SIZE(shape.ptr()) != 1) {
      ThrowInvalid(fmt::format("{} must be 1-D, got shape {}", name, TupleText(shape)));
    }
    IndexArg a;
    a.device = TensorDevice(obj, name);
    if (!Truthy(CallMethod(obj, n.is_contiguous))) {
      ThrowInvalid(fmt::format("{} must be contiguous", name));
    }
    a.count = PyLong_AsLongLong(PyTuple_GET_ITEM(shape.ptr(), 0));
    a.int64 = dtype.ptr() == torch->int64;
    a.data =
        reinterpret_cast<const void*>(static_cast<uintptr_t>(AsInt64(CallMethod(obj, n.data_ptr))));
    return a;
  }
  if (PyList_Check(obj.ptr()) || PyTuple_Check(obj.ptr()) || PyRange_Check(obj.ptr())) {
    return IndicesFromSequence(obj, name);
  }
  if (PyObject_CheckBuffer(obj.ptr())) {
    Py_buffer view;
    if (PyObject_GetBuffer(obj.ptr(), &view, PyBUF_STRIDES | PyBUF_FORMAT) == 0) {
      struct Release {
        Py_buffer* v;
        ~Release() { PyBuffer_Release(v); }
      } release{&view};
      const int bytes = IndexFormatBytes(view.format, view.itemsize);
      if (bytes == 0) ThrowIndexType(name, view.format ? view.format : "?");
      if (view.ndim != 1) {
        std::vector<int64_t> shape(view.shape, view.shape + view.ndim);
        ThrowInvalid(
            fmt::format("{} must be 1-D, got shape {}", name, ShapeText(shape.data(), view.ndim)));
      }
      IndexArg a;
      a.count = view.shape[0];
      a.int64 = bytes == 8;
      if (PyBuffer_IsContiguous(&view, 'C')) {
        a.data = view.buf;
        return a;
      }
      a.owned.resize(static_cast<size_t>(a.count));  // a strided host array: gather it
      for (int64_t k = 0; k < a.count; ++k) {
        const char* p = static_cast<const char*>(view.buf) + k * view.strides[0];
        int64_t v;
        if (bytes == 8) {
          std::memcpy(&v, p, 8);
        } else {
          int32_t v32;
          std::memcpy(&v32, p, 4);
          v = v32;
        }
        a.owned[static_cast<size_t>(k)] = v;
      }
      a.data = a.owned.data();
      a.int64 = true;
      return a;
    }
    PyErr_Clear();
  }
  Interface iface;
  bool on_device = false;
  if (!ReadInterface(obj, name, &iface, &on_device)) {
    ThrowInvalid(
        fmt::format("{} of type {} is not an index array (expected numpy/torch int32 or "
                    "int64, or a list of ints)",
                    name, TypeName(obj)));
  }
  std::string t = iface.typestr;
  if (t.size() == 3 && (t[0] == '|' || t[0] == '=')) t[0] = '<';
  if (t != "<i4" && t != "<i8") ThrowIndexType(name, iface.typestr);
  if (iface.shape.size() != 1) {
    ThrowInvalid(fmt::format("{} must be 1-D, got shape {}", name,
                             ShapeText(iface.shape.data(), static_cast<int>(iface.shape.size()))));
  }
  if (!iface.contiguous) ThrowInvalid(fmt::format("{} must be contiguous", name));
  IndexArg a;
  a.count = iface.shape[0];
  a.int64 = t == "<i8";
  a.data = reinterpret_cast<const void*>(static_cast<uintptr_t>(iface.address));
  a.device = on_device ? std::max(0, PointerDevice(iface.address)) : kHostDevice;
  return a;
}

int CommonDevice(std::span<const std::pair<std::string, int>> operands) {
  int device = kHostDevice;
  for (const auto& [name, d] : operands) {
    if (d == kHostDevice) continue;
    if (device != kHostDevice && d != device) {
      std::string where;
      for (const auto& [n2, d2] : operands) {
        if (d2 != kHostDevice)
          where += fmt::format("{}{} on cuda:{}", where.empty() ? "" : ", ", n2, d2);
      }
      ThrowInvalid("the copy spans several CUDA devices: " + where);
    }
    device = d;
  }
  return device;
}

IndexArg HostIndices(IndexArg arg, py::handle obj, std::string_view name) {
  if (arg.device == kHostDevice) return arg;
  const Names& n = Name();
  PyObject* method = nullptr;
  for (PyObject* attr : {n.cpu, n.get}) {
    method = PyObject_GetAttr(obj.ptr(), attr);
    if (method != nullptr) break;
    PyErr_Clear();
  }
  if (method == nullptr) {
    ThrowInvalid(fmt::format("{} is in device memory and cannot be read back to the host", name));
  }
  py::object host = Steal(PyObject_CallNoArgs(Steal(method).ptr()));
  IndexArg h = ReadIndices(host, name);
  h.keep = std::move(host);
  return h;
}

namespace {

// Host copies of GPU-resident address tables, keyed by (address, count, device). An entry holds
// the tensor, so its memory is not reused while cached; the version counter catches writes.
struct TableEntry {
  py::object tensor;
  int64_t version = 0;
  std::vector<uint64_t> addresses;
};
std::map<std::tuple<uint64_t, int64_t, int>, TableEntry>& TableCache() {
  static auto* cache = new std::map<std::tuple<uint64_t, int64_t, int>, TableEntry>();
  return *cache;
}
constexpr size_t kTableCacheCapacity = 64;

std::vector<uint64_t> CopyAddresses(uint64_t address, int64_t count) {
  std::vector<uint64_t> out(static_cast<size_t>(count));
  if (count > 0) {
    std::memcpy(out.data(), reinterpret_cast<const void*>(static_cast<uintptr_t>(address)),
                static_cast<size_t>(count) * sizeof(uint64_t));
  }
  return out;
}

}  // namespace

std::vector<uint64_t> ReadAddressTable(py::handle obj, std::string_view name, int64_t count,
                                       bool* on_gpu) {
  *on_gpu = false;
  if (obj.is_none()) {
    ThrowInvalid(fmt::format("{} is None; expected a uint64 tensor of per-layer addresses", name));
  }
  std::vector<uint64_t> addresses;
  const Torch* torch;
  if (IsTensor(obj, &torch)) {
    const Names& n = Name();
    py::object dtype = Attr(obj, n.dtype);
    if (dtype.ptr() != torch->int64 && dtype.ptr() != torch->uint64) {
      ThrowInvalid(fmt::format("{} has dtype {}; expected torch.uint64 addresses", name,
                               py::str(dtype).cast<std::string>()));
    }
    py::object shape = Attr(obj, n.shape);
    if (PyTuple_GET_SIZE(shape.ptr()) != 1 ||
        PyLong_AsLongLong(PyTuple_GET_ITEM(shape.ptr(), 0)) != count) {
      ThrowInvalid(fmt::format("{} has shape {}; expected ({},) for num_layers = {}", name,
                               TupleText(shape), count, count));
    }
    const int device = TensorDevice(obj, name);
    if (!Truthy(CallMethod(obj, n.is_contiguous))) {
      ThrowInvalid(fmt::format("{} must be contiguous", name));
    }
    const auto address = static_cast<uint64_t>(AsInt64(CallMethod(obj, n.data_ptr)));
    if (device == kHostDevice) {
      addresses = CopyAddresses(address, count);
    } else {
      *on_gpu = true;
      const int64_t version = AsInt64(Attr(obj, n.version));
      auto& cache = TableCache();
      const auto key = std::make_tuple(address, count, device);
      auto it = cache.find(key);
      if (it != cache.end() && it->second.version == version) return it->second.addresses;
      // One device-to-host read on the current stream (it waits for the stream's earlier work).
      py::object host = CallMethod(obj, n.cpu);
      addresses =
          CopyAddresses(static_cast<uint64_t>(AsInt64(CallMethod(host, n.data_ptr))), count);
      if (cache.size() >= kTableCacheCapacity) cache.clear();
      cache[key] = TableEntry{py::reinterpret_borrow<py::object>(obj), version, addresses};
    }
  } else {
    bool ok = false;
    if (PyObject_CheckBuffer(obj.ptr())) {
      Py_buffer view;
      if (PyObject_GetBuffer(obj.ptr(), &view, PyBUF_STRIDES | PyBUF_FORMAT) == 0) {
        const char* f = view.format ? view.format : "B";
        if (*f == '@' || *f == '=' || *f == '<') ++f;
        const bool int_type = f[1] == '\0' && std::strchr("QqLlNn", f[0]) != nullptr;
        ok = int_type && view.itemsize == 8 && view.ndim == 1 && view.shape[0] == count &&
             PyBuffer_IsContiguous(&view, 'C');
        const std::string format = view.format ? view.format : "B";
        std::vector<int64_t> shape(view.shape, view.shape + view.ndim);
        if (ok) addresses = CopyAddresses(reinterpret_cast<uintptr_t>(view.buf), count);
        PyBuffer_Release(&view);
        if (!ok) {
          ThrowInvalid(fmt::format(
              "{} must be a 1-D uint64 array of {} addresses, got format "
              "'{}' shape {}",
              name, count, format, ShapeText(shape.data(), static_cast<int>(shape.size()))));
        }
      } else {
        PyErr_Clear();
      }
    }
    if (!ok) {
      if (!PyList_Check(obj.ptr()) && !PyTuple_Check(obj.ptr())) {
        ThrowInvalid(fmt::format("{} must be a 1-D uint64 array of {} addresses, not {}", name,
                                 count, TypeName(obj)));
      }
      py::sequence seq = py::reinterpret_borrow<py::sequence>(obj);
      if (static_cast<int64_t>(seq.size()) != count) {
        ThrowInvalid(fmt::format("{} must be a 1-D uint64 array of {} addresses, got {} entries",
                                 name, count, seq.size()));
      }
      for (size_t i = 0; i < seq.size(); ++i) {
        addresses.push_back(static_cast<uint64_t>(ReadInt(seq[i], fmt::format("{}[{}]", name, i), 0,
                                                          std::numeric_limits<int64_t>::max())));
      }
    }
  }
  for (size_t i = 0; i < addresses.size(); ++i) {
    if (addresses[i] == 0) ThrowInvalid(fmt::format("{}[{}] is a null address", name, i));
  }
  return addresses;
}

CudaStream ResolveStreamArg(py::handle stream, int device) {
  auto as_stream = [](uint64_t a) {
    return reinterpret_cast<CudaStream>(static_cast<uintptr_t>(a));
  };
  if (!stream.is_none()) {
    PyObject* o = stream.ptr();
    if (PyBool_Check(o))
      ThrowInvalid(fmt::format("stream = {} is not a CUDA stream", Repr(stream)));
    if (PyLong_Check(o)) {
      int overflow = 0;
      const long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
      if (overflow < 0 || (overflow == 0 && v < 0)) {
        ThrowInvalid(fmt::format("stream = {} must not be negative", Repr(stream)));
      }
      return as_stream(PyLong_AsUnsignedLongLong(o));
    }
    const Names& n = Name();
    for (PyObject* attr : {n.cuda_stream, n.ptr, n.handle}) {
      PyObject* v = PyObject_GetAttr(o, attr);
      if (v == nullptr) {
        PyErr_Clear();
        continue;
      }
      py::object value = Steal(v);
      if (PyLong_Check(value.ptr()) && !PyBool_Check(value.ptr())) {
        return as_stream(PyLong_AsUnsignedLongLong(value.ptr()));
      }
    }
    ThrowInvalid(
        fmt::format("stream of type {} is not a CUDA stream (pass an int address or a "
                    "torch.cuda.Stream)",
                    TypeName(stream)));
  }
  if (device == kHostDevice) return nullptr;
  const Torch* torch = GetTorch();
  if (torch == nullptr) return nullptr;
  py::object s;
  if (torch->raw_stream != nullptr) {
    s = Steal(PyObject_CallOneArg(torch->raw_stream, py::int_(device).ptr()));
  } else {
    s = py::module_::import("torch").attr("cuda").attr("current_stream")(device).attr(
        "cuda_stream");
  }
  return as_stream(static_cast<uint64_t>(PyLong_AsUnsignedLongLong(s.ptr())));
}

int PointerDevice(uint64_t address) {
#if defined(KVTIER_PY_WITH_CUDA)
  cudaPointerAttributes attr{};
  if (cudaPointerGetAttributes(
          &attr, reinterpret_cast<const void*>(static_cast<uintptr_t>(address))) != cudaSuccess) {
    (void)cudaGetLastError();
    return kHostDevice;
  }
  if (attr.type == cudaMemoryTypeDevice || attr.type == cudaMemoryTypeManaged) return attr.device;
#else
  (void)address;
#endif
  return kHostDevice;
}

#if defined(KVTIER_PY_WITH_CUDA)
namespace {

// A driver entry point (the extension links the runtime only), or null.
void* DriverFunction(const char* name) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult found{};
  if (cudaGetDriverEntryPointByVersion(name, &fn, 12000, cudaEnableDefault, &found) !=
          cudaSuccess ||
      found != cudaDriverEntryPointSuccess) {
    (void)cudaGetLastError();
    return nullptr;
  }
  return fn;
}

// Bytes from `address` to the end of [start, start + size), or -1 when it is not inside.
int64_t BytesToEnd(uint64_t address, uint64_t start, uint64_t size) {
  if (size == 0 || address < start || address - start >= size) return -1;
  return static_cast<int64_t>(start + size - address);
}

}  // namespace
#endif

int64_t AllocationBytesFrom(uint64_t address) {
#if defined(KVTIER_PY_WITH_CUDA)
  using GetAttributes = CUresult (*)(unsigned, CUpointer_attribute*, void**, CUdeviceptr);
  using GetAddressRange = CUresult (*)(CUdeviceptr*, size_t*, CUdeviceptr);
  static const auto get = reinterpret_cast<GetAttributes>(DriverFunction("cuPointerGetAttributes"));
  static const auto range =
      reinterpret_cast<GetAddressRange>(DriverFunction("cuMemGetAddressRange"));
  // 1. Device memory, and pinned memory the driver reports a range for.
  if (get != nullptr) {
    CUpointer_attribute attrs[2] = {CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
                                    CU_POINTER_ATTRIBUTE_RANGE_SIZE};
    CUdeviceptr start = 0;
    size_t size = 0;
    void* data[2] = {&start, &size};
    if (get(2, attrs, data, static_cast<CUdeviceptr>(address)) == CUDA_SUCCESS) {
      const int64_t bytes = BytesToEnd(address, start, size);
      if (bytes >= 0) return bytes;
    }
  }
  // 2. Pinned host memory (cudaHostAlloc / cudaMallocHost) and registered host memory
  //    (cudaHostRegister): the runtime knows the page's device-side alias; the allocation (or
  //    registration) holding that alias is the range, translated back to the host address.
  if (range == nullptr) return -1;
  cudaPointerAttributes attr{};
  const void* host = reinterpret_cast<const void*>(static_cast<uintptr_t>(address));
  if (cudaPointerGetAttributes(&attr, host) != cudaSuccess) {
    (void)cudaGetLastError();
    return -1;
  }
  if (attr.type != cudaMemoryTypeHost || attr.devicePointer == nullptr) return -1;
  const auto alias = static_cast<CUdeviceptr>(reinterpret_cast<uintptr_t>(attr.devicePointer));
  CUdeviceptr base = 0;
  size_t size = 0;
  if (range(&base, &size, alias) != CUDA_SUCCESS) return -1;
  return BytesToEnd(alias, base, size);
#else
  (void)address;
  return -1;
#endif
}

}  // namespace kvtier::python
