#include "kvtier/testing/reference_copy.h"

#include <cstring>

namespace kvtier::testing {

Status ReferenceTransfer(const TransferRequest& r) {
  KVTIER_RETURN_IF_ERROR(ValidateTransfer(r));
  if (r.src->memory != MemoryKind::kHost || r.dst->memory != MemoryKind::kHost ||
      r.src_slots.memory != MemoryKind::kHost || r.dst_slots.memory != MemoryKind::kHost) {
    return Status::InvalidArgument("ReferenceTransfer needs host regions and host indices");
  }
  // Heads: page_head stores each head apart; use its head_num for both sides so that every
  // address comes from HeadOffset.
  const KvGeometry& sg = r.src->geometry;
  const KvGeometry& dg = r.dst->geometry;
  const int64_t heads = r.head_chunks();
  const int64_t head_bytes = sg.slot_bytes / heads;
  for (int b = 0; b < r.src->num_buffers(); ++b) {
    for (int64_t k = 0; k < r.src_slots.count; ++k) {
      const int64_t s = r.src_slots.at(k), d = r.dst_slots.at(k);
      for (int64_t l = 0; l < r.num_layers; ++l) {
        const int64_t sl = r.src_layer + l, dl = r.dst_layer + l;
        for (int64_t h = 0; h < heads; ++h) {
          KvGeometry sgh = sg, dgh = dg;
          sgh.head_num = heads;
          dgh.head_num = heads;
          const std::byte* from =
              r.src->LayerBase(b, sl) +
              (r.src->has_layer_table() ? sgh.OffsetInLayer(s, h) : sgh.HeadOffset(sl, s, h));
          std::byte* to =
              r.dst->LayerBase(b, dl) +
              (r.dst->has_layer_table() ? dgh.OffsetInLayer(d, h) : dgh.HeadOffset(dl, d, h));
          for (int64_t e = 0; e < head_bytes; e += 4) std::memcpy(to + e, from + e, 4);
        }
      }
    }
  }
  return Status::OK();
}

}  // namespace kvtier::testing
