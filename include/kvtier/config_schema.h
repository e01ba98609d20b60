// kvtier/config_schema.h — one declaration per configuration field, read by everything that
// needs the field: the struct's Validate, the command-line flags (tools/kvtier) and the Python
// keyword arguments (python/src).
//
// A schema is a list of `ConfigField<Config>`: the field's name, kind, bounds (or choices) and
// help, with a getter and a setter on the C++ struct (built from member pointers, so nested
// fields such as `HierarchicalCacheConfig::transfer.max_sms` are reached the same way). Defaults
// are not written in the schema: they are the struct's own member initializers, read from a
// default-constructed `Config` (`Default*`), so each default is written once too.
//
// `CheckFields` is the generated part of a Validate: the first field outside its bounds (or not
// one of its choices, or a float that is not finite) is an InvalidArgument
// "<name> = <value> must be in [<min>, <max>]". `name_of` renames fields in that message (the
// command line reports its flag names: "--dma-lanes = 0 must be in [1, 16]").
//
// Thread safety: schemas are built once (function-local statics) and read-only afterwards.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "kvtier/status.h"

namespace kvtier {

enum class FieldKind : uint8_t { kInt = 0, kFloat = 1, kBool = 2, kString = 3, kChoice = 4 };
// "int", "float", "bool", "str", "choice".
const char* FieldKindName(FieldKind kind);

// How a message names a field: field name -> the name the caller knows (a flag, a keyword).
// Empty: the field's own name.
using FieldNamer = std::function<std::string(std::string_view field)>;

template <typename Config>
struct ConfigField {
  std::string name;  // snake_case; flags are "--" + name with '-' for '_'
  FieldKind kind = FieldKind::kInt;
  std::string help;
  // kInt: inclusive bounds (within the C++ type's range).
  int64_t int_min = 0;
  int64_t int_max = 0;
  // kFloat: finite and in [float_min, float_max], or (float_min, float_max] when min_exclusive.
  double float_min = 0;
  double float_max = 0;
  bool min_exclusive = false;
  // kChoice: the names, in the order of the enum's values (get_int / set_int use the index).
  std::vector<std::string> choices;
  // Bounds apply only where this holds (null: always); `when` says it in words.
  std::function<bool(const Config&)> checked_when;
  std::string when;

  // kInt, kBool (0 / 1) and kChoice (the index).
  std::function<int64_t(const Config&)> get_int;
  std::function<void(Config&, int64_t)> set_int;
  std::function<double(const Config&)> get_float;  // kFloat
  std::function<void(Config&, double)> set_float;
  std::function<std::string(const Config&)> get_string;  // kString
  std::function<void(Config&, std::string)> set_string;

