// A follower rank of `kvtier replay --tp N` (replay_tp_pass.h): its own device pool and host
// pages, the decision ring's copies applied, its share of every prefill, and its answers to rank
// 0's questions.
#include <fmt/format.h>

#include <memory>
#include <span>

#include "kvtier/host_pool.h"
#include "kvtier/layout.h"
#include "kvtier/storage.h"
#include "replay_tp_pass.h"
#include "replay_tp_rank.h"
#include "replay_tp_report.h"
#include "replay_tp_step.h"
#include "replay_tp_timed_engine.h"

namespace kvtier::tools {

Status RunTpFollower(const TpSetup& s, const TpReplayArgs& a) {
  KVTIER_ASSIGN_OR_RETURN(std::unique_ptr<TpFollower> f,
                          TpFollower::Attach(TpGroupConfigOf(a, a.group), a.rank));
  KVTIER_ASSIGN_OR_RETURN(std::unique_ptr<PrefillEngine> engine, MakeTpRankEngine(s, a.tp, a.rank));
  KVTIER_ASSIGN_OR_RETURN(const ReplayModel rank_model, TpRankModel(s.model, a.tp));
  const TpShape shape = f->shape();
  KvRegion host_region;
  std::unique_ptr<HostKvPool> host;
  if (shape.host_slots > 0) {
    HostKvPoolConfig hc;
    hc.geometry = engine->device_region().geometry;
    hc.geometry.layout = a.store.empty() ? s.o.cache.host_layout : KvLayout::kPageHead;
    hc.geometry.head_num = rank_model.kv_head_num;
    hc.mla = rank_model.mla;
    hc.capacity_bytes = shape.host_slots * rank_model.kv_bytes_per_token();
    KVTIER_ASSIGN_OR_RETURN(host, HostKvPool::Create(hc));
    host_region = host->region();
  }
  TransferEngineConfig tc = s.o.cache.transfer;  // the leader's engine's settings
  tc.device = s.DeviceOf(a.rank);
  KVTIER_ASSIGN_OR_RETURN(std::unique_ptr<TransferEngine> real, MakeTransferEngine(s.io, tc));
  KVTIER_ASSIGN_OR_RETURN(std::unique_ptr<TpTimedEngine> copier,
                          TpTimedEngine::Create(std::move(real), engine->device_region(),
                                                s.gpu ? tc.device : -1, engine->load_stream()));
  std::shared_ptr<StorageBackend> store;
  if (!a.store.empty()) {
    StorageOptions so = s.o.cache.storage.options;
    so.timeout = kTpStoreTimeout;
    KVTIER_ASSIGN_OR_RETURN(
        store, OpenTpRankStorage(a.store,
                                 TpRankPages(rank_model, s.o.cache.page_size,
                                             host_region.geometry.head_num, a.rank, a.tp),
                                 so));
  }
  auto on_step = [&](std::span<const std::byte> msg) -> Result<uint64_t> {
    KVTIER_ASSIGN_OR_RETURN(TpStepMessage step, TpStepMessage::Decode(msg));
    switch (step.report) {
      case TpStepMessage::kStep:
        break;
      case TpStepMessage::kLoadNs:
        return static_cast<uint64_t>(copier->load_seconds() * 1e9);
      case TpStepMessage::kLoadBytes:
        return static_cast<uint64_t>(copier->load_bytes());
      case TpStepMessage::kLoads:
        return static_cast<uint64_t>(copier->loads());
      case TpStepMessage::kResetLoads:
        copier->ResetLoads();
        return uint64_t{0};
      case TpStepMessage::kLoadMedianBps:
        return static_cast<uint64_t>(copier->median_load_bytes_per_s());
      case TpStepMessage::kHostNode:
        return static_cast<uint64_t>(MemoryNumaNode(host_region.k) + 1);
      case TpStepMessage::kCpuNode:
        return static_cast<uint64_t>(CpuNumaNode() + 1);
      case TpStepMessage::kCeilingBps:
        return static_cast<uint64_t>(engine->ceiling_bytes_per_s());
      default:
        return Status::Corruption(fmt::format("tp step: unknown report code {}", step.report));
    }
    KVTIER_RETURN_IF_ERROR(engine->BeginRequest());
    PrefillTiming timing;
    KVTIER_ASSIGN_OR_RETURN(double ms,
                            RunTpStep(*engine, step, a.rank, s.model.mla, nullptr, {}, &timing));
    return static_cast<uint64_t>(ms * 1e6);  // ns
  };
  for (;;) {
    KVTIER_ASSIGN_OR_RETURN(TpServeResult r, f->Serve(*copier, engine->device_region(), host_region,
                                                      1.0, on_step, store.get()));
    if (r == TpServeResult::kClosed) return Status::OK();
  }
}

}  // namespace kvtier::tools
