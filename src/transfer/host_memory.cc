// This process's mappings from /proc/self/maps (kvtier/host_memory.h).
#include "kvtier/host_memory.h"

#include <fmt/format.h>

#include <cinttypes>
#include <cstdio>
#include <vector>

namespace kvtier {
namespace {

struct Mapping {
  uintptr_t start = 0, end = 0;
  bool readable = false, writable = false;
};

// The mappings in address order; false when /proc/self/maps cannot be read.
bool ReadMappings(std::vector<Mapping>* out) {
  std::FILE* f = std::fopen("/proc/self/maps", "re");
  if (f == nullptr) return false;
  char line[512];
  while (std::fgets(line, sizeof(line), f) != nullptr) {
    uintptr_t start = 0, end = 0;
    char perms[5] = {};
    if (std::sscanf(line, "%" SCNxPTR "-%" SCNxPTR " %4s", &start, &end, perms) == 3) {
      out->push_back({start, end, perms[0] == 'r', perms[1] == 'w'});
    }
  }
  std::fclose(f);
  return true;
}

}  // namespace

int64_t MappedBytesFrom(const void* address, bool writable) {
  std::vector<Mapping> maps;
  if (!ReadMappings(&maps)) return -1;
  const uintptr_t a = reinterpret_cast<uintptr_t>(address);
  uintptr_t end = 0;
  for (const Mapping& m : maps) {
    const bool usable = m.readable && (!writable || m.writable);
    if (end == 0) {
      if (a >= m.start && a < m.end && usable) end = m.end;
    } else if (m.start == end && usable) {
      end = m.end;  // the run goes on
    } else if (m.start >= end) {
      break;
    }
  }
  return end == 0 ? -1 : static_cast<int64_t>(end - a);
}

Status CheckHostWritable(const void* address, int64_t bytes, std::string_view name) {
  if (bytes <= 0) return Status::OK();
  std::vector<Mapping> maps;
  if (!ReadMappings(&maps)) return Status::OK();
  const int64_t writable = MappedBytesFrom(address, /*writable=*/true);
  if (writable >= bytes) return Status::OK();
  const int64_t readable = MappedBytesFrom(address, /*writable=*/false);
  return Status::InvalidArgument(fmt::format(
      "{} ({} bytes at {}) is {}: the cache writes into it (a load-back); give it writable "
      "memory",
      name, bytes, address,
      writable >= 0       ? fmt::format("writable for its first {} bytes only", writable)
      : readable >= bytes ? "read-only memory (a read-only mmap, a constant)"
                          : "not mapped writable in this process"));
}

}  // namespace kvtier
