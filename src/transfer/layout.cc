#include "kvtier/layout.h"

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

}  // namespace kvtier
