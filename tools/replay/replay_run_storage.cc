// The storage tier of a `kvtier replay` run and the reachability check of what it stored
// (replay_run_storage.h).
#include "replay_run_storage.h"

#include <fmt/format.h>
#include <stdlib.h>

#include <algorithm>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <unordered_map>
#include <unordered_set>

#include "kvtier/hierarchical_cache.h"
#include "kvtier/testing/kv_pattern.h"
#include "replay_ceiling.h"

namespace kvtier::tools {
namespace {
using Clock = std::chrono::steady_clock;
}  // namespace

RunStorage::~RunStorage() {
  if (!temp_dir_.empty()) {
    std::error_code ec;
    std::filesystem::remove_all(temp_dir_, ec);
  }
}

Status RunStorage::Open(ReplaySetup& s, int64_t host_bytes) {
  const ReplayOptions& o = s.options;
  std::string url = o.storage;
  if (url == "redis" || url == "redis://auto") {
    // A redis-server of the run's own on a free loopback port, stopped at the end (or at
    // --fault storage-down@S).
    const int64_t cap = o.storage_bytes > 0 ? o.storage_bytes
                                            : std::max<int64_t>(8 * host_bytes, int64_t{64} << 20);
    KVTIER_ASSIGN_OR_RETURN(redis_, LocalRedisServer::Start(cap));
    url = redis_->url();
    std::fprintf(stderr, "kvtier replay: redis-server %d started at %s\n", redis_->pid(),
                 url.c_str());
    capacity_bytes_ = cap;
  } else if (url == "file") {
    const char* tmp = std::getenv("TMPDIR");
    std::string templ =
        fmt::format("{}/kvtier-replay-XXXXXX", tmp != nullptr && *tmp != '\0' ? tmp : "/tmp");
    if (mkdtemp(templ.data()) == nullptr) {
      return Status::IOError(fmt::format("cannot create a temporary directory {}", templ));
    }
    temp_dir_ = templ;
    const int64_t cap = o.storage_bytes > 0 ? o.storage_bytes
                                            : std::max<int64_t>(8 * host_bytes, int64_t{64} << 20);
    url = FileStoreUrl(temp_dir_, cap);
    capacity_bytes_ = cap;
  }
  KvGeometry pages;
  pages.layout = o.cache.host_layout;
  pages.num_layers = s.model.num_layers;
  pages.slot_bytes = s.model.slot_bytes;
  pages.page_size = o.cache.page_size;
  pages.head_num = s.model.kv_head_num;
  const StorageNamespace ns =
      StorageNamespaceOf(pages, s.model.mla, {.model_id = s.model.model_id});
  const StorageOptions& so = o.cache.storage.options;
  KVTIER_ASSIGN_OR_RETURN(std::unique_ptr<StorageBackend> backend, OpenStorage(url, ns, so));
  url_ = backend->url();
  if (!s.storage_ceiling_measured) {
    s.storage_ceiling_measured = true;
    MeasureCeiling(s, url, so.timeout);
  }
  if ((s.fault_at_s >= 0 && redis_ == nullptr) || s.fault_delay_ms > 0) {
    // --fault: the store sits behind the fault-injecting wrapper, healthy until TakeDown (a
    // redis-server of the run's own is stopped instead), or slow from the start.
    KVTIER_ASSIGN_OR_RETURN(std::unique_ptr<FaultInjectingStorage> faulty,
                            FaultInjectingStorage::Wrap(std::move(backend), /*seed=*/1));
    if (s.fault_delay_ms > 0) {
      KVTIER_RETURN_IF_ERROR(faulty->SetDelay(std::chrono::milliseconds(s.fault_delay_ms)));
    }
    faulty_ = faulty.get();
    backend = std::move(faulty);
  }
  backend_ = std::shared_ptr<StorageBackend>(std::move(backend));
  return Status::OK();
}

void RunStorage::MeasureCeiling(ReplaySetup& s, const std::string& url,
                                std::chrono::milliseconds store_timeout) {
  const int64_t page_bytes = s.options.cache.page_size * s.model.kv_bytes_per_token();
  const int threads = s.options.cache.storage.options.io_threads;
  Result<StorageCeiling> c = Status::Unavailable("no plain-read baseline for this kind of store");
  switch (BaselineOf(url)) {
    case StorageBaseline::kFiles:
      c = MeasureFileReadCeiling(FileUrlDirectory(url), page_bytes, threads);
      break;
    case StorageBaseline::kRedisBenchmark:
      c = MeasureRedisReadCeiling(url, page_bytes, threads, store_timeout);
      break;
    case StorageBaseline::kMemcpy:
    case StorageBaseline::kNone:
      break;
  }
  if (c.ok()) {
    s.storage_ceiling = *c;
  } else {
    s.storage_ceiling.how = c.status().message();
  }
}

std::vector<std::vector<PageKey>> RequestChainsOf(const ReplaySetup& s, const Workload& w) {
  std::vector<std::vector<PageKey>> chains;
  for (size_t i = 0; i < w.requests.size(); ++i) {
    const WorkloadRequest& req = w.requests[i];
    std::vector<int32_t> tokens = PromptTokens(req);
    if (s.options.insert_output && req.output_length > 0) {
      const std::vector<int32_t> out = OutputTokens(static_cast<int64_t>(i), req.output_length);
      tokens.insert(tokens.end(), out.begin(), out.end());
    }
    Result<std::vector<PageKey>> keys =
        ComputePromptPageKeys(tokens, s.options.cache.page_size, /*salt=*/"");
    chains.push_back(keys.ok() ? std::move(*keys) : std::vector<PageKey>());
  }
  return chains;
}

std::vector<std::vector<PageKey>> RequestChains(const ReplaySetup& s) {
  std::vector<std::vector<PageKey>> chains;
  for (const Workload* w : {&s.warmup, &s.workload}) {
    for (std::vector<PageKey>& keys : RequestChainsOf(s, *w)) {
      if (!keys.empty()) chains.push_back(std::move(keys));
    }
  }
  return chains;
}

StoredChains CheckStoredChains(StorageBackend& store,
                               const std::vector<std::vector<PageKey>>& chains,
                               std::chrono::seconds budget) {
  StoredChains r;
  const auto deadline = Clock::now() + budget;
  std::unordered_map<PageKey, int8_t, PageKeyHash> stored;  // -1: not asked yet
  std::vector<PageKey> distinct;
  for (const auto& chain : chains) {
    for (const PageKey& k : chain) {
      if (stored.emplace(k, -1).second) distinct.push_back(k);
    }
  }
  std::mutex mu;
  std::condition_variable cv;
  int64_t in_flight = 0, asked = 0;
  Status failed;
  for (const PageKey& k : distinct) {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return in_flight < 64; });
    if (failed.ok() && Clock::now() > deadline) {
      failed = Status::Unavailable(fmt::format("the store answered {} of {} Exists in {} s",
                                               asked - in_flight, distinct.size(), budget.count()));
    }
    if (!failed.ok()) break;
    ++asked;
    ++in_flight;
    lock.unlock();
    store.ExistsAsync({k}, [&, k](ExistsResult e) {
      std::lock_guard<std::mutex> l(mu);
      if (!e.status.ok() && failed.ok()) failed = e.status;
      stored[k] = e.leading == 1 ? 1 : 0;
      --in_flight;
      cv.notify_all();
    });
  }
  {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return in_flight == 0; });
  }
  if (!failed.ok()) {
    r.why_unchecked = failed.ToString();
    return r;
  }
  r.checked = true;
  r.keys = static_cast<int64_t>(distinct.size());
  std::unordered_set<PageKey, PageKeyHash> unreachable;
  for (const auto& chain : chains) {
    bool gap = false;  // a page before this one in the prompt is not stored
    for (const PageKey& k : chain) {
      const bool here = stored.at(k) == 1;
      if (here && gap) unreachable.insert(k);
      gap = gap || !here;
    }
  }
  for (const auto& [k, v] : stored) r.stored += v == 1 ? 1 : 0;
  r.unreachable = static_cast<int64_t>(unreachable.size());
  return r;
}

}  // namespace kvtier::tools
