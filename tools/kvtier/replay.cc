// `kvtier replay` (see replay.h): options, the scheduler's timeline, the driver of one run, and
// the runs of one invocation.
#include "replay.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <filesystem>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "kvtier/device.h"
#include "kvtier/hierarchical_cache.h"
#include "kvtier/kv_events.h"
#include "kvtier/shared_host_pool.h"
#include "kvtier/storage.h"
#include "kvtier/testing/kv_pattern.h"
#include "kvtier/testing/storage_fault.h"
#include "redis_server.h"
#include "replay_ceiling.h"
#include "replay_engine.h"
#include "replay_model.h"
#include "replay_report.h"
#include "workload.h"

#if !defined(KVTIER_DATA_DIR)
#define KVTIER_DATA_DIR ""
#endif

namespace kvtier::tools {
namespace {

using Clock = std::chrono::steady_clock;
double MsSince(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

Status Bound(const char* flag, int64_t value, int64_t lo, int64_t hi) {
  if (value < lo || value > hi) {
    return Status::InvalidArgument(fmt::format("{} = {} must be in [{}, {}]", flag, value, lo, hi));
  }
  return Status::OK();
}
Status BoundReal(const char* flag, double value, double lo, double hi) {
  if (!(std::isfinite(value) && value >= lo && value <= hi)) {
    return Status::InvalidArgument(
        fmt::format("{} = {} must be in [{:g}, {:g}]", flag, value, lo, hi));
  }
  return Status::OK();
}
Status OneOf(const char* flag, const std::string& value, std::initializer_list<const char*> ok) {
  std::string list;
  for (const char* o : ok) {
    if (value == o) return Status::OK();
    list += list.empty() ? o : fmt::format(", {}", o);
  }
  return Status::InvalidArgument(fmt::format("{} = '{}' must be one of: {}", flag, value, list));
}

constexpr int64_t kMaxTokens = int64_t{1} << 34;

// The replay's flags that set a HierarchicalCacheConfig field, by field: the cache's Validate
// checks them (its schema has the bounds) and names them by these flags.
std::string ReplayFlagOf(std::string_view field) {
  static const std::pair<std::string_view, std::string_view> kFlags[] = {
      {"page_size", "--page-size"},
      {"host_layout", "--hicache-mem-layout"},
      {"write_policy", "--hicache-write-policy"},
      {"write_through_threshold", "--write-through-threshold"},
      {"device_eviction", "--eviction"},
      {"host_eviction", "--eviction"},
      {"load_back_min_tokens", "--load-back-threshold"},
      {"prefetch_policy", "--hicache-storage-prefetch-policy"},
      {"prefetch_threshold_tokens", "--prefetch-threshold"},
      {"max_backup_queue_pages", "--storage-backup-queue-pages"},
      {"storage_io_threads", "--storage-io-threads"},
  };
  for (const auto& [f, flag] : kFlags) {
    if (f == field) return std::string(flag);
  }
  return std::string(field);  // not a replay flag: the cache's own name
}

// The cache settings the replay's flags give. REQUIRES: the names in `o` parse (Validate checks
// them first).
HierarchicalCacheConfig CacheConfigOf(const ReplayOptions& o) {
  HierarchicalCacheConfig c;
  c.page_size = o.page_size;
  c.host_layout = *ParseLayout(o.host_layout);
  c.write_policy = *ParseWritePolicy(o.write_policy);
  c.write_through_threshold = o.write_through_threshold;
  c.device_eviction = *ParseEvictionPolicy(o.eviction);
  c.host_eviction = c.device_eviction;
  c.load_back_min_tokens = o.load_back_threshold;
  c.storage.prefetch_policy = *ParsePrefetchPolicy(o.prefetch_policy);
  c.storage.prefetch_threshold_tokens = o.prefetch_threshold;
  c.storage.max_backup_queue_pages = o.storage_backup_queue_pages;
  c.storage.options.io_threads = o.storage_io_threads;
  return c;
}

// --fault: the store goes down at `down_at_s` (-1: never), or every storage call waits
// `delay_ms` first (0: none).
struct Fault {
  double down_at_s = -1;
  int64_t delay_ms = 0;
};

// "storage-down@SECONDS" or "storage-delay@MS".
Result<Fault> ParseFault(const std::string& fault) {
  const std::string down = "storage-down@", delay = "storage-delay@";
  const bool is_down = fault.rfind(down, 0) == 0;
  if (!is_down && fault.rfind(delay, 0) != 0) {
    return Status::InvalidArgument(fmt::format(
        "--fault = '{}': the known faults are storage-down@SECONDS and storage-delay@MS", fault));
  }
  char* end = nullptr;
  const std::string number = fault.substr((is_down ? down : delay).size());
  const double v = std::strtod(number.c_str(), &end);
  const bool parsed = !number.empty() && end == number.c_str() + number.size() && std::isfinite(v);
  Fault f;
  if (is_down) {
    if (!parsed || v < 0 || v > 1e7) {
      return Status::InvalidArgument(fmt::format(
          "--fault = '{}': SECONDS must be a number in [0, 1e7] (the replay's clock)", fault));
    }
    f.down_at_s = v;
    return f;
  }
  // Below the storage calls' 2 s deadline: the calls are slow, not timed out.
  if (!parsed || v != std::floor(v) || v < 1 || v > 1000) {
    return Status::InvalidArgument(fmt::format(
        "--fault = '{}': MS must be a whole number of milliseconds in [1, 1000]", fault));
  }
  f.delay_ms = static_cast<int64_t>(v);
  return f;
}

// "I/K" -> {I, K} with 0 <= I < K <= 4096.
Result<std::pair<int64_t, int64_t>> ParseShard(const std::string& shard) {
  const size_t slash = shard.find('/');
  char* end_i = nullptr;
  char* end_k = nullptr;
  const std::string a = shard.substr(0, slash);
  const std::string b = slash == std::string::npos ? "" : shard.substr(slash + 1);
  const long long i = std::strtoll(a.c_str(), &end_i, 10);
  const long long k = std::strtoll(b.c_str(), &end_k, 10);
  if (a.empty() || b.empty() || end_i != a.c_str() + a.size() || end_k != b.c_str() + b.size() ||
      k < 1 || k > 4096 || i < 0 || i >= k) {
    return Status::InvalidArgument(
        fmt::format("--shard = '{}' must be I/K with 0 <= I < K <= 4096 (engine I of K)", shard));
  }
  return std::make_pair(static_cast<int64_t>(i), static_cast<int64_t>(k));
}

// "host-tokens=A,B,C" -> {A, B, C}.
Result<std::vector<int64_t>> ParseSweep(const std::string& sweep) {
  const std::string prefix = "host-tokens=";
  if (sweep.rfind(prefix, 0) != 0) {
    return Status::InvalidArgument(
        fmt::format("--sweep = '{}': the knob that can be swept is host-tokens=A,B,C", sweep));
  }
  std::vector<int64_t> values;
  std::string_view rest = std::string_view(sweep).substr(prefix.size());
  while (!rest.empty()) {
    const size_t comma = rest.find(',');
    const std::string item(rest.substr(0, comma));
    char* end = nullptr;
    const long long v = std::strtoll(item.c_str(), &end, 10);
    if (item.empty() || end != item.c_str() + item.size() || v < 0 || v > kMaxTokens) {
      return Status::InvalidArgument(
          fmt::format("--sweep: '{}' is not a token count in [0, {}]", item, kMaxTokens));
    }
    values.push_back(v);
    if (comma == std::string_view::npos) break;
    rest.remove_prefix(comma + 1);
  }
  if (values.empty() || values.size() > 32) {
    return Status::InvalidArgument("--sweep: give 1 to 32 values");
  }
  return values;
}

}  // namespace

std::string DefaultTracePath() {
  namespace fs = std::filesystem;
  const std::string name = "traces/mooncake_conversation_trace.jsonl";
  std::vector<fs::path> candidates;
  if (const char* env = std::getenv("KVTIER_DATA_DIR"); env != nullptr && *env != '\0') {
    candidates.emplace_back(fs::path(env) / name);
  }
  if (*KVTIER_DATA_DIR != '\0') candidates.emplace_back(fs::path(KVTIER_DATA_DIR) / name);
  candidates.emplace_back(fs::path("data") / name);
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) candidates.emplace_back(exe.parent_path().parent_path() / "share/kvtier" / name);
  for (const fs::path& p : candidates) {
    if (fs::exists(p, ec)) return p.string();
  }
  return "";
}

Status ReplayOptions::Validate() const {
  KVTIER_RETURN_IF_ERROR(Bound("--requests", requests, 0, 10'000'000));
  KVTIER_RETURN_IF_ERROR(Bound("--warmup", warmup, 0, 10'000'000));
  KVTIER_RETURN_IF_ERROR(Bound("--skip", skip, 0, 10'000'000));
  if (!shard.empty()) KVTIER_RETURN_IF_ERROR(ParseShard(shard).status());
  if ((skip > 0 || !shard.empty()) &&
      (workload == "chat" || workload == "system-prompt" || workload == "doc-qa")) {
    return Status::InvalidArgument(fmt::format(
        "--skip / --shard select requests of a trace; the synthetic workload '{}' has no trace "
        "(use --seed and --requests)",
        workload));
  }
  KVTIER_RETURN_IF_ERROR(BoundReal("--rate", rate, 1e-6, 1e6));
  KVTIER_RETURN_IF_ERROR(Bound("--concurrency", concurrency, 0, 100'000));
  KVTIER_RETURN_IF_ERROR(BoundReal("--speed", speed, 1e-6, 1e9));
  KVTIER_RETURN_IF_ERROR(Bound("--max-inflight", max_inflight, 1, 100'000));
  if (sequential && concurrency > 1) {
    return Status::InvalidArgument(fmt::format(
        "--sequential serves one request at a time; it cannot be combined with --concurrency {}",
        concurrency));
  }
  KVTIER_RETURN_IF_ERROR(FindReplayModel(model).status().WithContext("--model"));
  if (!compute_model.empty()) {
    KVTIER_RETURN_IF_ERROR(FindReplayModel(compute_model).status().WithContext("--compute-model"));
  }
  KVTIER_RETURN_IF_ERROR(OneOf("--compute", compute, {"auto", "gemm", "model"}));
  KVTIER_RETURN_IF_ERROR(BoundReal("--tflops", tflops, 1e-3, 1e5));
  KVTIER_RETURN_IF_ERROR(Bound("--chunk-tokens", chunk_tokens, 64, 1 << 20));
  KVTIER_RETURN_IF_ERROR(OneOf("--device", device, {"auto", "gpu", "cpu"}));
  KVTIER_RETURN_IF_ERROR(ValidatePageSize(page_size, "--page-size"));  // the geometry's rule
  KVTIER_RETURN_IF_ERROR(Bound("--device-tokens", device_tokens, page_size, kMaxTokens));
  if (host_tokens != -1 || host_tokens_given) {  // -1 unless given: 4 x --device-tokens
    KVTIER_RETURN_IF_ERROR(Bound("--host-tokens", host_tokens, 0, kMaxTokens));
  }
  if (host_tokens == 0 && storage != "none") {
    return Status::InvalidArgument(
        "--host-tokens 0 (no host tier) needs --storage none: prefetches from storage land in "
        "host memory");
  }
  KVTIER_RETURN_IF_ERROR(Bound("--storage-bytes", storage_bytes, 0, int64_t{1} << 50));
  KVTIER_RETURN_IF_ERROR(ParseLayout(host_layout).status().WithContext("--hicache-mem-layout"));
  KVTIER_RETURN_IF_ERROR(
      ParseWritePolicy(write_policy).status().WithContext("--hicache-write-policy"));
  KVTIER_RETURN_IF_ERROR(ParsePrefetchPolicy(prefetch_policy)
                             .status()
                             .WithContext("--hicache-storage-prefetch-policy"));
  KVTIER_RETURN_IF_ERROR(ParseEvictionPolicy(eviction).status().WithContext("--eviction"));
  KVTIER_RETURN_IF_ERROR(
      OneOf("--hicache-io-backend", io_backend, {"auto", "kernel", "dma", "cpu"}));
  {
    // The cache's settings, through the cache's own Validate (a host tier and a storage tier
    // stand in so that every field the flags set is checked).
    HierarchicalCacheConfig c = CacheConfigOf(*this);
    c.host_capacity_bytes = 1;
    c.storage.url = "memory://";
    KVTIER_RETURN_IF_ERROR(c.Validate(ReplayFlagOf));
  }
  KVTIER_RETURN_IF_ERROR(OneOf("--verify", verify, {"all", "sample"}));
  KVTIER_RETURN_IF_ERROR(OneOf("--runs", runs, {"all", "hierarchy", "no_cache,hierarchy"}));
  KVTIER_RETURN_IF_ERROR(BoundReal("--slow-class-margin", slow_class_margin, 0, 10));
  if (kv_events.empty() && (!kv_events_replay.empty() || !kv_events_topic.empty())) {
    return Status::InvalidArgument("--kv-events-replay and --kv-events-topic need --kv-events");
  }
  KVTIER_RETURN_IF_ERROR(BoundReal("--kv-events-hold", kv_events_hold_s, 0, 3600));
  if (kv_events.empty() && kv_events_hold_s > 0) {
    return Status::InvalidArgument("--kv-events-hold needs --kv-events");
  }
  if (!kv_events.empty() && !sweep.empty()) {
    return Status::InvalidArgument(
        "--kv-events publishes one hierarchy run's events; --sweep makes several");
  }
  if (!fault.empty()) {
    KVTIER_RETURN_IF_ERROR(ParseFault(fault).status());
    if (storage == "none") {
      return Status::InvalidArgument("--fault needs a storage tier (not --storage none)");
    }
  }
  if (!sweep.empty()) KVTIER_RETURN_IF_ERROR(ParseSweep(sweep).status());
  if (!shared_host.empty() &&
      ((storage != "file" && storage != "none") || !fault.empty() || host_tokens == 0)) {
    return Status::InvalidArgument(fmt::format(
        "--shared-host {} is the host tier, with no storage tier below it: it needs a host tier "
        "(--host-tokens > 0) and takes neither --storage {} nor --fault",
        shared_host, RedactUrl(storage)));
  }
  if (storage != "none" && storage != "file" && storage != "redis" &&
      storage.find("://") == std::string::npos) {
    return Status::InvalidArgument(
        fmt::format("--storage = '{}' must be none, file (a temporary file store), redis (a "
                    "redis-server the run starts) or a URL such as file:///path, "
                    "redis://host:port, memory://",
                    RedactUrl(storage)));
  }
  if (!json_path.empty()) KVTIER_RETURN_IF_ERROR(CheckOutputPath(json_path, "--json"));
  if (!plot_path.empty()) {
    KVTIER_RETURN_IF_ERROR(CheckOutputPath(plot_path, "--plot"));
    // A PNG goes to a file: a device (/dev/full, /dev/null) would swallow or refuse it after the
    // whole run.
    std::error_code ec;
    if (std::filesystem::exists(plot_path, ec) &&
        !std::filesystem::is_regular_file(plot_path, ec)) {
      return Status::InvalidArgument(
          fmt::format("--plot {}: not a regular file (the plot is a PNG file)", plot_path));
    }
  }
  return Status::OK();
}

namespace {

// When each request arrives and when the device serves it: open loop (timestamps / speed), closed
// loop (request i arrives when request i - N finished) or sequential (N = 1). The device serves one
// request at a time, in arrival order.
class Timeline {
 public:
  Timeline(const Workload& w, const ReplayOptions& o)
      : n_(static_cast<int64_t>(w.requests.size())),
        closed_(o.sequential ? 1 : o.concurrency),
        end_(static_cast<size_t>(n_), 0) {
    if (closed_ == 0) {
      open_.reserve(static_cast<size_t>(n_));
      const double t0 = n_ > 0 ? w.requests[0].arrival_ms : 0;
      for (const WorkloadRequest& r : w.requests) open_.push_back((r.arrival_ms - t0) / o.speed);
    }
  }
  // True once request i's arrival time is known (closed loop: request i - N has finished).
  bool Known(int64_t i, int64_t served) const {
    return closed_ == 0 || i < closed_ || i - closed_ < served;
  }
  double Arrival(int64_t i) const {
    if (closed_ == 0) return open_[static_cast<size_t>(i)];
    return i < closed_ ? 0 : end_[static_cast<size_t>(i - closed_)];
  }
  // When the device can start request i (all earlier ones served).
  double StartOf(int64_t i) const { return std::max(device_free_, Arrival(i)); }
  // Serves request i for `service_ms`; returns its end.
  double Serve(int64_t i, double service_ms) {
    const double end = StartOf(i) + service_ms;
    end_[static_cast<size_t>(i)] = end;
    device_free_ = end;
    return end;
  }

 private:
  int64_t n_;
  int64_t closed_;  // 0: open loop
  std::vector<double> open_;
  std::vector<double> end_;
  double device_free_ = 0;
};

enum class RunKind { kNoCache, kDeviceOnly, kHierarchy };
const char* RunName(RunKind k) {
  switch (k) {
    case RunKind::kNoCache:
      return "no_cache";
    case RunKind::kDeviceOnly:
      return "device_only";
    case RunKind::kHierarchy:
      return "hierarchy";
  }
  return "?";
}

// Everything the runs of one invocation share.
struct Setup {
  ReplayOptions options;
  Workload workload;  // the measured requests
  Workload warmup;    // --warmup: served first, not measured
  ReplayModel model;
  std::unique_ptr<PrefillEngine> engine;
  TransferBackend io_backend = TransferBackend::kCpu;
  bool gpu = false;
  double fault_at_s = -1;
  int64_t fault_delay_ms = 0;  // --fault storage-delay@MS
  // The storage read ceiling (replay_ceiling.h), measured when the first store opens; 0 when
  // there is no baseline for the store (then `storage_ceiling.how` says why).
  bool storage_ceiling_measured = false;
  StorageCeiling storage_ceiling;
  std::shared_ptr<KvEventPublisher> kv_events;  // --kv-events: the hierarchy run's sink
};

// A request between its Match and its Release.
struct InFlight {
  int64_t index = 0;
  std::vector<Token> tokens;     // prompt (and output, with --insert-output)
  std::vector<uint64_t> hashes;  // KV pattern hashes of `tokens`
  int64_t prompt_tokens = 0;
  bool matched = false;
  MatchResult match;
  int64_t storage_tokens = 0;  // after QueryStorage
  PrefetchState prefetch = PrefetchState::kNone;
};

// The storage tier of a run: a temporary file store (removed afterwards) or the user's URL.
class RunStorage {
 public:
  ~RunStorage() {
    if (!temp_dir_.empty()) {
      std::error_code ec;
      std::filesystem::remove_all(temp_dir_, ec);
    }
  }
  Status Open(Setup& s, int64_t host_bytes) {
    const ReplayOptions& o = s.options;
    std::string url = o.storage;
    if (url == "redis" || url == "redis://auto") {
      // A redis-server of the run's own on a free loopback port, stopped at the end (or at
      // --fault storage-down@S).
      const int64_t cap = o.storage_bytes > 0
                              ? o.storage_bytes
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
      const int64_t cap = o.storage_bytes > 0
                              ? o.storage_bytes
                              : std::max<int64_t>(8 * host_bytes, int64_t{64} << 20);
      url = fmt::format("file://{}?capacity={}", temp_dir_, cap);
      capacity_bytes_ = cap;
    }
    StorageNamespace ns;
    ns.model_id = s.model.model_id;
    ns.layout = *ParseLayout(o.host_layout);
    ns.mla = s.model.mla;
    ns.num_layers = s.model.num_layers;
    ns.slot_bytes = s.model.slot_bytes;
    ns.page_size = o.page_size;
    ns.head_num = s.model.kv_head_num;
    StorageOptions so;
    so.io_threads = o.storage_io_threads;
    KVTIER_ASSIGN_OR_RETURN(std::unique_ptr<StorageBackend> backend, OpenStorage(url, ns, so));
    url_ = backend->url();
    if (!s.storage_ceiling_measured) {
      s.storage_ceiling_measured = true;
      MeasureCeiling(s, url);
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
  // a baseline keeps 0 and the reason.
  void MeasureCeiling(Setup& s, const std::string& url) {
    const int64_t page_bytes = s.options.page_size * s.model.kv_bytes_per_token();
    const int threads = static_cast<int>(s.options.storage_io_threads);
    Result<StorageCeiling> c = Status::Unavailable("no plain-read baseline for this kind of store");
    if (const std::string dir = FileUrlDirectory(url); !dir.empty()) {
      c = MeasureFileReadCeiling(dir, page_bytes, threads);
    } else if (url.rfind("redis", 0) == 0) {
      c = MeasureRedisReadCeiling(url, page_bytes, threads);
    }
    if (c.ok()) {
      s.storage_ceiling = *c;
    } else {
      s.storage_ceiling.how = c.status().message();
    }
  }

  // Declared first, so destroyed last: the backend closes its connections before the server
  // stops.
  std::unique_ptr<LocalRedisServer> redis_;
  FaultInjectingStorage* faulty_ = nullptr;  // owned by backend_
  std::string temp_dir_;
  std::string url_;
  int64_t capacity_bytes_ = -1;
  std::shared_ptr<StorageBackend> backend_;
};

// The progress line: requests done, hit rate so far, ETA, on stderr: rewritten in place twice a
// second on a terminal, a plain line every 10 s otherwise (logs), and a last line per run.
class Progress {
 public:
  Progress(bool on, std::string name, int64_t total)
      : on_(on),
        tty_(isatty(STDERR_FILENO) != 0),
        name_(std::move(name)),
        total_(total),
        t0_(Clock::now()),
        last_(t0_) {}
  void Update(int64_t done, double hit_rate) {
    if (!on_) return;
    const auto now = Clock::now();
    const auto every = tty_ ? std::chrono::milliseconds(500) : std::chrono::milliseconds(10000);
    if (done < total_ && now - last_ < every) return;
    last_ = now;
    const double s = std::chrono::duration<double>(now - t0_).count();
    const double eta =
        done > 0 ? s / static_cast<double>(done) * static_cast<double>(total_ - done) : 0;
    std::fprintf(stderr, "%s  [%s] %lld/%lld requests, hit rate %.1f %%, %.0f s, ETA %.0f s%s",
                 tty_ ? "\r" : "", name_.c_str(), static_cast<long long>(done),
                 static_cast<long long>(total_), 100 * hit_rate, s, eta,
                 tty_ && done < total_ ? "   " : "\n");
    std::fflush(stderr);
  }

 private:
  bool on_;
  bool tty_;
  std::string name_;
  int64_t total_;
  Clock::time_point t0_, last_;
};

// Every page key the run's requests can have stored: the whole pages of each request's tokens
// (prompt, and output with --insert-output), chained from the prompt's start (the cache's keys,
// empty tenant salt).
std::vector<std::vector<PageKey>> RequestChains(const Setup& s) {
  std::vector<std::vector<PageKey>> chains;
  for (const Workload* w : {&s.warmup, &s.workload}) {
    for (size_t i = 0; i < w->requests.size(); ++i) {
      const WorkloadRequest& req = w->requests[i];
      std::vector<int32_t> tokens = PromptTokens(req);
      if (s.options.insert_output && req.output_length > 0) {
        const std::vector<int32_t> out = OutputTokens(static_cast<int64_t>(i), req.output_length);
        tokens.insert(tokens.end(), out.begin(), out.end());
      }
      Result<std::vector<PageKey>> keys =
          ComputePromptPageKeys(tokens, s.options.page_size, /*salt=*/"");
      if (keys.ok() && !keys->empty()) chains.push_back(std::move(*keys));
    }
  }
  return chains;
}

// The stored pages unreachable from a stored first page (StoredChains in replay_report.h): one
// Exists per distinct key of `chains`, at most 64 in flight, for at most `budget` (a slow store:
// then not checked, saying why). A lookup walks a prompt's pages from its first and stops at the
// first miss, so a stored page after a missing one is bytes no request can reach.
StoredChains CheckStoredChains(StorageBackend& store,
                               const std::vector<std::vector<PageKey>>& chains,
                               std::chrono::seconds budget = std::chrono::seconds(30)) {
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

class RunDriver {
 public:
  RunDriver(Setup& setup, RunKind kind, int64_t host_tokens, std::string name)
      : s_(setup),
        o_(setup.options),
        kind_(kind),
        host_tokens_(host_tokens),
        P_(o_.page_size),
        timeline_(setup.workload, setup.options) {
    summary_.name = std::move(name);
    summary_.device_tokens = o_.device_tokens;
    summary_.host_tokens = kind == RunKind::kHierarchy ? host_tokens : 0;
    summary_.storage = "none";
  }

  Result<RunSummary> Run() {
    const auto wall0 = Clock::now();
    if (kind_ != RunKind::kNoCache) KVTIER_RETURN_IF_ERROR(CreateCache());
    const int64_t n = static_cast<int64_t>(s_.workload.requests.size());
    summary_.records.resize(static_cast<size_t>(n));
    Progress progress(o_.progress, summary_.name, n);
    // --warmup: requests served one by one before the measured ones, to fill the tiers; their KV
    // is written and checked, nothing is timed or recorded.
    if (cache_ != nullptr) {
      warming_ = true;
      for (int64_t i = 0; i < static_cast<int64_t>(s_.warmup.requests.size()); ++i) {
        KVTIER_ASSIGN_OR_RETURN(InFlight f, Arrive(i));
        KVTIER_RETURN_IF_ERROR(Serve(f).WithContext(fmt::format("warm-up request {}", i)));
      }
      warming_ = false;
    }
    std::deque<InFlight> pending;
    int64_t next = 0;
    int64_t hit = 0, input = 0;
    for (int64_t served = 0; served < n; ++served) {
      if (pending.empty()) {
        KVTIER_ASSIGN_OR_RETURN(InFlight f, Arrive(next++));
        pending.push_back(std::move(f));
      }
      const double serve_at = timeline_.StartOf(served);
      while (next < n && static_cast<int64_t>(pending.size()) < o_.max_inflight &&
             timeline_.Known(next, served) && timeline_.Arrival(next) <= serve_at) {
        KVTIER_ASSIGN_OR_RETURN(InFlight f, Arrive(next++));
        pending.push_back(std::move(f));
      }
      InFlight f = std::move(pending.front());
      pending.pop_front();
      KVTIER_RETURN_IF_ERROR(Serve(f).WithContext(fmt::format("request {}", f.index)));
      if (o_.settle_backups && cache_ != nullptr) {
        KVTIER_RETURN_IF_ERROR(cache_->WaitForBackups().WithContext(
            fmt::format("--settle-backups after request {}", f.index)));
      }
      const RequestRecord& r = summary_.records[static_cast<size_t>(f.index)];
      hit += r.hit_tokens();
      input += r.input_tokens;
      progress.Update(served + 1, input > 0 ? static_cast<double>(hit) / input : 0);
    }
    if (cache_ != nullptr) {
      KVTIER_RETURN_IF_ERROR(cache_->WaitForBackups().WithContext("waiting for backups"));
      summary_.cache = cache_->stats();
      if (kind_ == RunKind::kHierarchy && s_.kv_events != nullptr) {
        // The blocks the events describe, then every batch sent (the seq they end at).
        KVTIER_ASSIGN_OR_RETURN(summary_.kv_blocks, cache_->CachedBlocks());
        if (!s_.kv_events->Flush(std::chrono::seconds(30))) {
          return Status::Unavailable("--kv-events: batches still queued after 30 s");
        }
        summary_.has_kv_events = true;
        summary_.kv_events = s_.kv_events->stats();
        summary_.kv_events_endpoint = s_.kv_events->endpoint();
        summary_.kv_events_replay_endpoint = s_.kv_events->replay_endpoint();
      }
      if (o_.metrics) summary_.metrics = cache_->Metrics();
      if (StorageBackend* b = cache_->storage(); b != nullptr) {
        summary_.has_storage = true;
        summary_.storage_stats = b->Stats();
        if (s_.fault_at_s >= 0 || s_.fault_delay_ms > 0) {
          summary_.stored_chains.why_unchecked = "--fault: the store answers as the fault makes it";
        } else {
          summary_.stored_chains = CheckStoredChains(*b, RequestChains(s_));
        }
      }
      KVTIER_RETURN_IF_ERROR(cache_->CheckConsistency().WithContext("cache consistency"));
      cache_.reset();
    }
    summary_.wall_s = std::chrono::duration<double>(Clock::now() - wall0).count();
    return std::move(summary_);
  }

 private:
  Status CreateCache() {
    HierarchicalCacheConfig c = CacheConfigOf(o_);
    c.page_size = P_;
    c.transfer_backend = s_.io_backend;
    c.transfer.device = 0;
    // One replay thread drives the cache; sequential runs keep backups in that thread, so a
    // replay is deterministic.
    c.backup_threads = o_.sequential ? 0 : 1;
    const int64_t token_bytes = s_.model.kv_bytes_per_token();
    const bool host_tier = kind_ == RunKind::kHierarchy && host_tokens_ > 0;
    if (host_tier) {
      c.host_capacity_bytes = host_tokens_ * token_bytes;
      if (!o_.shared_host.empty()) {
        SharedHostPoolAttachOptions attach;
        attach.register_with_cuda = s_.gpu;
        Result<std::unique_ptr<SharedHostPool>> pool =
            SharedHostPool::Attach(o_.shared_host, attach);
        if (!pool.ok()) return pool.status().WithContext("--shared-host");
        c.shared_host = std::move(*pool);
        c.storage.model_id = s_.model.model_id;  // part of the page keys' namespace
        summary_.shared_host = o_.shared_host;
      }
    } else {
      // No host tier (--host-tokens 0, and the device-only run): device evictions forget.
      c.host_capacity_bytes = 0;
      c.host_ratio = 0;
    }
    if (kind_ == RunKind::kHierarchy && o_.storage != "none" && host_tier) {
      storage_ = std::make_unique<RunStorage>();
      KVTIER_RETURN_IF_ERROR(storage_->Open(s_, c.host_capacity_bytes).WithContext("--storage"));
      c.storage.backend = storage_->backend();
      if (storage_->capacity_bytes() >= 0) {
        // The tree remembers no more storage-only pages than the store can hold beside the host
        // tier's (the store evicts by itself and does not tell the tree): a page the tree still
        // believes stored after the store dropped it costs a prefetch that waits and then
        // misses. Pages the tree forgot are found again by QueryStorage's Exists.
        const int64_t page_bytes = P_ * token_bytes;
        c.storage.max_storage_only_pages = std::max<int64_t>(
            0, storage_->capacity_bytes() / page_bytes - c.host_capacity_bytes / page_bytes);
      }
      summary_.storage = RedactUrl(storage_->url());
    }
    if (kind_ == RunKind::kHierarchy && s_.kv_events != nullptr) {
      c.kv_event_sink = s_.kv_events;
      if (c.storage.backend != nullptr) {
        summary_.kv_events_storage_medium = StorageMediumOf(c.storage.backend->url());
      }
    }
    KVTIER_ASSIGN_OR_RETURN(cache_, HierarchicalCache::Create(c, s_.engine->device_region()));
    summary_.has_cache = true;
    return Status::OK();
  }

  Result<InFlight> Arrive(int64_t i) {
    const WorkloadRequest& req =
        (warming_ ? s_.warmup : s_.workload).requests[static_cast<size_t>(i)];
    InFlight f;
    f.index = i;
    f.tokens = PromptTokens(req);
    f.prompt_tokens = req.input_length;
    if (o_.insert_output && req.output_length > 0) {
      const std::vector<int32_t> out = OutputTokens(i, req.output_length);
      f.tokens.insert(f.tokens.end(), out.begin(), out.end());
    }
    if (cache_ == nullptr) return f;
    // --fault storage-down@S: the store fails from the first request arriving at or after S.
    if (!warming_ && storage_ != nullptr && s_.fault_at_s >= 0 && summary_.fault_index < 0 &&
        timeline_.Arrival(i) >= s_.fault_at_s * 1e3) {
      summary_.fault_action = storage_->TakeDown();
      summary_.fault_index = i;
      summary_.fault_at_s = timeline_.Arrival(i) / 1e3;
    }
    f.hashes = KvPatternHashes(f.tokens, KvPatternSalt(""));
    const std::span<const Token> prompt(f.tokens.data(), static_cast<size_t>(f.prompt_tokens));
    KVTIER_ASSIGN_OR_RETURN(f.match, cache_->Match(prompt));
    f.matched = true;
    f.storage_tokens = f.match.storage_tokens;
    if (storage_ != nullptr) {
      KVTIER_ASSIGN_OR_RETURN(StorageQueryResult q, cache_->QueryStorage(f.match.handle));
      f.storage_tokens = q.storage_tokens;
      KVTIER_ASSIGN_OR_RETURN(PrefetchResult p, cache_->Prefetch(f.match.handle));
      f.prefetch = p.state;
    }
    return f;
  }

  Status Serve(InFlight& f) {
    RequestRecord warm_record;
    RequestRecord& r = warming_ ? warm_record : summary_.records[static_cast<size_t>(f.index)];
    r.arrival_ms = warming_ ? 0 : timeline_.Arrival(f.index);
    r.start_ms = warming_ ? 0 : timeline_.StartOf(f.index);
    r.queue_ms = r.start_ms - r.arrival_ms;
    r.input_tokens = f.prompt_tokens;
    PrefillJob job;
    std::vector<int64_t> hit_slots;
    std::vector<int64_t> new_slots;
    int64_t hit = 0;
    if (cache_ != nullptr) {
      const MatchHandle h = f.match.handle;
      // The prefetch wait: how long ending the prefetch blocks when the request is served.
      if (f.prefetch == PrefetchState::kRunning) {
        const auto t0 = Clock::now();
        KVTIER_ASSIGN_OR_RETURN(PrefetchResult p, cache_->FinishPrefetch(h));
        r.prefetch_wait_ms = MsSince(t0);
        f.prefetch = p.state;
      }
      CountPrefetch(f.prefetch);
      KVTIER_RETURN_IF_ERROR(s_.engine->BeginRequest());
      const auto t0 = Clock::now();
      Result<LoadBackResult> lb = cache_->LoadBack(h, s_.engine->load_stream());
      job.load_wall_ms = MsSince(t0);
      if (lb.ok()) {
        hit_slots = std::move(lb->device_slots);
        r.loaded_bytes = lb->loaded_tokens * s_.model.kv_bytes_per_token();
      } else if (lb.status().IsOutOfMemory()) {
        ++summary_.load_failures;  // no room to load: the host part is recomputed
        hit_slots = f.match.device_slots;
      } else {
        return lb.status().WithContext("LoadBack");
      }
      hit = static_cast<int64_t>(hit_slots.size());
      r.device_hit = std::min(hit, f.match.device_tokens);
      r.host_hit = std::min(hit - r.device_hit, f.match.host_tokens);
      r.storage_hit = hit - r.device_hit - r.host_hit;
      // Slots for the new whole pages of the prompt (as many as the device can make room for).
      const int64_t whole = f.prompt_tokens / P_ * P_;
      if (whole > hit) {
        KVTIER_ASSIGN_OR_RETURN(new_slots,
                                cache_->AllocateDeviceSlots(whole - hit, {.allow_fewer = true}));
      }
      job.cache = cache_.get();
      job.handle = h;
      job.hit_slots = hit_slots;
      job.hit_hashes = std::span<const uint64_t>(f.hashes.data(), static_cast<size_t>(hit));
      job.verify_sample = o_.verify == "sample";
      job.skip_compute = warming_;
      job.new_slots = new_slots;
      job.new_hashes = std::span<const uint64_t>(f.hashes.data() + hit, new_slots.size());
    }
    job.cached_tokens = hit;
    job.new_tokens = f.prompt_tokens - hit;
    KVTIER_ASSIGN_OR_RETURN(PrefillTiming t, s_.engine->Prefill(job));
    summary_.bytes_checked += t.bytes_checked;
    summary_.wrong_bytes += t.wrong_bytes;
    if (summary_.first_wrong.empty() && !t.first_wrong.empty()) {
      summary_.first_wrong = fmt::format("request {}: {}", f.index, t.first_wrong);
    }
    r.load_ms = t.load_ms;
    r.compute_ms = t.compute_ms;
    r.device_ms = t.total_ms;
    if (!warming_) {
      const double end = timeline_.Serve(f.index, r.prefetch_wait_ms + t.total_ms);
      r.ttft_ms = end - r.arrival_ms;
    }
    if (cache_ != nullptr) KVTIER_RETURN_IF_ERROR(InsertAndRelease(f, hit_slots, new_slots));
    return Status::OK();
  }

  // Insert the prompt's computed pages (and, with --insert-output, the output's), then Release.
  Status InsertAndRelease(InFlight& f, std::vector<int64_t>& slots,
                          const std::vector<int64_t>& new_slots) {
    slots.insert(slots.end(), new_slots.begin(), new_slots.end());
    const int64_t prompt_whole = f.prompt_tokens / P_ * P_;
    const int64_t all_whole = static_cast<int64_t>(f.tokens.size()) / P_ * P_;
    if (o_.insert_output && static_cast<int64_t>(slots.size()) == prompt_whole &&
        all_whole > prompt_whole) {
      // Decode would have written the output's KV; write it now (untimed) and cache it too.
      KVTIER_ASSIGN_OR_RETURN(
          std::vector<int64_t> out,
          cache_->AllocateDeviceSlots(all_whole - prompt_whole, {.allow_fewer = true}));
      if (!out.empty()) {
        PrefillJob write;
        write.new_slots = out;
        write.new_hashes = std::span<const uint64_t>(f.hashes.data() + prompt_whole, out.size());
        write.cached_tokens = prompt_whole;
        KVTIER_RETURN_IF_ERROR(s_.engine->Prefill(write).status());
        slots.insert(slots.end(), out.begin(), out.end());
      }
    }
    if (!slots.empty()) {
      const std::span<const Token> tokens(f.tokens.data(), slots.size());
      InsertOptions io;
      io.stream = s_.engine->write_stream();
      KVTIER_RETURN_IF_ERROR(cache_->Insert(tokens, slots, "", io).status().WithContext("Insert"));
    }
    return cache_->Release(f.match.handle).WithContext("Release");
  }

  void CountPrefetch(PrefetchState st) {
    switch (st) {
      case PrefetchState::kNone:
        ++summary_.prefetch_none;
        break;
      case PrefetchState::kComplete:
        ++summary_.prefetch_complete;
        break;
      case PrefetchState::kTimedOut:
        ++summary_.prefetch_timed_out;
        break;
      default:
        ++summary_.prefetch_partial;
        break;
    }
  }

  Setup& s_;
  const ReplayOptions& o_;
  RunKind kind_;
  int64_t host_tokens_;
  int64_t P_;
  Timeline timeline_;
  RunSummary summary_;
  std::unique_ptr<RunStorage> storage_;
  std::unique_ptr<HierarchicalCache> cache_;
  bool warming_ = false;  // serving --warmup requests
};

// The ideal of a run: its hits and its compute, no prefetch wait, the same scheduling; the loads
// fully overlapped with the compute, each at its ceiling: every loaded byte (host and storage
// hits) crosses host -> device at `pcie` bytes/s, and storage hits are read at `storage` bytes/s
// (<= 0: no storage ceiling, then at pcie), the read pipelined with the copy (the slower of the
// two sets the load time).
std::vector<double> IdealTtft(const Setup& s, const RunSummary& run, double pcie, double storage) {
  Timeline timeline(s.workload, s.options);
  std::vector<double> out(run.records.size());
  const double token_bytes = static_cast<double>(s.model.kv_bytes_per_token());
  for (size_t i = 0; i < run.records.size(); ++i) {
    const RequestRecord& r = run.records[i];
    const double copy_ms =
        static_cast<double>(r.host_hit + r.storage_hit) * token_bytes / pcie * 1e3;
    const double read_ms =
        storage > 0 ? static_cast<double>(r.storage_hit) * token_bytes / storage * 1e3 : 0;
    const double load_ms = std::max(copy_ms, read_ms);
    const double end = timeline.Serve(static_cast<int64_t>(i), std::max(r.compute_ms, load_ms));
    out[i] = end - timeline.Arrival(static_cast<int64_t>(i));
  }
  return out;
}

// The storage rate the ideal charges: the ceiling measured at start, else (a store without a
// baseline) the run's own storage -> host rate, which report.storage_ceiling_how then says.
double StorageRateFor(const Setup& s, const RunSummary& run, ReplayReport* report) {
  if (!s.storage_ceiling_measured) return 0;  // no storage tier
  if (s.storage_ceiling.bytes_per_s > 0) {
    report->storage_ceiling_bytes_per_s = s.storage_ceiling.bytes_per_s;
    report->storage_ceiling_how = s.storage_ceiling.how;
    return s.storage_ceiling.bytes_per_s;
  }
  const double rate =
      run.cache.prefetch_seconds > 0
          ? static_cast<double>(run.cache.prefetch_bytes) / run.cache.prefetch_seconds
          : 0;
  report->storage_ceiling_bytes_per_s = rate;
  report->storage_ceiling_how =
      rate > 0 ? fmt::format("the run's own storage -> host rate ({})", s.storage_ceiling.how)
               : fmt::format(
                     "no baseline ({}) and no storage reads in the run: storage hits "
                     "charged at the host -> device ceiling",
                     s.storage_ceiling.how);
  return rate;
}

Result<TransferBackend> ChooseIoBackend(const ReplayOptions& o, bool gpu) {
  if (!gpu) {
    if (o.io_backend != "auto" && o.io_backend != "cpu") {
      return Status::InvalidArgument(fmt::format(
          "--hicache-io-backend {} needs a GPU; this run uses the cpu device pool", o.io_backend));
    }
    return TransferBackend::kCpu;
  }
  if (o.io_backend == "cpu") {
    return Status::InvalidArgument(
        "--hicache-io-backend cpu cannot move GPU memory; use auto, "
        "kernel or dma");
  }
  if (o.io_backend == "auto") return TransferBackend::kKernel;
  return ParseTransferBackend(o.io_backend);
}

}  // namespace

Status LoadWorkload(const ReplayOptions& o, Workload* w) {
  const std::string& name = o.workload;
  if (name == "chat" || name == "system-prompt" || name == "doc-qa") {
    SyntheticOptions so;
    so.kind = *ParseSyntheticKind(name);
    so.requests = (o.requests > 0 ? o.requests : 1000) + o.warmup;
    so.seed = o.seed;
    so.rate_per_s = o.rate;
    KVTIER_ASSIGN_OR_RETURN(*w, MakeSyntheticWorkload(so));
    return Status::OK();
  }
  std::string path = name;
  if (name == "mooncake") {
    path = DefaultTracePath();
    if (path.empty()) {
      return Status::NotFound(
          "the shipped trace data/traces/mooncake_conversation_trace.jsonl was not found; give "
          "its path with --workload FILE (or set KVTIER_DATA_DIR to the data folder)");
    }
  }
  const bool select = o.skip > 0 || !o.shard.empty();
  const int64_t wanted = o.requests > 0 ? o.requests + o.warmup : 0;
  KVTIER_ASSIGN_OR_RETURN(*w, LoadMooncakeTrace(path, select ? 0 : wanted));
  if (!o.shard.empty()) {
    const auto [shard, shards] = *ParseShard(o.shard);
    *w = ShardWorkload(*w, shard, shards);
    w->name += fmt::format(", shard {}", o.shard);
  }
  if (o.skip > 0) {
    if (o.skip >= static_cast<int64_t>(w->requests.size())) {
      return Status::InvalidArgument(
          fmt::format("--skip {} leaves none of the {} requests", o.skip, w->requests.size()));
    }
    w->requests.erase(w->requests.begin(), w->requests.begin() + o.skip);
    w->name += fmt::format(", from request {}", o.skip);
  }
  if (wanted > 0 && static_cast<int64_t>(w->requests.size()) > wanted) w->requests.resize(wanted);
  return Status::OK();
}

namespace {

std::string Settings(const Setup& s, bool exact) {
  const ReplayOptions& o = s.options;
  std::string sched = o.sequential ? "sequential"
                      : o.concurrency > 0
                          ? fmt::format("closed loop, {} in flight", o.concurrency)
                          : fmt::format("open loop at {:g}x the timestamps", o.speed);
  return fmt::format(
      "page {}, device {} tokens, host {} tokens ({}), storage {}, write {}, "
      "prefetch {}, eviction {}, io {}, verify {}, {}{}",
      o.page_size, o.device_tokens, o.host_tokens, o.host_layout, RedactUrl(o.storage),
      o.write_policy, o.prefetch_policy, o.eviction, TransferBackendName(s.io_backend), o.verify,
      sched, exact ? " [exact mode: the device tier is a plain leaf-LRU prefix cache]" : "");
}

}  // namespace

int RunReplay(const ReplayOptions& input) {
  ReplayOptions o = input;
  if (Status st = o.Validate(); !st.ok()) {
    std::fprintf(stderr, "kvtier replay: %s\n", st.message().c_str());
    return 2;
  }
  auto fail = [](const Status& st) {
    std::fprintf(stderr, "kvtier replay: %s\n", st.ToString().c_str());
    return 1;
  };
  if (o.host_tokens == -1) o.host_tokens = std::min(4 * o.device_tokens, kMaxTokens);
  if (o.storage_io_threads == 0) o.storage_io_threads = DefaultIoThreads();  // as the cache's 0
  if (!o.shared_host.empty()) o.storage = "none";  // the default file store is not made
  Setup s;
  s.options = o;
  s.model = *FindReplayModel(o.model);
  if (!o.fault.empty()) {
    const Fault f = *ParseFault(o.fault);
    s.fault_at_s = f.down_at_s;
    s.fault_delay_ms = f.delay_ms;
  }
  if (!o.kv_events.empty()) {
    KvEventPublisherConfig events;
    events.endpoint = o.kv_events;
    events.replay_endpoint = o.kv_events_replay;
    events.topic = o.kv_events_topic;
    Result<std::unique_ptr<KvEventPublisher>> pub = KvEventPublisher::Open(events);
    if (!pub.ok()) return fail(pub.status().WithContext("--kv-events"));
    s.kv_events = std::move(*pub);
    // Subscribers may want the bound ports ('*') before the run ends.
    std::fprintf(stderr, "kvtier replay: kv events on %s%s%s\n", s.kv_events->endpoint().c_str(),
                 s.kv_events->replay_endpoint().empty() ? "" : ", replay socket on ",
                 s.kv_events->replay_endpoint().c_str());
  }
  if (Status st = LoadWorkload(o, &s.workload); !st.ok()) {
    std::fprintf(stderr, "kvtier replay: %s\n", st.message().c_str());
    return st.IsInvalidArgument() || st.IsNotFound() ? 2 : 1;
  }
  if (o.warmup > 0) {
    if (o.warmup >= static_cast<int64_t>(s.workload.requests.size())) {
      std::fprintf(stderr, "kvtier replay: --warmup %lld leaves no request of the %zu to measure\n",
                   static_cast<long long>(o.warmup), s.workload.requests.size());
      return 2;
    }
    const auto cut = s.workload.requests.begin() + o.warmup;
    s.warmup.name = s.workload.name;
    s.warmup.requests.assign(s.workload.requests.begin(), cut);
    s.workload.requests.erase(s.workload.requests.begin(), cut);
  }

  // The device pool: a GPU when asked for or present, else host memory standing in.
  const bool have_gpu = CudaDeviceCount() > 0;
  if (o.device == "gpu" && !have_gpu) {
    return fail(Status::Unavailable(BuiltWithCuda() ? "--device gpu: no GPU is present"
                                                    : "--device gpu: kvtier was built without "
                                                      "CUDA"));
  }
  s.gpu = o.device == "gpu" || (o.device == "auto" && have_gpu);
  if (o.compute == "gemm" && !s.gpu) {
    return fail(Status::InvalidArgument(
        "--compute gemm runs cuBLAS GEMMs on a GPU; this run has none (use --compute model)"));
  }
  Result<TransferBackend> io = ChooseIoBackend(o, s.gpu);
  if (!io.ok()) {
    std::fprintf(stderr, "kvtier replay: %s\n", io.status().message().c_str());
    return 2;
  }
  s.io_backend = *io;
  const int64_t device_slots = (o.device_tokens + o.page_size - 1) / o.page_size * o.page_size;
  s.options.device_tokens = device_slots;
  PrefillEngineConfig ec;
  ec.model = s.model;
  ec.compute_model = o.compute_model.empty() ? s.model : *FindReplayModel(o.compute_model);
  ec.device_slots = device_slots;
  ec.page_size = o.page_size;
  ec.compute = (o.compute == "gemm" || (o.compute == "auto" && s.gpu)) ? ComputeMode::kGemm
                                                                       : ComputeMode::kModel;
  ec.tflops = o.tflops;
  ec.chunk_tokens = o.chunk_tokens;
  ec.max_context = 1;
  for (const WorkloadRequest& r : s.workload.requests) {
    ec.max_context = std::max(ec.max_context, r.input_length);
  }
  Result<std::unique_ptr<PrefillEngine>> engine =
      s.gpu ? MakeGpuPrefillEngine(ec) : MakeCpuPrefillEngine(ec);
  if (!engine.ok()) return fail(engine.status().WithContext("device pool"));
  s.engine = std::move(*engine);

  const bool exact = o.sequential && o.host_tokens == 0 && o.storage == "none";
  ReplayReport report;
  report.label = o.label;
  report.command = o.command_line;
  report.workload =
      fmt::format("{} ({} requests, {} input tokens{})", s.workload.name,
                  s.workload.requests.size(), s.workload.input_tokens(),
                  o.warmup > 0 ? fmt::format(", after {} warm-up requests", o.warmup) : "");
  report.model =
      fmt::format("{} ({} layers, {}, {} KV bytes per token){}", s.model.name, s.model.num_layers,
                  s.model.mla ? "MLA" : "MHA", s.model.kv_bytes_per_token(),
                  o.compute_model.empty() || o.compute_model == o.model
                      ? ""
                      : fmt::format("; compute of {}", o.compute_model));
  report.engine = s.engine->Describe();
  report.settings = Settings(s, exact);
  report.page_size = o.page_size;
  report.kv_bytes_per_token = s.model.kv_bytes_per_token();
  report.ceiling_bytes_per_s = s.engine->ceiling_bytes_per_s();
  report.ceiling_how = s.gpu ? "one 256 MiB pinned host -> device copy, median of 5"
                             : "cpu device: one 64 MiB memcpy, median of 3";
  report.gpu = s.gpu;
  report.slow_class_margin = o.slow_class_margin;
  report.slow_class_warn = o.slow_class_warn;
  report.exact_mode = exact;
  std::printf("%s: %s\n  model %s\n  %s\n  %s\n", o.label.c_str(), report.workload.c_str(),
              report.model.c_str(), report.engine.c_str(), report.settings.c_str());
  std::fflush(stdout);

  auto run = [&](RunKind kind, int64_t host_tokens, std::string name) -> Result<RunSummary> {
    RunDriver driver(s, kind, host_tokens, std::move(name));
    return driver.Run();
  };
  // The hierarchy with the same knobs as the device-only run is that run (exact mode).
  const bool hierarchy_is_device_only = o.host_tokens == 0 && o.storage == "none";
  const bool with_device_only = o.runs == "all";
  if (o.runs != "hierarchy") {
    Result<RunSummary> none = run(RunKind::kNoCache, 0, RunName(RunKind::kNoCache));
    if (!none.ok()) return fail(none.status().WithContext("no-cache run"));
    report.runs.push_back(std::move(*none));
    if (with_device_only && !hierarchy_is_device_only) {
      Result<RunSummary> dev = run(RunKind::kDeviceOnly, 0, RunName(RunKind::kDeviceOnly));
      if (!dev.ok()) return fail(dev.status().WithContext("device-only run"));
      report.runs.push_back(std::move(*dev));
    }
  }
  Result<RunSummary> hier = run(RunKind::kHierarchy, o.host_tokens, RunName(RunKind::kHierarchy));
  if (!hier.ok()) return fail(hier.status().WithContext("hierarchy run"));
  const double pcie = s.engine->ceiling_bytes_per_s();
  const double storage_rate = StorageRateFor(s, *hier, &report);
  hier->ideal_ttft_ms = IdealTtft(s, *hier, pcie, storage_rate);
  report.runs.push_back(std::move(*hier));
  if (with_device_only && hierarchy_is_device_only) {
    RunSummary dev = report.runs.back();
    dev.name = RunName(RunKind::kDeviceOnly);
    dev.ideal_ttft_ms.clear();
    report.runs.insert(report.runs.end() - 1, std::move(dev));
  }
  if (!o.sweep.empty()) {
    const std::vector<int64_t> values = *ParseSweep(o.sweep);
    for (int64_t value : values) {
      Result<RunSummary> r = run(RunKind::kHierarchy, value, fmt::format("host-tokens={}", value));
      if (!r.ok()) return fail(r.status().WithContext(fmt::format("sweep host-tokens={}", value)));
      r->ideal_ttft_ms = IdealTtft(s, *r, pcie, storage_rate);
      report.sweep.push_back({"host-tokens", value, std::move(*r)});
    }
  }

  PrintReport(stdout, report);
  int code = report.wrong_bytes() > 0 ? 1 : 0;
  if (!o.json_path.empty()) {
    if (Status st = WriteReplayJson(o.json_path, report); !st.ok()) code = fail(st);
  }
  if (!o.plot_path.empty()) {
    std::string json = o.json_path;
    std::string temp_json;
    if (json.empty()) {
      const char* tmp = std::getenv("TMPDIR");
      temp_json = fmt::format("{}/kvtier-replay-plot-{}.json",
                              tmp != nullptr && *tmp != '\0' ? tmp : "/tmp", ::getpid());
      json = temp_json;
      if (Status st = WriteReplayJson(json, report); !st.ok()) code = fail(st);
    }
    if (Status st = WriteReplayPlot(o.plot_path, json); !st.ok()) {
      std::fprintf(stderr, "kvtier replay: --plot: %s%s\n", st.message().c_str(),
                   o.json_path.empty() ? "" : " (the JSON was written)");
      if (!st.IsUnavailable()) code = 1;
    } else {
      std::printf("plot: %s\n", o.plot_path.c_str());
    }
    if (!temp_json.empty()) std::remove(temp_json.c_str());
  }
  if (report.wrong_bytes() > 0) {
    std::fprintf(stderr, "kvtier replay: %lld WRONG bytes in loaded KV\n",
                 static_cast<long long>(report.wrong_bytes()));
  }
  for (const ClassComparison& c : report.CompareHitClasses()) {
    if (!c.slower) continue;
    std::fprintf(stderr,
                 "kvtier replay: %s: hit class %s is slower than no cache beyond noise: TTFT p50 "
                 "%.1f ms against %.1f ms, %.2fx [95 %% interval %.2f, %.2f] over %lld requests, "
                 "above %.2fx%s\n",
                 o.slow_class_warn ? "WARNING" : "FAIL", HitClassName(c.hit_class),
                 c.hierarchy_p50_ms, c.no_cache_p50_ms, c.ratio.value, c.ratio.lo, c.ratio.hi,
                 static_cast<long long>(c.requests), 1 + o.slow_class_margin,
                 o.slow_class_warn ? "" : " (--slow-class-warn makes this a warning)");
    if (!o.slow_class_warn && code == 0) code = 3;
  }
  if (s.kv_events != nullptr && o.kv_events_hold_s > 0) {
    // The report is written: subscribers that missed batches can still ask the replay socket.
    std::fprintf(stderr, "kvtier replay: holding the kv event sockets open for %g s\n",
                 o.kv_events_hold_s);
    std::this_thread::sleep_for(std::chrono::duration<double>(o.kv_events_hold_s));
  }
  return code;
}

}  // namespace kvtier::tools
