// tools/baselines/redis_baseline.h — the platform baseline of `kvtier bench --storage redis://...`:
// `redis-benchmark` (Debian redis-tools) SET and GET of values of the same size, with the same
// number of clients and the same pipeline depth, against the same server(s) as the backend.
//
// By default redis-benchmark SETs and GETs one literal key, so the server rewrites and serves
// one value that stays in the CPU caches on both sides. With a key space (redis-benchmark -r N)
// its requests go to N keys ("key:%012d"), which RedisKeySpace fills with values of the same size
// and deletes again: the server then holds as many distinct values as the backend stored, the
// same bytes in memory, for as long as the backend's keys live.
//
// Thread safety: one call at a time per process is enough; it runs a child process and waits.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
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
  // redis-benchmark -r: the number of keys of a RedisKeySpace that exists for the run; 0: its
  // one literal key. Not with a redis+cluster:// URL (redis-benchmark names cluster keys itself).
  int64_t key_space = 0;
  std::chrono::seconds time_limit{300};
};

// One line of redis-benchmark's --csv output.
struct RedisBaselineRow {
  std::string test;  // "SET", "GET"
  double requests_per_second = 0;
  double avg_ms = 0, p50_ms = 0, p99_ms = 0;  // per request, as redis-benchmark measures them
  double gb_per_second = 0;                   // requests_per_second * value_bytes / 1e9
};

// redis-benchmark's key space ("key:000000000000" ...) on the server of a redis:// URL, filled
// with values of one size; Delete() (or the destructor, best effort) removes it.
class RedisKeySpace {
 public:
  // Whether `url` can hold one: a valid URL of one server, not of a cluster (redis-benchmark
  // names a cluster's keys itself).
  static bool Fits(std::string_view url);
  // Unavailable when the server cannot be reached or a SET fails; InvalidArgument for a bad or
  // a cluster URL.
  static Result<std::unique_ptr<RedisKeySpace>> Fill(std::string_view url, int64_t keys,
                                                     int64_t value_bytes);
  ~RedisKeySpace();
  RedisKeySpace(const RedisKeySpace&) = delete;
  RedisKeySpace& operator=(const RedisKeySpace&) = delete;

  int64_t keys() const { return keys_; }
  Status Delete();

 private:
  struct Client;
  RedisKeySpace(std::unique_ptr<Client> client, int64_t keys);
  std::unique_ptr<Client> client_;
  int64_t keys_ = 0;
  bool deleted_ = false;
};

// Runs redis-benchmark against the server of a redis:// URL (or, with --cluster, the first seed
// of a redis+cluster:// URL), with the URL's credentials. A run that fails, runs past the time
// limit or prints no result is retried once. NotFound when redis-benchmark is not installed;
// Unavailable when both runs failed; InvalidArgument for a bad URL or a key space with a cluster
// URL. A run that reaches `options.time_limit` is killed (its process group) and reaped, and
// not retried: Unavailable at once, with `*timed_out` (when given) set — the server did not
// answer, so the literal key is not deleted either (that would wait for the server again).
Result<std::vector<RedisBaselineRow>> RunRedisBenchmark(std::string_view url,
                                                        const RedisBaselineOptions& options,
                                                        bool* timed_out = nullptr);

// Parses redis-benchmark's --csv output (header line, then one line per test).
Result<std::vector<RedisBaselineRow>> ParseRedisBenchmarkCsv(std::string_view csv,
                                                             int64_t value_bytes);

}  // namespace kvtier::tools
