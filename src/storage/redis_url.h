// Internal: the parsed form of a Redis storage URL.
//
// Shared URL parsing, not the redis backend's (src/storage/redis/): it needs no hiredis and is
// built whatever KVTIER_STORAGE_REDIS says, because the tools find the server behind a redis://
// URL for their redis-benchmark baseline (kvtier/testing/redis.h) and the URL tests and fuzz
// target check its parsing in every build.
//
//   redis://[[user]:password@]host[:port][/][?param=value&...]
//   redis+cluster://[[user]:password@]host[:port][,host[:port]...][/][?param=value&...]
//
// with the parameters timeout_ms=N, connect_timeout_ms=N and header_last_bytes=SIZE.
//
// user and password may be percent-encoded; an IPv6 host is written in brackets ([::1]:6379); the
// port defaults to 6379. `timeout_ms` bounds one pipelined round trip to one node (default: the
// call's StorageOptions::timeout); `connect_timeout_ms` bounds connecting and authenticating
// (default 1000). Both are also capped by the call's deadline. `header_last_bytes` (a byte size,
// default 1MiB, 0 = never): pages of at least this many bytes are written header-last (the value
// with a blank header first, its checksum computed meanwhile, then the header; redis_backend.cc).
//
// Thread safety: plain values and pure functions.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "kvtier/status.h"

namespace kvtier::storage {

struct RedisEndpoint {
  std::string host;  // without brackets
  int port = 6379;

  // "host:port", or "[v6]:port".
  std::string ToString() const;
  friend bool operator==(const RedisEndpoint&, const RedisEndpoint&) = default;
};

struct RedisUrl {
  bool cluster = false;
  std::vector<RedisEndpoint> endpoints;  // the server, or the cluster's seed nodes
  std::string user;                      // empty: the default user
  std::string password;                  // empty: no AUTH
  std::chrono::milliseconds timeout{0};  // 0: the call's timeout
  std::chrono::milliseconds connect_timeout{1000};
  int64_t header_last_bytes = int64_t{1} << 20;  // 0: every page in one SET

  // The URL without credentials ("redis://host:port", "redis+cluster://a:1,b:2").
  std::string Redacted() const;
};

// InvalidArgument naming the part of the URL that is wrong (scheme, user info, host, port,
// a path, an unknown or bad query parameter).
Result<RedisUrl> ParseRedisUrl(std::string_view url);

// "host:port" or "[v6]:port" into an endpoint (used for URLs and for MOVED/ASK replies).
Result<RedisEndpoint> ParseRedisEndpoint(std::string_view text);

}  // namespace kvtier::storage
