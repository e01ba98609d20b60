// tools/kvtier/redis_baseline.h — the platform baseline of `kvtier bench --storage redis://...`:
// `redis-benchmark` (Debian redis-tools) SET and GET of values of the same size, with the same
// number of clients and the same pipeline depth, against the same server(s) as the backend.
//
// Thread safety: one call at a time per process is enough; it runs a child process and waits.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "kvtier/status.h"

namespace kvtier::tools {

struct RedisBaselineOptions {
  int64_t value_bytes = 0;  // bytes of each SET value (header + page, like the backend's)
  int clients = 1;          // redis-benchmark -c: the backend's I/O threads
  int pipeline = 1;         // redis-benchmark -P: pages per batch
  int64_t requests = 0;     // redis-benchmark -n: per test (SET, then GET)
  std::chrono::seconds time_limit{300};
};

// One line of redis-benchmark's --csv output.
struct RedisBaselineRow {
  std::string test;  // "SET", "GET"
  double requests_per_second = 0;
  double avg_ms = 0, p50_ms = 0, p99_ms = 0;  // per request, as redis-benchmark measures them
  double gb_per_second = 0;                   // requests_per_second * value_bytes / 1e9
};

// Runs redis-benchmark against the server of a redis:// URL (or, with --cluster, the first seed
// of a redis+cluster:// URL), with the URL's credentials. NotFound when redis-benchmark is not
// installed; Unavailable when it fails or runs past the time limit; InvalidArgument for a bad URL.
Result<std::vector<RedisBaselineRow>> RunRedisBenchmark(std::string_view url,
                                                        const RedisBaselineOptions& options);

// Parses redis-benchmark's --csv output (header line, then one line per test).
Result<std::vector<RedisBaselineRow>> ParseRedisBenchmarkCsv(std::string_view csv,
                                                             int64_t value_bytes);

}  // namespace kvtier::tools
