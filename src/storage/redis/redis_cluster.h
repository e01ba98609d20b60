// Internal: the parts of Redis Cluster routing that are pure functions of server replies —
// redirects (`MOVED` / `ASK`) and the slot map of `CLUSTER SLOTS`.
//
// Thread safety: pure functions.
#pragma once

#if KVTIER_HAVE_HIREDIS

#include <optional>
#include <string_view>
#include <vector>

#include "kvtier/status.h"
#include "storage/redis_url.h"

struct redisReply;

namespace kvtier::storage {

// "MOVED <slot> <host>:<port>" or "ASK <slot> <host>:<port>".
struct RedisRedirect {
  bool ask = false;  // ASK: this one command goes to `target` after ASKING; MOVED: the slot moved
  int slot = 0;
  RedisEndpoint target;
};

// The redirect an error reply's text names, or nullopt when it is not one. An empty host (a node
// that does not know its address) means the host of `replier`, the node that answered.
std::optional<RedisRedirect> ParseRedirect(std::string_view error, const RedisEndpoint& replier);

// One entry of `CLUSTER SLOTS`: slots [first, last] served by `master`.
struct RedisSlotRange {
  int first = 0;
  int last = 0;
  RedisEndpoint master;
};

// The ranges of a `CLUSTER SLOTS` reply; an empty host means `replier`'s host; ranges whose
// master endpoint is unknown ("?") are left out. Unavailable for an error reply (for example a
// server without cluster support), Corruption for a malformed one.
Result<std::vector<RedisSlotRange>> ParseClusterSlots(const redisReply& reply,
                                                      const RedisEndpoint& replier);

}  // namespace kvtier::storage

#endif  // KVTIER_HAVE_HIREDIS
