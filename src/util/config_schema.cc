// The non-template parts of kvtier/config_schema.h: messages and range texts.
#include "kvtier/config_schema.h"

#include <fmt/format.h>

#include <cmath>

namespace kvtier {

const char* FieldKindName(FieldKind kind) {
  switch (kind) {
    case FieldKind::kInt:
      return "int";
    case FieldKind::kFloat:
      return "float";
    case FieldKind::kBool:
      return "bool";
    case FieldKind::kString:
      return "str";
    case FieldKind::kChoice:
      return "choice";
  }
  return "unknown_kind";
}

namespace schema_detail {

std::string FloatText(double value) { return fmt::format("{}", value); }

std::string IntRangeText(int64_t min, int64_t max) { return fmt::format("[{}, {}]", min, max); }

std::string FloatRangeText(double min, double max, bool min_exclusive) {
  return fmt::format("{}{}, {}]", min_exclusive ? "(" : "[", FloatText(min), FloatText(max));
}

std::string ChoicesText(const std::vector<std::string>& choices) {
  return fmt::format("one of {}", fmt::join(choices, ", "));
}

Status IntOutOfRange(std::string_view display, int64_t value, int64_t min, int64_t max) {
  return Status::InvalidArgument(
      fmt::format("{} = {} must be in {}", display, value, IntRangeText(min, max)));
}

Status FloatOutOfRange(std::string_view display, double value, double min, double max,
                       bool min_exclusive) {
  return Status::InvalidArgument(fmt::format("{} = {} must be in {}", display, FloatText(value),
                                             FloatRangeText(min, max, min_exclusive)));
}

Status NotAChoice(std::string_view display, int64_t index,
                  const std::vector<std::string>& choices) {
  return Status::InvalidArgument(
      fmt::format("{} = {} is not {}", display, index, ChoicesText(choices)));
}

}  // namespace schema_detail
}  // namespace kvtier
