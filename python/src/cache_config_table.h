// python/src/cache_config_table.h — the C++ config schemas (kvtier/config_schema.h) seen from
// Python: a table of the fields (name, kind, default, bounds, choices, help) for the Python
// keyword arguments and their defaults, and a dict of settings applied to a C++ config.
//
// Nothing is typed here: names, bounds and help are the schema's (HierarchicalCacheConfigSchema,
// TransferEngineConfigSchema), defaults are read from a default-constructed config. The setters
// check each value's Python type and that an integer lies within its field's bounds (so nothing
// is truncated into a narrower C++ type); the rest (float bounds, rules between fields) is the
// C++ Validate's, which runs before any config is used.
//
// Thread safety: REQUIRES the GIL; the schemas are read-only.
#pragma once

#include <pybind11/pybind11.h>

#include <algorithm>
#include <initializer_list>
#include <string>
#include <string_view>

#include "kvtier/config_schema.h"
#include "kvtier/hierarchical_cache.h"
#include "kvtier/transfer.h"

namespace kvtier::python {

namespace table_detail {
pybind11::dict FieldDict(std::string_view name, FieldKind kind, pybind11::object default_value,
                         int64_t int_min, int64_t int_max, double float_min, double float_max,
                         bool min_exclusive, const std::vector<std::string>& choices,
                         std::string_view help);
pybind11::object Default(FieldKind kind, int64_t i, double f, const std::string& s,
                         const std::vector<std::string>& choices);
int64_t IntArg(std::string_view name, pybind11::handle value, int64_t min, int64_t max);
double FloatArg(std::string_view name, pybind11::handle value);
bool BoolArg(std::string_view name, pybind11::handle value);
std::string StringArg(std::string_view name, pybind11::handle value);
int64_t ChoiceArg(std::string_view name, pybind11::handle value,
                  const std::vector<std::string>& choices);
[[noreturn]] void UnknownSetting(std::string_view key, std::string_view what);
}  // namespace table_detail

// The value of field `f` in `c` as a Python object (int, float, bool, str, or the choice's name).
template <typename Config>
pybind11::object ValueOf(const ConfigField<Config>& f, const Config& c) {
  const int64_t i = f.get_int ? f.get_int(c) : 0;
  const double x = f.get_float ? f.get_float(c) : 0;
  const std::string s = f.get_string ? f.get_string(c) : std::string();
  return table_detail::Default(f.kind, i, x, s, f.choices);
}

// {name: value} of every field of `schema` in `c`, less `skip`.
template <typename Config>
pybind11::dict ConfigValues(const ConfigSchema<Config>& schema, const Config& c,
                            std::initializer_list<std::string_view> skip = {}) {
  pybind11::dict d;
  for (const ConfigField<Config>& f : schema) {
    if (std::find(skip.begin(), skip.end(), f.name) != skip.end()) continue;
    d[pybind11::str(f.name)] = ValueOf(f, c);
  }
  return d;
}

// [{name, kind, default, min, max, min_exclusive, choices, help}] of `schema`, less `skip`
// (fields Python does not set: they come from elsewhere, e.g. the device from the region).
template <typename Config>
pybind11::list SchemaTable(const ConfigSchema<Config>& schema,
                           std::initializer_list<std::string_view> skip = {}) {
  const Config defaults{};
  pybind11::list out;
  for (const ConfigField<Config>& f : schema) {
    if (std::find(skip.begin(), skip.end(), f.name) != skip.end()) continue;
    out.append(table_detail::FieldDict(f.name, f.kind, ValueOf(f, defaults), f.int_min, f.int_max,
                                       f.float_min, f.float_max, f.min_exclusive, f.choices,
                                       f.help));
  }
  return out;
}

// Applies `values` (field name -> Python value) to `config`. InvalidArgument naming an unknown
// or skipped field (`what` names the settings in the message), a value of the wrong type, or an
// integer outside its field's bounds.
template <typename Config>
void ApplySettings(const ConfigSchema<Config>& schema, const pybind11::dict& values,
                   std::string_view what, Config* config,
                   std::initializer_list<std::string_view> skip = {}) {
  namespace td = table_detail;
  for (auto item : values) {
    const std::string key = pybind11::str(item.first).cast<std::string>();
    const ConfigField<Config>* f = FindField(schema, key);
    if (f == nullptr || std::find(skip.begin(), skip.end(), key) != skip.end()) {
      td::UnknownSetting(key, what);
    }
    switch (f->kind) {
      case FieldKind::kInt:
        f->set_int(*config, td::IntArg(f->name, item.second, f->int_min, f->int_max));
        break;
      case FieldKind::kFloat:
        f->set_float(*config, td::FloatArg(f->name, item.second));
        break;
      case FieldKind::kBool:
        f->set_int(*config, td::BoolArg(f->name, item.second) ? 1 : 0);
        break;
      case FieldKind::kString:
        f->set_string(*config, td::StringArg(f->name, item.second));
        break;
      case FieldKind::kChoice:
        f->set_int(*config, td::ChoiceArg(f->name, item.second, f->choices));
        break;
    }
  }
}

// The cache's settings: every field of HierarchicalCacheConfigSchema but the transfer device
// (the device region's).
pybind11::list CacheConfigTable();
// Applies `values` over the C++ defaults.
HierarchicalCacheConfig CacheConfigFromDict(const pybind11::dict& values);

// kvtier.ops.configure's settings: every field of TransferEngineConfigSchema but the device
// (each engine is made for the device of the regions it copies).
pybind11::list TransferConfigTable();
pybind11::dict TransferConfigValues(const TransferEngineConfig& config);
TransferEngineConfig TransferConfigFromDict(const TransferEngineConfig& base,
                                            const pybind11::dict& values);

}  // namespace kvtier::python
