#include "kvtier/layout.h"

#include <fmt/format.h>

#include <limits>
#include <string>

namespace kvtier {

const char* LayoutName(KvLayout layout) {
  switch (layout) {
    case KvLayout::kLayerFirst:
      return "layer_first";
    case KvLayout::kPageFirst:
      return "page_first";
    case KvLayout::kPageFirstDirect:
      return "page_first_direct";
    case KvLayout::kPageHead:
      return "page_head";
  }
  return "unknown_layout";
}

const char* MemoryKindName(MemoryKind kind) {
  switch (kind) {
    case MemoryKind::kHost:
      return "host";
    case MemoryKind::kDevice:
      return "device";
  }
  return "unknown_memory";
}

Result<KvLayout> ParseLayout(std::string_view name) {
  for (int i = 0; i < kNumLayouts; ++i) {
    const auto layout = static_cast<KvLayout>(i);
    if (name == LayoutName(layout)) return layout;
  }
  return Status::InvalidArgument(
      "layout '" + std::string(name) +
      "' is not one of layer_first, page_first, page_first_direct, page_head");
}

Status ValidatePageSize(int64_t page_size, std::string_view name) {
  if (page_size < 1 || page_size > kMaxKvPageSize || (page_size & (page_size - 1)) != 0) {
    return Status::InvalidArgument(
        fmt::format("{} = {} must be a power of two in [1, {}]", name, page_size, kMaxKvPageSize));
  }
  return Status::OK();
}

Status KvGeometry::Validate(std::string_view name) const {
  const KvGeometry& g = *this;
  const int layout_index = static_cast<int>(g.layout);
  if (layout_index < 0 || layout_index >= kNumLayouts) {
    return Status::InvalidArgument(
        fmt::format("{}.layout = {} is not a known layout", name, layout_index));
  }
  if (g.num_layers <= 0) {
    return Status::InvalidArgument(
        fmt::format("{}.num_layers = {} must be positive", name, g.num_layers));
  }
  if (g.num_slots <= 0) {
    return Status::InvalidArgument(
        fmt::format("{}.num_slots = {} must be positive", name, g.num_slots));
  }
  if (g.slot_bytes <= 0) {
    return Status::InvalidArgument(
        fmt::format("{}.slot_bytes = {} must be positive", name, g.slot_bytes));
  }
  if (g.slot_bytes % kSlotBytesAlignment != 0) {
    return Status::InvalidArgument(fmt::format("{}.slot_bytes = {} is not a multiple of {}", name,
                                               g.slot_bytes, kSlotBytesAlignment));
  }
  if (g.page_size <= 0) {
    return Status::InvalidArgument(
        fmt::format("{}.page_size = {} must be positive", name, g.page_size));
  }
  if (g.num_slots % g.page_size != 0) {
    return Status::InvalidArgument(fmt::format("{}.page_size = {} does not divide num_slots = {}",
                                               name, g.page_size, g.num_slots));
  }
  KVTIER_RETURN_IF_ERROR(ValidatePageSize(g.page_size, fmt::format("{}.page_size", name)));
  if (g.head_num <= 0) {
    return Status::InvalidArgument(
        fmt::format("{}.head_num = {} must be positive", name, g.head_num));
  }
  if (g.layout == KvLayout::kPageHead &&
      (g.slot_bytes % g.head_num != 0 || g.head_bytes() % kSlotBytesAlignment != 0)) {
    return Status::InvalidArgument(fmt::format(
        "{}.head_num = {} must divide slot_bytes = {} into multiples of {} bytes for page_head",
        name, g.head_num, g.slot_bytes, kSlotBytesAlignment));
  }
  if (g.num_slots > std::numeric_limits<int64_t>::max() / g.slot_bytes / g.num_layers) {
    return Status::InvalidArgument(fmt::format("{} is too large: {} layers x {} slots x {} bytes",
                                               name, g.num_layers, g.num_slots, g.slot_bytes));
  }
  return Status::OK();
}

}  // namespace kvtier
