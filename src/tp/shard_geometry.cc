// The geometry of a rank's share of a KV pool (kvtier/tp_group.h).
#include <fmt/format.h>

#include "kvtier/tp_group.h"

namespace kvtier {

Result<KvGeometry> TpShardGeometry(const KvGeometry& full, bool mla, int tp_size) {
  if (tp_size < 1 || tp_size > kMaxTpSize) {
    return Status::InvalidArgument(fmt::format("tp_size = {} not in [1, {}]", tp_size, kMaxTpSize));
  }
  if (mla || tp_size == 1) return full;
  if (full.head_num % tp_size != 0 || full.slot_bytes % tp_size != 0) {
    return Status::InvalidArgument(
        fmt::format("tp: {} KV heads ({} bytes a slot) do not split evenly over tp_size {}",
                    full.head_num, full.slot_bytes, tp_size));
  }
  KvGeometry g = full;
  g.head_num = full.head_num / tp_size;
  g.slot_bytes = full.slot_bytes / tp_size;
  return g;
}

}  // namespace kvtier
