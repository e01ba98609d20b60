// tools/replay/replay_run_storage.h — the storage tier of a `kvtier replay` run (RunStorage),
// and the check, after the run, that every stored page is reachable from its prompt's first page
// (CheckStoredChains).
//
// Thread safety: used by the one thread that drives a run.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kvtier/page_key.h"
#include "kvtier/storage.h"
#include "kvtier/testing/storage_fault.h"
#include "redis_server.h"
#include "replay_report.h"
#include "replay_run.h"

namespace kvtier::tools {

// The storage tier of a run: a temporary file store (removed afterwards) or the user's URL.
class RunStorage {
 public:
  ~RunStorage();
  // Opens the store --storage names (the first time, measuring the storage read ceiling into
  // s.storage_ceiling), behind --fault's wrapper when the run has one.
  Status Open(ReplaySetup& s, int64_t host_bytes);
  std::shared_ptr<StorageBackend> backend() const { return backend_; }
  const std::string& url() const { return url_; }
  // The store's capacity when the run made the store (file, redis), else -1.
  int64_t capacity_bytes() const { return capacity_bytes_; }
  // Makes the store fail from now on (--fault storage-down@S): stops the run's own redis-server,
  // or makes the wrapped store answer as a stopped server does. Returns what was done.
  std::string TakeDown() {
    if (redis_ != nullptr) return "redis-server stopped (SIGTERM): " + redis_->Stop();
    if (faulty_ != nullptr) faulty_->SetDown(true);
    return "the store fails every call";
  }

 private:
  // The storage read ceiling of `url` (replay_ceiling.h) into s.storage_ceiling; a store without
  // a baseline keeps 0 and the reason. A Redis ceiling is bounded by the store's timeout
  // (RedisCeilingTimeLimit).
  void MeasureCeiling(ReplaySetup& s, const std::string& url,
                      std::chrono::milliseconds store_timeout);

  // Declared first, so destroyed last: the backend closes its connections before the server
  // stops.
  std::unique_ptr<LocalRedisServer> redis_;
  FaultInjectingStorage* faulty_ = nullptr;  // owned by backend_
  std::string temp_dir_;
  std::string url_;
  int64_t capacity_bytes_ = -1;
  std::shared_ptr<StorageBackend> backend_;
};

// Every page key the run's requests can have stored: the whole pages of each request's tokens
// (prompt, and output with --insert-output), chained from the prompt's start (the cache's keys,
// empty tenant salt).
std::vector<std::vector<PageKey>> RequestChains(const ReplaySetup& s);
// The same for the requests of `w` (s.warmup or s.workload), one chain per request in order (empty
// where a request has no whole page).
std::vector<std::vector<PageKey>> RequestChainsOf(const ReplaySetup& s, const Workload& w);

// The stored pages unreachable from a stored first page (StoredChains in replay_report.h): one
// Exists per distinct key of `chains`, at most 64 in flight, for at most `budget` (a slow store:
// then not checked, saying why). A lookup walks a prompt's pages from its first and stops at the
// first miss, so a stored page after a missing one is bytes no request can reach.
StoredChains CheckStoredChains(StorageBackend& store,
                               const std::vector<std::vector<PageKey>>& chains,
                               std::chrono::seconds budget = std::chrono::seconds(30));

}  // namespace kvtier::tools
