// Internal: who a process is, for the owners of shared memory (a shared host pool's page index,
// a TP group's decision ring): a pid with its start time names one process for good, so a dead
// owner is told from a live one that reused its pid.
//
// Thread safety: pure functions (they read /proc).
#pragma once

#include <cstdint>

namespace kvtier::shm {

// Start time of process `pid` in clock ticks after boot (/proc/<pid>/stat field 22), or 0 when
// it cannot be read.
uint64_t ProcessStartTime(int64_t pid);
// True when `pid` runs and started at `start_time` (not a zombie, not a reused pid).
bool ProcessAlive(int64_t pid, uint64_t start_time);

}  // namespace kvtier::shm
