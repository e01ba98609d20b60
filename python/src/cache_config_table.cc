// python/src/cache_config_table.cc — see cache_config_table.h.
#include "cache_config_table.h"

#include <fmt/format.h>
#include <pybind11/stl.h>

#include <limits>

#include "errors.h"

namespace py = pybind11;

namespace kvtier::python {
namespace table_detail {
namespace {

[[noreturn]] void WrongType(std::string_view name, py::handle value, const char* want) {
  ThrowStatus(Status::InvalidArgument(
      fmt::format("{} = {} must be {}", name, py::repr(value).cast<std::string>(), want)));
}

}  // namespace

py::dict FieldDict(std::string_view name, FieldKind kind, py::object default_value, int64_t int_min,
                   int64_t int_max, double float_min, double float_max, bool min_exclusive,
                   const std::vector<std::string>& choices, std::string_view help) {
  py::dict d;
  d["name"] = std::string(name);
  d["kind"] = FieldKindName(kind);
  d["default"] = std::move(default_value);
  if (kind == FieldKind::kInt) {
    d["min"] = int_min;
    d["max"] = int_max;
  } else if (kind == FieldKind::kFloat) {
    d["min"] = float_min;
    d["max"] = float_max;
  } else {
    d["min"] = py::none();
    d["max"] = py::none();
  }
  d["min_exclusive"] = min_exclusive;
  d["choices"] = choices;
  d["help"] = std::string(help);
  return d;
}

py::object Default(FieldKind kind, int64_t i, double f, const std::string& s,
                   const std::vector<std::string>& choices) {
  switch (kind) {
    case FieldKind::kInt:
      return py::int_(i);
    case FieldKind::kFloat:
      return py::float_(f);
    case FieldKind::kBool:
      return py::bool_(i != 0);
    case FieldKind::kString:
      return py::str(s);
    case FieldKind::kChoice:
      return i >= 0 && i < static_cast<int64_t>(choices.size()) ? py::str(choices[i])
                                                                : py::object(py::int_(i));
  }
  return py::none();
}

int64_t IntArg(std::string_view name, py::handle value, int64_t min, int64_t max) {
  if (PyBool_Check(value.ptr()) || !PyIndex_Check(value.ptr())) {
    WrongType(name, value, "an integer");
  }
  py::object index = py::reinterpret_steal<py::object>(PyNumber_Index(value.ptr()));
  if (!index) throw py::error_already_set();
  int overflow = 0;
  const long long x = PyLong_AsLongLongAndOverflow(index.ptr(), &overflow);
  if (overflow != 0 || x < min || x > max) {
    ThrowStatus(Status::InvalidArgument(fmt::format("{} = {} must be in [{}, {}]", name,
                                                    py::str(index).cast<std::string>(), min, max)));
  }
  return x;
}

double FloatArg(std::string_view name, py::handle value) {
  if (PyBool_Check(value.ptr()) || !(PyFloat_Check(value.ptr()) || PyIndex_Check(value.ptr()))) {
    WrongType(name, value, "a number");
  }
  const double x = PyFloat_AsDouble(value.ptr());
  if (x == -1.0 && PyErr_Occurred()) throw py::error_already_set();  // an int too large
  return x;
}

bool BoolArg(std::string_view name, py::handle value) {
  if (!PyBool_Check(value.ptr())) WrongType(name, value, "True or False");
  return value.ptr() == Py_True;
}

std::string StringArg(std::string_view name, py::handle value) {
  if (value.is_none()) return "";  // None reads as "" (off)
  if (!PyUnicode_Check(value.ptr())) WrongType(name, value, "a string");
  std::string s = value.cast<std::string>();
  if (s.find('\0') != std::string::npos) {
    // C++ would see the text cut at the NUL (a storage URL: another path or server)
    ThrowStatus(Status::InvalidArgument(fmt::format("{} holds a NUL byte", name)));
  }
  return s;
}

int64_t ChoiceArg(std::string_view name, py::handle value,
                  const std::vector<std::string>& choices) {
  if (!PyUnicode_Check(value.ptr())) WrongType(name, value, "a string");
  const std::string s = value.cast<std::string>();
  for (size_t i = 0; i < choices.size(); ++i) {
    if (choices[i] == s) return static_cast<int64_t>(i);
  }
  ThrowStatus(Status::InvalidArgument(fmt::format("{} = {} is not one of {}", name,
                                                  py::repr(value).cast<std::string>(),
                                                  fmt::join(choices, ", "))));
}

void UnknownSetting(std::string_view key, std::string_view what) {
  ThrowStatus(Status::InvalidArgument(
      fmt::format("'{}' is not a {} setting (see its config_fields())", key, what)));
}

}  // namespace table_detail

py::list CacheConfigTable() { return SchemaTable(HierarchicalCacheConfigSchema(), {"device"}); }

HierarchicalCacheConfig CacheConfigFromDict(const py::dict& values) {
  HierarchicalCacheConfig c;
  ApplySettings(HierarchicalCacheConfigSchema(), values, "HierarchicalCache", &c, {"device"});
  return c;
}

py::list TransferConfigTable() { return SchemaTable(TransferEngineConfigSchema(), {"device"}); }

py::dict TransferConfigValues(const TransferEngineConfig& config) {
  return ConfigValues(TransferEngineConfigSchema(), config, {"device"});
}

TransferEngineConfig TransferConfigFromDict(const TransferEngineConfig& base,
                                            const py::dict& values) {
  TransferEngineConfig c = base;
  ApplySettings(TransferEngineConfigSchema(), values, "kvtier.ops engine", &c, {"device"});
  return c;
}

}  // namespace kvtier::python
