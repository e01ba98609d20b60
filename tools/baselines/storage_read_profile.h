// tools/baselines/storage_read_profile.h — a store's profiled Get pages (StorageStats'
// get_profiled_*, filled by the file store's ReadProfile) as the tools print them: where a read
// page's time went. `kvtier bench --storage` and `kvtier replay` both use it, so the split is
// worded and computed once.
#pragma once

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <string>

namespace kvtier::tools {

// "a profiled page 0.210 ms: 80 % on a core, 15 % waiting for a core, 5 % blocked" (blocked:
// the rest, a sleep in the kernel); "..., waiting for a core unknown" when `core_wait_seconds`
// is negative (the kernel does not say). REQUIRES: pages > 0 and seconds > 0.
inline std::string ProfiledGetPageText(int64_t pages, double seconds, double cpu_seconds,
                                       double core_wait_seconds) {
  const auto pct = [seconds](double part) { return 100.0 * part / seconds; };
  std::string split = "waiting for a core unknown";
  if (core_wait_seconds >= 0) {
    const double blocked = std::max(0.0, seconds - cpu_seconds - core_wait_seconds);
    split = fmt::format("{:.0f} % waiting for a core, {:.0f} % blocked", pct(core_wait_seconds),
                        pct(blocked));
  }
  return fmt::format("a profiled page {:.3f} ms: {:.0f} % on a core, {}",
                     1e3 * seconds / static_cast<double>(pages), pct(cpu_seconds), split);
}

}  // namespace kvtier::tools
