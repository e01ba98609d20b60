// Internal: sends batches of single-key commands to one Redis server or a Redis Cluster.
//
// `Execute` groups a batch's commands by server (in a cluster: by the CRC16 slot of each key and
// the slot map), pipelines each group on one connection, runs all servers at once (one round trip
// per server), and follows the cluster's redirects: `MOVED` updates the slot map and resends,
// `ASK` resends that one command after `ASKING` to the node named; a later batch refreshes the
// whole map from `CLUSTER SLOTS` after a redirect or a node failure. Every wait is bounded by the
// batch's deadline and the per-round-trip command timeout; a server that is down, slow or gone
// turns the commands sent to it into kFailed / kTimedOut, never into a wait past the deadline.
//
// Connections are pooled per server. A connect failure, an I/O error or a timeout drops the
// server's idle connections and starts a backoff (doubling from `backoff_min` to `backoff_max`):
// until it ends, commands for that server fail at once; then the next batch reconnects.
//
// Thread safety: Execute may be called from several threads at once (each batch takes its own
// connections); the slot map and the node table are guarded by one mutex.
#pragma once

#if KVTIER_HAVE_HIREDIS

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kvtier/status.h"
#include "storage/redis/redis_connection.h"
#include "storage/redis_url.h"

namespace kvtier::storage {

struct RedisClientConfig {
  RedisUrl url;
  std::chrono::milliseconds command_timeout{2000};  // one pipelined round trip to one server
  std::chrono::milliseconds backoff_min{10};
  std::chrono::milliseconds backoff_max{1000};
  int max_idle_connections_per_node = 16;
};

enum class RedisOpOutcome : uint8_t {
  kPending = 0,  // not answered yet
  kReplied = 1,  // `reply` holds the server's final answer (not a redirect)
  kTimedOut = 2,
  kFailed = 3,  // the server is down, the connection failed, too many redirects; see `error`
};

// One single-key command of a batch: `verb key [offset] [value]`.
struct RedisOp {
  std::string_view verb;    // "GET", "SET", "SETRANGE", "EXISTS", "DEL"
  std::string key;          // the object name; routes the command in a cluster
  std::string_view offset;  // SETRANGE: the offset, sent between the key and the value
  // SET, SETRANGE: the value, the concatenation of these pieces, borrowed until Execute returns.
  std::span<const std::span<const std::byte>> value;
  // GET: where a value of exactly the sink's total size is read to (no copies), borrowed until
  // Execute returns. Its contents are undefined unless the op ends `sunk`.
  std::span<const std::span<std::byte>> sink;

  RedisOpOutcome outcome = RedisOpOutcome::kPending;
  RedisReplyPtr reply;  // kReplied: the reply, or null when it was `sunk`
  bool sunk = false;    // kReplied with the value in `sink`
  std::string error;    // why, for kFailed / kTimedOut
  int ask_node = -1;    // routing state: the node an ASK named, for the next round
};

struct RedisClientCounters {
  int64_t moved = 0, ask = 0;  // redirects followed
  int64_t slot_refreshes = 0;  // CLUSTER SLOTS read
  int64_t round_trips = 0;     // pipelines run by Execute (one per server per round)
  int64_t connects = 0, connect_failures = 0, node_failures = 0;
};

class RedisNode;

class RedisClient {
 public:
  // Connects to the server (redis://: PING, after AUTH) or reads the cluster's slot map from the
  // first seed that answers (redis+cluster://). Unavailable naming the server and the cause
  // (unreachable, AUTH rejected, a password required, no cluster support, no slots served).
  static Result<std::unique_ptr<RedisClient>> Open(RedisClientConfig config, Deadline deadline);
  ~RedisClient();
  RedisClient(const RedisClient&) = delete;
  RedisClient& operator=(const RedisClient&) = delete;

  // Runs every op that is still kPending; on return none is. REQUIRES: ops outlive the call.
  void Execute(std::span<RedisOp> ops, Deadline deadline);

  // "host:port" of the node serving `slot` in the current map ("" when none; the one server of a
  // redis:// client).
  std::string SlotOwner(int slot) const;
  RedisClientCounters counters() const;
  const RedisClientConfig& config() const { return config_; }

 private:
  explicit RedisClient(RedisClientConfig config);
  // The index of the node at `endpoint`, added when new. REQUIRES: mu_ held.
  int NodeIndexLocked(const RedisEndpoint& endpoint);
  RedisNode* node(int index) const;
  // Reads CLUSTER SLOTS from a node that answers and replaces the slot map. With !force, does
  // nothing unless a refresh was asked for and the last one is older than the minimum interval.
  Status RefreshSlots(Deadline deadline, bool force);

  const RedisClientConfig config_;
  const RedisAuth auth_;
  mutable std::mutex mu_;
  std::vector<std::unique_ptr<RedisNode>> nodes_;  // append-only; indexes stay valid
  std::vector<int> slot_node_;                     // cluster: node index per slot, -1 if none
  std::chrono::steady_clock::time_point last_refresh_{};
  std::atomic<bool> refresh_wanted_{false};
  std::atomic<int64_t> moved_{0}, ask_{0}, slot_refreshes_{0}, round_trips_{0};
};

}  // namespace kvtier::storage

#endif  // KVTIER_HAVE_HIREDIS
