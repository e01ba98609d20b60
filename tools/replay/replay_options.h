// tools/replay/replay_options.h — what `kvtier replay`'s flags mean beyond ReplayOptions
// (replay.h): the names of the flags that set cache fields, and the parsers of the flags that carry
// a small language (--fault, --sweep, --decode-ms-per-token). ReplayOptions::Validate, LoadWorkload
// and DefaultTracePath live in replay_options.cc too.
//
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kvtier/hierarchical_cache.h"
#include "kvtier/status.h"
#include "replay.h"

namespace kvtier::tools {

// The largest token count a replay flag takes.
inline constexpr int64_t kMaxTokens = int64_t{1} << 34;

// The cache fields whose replay flag is not FlagName(field) (config_flags.h): CLI11 name lists,
// the first naming the flag in messages (SGLang's --hicache-* names, then the replay's older
// ones). host_eviction has no flag: --eviction sets both tiers' (its messages name --eviction).
inline constexpr std::pair<std::string_view, std::string_view> kReplayCacheFlagNames[] = {
    {"host_layout", "--hicache-mem-layout,--host-layout"},
    {"write_policy", "--hicache-write-policy,--write-policy"},
    {"device_eviction", "--eviction"},
    {"host_eviction", "--eviction"},
    {"load_back_min_tokens", "--load-back-threshold"},
    {"prefetch_policy", "--hicache-storage-prefetch-policy,--prefetch-policy"},
    {"prefetch_threshold_tokens", "--prefetch-threshold"},
    {"stream_load_back", "--no-stream-load-back"},
    {"max_backup_queue_pages", "--storage-backup-queue-pages"},
};

// Whether the replay sets cache field `field` itself (then it has no flag): the capacities
// (--host-tokens), the store and its namespace (--storage, the model, --tp), the copy backend and
// device (--hicache-io-backend, --device), the backup threads (deterministic sequential runs),
// the host pool's heads (the model's), the pin budgets (--pin-system-prompt), the storage-only
// pages the tree remembers (the store's capacity) and host_eviction (--eviction).
bool ReplaySetsCacheField(std::string_view field);

// The replay's flag of cache field `field` (kReplayCacheFlagNames' first name, else
// FlagName(field)); a field the replay sets itself keeps its own name. The cache's Validate names
// the flags with it.
std::string ReplayFlagOf(std::string_view field);

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
