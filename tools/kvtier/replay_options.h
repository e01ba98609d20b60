// tools/kvtier/replay_options.h — what `kvtier replay`'s flags mean beyond ReplayOptions
// (replay.h): the cache settings they give, and the parsers of the flags that carry a small
// language (--fault, --sweep, --decode-ms-per-token). ReplayOptions::Validate, LoadWorkload and
// DefaultTracePath live in replay_options.cc too.
//
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kvtier/hierarchical_cache.h"
#include "kvtier/status.h"
#include "replay.h"

namespace kvtier::tools {

// The largest token count a replay flag takes.
inline constexpr int64_t kMaxTokens = int64_t{1} << 34;

// The cache settings the replay's flags give. REQUIRES: the names in `o` parse (Validate checks
// them first).
HierarchicalCacheConfig CacheConfigOf(const ReplayOptions& o);

// --fault: the store goes down at `down_at_s` (-1: never), or every storage call waits
// `delay_ms` first (0: none).
struct Fault {
  double down_at_s = -1;
  int64_t delay_ms = 0;
};

// "storage-down@SECONDS" or "storage-delay@MS"; InvalidArgument naming --fault otherwise.
Result<Fault> ParseFault(const std::string& fault);

// --decode-ms-per-token: a number of ms in [0, 1000], or kDecodeMeasure (-1) for "measure";
// InvalidArgument naming the flag otherwise.
inline constexpr double kDecodeMeasure = -1;
Result<double> ParseDecodeMsPerToken(const std::string& value);

// "host-tokens=A,B,C" -> {A, B, C}; InvalidArgument naming --sweep otherwise.
Result<std::vector<int64_t>> ParseSweep(const std::string& sweep);

}  // namespace kvtier::tools
