// Redirect and slot-map parsing for Redis Cluster (see redis_cluster.h).
#include "storage/redis/redis_cluster.h"

#include <fmt/format.h>
#include <hiredis/hiredis.h>

#include <charconv>

#include "storage/redis/crc16.h"

namespace kvtier::storage {
namespace {

std::optional<int> ParseSlot(std::string_view text) {
  int slot = -1;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), slot);
  if (ec != std::errc() || end != text.data() + text.size()) return std::nullopt;
  if (slot < 0 || slot >= kRedisClusterSlots) return std::nullopt;
  return slot;
}

}  // namespace

std::optional<RedisRedirect> ParseRedirect(std::string_view error, const RedisEndpoint& replier) {
  RedisRedirect redirect;
  if (error.starts_with("MOVED ")) {
    error.remove_prefix(6);
  } else if (error.starts_with("ASK ")) {
    redirect.ask = true;
    error.remove_prefix(4);
  } else {
    return std::nullopt;
  }
  const size_t space = error.find(' ');
  if (space == std::string_view::npos) return std::nullopt;
  const std::optional<int> slot = ParseSlot(error.substr(0, space));
  if (!slot) return std::nullopt;
  redirect.slot = *slot;
  const std::string_view address = error.substr(space + 1);
  // "MOVED 3999 :6380": a node that does not know its own address; the replier's host.
  const bool no_host = address.starts_with(":");
  Result<RedisEndpoint> target =
      ParseRedisEndpoint(no_host ? "unknown" + std::string(address) : std::string(address));
  if (!target.ok()) return std::nullopt;
  if (no_host) target->host = replier.host;
  redirect.target = std::move(target).value();
  return redirect;
}

Result<std::vector<RedisSlotRange>> ParseClusterSlots(const redisReply& reply,
                                                      const RedisEndpoint& replier) {
  if (reply.type == REDIS_REPLY_ERROR) {
    return Status::Unavailable(fmt::format("redis {}: CLUSTER SLOTS failed: {}", replier.ToString(),
                                           std::string_view(reply.str, reply.len)));
  }
  auto malformed = [&](std::string_view what) {
    return Status::Corruption(
        fmt::format("redis {}: malformed CLUSTER SLOTS reply: {}", replier.ToString(), what));
  };
  if (reply.type != REDIS_REPLY_ARRAY) return malformed("not an array");
  std::vector<RedisSlotRange> ranges;
  for (size_t i = 0; i < reply.elements; ++i) {
    const redisReply* entry = reply.element[i];
    if (entry->type != REDIS_REPLY_ARRAY || entry->elements < 3) {
      return malformed("an entry is not [first, last, master, ...]");
    }
    const redisReply* first = entry->element[0];
    const redisReply* last = entry->element[1];
    const redisReply* master = entry->element[2];
    if (first->type != REDIS_REPLY_INTEGER || last->type != REDIS_REPLY_INTEGER ||
        first->integer < 0 || last->integer >= kRedisClusterSlots ||
        first->integer > last->integer) {
      return malformed("bad slot range");
    }
    if (master->type != REDIS_REPLY_ARRAY || master->elements < 2 ||
        master->element[0]->type != REDIS_REPLY_STRING ||
        master->element[1]->type != REDIS_REPLY_INTEGER) {
      return malformed("bad master [host, port, ...]");
    }
    std::string host(master->element[0]->str, master->element[0]->len);
    const long long port = master->element[1]->integer;
    if (host == "?") continue;  // the master's endpoint is unknown for now
    if (host.empty()) host = replier.host;
    if (port < 1 || port > 65535) return malformed("bad master port");
    ranges.push_back(RedisSlotRange{static_cast<int>(first->integer),
                                    static_cast<int>(last->integer),
                                    RedisEndpoint{std::move(host), static_cast<int>(port)}});
  }
  return ranges;
}

}  // namespace kvtier::storage
