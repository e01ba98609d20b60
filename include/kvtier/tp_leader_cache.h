// kvtier/tp_leader_cache.h — rank 0's HierarchicalCache of a tensor-parallel group, assembled in
// one place (the Python binding's leader and `kvtier replay --tp`'s rank 0 both call it).
//
// Thread safety: a pure function; the cache it returns is as thread-safe as any HierarchicalCache.
#pragma once

#include <memory>

#include "kvtier/hierarchical_cache.h"
#include "kvtier/status.h"
#include "kvtier/storage.h"
#include "kvtier/tp_group.h"
#include "kvtier/transfer.h"

namespace kvtier {

// The leader's cache over `device` (rank 0's device region), with `config`'s settings:
// - `leader`: the group (TpLeader::Create with the TpShape every rank's pools have); null for a
//   group of one (TP = 1: the same cache, nothing published).
// - `engine`: rank 0's own copies. The cache copies through leader->WrapEngine(engine, device),
//   which publishes each copy to the followers (without a leader: through `engine`).
// - `rank_store`: rank 0's view of the per-head store (OpenTpRankStorage with rank 0's pages), or
//   null without a storage tier. It is the cache's store, wrapped by leader->WrapStorage so every
//   rank runs each Get and Set on its heads (MLA, `device.mla`: the leader is the one writer,
//   every rank reads); config.storage.url, if set, is where the caller opened it and is not
//   opened again.
// Then, with a leader: the cache's host slots must be the group's (leader->shape().host_slots —
// the followers made their host pages from it; Internal otherwise), and the leader is given the
// cache's host region (SetHostRegion), which its storage decisions name pages by.
// It does not wait for the followers: call leader->WaitForFollowers() before or after.
// Errors: InvalidArgument when config.storage names a store and `rank_store` is null, or sets
// storage.backend (a TP group's store is only ever the rank's view of the per-head store);
// Unavailable when the leader's storage threads cannot start; HierarchicalCache::Create's.
// Destroy the cache before the leader (its engine and store call into the leader).
Result<std::unique_ptr<HierarchicalCache>> MakeTpLeaderCache(
    HierarchicalCacheConfig config, const KvRegion& device, TpLeader* leader,
    std::unique_ptr<TransferEngine> engine, std::shared_ptr<StorageBackend> rank_store);

}  // namespace kvtier
