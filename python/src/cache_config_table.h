// python/src/cache_config_table.h — every HierarchicalCacheConfig field Python can set, declared
// once: its Python name (storage fields prefixed "storage_" where the C++ name alone would be
// ambiguous), kind, bounds, choices and help, with a getter and a setter on the C++ struct.
//
// Defaults are not typed here: they are read from a default-constructed HierarchicalCacheConfig
// through the getters, so the C++ struct stays the one source of them. The bounds restate
// HierarchicalCacheConfig::Validate (which still runs in Create, the final word) so that Python
// can name the argument and its range before any C++ object exists; tests check that a value
// just outside each bound is refused by both.
//
// Thread safety: the table is built once (function-local static) and read-only afterwards.
#pragma once

#include <pybind11/pybind11.h>

#include <functional>
#include <string>
#include <vector>

#include "kvtier/hierarchical_cache.h"

namespace kvtier::python {

struct ConfigField {
  enum class Kind { kInt, kFloat, kBool, kString, kChoice };
  std::string name;
  Kind kind;
  // kInt / kFloat: inclusive bounds, except the lower one when min_exclusive.
  double min = 0;
  double max = 0;
  bool min_exclusive = false;
  std::vector<std::string> choices;  // kChoice
  std::string help;
  std::function<pybind11::object(const HierarchicalCacheConfig&)> get;
  // REQUIRES: the GIL. Throws StatusError(InvalidArgument) for a value of the wrong type.
  std::function<void(HierarchicalCacheConfig&, pybind11::handle)> set;
};

const std::vector<ConfigField>& CacheConfigFields();

// [{name, kind, default, min, max, min_exclusive, choices, help}] for kvtier.HierarchicalCache.
pybind11::list CacheConfigTable();

// Applies `values` (a dict of field name -> value) over the C++ defaults. InvalidArgument naming
// an unknown field or a value of the wrong type; bounds are left to Validate.
HierarchicalCacheConfig CacheConfigFromDict(const pybind11::dict& values);

}  // namespace kvtier::python
