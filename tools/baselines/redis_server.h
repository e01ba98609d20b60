// tools/baselines/redis_server.h — a redis-server process that `kvtier replay --storage redis`
// starts for itself on a free 127.0.0.1 port, uses as the storage tier, and stops (at --fault
// storage-down@S, and always at the end, also on error).
//
// The server keeps nothing on disk (no RDB, no AOF; its working directory is a temporary one that
// is removed), evicts least recently used keys beyond `max_bytes` (allkeys-lru), and runs in a
// process group of its own with PR_SET_PDEATHSIG, so it dies with the replay even when the replay
// is killed without unwinding. Every wait is bounded.
//
// Thread safety: one object is used by one thread.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>

#include "kvtier/status.h"

namespace kvtier::tools {

class LocalRedisServer {
 public:
  // Starts redis-server (found on PATH) with at most `max_bytes` of data (0: no limit) and waits
  // until it answers PING (10 s at most). Unavailable, with the reason and the server's log, when
  // redis-server is missing or does not come up.
  static Result<std::unique_ptr<LocalRedisServer>> Start(int64_t max_bytes);

  ~LocalRedisServer();
  LocalRedisServer(const LocalRedisServer&) = delete;
  LocalRedisServer& operator=(const LocalRedisServer&) = delete;

  // "redis://127.0.0.1:PORT".
  std::string url() const;
  int port() const { return port_; }
  int pid() const { return static_cast<int>(pid_); }
  bool running() const { return pid_ > 0; }

  // SIGTERM, then waits up to `grace_ms` for the server to exit; SIGKILL to its process group
  // after that. Idempotent. Returns how it ended ("exited", "killed after N ms").
  std::string Stop(int grace_ms = 3000);

 private:
  LocalRedisServer() = default;
  pid_t pid_ = -1;
  int port_ = -1;
  std::string dir_;
};

}  // namespace kvtier::tools
