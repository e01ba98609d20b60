// MakeTpLeaderCache (kvtier/tp_leader_cache.h): rank 0's cache of a TP group.
#include "kvtier/tp_leader_cache.h"

#include <fmt/format.h>

#include <utility>

namespace kvtier {

Result<std::unique_ptr<HierarchicalCache>> MakeTpLeaderCache(
    HierarchicalCacheConfig config, const KvRegion& device, TpLeader* leader,
    std::unique_ptr<TransferEngine> engine, std::shared_ptr<StorageBackend> rank_store) {
  if (engine == nullptr) return Status::InvalidArgument("tp leader cache: no transfer engine");
  if (config.storage.backend != nullptr) {
    return Status::InvalidArgument(
        "tp leader cache: storage.backend is set; a TP group's store is rank 0's view of the "
        "per-head store, given as rank_store");
  }
  if (rank_store != nullptr) {
    // MLA: the leader is the one writer; every rank reads.
    config.storage.backend = leader != nullptr
                                 ? leader->WrapStorage(std::move(rank_store), !device.mla)
                                 : std::move(rank_store);
    if (config.storage.backend == nullptr) {
      return Status::Unavailable("tp leader cache: the leader's storage threads could not start");
    }
  } else if (config.storage.enabled()) {
    return Status::InvalidArgument(fmt::format(
        "tp leader cache: storage '{}' without rank 0's view of the per-head store (rank_store); "
        "open it with OpenTpRankStorage",
        RedactUrl(config.storage.url)));
  }
  if (leader != nullptr) engine = leader->WrapEngine(std::move(engine), device);
  KVTIER_ASSIGN_OR_RETURN(std::unique_ptr<HierarchicalCache> cache,
                          HierarchicalCache::Create(config, device, std::move(engine)));
  if (leader == nullptr) return cache;
  // The followers sized their host pages from the leader's shape; it must be the cache's.
  const int64_t made = cache->host_region().geometry.num_slots;
  if (made != leader->shape().host_slots) {
    return Status::Internal(
        fmt::format("tp leader cache: the cache made {} host slots, the group "
                    "has {}",
                    made, leader->shape().host_slots));
  }
  leader->SetHostRegion(cache->host_region());
  return cache;
}

}  // namespace kvtier
