// kvtier/testing/redis.h — the Redis server behind a storage URL, for tools that measure or fill
// it beside kvtier (`kvtier bench --storage redis://...`'s redis-benchmark baseline, the replay's
// storage ceiling): the URL's parts as the redis backend reads them, and plain commands sent
// through the backend's own client.
//
// Thread safety: plain values; every call opens its own connection.
#pragma once

#include <cstddef>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kvtier/status.h"

namespace kvtier::testing {

struct RedisServer {
  bool cluster = false;  // a redis+cluster:// URL
  std::string host;      // the server, or the cluster's first seed node (IPv6 without brackets)
  int port = 6379;
  std::string user;      // empty: the default user
  std::string password;  // empty: no AUTH
};

// The server of a redis:// or redis+cluster:// storage URL; InvalidArgument naming the part of
// the URL that is wrong, as the redis backend says it.
Result<RedisServer> ParseRedisServer(std::string_view url);

// Sends `verb key [value]` for every key to the server of `url` (not a cluster), `group`
// commands per pipeline, each group bounded by 60 s. Unavailable naming the first command that
// got no reply; Unavailable also when kvtier was built without hiredis.
Status RedisExecuteAll(std::string_view url, std::string_view verb,
                       const std::vector<std::string>& keys, std::span<const std::byte> value,
                       size_t group);

}  // namespace kvtier::testing
