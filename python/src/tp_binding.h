// python/src/tp_binding.h — a tensor-parallel group from Python (kvtier/tp_group.h, docs/tp.md):
// the leader's cache (rank 0, made by cache_binding.cc with a `tp` dict) and `_kvtier._TpFollower`
// (ranks 1 .. N-1). Every rank passes the same cache settings; each brings its own device region
// (its heads, or the full latent for MLA).
//
// Thread safety: the functions are pure; _TpFollower serves from one thread at a time.
#pragma once

#include <pybind11/pybind11.h>

#include <memory>

#include "kvtier/hierarchical_cache.h"
#include "kvtier/tp_group.h"

namespace kvtier::python {

// The fields of TpGroupConfigSchema by name ("name" and "tp_size" given, the rest optional), plus
// the caller's "rank" (not read here), as a validated TpGroupConfig; InvalidArgument naming the
// key otherwise.
TpGroupConfig TpGroupConfigFromDict(const pybind11::dict& d);

// The leader's group and cache. Destroy the cache first (declaration order does).
struct TpLeaderCache {
  std::unique_ptr<TpLeader> leader;
  std::unique_ptr<HierarchicalCache> cache;
};

// Creates the group's ring (announcing the shape every rank's pools must have), the cache over
// `device` (MakeTpLeaderCache: the leader's engine and, with a storage tier, rank 0's view of the
// per-head store at storage.url), then waits for the followers to attach (attach_timeout_s). A
// storage tier needs host_layout page_head (InvalidArgument). Call without the GIL.
Result<TpLeaderCache> CreateTpLeaderCache(HierarchicalCacheConfig config, const KvRegion& device,
                                          const TpGroupConfig& group);

// Registers _kvtier._TpFollower.
void RegisterTp(pybind11::module_& m);

}  // namespace kvtier::python
