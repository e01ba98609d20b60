// Internal: the write policy of a cache as a small interface beside EvictionPolicy — when device
// pages are copied to host memory and when host pages go on to storage. The mechanism (backups and
// stores, cache/backup_planner.h; eviction, cache/tier_evictor.h) asks; the policy answers.
//
//   write_through            back up a device-only node on its first use; store when the backup
//                            lands
//   write_through_selective  the same once a node has `threshold` hits
//   write_back               back up only what device eviction would drop; store only what host
//                            eviction would drop
//
// Thread safety: immutable; any thread.
#pragma once

#include <cstdint>
#include <memory>

#include "kvtier/hierarchical_cache.h"

namespace kvtier {

class RadixNode;

class BackupPolicy {
 public:
  virtual ~BackupPolicy() = default;
  virtual WritePolicy kind() const = 0;
  // Whether device-only nodes on a path just matched or inserted are ever backed up on use.
  virtual bool backs_up_on_use() const = 0;
  // Whether `node` (device-only, on a path just used) is backed up to host memory now.
  virtual bool BackUpOnUse(const RadixNode& node) const = 0;
  // Whether a device victim without a host copy is backed up first (and evicted once copied)
  // rather than dropped.
  virtual bool back_up_on_eviction() const = 0;
  // Whether host pages are stored when their backup lands (true) or only when host eviction would
  // drop them (false).
  virtual bool store_on_backup() const = 0;
};

// The policy for `policy`; `threshold` is write_through_selective's hit count (at least 1).
std::unique_ptr<BackupPolicy> MakeBackupPolicy(WritePolicy policy, int64_t threshold);

}  // namespace kvtier
