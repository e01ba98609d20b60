// tools/kvtier/config_flags.h — command-line flags generated from a config schema
// (kvtier/config_schema.h): one flag per field, named "--" + the field's name with '-' for '_'
// (plus any aliases the caller gives), bound to the field of a config the caller owns, its
// default shown from that config, its help and bounds from the schema, and a value outside the
// bounds refused while parsing with the schema's message under the flag's name:
//   "--dma-lanes: --dma-lanes = 0 must be in [1, 16]".
//
// Thread safety: used while the command line is parsed, from main's thread. The schema's fields
// are referenced by the flags (schemas are static); `config` must outlive the parse.
#pragma once

#include <CLI/CLI.hpp>
#include <algorithm>
#include <initializer_list>
#include <map>
#include <string>
#include <string_view>

#include "kvtier/config_schema.h"

namespace kvtier::tools {

// "--" + name with '-' for '_'.
inline std::string FlagName(std::string_view field) {
  std::string flag = "--" + std::string(field);
  for (char& ch : flag) ch = ch == '_' ? '-' : ch;
  return flag;
}

// One flag for field `f` of `*config`; `names` is CLI11's name list ("--cpu-threads,--threads"),
// FlagName(f.name) when empty.
template <typename Config>
CLI::Option* AddFieldFlag(CLI::App* app, const ConfigField<Config>& f, Config* config,
                          std::string names = "") {
  const std::string flag = FlagName(f.name);
  if (names.empty()) names = flag;
  const std::string range = f.RangeText();
  const std::string help = range.empty() ? f.help : f.help + "; " + range;
  CLI::Option* opt = nullptr;
  switch (f.kind) {
    case FieldKind::kInt:
      opt = app->add_option_function<int64_t>(
          names, [&f, config](const int64_t& v) { f.set_int(*config, v); }, help);
      opt->check(CLI::Validator(
          [&f, flag](std::string& text) -> std::string {
            int64_t v = 0;
            if (!CLI::detail::lexical_cast(text, v))
              return flag + " = " + text + " is not an integer";
            const Status st = f.CheckInt(v, flag);
            return st.ok() ? std::string() : st.message();
          },
          "", "schema bounds"));
      break;
    case FieldKind::kFloat:
      opt = app->add_option_function<double>(
          names, [&f, config](const double& v) { f.set_float(*config, v); }, help);
      opt->check(CLI::Validator(
          [&f, flag](std::string& text) -> std::string {
            double v = 0;
            if (!CLI::detail::lexical_cast(text, v))
              return flag + " = " + text + " is not a number";
            const Status st = f.CheckFloat(v, flag);
            return st.ok() ? std::string() : st.message();
          },
          "", "schema bounds"));
      break;
    case FieldKind::kBool:
      opt = app->add_option_function<bool>(
          names, [&f, config](const bool& v) { f.set_int(*config, v ? 1 : 0); }, help);
      break;
    case FieldKind::kString:
      opt = app->add_option_function<std::string>(
          names, [&f, config](const std::string& v) { f.set_string(*config, v); }, help);
      break;
    case FieldKind::kChoice: {
      opt = app->add_option_function<std::string>(
          names,
          [&f, config](const std::string& v) {
            for (size_t i = 0; i < f.choices.size(); ++i) {
              if (f.choices[i] == v) f.set_int(*config, static_cast<int64_t>(i));
            }
          },
          help);
      opt->check(CLI::IsMember(f.choices));
      break;
    }
  }
  opt->default_str(f.ValueText(*config));
  return opt;
}

// A flag for every field of `schema` but those in `skip`; `aliases` adds names to a field's flag
// (field name -> ",--other" etc.).
template <typename Config>
void AddSchemaFlags(CLI::App* app, const ConfigSchema<Config>& schema, Config* config,
                    const std::map<std::string, std::string>& aliases = {},
                    std::initializer_list<std::string_view> skip = {}) {
  for (const ConfigField<Config>& f : schema) {
    if (std::find(skip.begin(), skip.end(), f.name) != skip.end()) continue;
    auto it = aliases.find(f.name);
    AddFieldFlag(app, f, config, FlagName(f.name) + (it == aliases.end() ? "" : it->second));
  }
}

}  // namespace kvtier::tools
