// The Redis server behind a storage URL, for tools (kvtier/testing/redis.h).
#include "kvtier/testing/redis.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <utility>

#include "storage/redis/redis_client.h"
#include "storage/redis_url.h"

namespace kvtier::testing {

Result<RedisServer> ParseRedisServer(std::string_view url) {
  KVTIER_ASSIGN_OR_RETURN(storage::RedisUrl parsed, storage::ParseRedisUrl(url));
  RedisServer server;
  server.cluster = parsed.cluster;
  server.host = parsed.endpoints.front().host;
  server.port = parsed.endpoints.front().port;
  server.user = std::move(parsed.user);
  server.password = std::move(parsed.password);
  return server;
}

#if KVTIER_HAVE_HIREDIS
Status RedisExecuteAll(std::string_view url, std::string_view verb,
                       const std::vector<std::string>& keys, std::span<const std::byte> value,
                       size_t group) {
  storage::RedisClientConfig config;
  KVTIER_ASSIGN_OR_RETURN(config.url, storage::ParseRedisUrl(url));
  config.command_timeout = std::chrono::seconds(10);
  KVTIER_ASSIGN_OR_RETURN(
      std::unique_ptr<storage::RedisClient> client,
      storage::RedisClient::Open(std::move(config),
                                 std::chrono::steady_clock::now() + std::chrono::seconds(10)));
  for (size_t first = 0; first < keys.size(); first += group) {
    std::vector<storage::RedisOp> ops(std::min(group, keys.size() - first));
    for (size_t i = 0; i < ops.size(); ++i) {
      ops[i].verb = verb;
      ops[i].key = keys[first + i];
      if (!value.empty()) ops[i].value = std::span<const std::span<const std::byte>>(&value, 1);
    }
    client->Execute(ops, std::chrono::steady_clock::now() + std::chrono::seconds(60));
    for (const storage::RedisOp& op : ops) {
      if (op.outcome != storage::RedisOpOutcome::kReplied) {
        return Status::Unavailable(
            fmt::format("redis baseline: {} {}: {}", op.verb, op.key, op.error));
      }
    }
  }
  return Status::OK();
}
#else
Status RedisExecuteAll(std::string_view, std::string_view, const std::vector<std::string>&,
                       std::span<const std::byte>, size_t) {
  return Status::Unavailable("redis commands need kvtier built with hiredis");
}
#endif  // KVTIER_HAVE_HIREDIS

}  // namespace kvtier::testing
