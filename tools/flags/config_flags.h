// tools/flags/config_flags.h — command-line flags generated from a config schema
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
#include <cerrno>
#include <cmath>
#include <cstdlib>
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

// A flag of type T (an integer or floating type): text that is not `what` ("an integer") or a value
// `check` refuses is refused while parsing, naming `flag`; a value that passes goes to `set`.
template <typename T, typename Set, typename Check>
CLI::Option* AddNumberFlag(CLI::App* app, const std::string& names, const std::string& help,
                           const std::string& flag, const char* what, Set set, Check check) {
  CLI::Option* opt = app->add_option_function<T>(names, set, help);
  opt->check(CLI::Validator(
      [flag, what, check](std::string& text) -> std::string {
        T v = 0;
        if (!CLI::detail::lexical_cast(text, v)) return flag + " = " + text + " is not " + what;
        const Status st = check(v);
        return st.ok() ? std::string() : st.message();
      },
      "", "schema bounds"));
  return opt;
}

// Every numeric flag of `app` and its subcommands (CLI11 type names INT, UINT, FLOAT) refuses text
// CLI11's own conversion lets through: an integer outside the 64-bit range (strtoll saturates it to
// 2^63 - 1 without an error) and a non-finite number ("nan" passes every CLI::Range, "inf").
// Called once every flag is added, before the parse.
inline void RejectUnrepresentableNumbers(CLI::App* app) {
  for (CLI::Option* opt : app->get_options()) {
    // "FLOAT", or "FLOAT:FLOAT in [0.1 - 3600]" once a validator describes itself.
    const std::string full_type = opt->get_type_name();
    const std::string type = full_type.substr(0, full_type.find(':'));
    const bool is_signed = type == "INT", is_unsigned = type == "UINT", is_real = type == "FLOAT";
    if (!is_signed && !is_unsigned && !is_real) continue;
    const std::string flag = opt->get_name();
    opt->check(CLI::Validator(
        [=](std::string& text) -> std::string {
          const char* s = text.c_str();
          char* end = nullptr;
          errno = 0;
          if (is_real) {
            const double v = std::strtod(s, &end);
            if (end != s && !std::isfinite(v))
              return flag + " = " + text + " is not a finite number";
            return "";
          }
          if (is_signed) {
            (void)std::strtoll(s, &end, 0);
          } else {
            (void)std::strtoull(s, &end, 0);
          }
          if (end != s && errno == ERANGE) {
            return flag + " = " + text + " is out of range (" +
                   (is_signed ? "-2^63 .. 2^63 - 1" : "0 .. 2^64 - 1") + ")";
          }
          return "";
        },
        "", "representable"));
  }
  for (CLI::App* sub : app->get_subcommands([](CLI::App*) { return true; })) {
    RejectUnrepresentableNumbers(sub);
  }
}

// One flag for field `f` of `*config`; `names` is CLI11's name list ("--cpu-threads,--threads"),
// FlagName(f.name) when empty. Messages name the flag by the first of `names`.
template <typename Config>
CLI::Option* AddFieldFlag(CLI::App* app, const ConfigField<Config>& f, Config* config,
                          std::string names = "") {
  if (names.empty()) names = FlagName(f.name);
  const std::string flag = names.substr(0, names.find(','));
  const std::string range = f.RangeText();
  const std::string help = range.empty() ? f.help : f.help + "; " + range;
  CLI::Option* opt = nullptr;
  switch (f.kind) {
    case FieldKind::kInt:
      opt = AddNumberFlag<int64_t>(
          app, names, help, flag, "an integer",
          [&f, config](const int64_t& v) { f.set_int(*config, v); },
          [&f, flag](int64_t v) { return f.CheckInt(v, flag); });
      break;
    case FieldKind::kFloat:
      opt = AddNumberFlag<double>(
          app, names, help, flag, "a number",
          [&f, config](const double& v) { f.set_float(*config, v); },
          [&f, flag](double v) { return f.CheckFloat(v, flag); });
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
