// tools/replay/replay_tp_rank.h — what every rank of `kvtier replay --tp N` (replay_tp.h) derives
// the same way from the same options: the run's setup (TpSetup), a rank's share of the model, its
// prefill engine on its device, and its pages' storage namespace in the per-head file store.
//
// Thread safety: plain values and functions; each process (rank) uses them from its one thread.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "kvtier/device.h"
#include "kvtier/status.h"
#include "kvtier/storage.h"
#include "kvtier/transfer.h"
#include "replay.h"
#include "replay_engine.h"
#include "replay_model.h"
#include "workload.h"

namespace kvtier::tools {

// The stores' per-call timeout (the leader's wrapper inherits it, and its calls include waiting
// for every rank): long, so that a loaded machine slows the passes down but never turns a storage
// hit into a timed-out miss in one pass and not the other.
inline constexpr std::chrono::milliseconds kTpStoreTimeout{60'000};

// The run as every rank sees it (rank 0 builds it once per pass; a follower from its arguments).
struct TpSetup {
  ReplayOptions o;
  int tp = 1;
  bool gpu = false;
  TransferBackend io = TransferBackend::kCpu;
  ReplayModel model{};          // the whole model's KV
  ReplayModel compute_model{};  // the whole model's compute
  Workload workload;            // warm-up requests first
  int64_t device_slots = 0;
  int64_t host_slots = 0;
  int64_t max_context = 1;
  std::string store_dir;  // --storage file: one file store per pass under it (empty: none)
  int64_t store_bytes = 0;
  std::string store_suffix;  // of the pass's store directory (tp<N><suffix>)
  int first_gpu = 0;         // rank r runs on GPU (first_gpu + r) % GPUs (rank 0's TP=1 passes)
  // The CUDA device of rank `rank` (0 on the cpu device).
  int DeviceOf(int rank) const {
    return gpu ? (first_gpu + rank) % std::max(1, CudaDeviceCount()) : 0;
  }
  // The per-head file store of the pass at `tp` ranks; "" without a store.
  std::string StoreUrl(int tp) const;
};

// Rank `rank`'s share of `m` in a group of `tp`: MHA splits the KV heads, MLA keeps the latent;
// the prefill's heads and MLP columns are split as tensor parallelism splits them.
// InvalidArgument when the heads do not split over `tp` ranks.
Result<ReplayModel> TpRankModel(const ReplayModel& m, int tp);

// Rank `rank`'s prefill engine in a group of `tp`: its share of the model on its device.
Result<std::unique_ptr<PrefillEngine>> MakeTpRankEngine(const TpSetup& s, int tp, int rank);

// Rank `rank`'s host pages (page_head, `head_num` heads) as a storage namespace.
StorageNamespace TpRankPages(const ReplayModel& rank_model, int64_t page_size, int64_t head_num,
                             int rank, int tp);

}  // namespace kvtier::tools