  bool numeric() const { return kind == FieldKind::kInt || kind == FieldKind::kFloat; }
  // OK, or InvalidArgument "<display> = <value> must be in [min, max]" for `value`.
  Status CheckInt(int64_t value, std::string_view display) const;
  Status CheckFloat(double value, std::string_view display) const;
  Status CheckChoice(int64_t index, std::string_view display) const;
  // The field's value in `c`, checked (ignoring checked_when).
  Status Check(const Config& c, std::string_view display) const;
  // "[16, 1048576]", "(0, 1]", "one of lru, lfu, fifo, priority"; "" for bool and string.
  std::string RangeText() const;
  // The value in `c` as text: 42, 0.5, true, "page_first".
  std::string ValueText(const Config& c) const;
};

template <typename Config>
using ConfigSchema = std::vector<ConfigField<Config>>;

// ---- non-template helpers (src/util/config_schema.cc) -------------------------------------------
namespace schema_detail {
Status IntOutOfRange(std::string_view display, int64_t value, int64_t min, int64_t max);
Status FloatOutOfRange(std::string_view display, double value, double min, double max,
                       bool min_exclusive);
Status NotAChoice(std::string_view display, int64_t index, const std::vector<std::string>& choices);
std::string IntRangeText(int64_t min, int64_t max);
std::string FloatRangeText(double min, double max, bool min_exclusive);
std::string ChoicesText(const std::vector<std::string>& choices);
std::string FloatText(double value);
}  // namespace schema_detail

template <typename Config>
Status ConfigField<Config>::CheckInt(int64_t value, std::string_view display) const {
  if (value < int_min || value > int_max) {
    return schema_detail::IntOutOfRange(display, value, int_min, int_max);
  }
  return Status::OK();
}

template <typename Config>
Status ConfigField<Config>::CheckFloat(double value, std::string_view display) const {
  const bool low_ok = min_exclusive ? value > float_min : value >= float_min;
  if (!(low_ok && value <= float_max)) {  // NaN fails both
    return schema_detail::FloatOutOfRange(display, value, float_min, float_max, min_exclusive);
  }
  return Status::OK();
}

template <typename Config>
Status ConfigField<Config>::CheckChoice(int64_t index, std::string_view display) const {
  if (index < 0 || index >= static_cast<int64_t>(choices.size())) {
    return schema_detail::NotAChoice(display, index, choices);
  }
  return Status::OK();
}

template <typename Config>
Status ConfigField<Config>::Check(const Config& c, std::string_view display) const {
  switch (kind) {
    case FieldKind::kInt:
      return CheckInt(get_int(c), display);
    case FieldKind::kFloat:
      return CheckFloat(get_float(c), display);
    case FieldKind::kChoice:
      return CheckChoice(get_int(c), display);
    case FieldKind::kBool:
    case FieldKind::kString:
      return Status::OK();
  }
  return Status::OK();
}

template <typename Config>
std::string ConfigField<Config>::RangeText() const {
  switch (kind) {
    case FieldKind::kInt:
      return schema_detail::IntRangeText(int_min, int_max);
    case FieldKind::kFloat:
      return schema_detail::FloatRangeText(float_min, float_max, min_exclusive);
    case FieldKind::kChoice:
      return schema_detail::ChoicesText(choices);
    case FieldKind::kBool:
    case FieldKind::kString:
      return "";
  }
  return "";
}

template <typename Config>
std::string ConfigField<Config>::ValueText(const Config& c) const {
  switch (kind) {
    case FieldKind::kInt:
      return std::to_string(get_int(c));
    case FieldKind::kFloat:
      return schema_detail::FloatText(get_float(c));
    case FieldKind::kBool:
      return get_int(c) != 0 ? "true" : "false";
    case FieldKind::kString:
      return get_string(c);
    case FieldKind::kChoice: {
      const int64_t i = get_int(c);
      return i >= 0 && i < static_cast<int64_t>(choices.size()) ? choices[i] : std::to_string(i);
    }
  }
  return "";
}

// The generated part of a Validate: each field in schema order, where its checked_when holds.
template <typename Config>
Status CheckFields(const ConfigSchema<Config>& schema, const Config& c,
                   const FieldNamer& name_of = nullptr) {
  for (const ConfigField<Config>& f : schema) {
    if (f.checked_when && !f.checked_when(c)) continue;
    Status st = f.Check(c, name_of ? name_of(f.name) : f.name);
    if (!st.ok()) return st;
  }
  return Status::OK();
}

template <typename Config>
const ConfigField<Config>* FindField(const ConfigSchema<Config>& schema, std::string_view name) {
  for (const ConfigField<Config>& f : schema) {
    if (f.name == name) return &f;
  }
  return nullptr;
}

// ---- building a schema ----------------------------------------------------------------------
// `ref` is a callable Config& -> T& (Member below builds one from member pointers).

// Config -> its member `m`, or a member of a member (nested parts of a config).
template <typename Config, typename T>
auto Member(T Config::*m) {
  return [m](Config& c) -> T& { return c.*m; };
}
template <typename Config, typename Part, typename T>
auto Member(Part Config::*part, T Part::*m) {
  return [part, m](Config& c) -> T& { return (c.*part).*m; };
}
template <typename Config, typename Part, typename Sub, typename T>
auto Member(Part Config::*part, Sub Part::*sub, T Sub::*m) {
  return [part, sub, m](Config& c) -> T& { return ((c.*part).*sub).*m; };
}

// An integer field of type T in [min, max] (max defaults to T's largest value).
template <typename Config, typename Ref>
ConfigField<Config> IntField(std::string name, Ref ref, int64_t min, int64_t max,
                             std::string help) {
  using T = std::remove_reference_t<decltype(ref(std::declval<Config&>()))>;
  static_assert(std::is_integral_v<T> && !std::is_same_v<T, bool>);
  ConfigField<Config> f;
  f.name = std::move(name);
  f.kind = FieldKind::kInt;
  f.help = std::move(help);
  f.int_min = std::max<int64_t>(min, std::numeric_limits<T>::min());
  f.int_max = std::min<int64_t>(max, std::numeric_limits<T>::max());
  f.get_int = [ref](const Config& c) { return static_cast<int64_t>(ref(const_cast<Config&>(c))); };
  f.set_int = [ref](Config& c, int64_t v) { ref(c) = static_cast<T>(v); };
  return f;
}
template <typename Config, typename Ref>
ConfigField<Config> IntField(std::string name, Ref ref, int64_t min, std::string help) {
  return IntField<Config>(std::move(name), ref, min, std::numeric_limits<int64_t>::max(),
                          std::move(help));
}

template <typename Config, typename Ref>
ConfigField<Config> FloatField(std::string name, Ref ref, double min, double max,
                               bool min_exclusive, std::string help) {
  ConfigField<Config> f;
  f.name = std::move(name);
  f.kind = FieldKind::kFloat;
  f.help = std::move(help);
  f.float_min = min;
  f.float_max = max;
  f.min_exclusive = min_exclusive;
  f.get_float = [ref](const Config& c) { return ref(const_cast<Config&>(c)); };
  f.set_float = [ref](Config& c, double v) { ref(c) = v; };
  return f;
}

template <typename Config, typename Ref>
ConfigField<Config> BoolField(std::string name, Ref ref, std::string help) {
  ConfigField<Config> f;
  f.name = std::move(name);
  f.kind = FieldKind::kBool;
  f.help = std::move(help);
  f.int_max = 1;
  f.get_int = [ref](const Config& c) { return int64_t{ref(const_cast<Config&>(c)) ? 1 : 0}; };
  f.set_int = [ref](Config& c, int64_t v) { ref(c) = v != 0; };
  return f;
}

template <typename Config, typename Ref>
ConfigField<Config> StringField(std::string name, Ref ref, std::string help) {
  ConfigField<Config> f;
  f.name = std::move(name);
  f.kind = FieldKind::kString;
  f.help = std::move(help);
  f.get_string = [ref](const Config& c) { return std::string(ref(const_cast<Config&>(c))); };
  f.set_string = [ref](Config& c, std::string v) { ref(c) = std::move(v); };
  return f;
}

// An enum field whose values are 0 .. n-1, spelled by `name_of` (the C++ API's Name function).
template <typename Config, typename Ref, typename NameFn>
ConfigField<Config> ChoiceField(std::string name, Ref ref, int num_values, NameFn name_of,
                                std::string help) {
  using E = std::remove_reference_t<decltype(ref(std::declval<Config&>()))>;
  ConfigField<Config> f;
  f.name = std::move(name);
  f.kind = FieldKind::kChoice;
  f.help = std::move(help);
  for (int i = 0; i < num_values; ++i) f.choices.emplace_back(name_of(static_cast<E>(i)));
  f.get_int = [ref](const Config& c) { return static_cast<int64_t>(ref(const_cast<Config&>(c))); };
  f.set_int = [ref](Config& c, int64_t v) { ref(c) = static_cast<E>(v); };
  return f;
}

// Marks the fields [first, schema.size()) as checked only where `when` holds.
template <typename Config>
void CheckedWhen(ConfigSchema<Config>& schema, size_t first,
                 std::function<bool(const Config&)> when, const std::string& words) {
  for (size_t i = first; i < schema.size(); ++i) {
    schema[i].checked_when = when;
    schema[i].when = words;
  }
}

// The fields of a part's schema as fields of the whole: `ref` reaches the part in a Config (a
// callable Config& -> Part&, as Member builds from member pointers), and each field's name is
// `prefix` + the part's name for it.
template <typename Config, typename Part, typename Ref>
void AppendPart(ConfigSchema<Config>& schema, const ConfigSchema<Part>& part_schema, Ref ref,
                std::string_view prefix) {
  // The part of a const Config (the getters), through the same path.
  auto part = [ref](const Config& c) -> const Part& { return ref(const_cast<Config&>(c)); };
  for (const ConfigField<Part>& p : part_schema) {
    ConfigField<Config> f;
    f.name = std::string(prefix) + p.name;
    f.kind = p.kind;
    f.help = p.help;
    f.int_min = p.int_min;
    f.int_max = p.int_max;
    f.float_min = p.float_min;
    f.float_max = p.float_max;
    f.min_exclusive = p.min_exclusive;
    f.choices = p.choices;
    f.when = p.when;
    if (p.checked_when)
      f.checked_when = [w = p.checked_when, part](const Config& c) { return w(part(c)); };
    if (p.get_int) f.get_int = [g = p.get_int, part](const Config& c) { return g(part(c)); };
    if (p.set_int) f.set_int = [s = p.set_int, ref](Config& c, int64_t v) { s(ref(c), v); };
    if (p.get_float) f.get_float = [g = p.get_float, part](const Config& c) { return g(part(c)); };
    if (p.set_float) f.set_float = [s = p.set_float, ref](Config& c, double v) { s(ref(c), v); };
    if (p.get_string)
      f.get_string = [g = p.get_string, part](const Config& c) { return g(part(c)); };
    if (p.set_string)
      f.set_string = [s = p.set_string, ref](Config& c, std::string v) { s(ref(c), std::move(v)); };
    schema.push_back(std::move(f));
  }
}
// The same for a direct member `part` of Config, names unchanged.
template <typename Config, typename Part>
void AppendPart(ConfigSchema<Config>& schema, const ConfigSchema<Part>& part_schema,
                Part Config::*part) {
  AppendPart(schema, part_schema, Member(part), "");
}

}  // namespace kvtier
