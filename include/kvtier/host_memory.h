// What this process's own address space says about host memory: whether a range is mapped, and
// writable, per /proc/self/maps. For checks made once (registering a region, measuring a pointer
// table), never per copy: each call reads the maps (tens of microseconds).
//
// Thread safety: any thread; a mapping changed by another thread meanwhile may or may not be seen.
#pragma once

#include <cstdint>
#include <string_view>

#include "kvtier/status.h"

namespace kvtier {

// Bytes from `address` to the end of the run of contiguous mappings of this process that holds
// it (each readable, and writable too when `writable`); -1 when `address` is in no such mapping
// (unmapped, PROT_NONE, read-only with `writable`), or the maps cannot be read (not Linux).
int64_t MappedBytesFrom(const void* address, bool writable);

// OK when [address, address + bytes) is mapped readable and writable in this process;
// InvalidArgument naming `name` otherwise (read-only memory: a read-only mmap, a constant; or not
// mapped at all). OK as well when the maps cannot be read (nothing known).
Status CheckHostWritable(const void* address, int64_t bytes, std::string_view name);

}  // namespace kvtier
