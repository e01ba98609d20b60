// What every rank of `kvtier replay --tp N` derives the same way: the store's URL, the rank's
// share of the model, its engine and its storage namespace (replay_tp_rank.h).
#include "replay_tp_rank.h"

#include <fmt/format.h>

#include "kvtier/layout.h"
#include "replay_ceiling.h"

namespace kvtier::tools {

std::string TpSetup::StoreUrl(int tp) const {
  if (store_dir.empty()) return "";
  return FileStoreUrl(fmt::format("{}/tp{}{}", store_dir, tp, store_suffix), store_bytes);
}

Result<ReplayModel> TpRankModel(const ReplayModel& m, int tp) {
  if (tp == 1) return m;
  if ((!m.mla && (m.kv_head_num % tp != 0 || m.slot_bytes % tp != 0)) || m.q_heads % tp != 0) {
    return Status::InvalidArgument(fmt::format(
        "--tp {}: model {} has {} KV heads and {} query heads, which do not split over {} ranks",
        tp, m.name, m.kv_head_num, m.q_heads, tp));
  }
  ReplayModel s = m;
  if (!m.mla) {
    s.slot_bytes = m.slot_bytes / tp;
    s.kv_head_num = m.kv_head_num / tp;
  }
  s.q_heads = m.q_heads / tp;
  s.attn_in_cols = m.attn_in_cols / tp;
  s.mlp_cols = m.mlp_cols / tp;
  return s;
}

Result<std::unique_ptr<PrefillEngine>> MakeTpRankEngine(const TpSetup& s, int tp, int rank) {
  PrefillEngineConfig ec;
  KVTIER_ASSIGN_OR_RETURN(ec.model, TpRankModel(s.model, tp));
  KVTIER_ASSIGN_OR_RETURN(ec.compute_model, TpRankModel(s.compute_model, tp));
  ec.device_slots = s.device_slots;
  ec.page_size = s.o.cache.page_size;
  ec.compute = (s.o.compute == "gemm" || (s.o.compute == "auto" && s.gpu)) ? ComputeMode::kGemm
                                                                           : ComputeMode::kModel;
  ec.tflops = s.o.tflops;
  ec.chunk_tokens = s.o.chunk_tokens;
  ec.max_context = s.max_context;
  ec.device = s.DeviceOf(rank);
  return s.gpu ? MakeGpuPrefillEngine(ec) : MakeCpuPrefillEngine(ec);
}

StorageNamespace TpRankPages(const ReplayModel& rank_model, int64_t page_size, int64_t head_num,
                             int rank, int tp) {
  KvGeometry pages;
  pages.layout = KvLayout::kPageHead;
  pages.num_layers = rank_model.num_layers;
  pages.slot_bytes = rank_model.slot_bytes;
  pages.page_size = page_size;
  pages.head_num = head_num;
  return StorageNamespaceOf(pages, rank_model.mla,
                            {.model_id = rank_model.model_id, .tp_rank = rank, .tp_size = tp});
}

}  // namespace kvtier::tools
