// `kvtier replay`'s options (replay_options.h): their bounds and names (ReplayOptions::Validate),
// the cache settings they give, and the workload they name (LoadWorkload).
#include "replay_options.h"

#include <fmt/format.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <initializer_list>
#include <iterator>
#include <string_view>
#include <utility>

#include "config_flags.h"
#include "kvtier/storage.h"
#include "replay_model.h"
#include "replay_pin.h"
#include "replay_report.h"
#include "workload.h"

#if !defined(KVTIER_DATA_DIR)
#define KVTIER_DATA_DIR ""
#endif

namespace kvtier::tools {
namespace {

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
// A ZeroMQ endpoint the replay binds or connects: a tcp:// port is '*' (the kernel picks) or a
// number in [1, 65535] (libzmq itself binds a random port for 99999 and 65535 for -1); an ipc://
// socket another process is listening on is refused (binding it would silently take it over).
Status CheckEventEndpoint(const std::string& endpoint, const char* flag) {
  if (endpoint.empty()) return Status::OK();
  auto bad = [&](std::string_view why) {
    return Status::InvalidArgument(fmt::format("{} {}: {}", flag, endpoint, why));
  };
  if (endpoint.starts_with("tcp://")) {
    const size_t colon = endpoint.rfind(':');
    if (colon == std::string::npos || colon < 6) return bad("no port (tcp://HOST:PORT)");
    const std::string port = endpoint.substr(colon + 1);
    if (port == "*") return Status::OK();
    const bool digits = !port.empty() && port.size() <= 5 &&
                        port.find_first_not_of("0123456789") == std::string::npos;
    if (!digits || std::stoi(port) < 1 || std::stoi(port) > 65535) {
      return bad(fmt::format("port '{}' must be * or in [1, 65535]", port));
    }
    return Status::OK();
  }
  if (endpoint.starts_with("ipc://")) {
    const std::string path = endpoint.substr(6);
    if (path.empty() || path.size() >= sizeof(sockaddr_un{}.sun_path)) {
      return bad("the socket path is empty or too long");
    }
    const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return Status::OK();
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::memcpy(addr.sun_path, path.data(), path.size());
    socklen_t len = sizeof(addr);
    if (path[0] == '@') {  // libzmq's abstract namespace: a leading NUL, the name's bytes only
      addr.sun_path[0] = '\0';
      len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + path.size());
    }
    const bool listening = ::connect(fd, reinterpret_cast<sockaddr*>(&addr), len) == 0;
    ::close(fd);
    if (listening) {
      return bad("another process is listening on this socket (binding it would take it over)");
    }
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

}  // namespace

HierarchicalCacheConfig ReplayCacheDefaults() {
  HierarchicalCacheConfig c;
  c.page_size = 64;
  c.write_policy = WritePolicy::kWriteThrough;
  c.storage.prefetch_policy = PrefetchPolicy::kWaitComplete;
  c.storage.options.io_threads = 4;
  return c;
}

bool ReplaySetsCacheField(std::string_view field) {
  static constexpr std::string_view kSet[] = {
      "host_capacity_bytes",
      "host_ratio",
      "host_head_num",
      "host_eviction",
      "transfer_backend",
      "device",
      "backup_threads",
      "pin_device_budget_tokens",
      "pin_host_budget_tokens",
      "pin_storage_budget_tokens",
      "storage",
      "storage_model_id",
      "storage_kv_dtype",
      "storage_tp_rank",
      "storage_tp_size",
      "max_storage_only_pages",
  };
  return std::find(std::begin(kSet), std::end(kSet), field) != std::end(kSet);
}

std::string ReplayFlagOf(std::string_view field) {
  for (const auto& [f, names] : kReplayCacheFlagNames) {
    if (f == field) return std::string(names.substr(0, names.find(',')));
  }
  return ReplaySetsCacheField(field) ? std::string(field) : FlagName(field);
}

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

Result<double> ParseDecodeMsPerToken(const std::string& value) {
  if (value == "measure") return kDecodeMeasure;
  char* end = nullptr;
  const double v = std::strtod(value.c_str(), &end);
  if (value.empty() || end != value.c_str() + value.size() || !std::isfinite(v) || v < 0 ||
      v > 1000) {
    return Status::InvalidArgument(fmt::format(
        "--decode-ms-per-token = '{}': give milliseconds per output token in [0, 1000], or "
        "measure",
        value));
  }
  return v;
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

namespace {

// --workload's selection and the scheduling flags.
Status ValidateWorkloadFlags(const ReplayOptions& o) {
  KVTIER_RETURN_IF_ERROR(Bound("--requests", o.requests, 0, 10'000'000));
  KVTIER_RETURN_IF_ERROR(Bound("--warmup", o.warmup, 0, 10'000'000));
  KVTIER_RETURN_IF_ERROR(Bound("--skip", o.skip, 0, 10'000'000));
  if (!o.shard.empty()) KVTIER_RETURN_IF_ERROR(ParseShard(o.shard).status());
  if ((o.skip > 0 || !o.shard.empty()) &&
      (o.workload == "chat" || o.workload == "system-prompt" || o.workload == "doc-qa")) {
    return Status::InvalidArgument(fmt::format(
        "--skip / --shard select requests of a trace; the synthetic workload '{}' has no trace "
        "(use --seed and --requests)",
        o.workload));
  }
  KVTIER_RETURN_IF_ERROR(BoundReal("--rate", o.rate, 1e-6, 1e6));
  KVTIER_RETURN_IF_ERROR(Bound("--concurrency", o.concurrency, 0, 100'000));
  KVTIER_RETURN_IF_ERROR(BoundReal("--speed", o.speed, 1e-6, 1e9));
  KVTIER_RETURN_IF_ERROR(Bound("--max-inflight", o.max_inflight, 1, 100'000));
  if (o.sequential && o.concurrency > 1) {
    return Status::InvalidArgument(fmt::format(
        "--sequential serves one request at a time; it cannot be combined with --concurrency {}",
        o.concurrency));
  }
  KVTIER_ASSIGN_OR_RETURN(const double decode, ParseDecodeMsPerToken(o.decode_ms_per_token));
  if (decode != 0 && !o.sequential && o.concurrency == 0) {
    return Status::InvalidArgument(
        "--decode-ms-per-token holds a closed loop's client while its output is decoded; an open "
        "loop's arrivals come from the timestamps (use --concurrency N or --sequential)");
  }
  return Status::OK();
}

// The model, the compute and the tiers, the cache's settings through the cache's own Validate.
Status ValidateTierFlags(const ReplayOptions& o) {
  KVTIER_RETURN_IF_ERROR(FindReplayModel(o.model).status().WithContext("--model"));
  if (!o.compute_model.empty()) {
    KVTIER_RETURN_IF_ERROR(
        FindReplayModel(o.compute_model).status().WithContext("--compute-model"));
  }
  KVTIER_RETURN_IF_ERROR(OneOf("--compute", o.compute, {"auto", "gemm", "model"}));
  KVTIER_RETURN_IF_ERROR(BoundReal("--tflops", o.tflops, 1e-3, 1e5));
  KVTIER_RETURN_IF_ERROR(Bound("--chunk-tokens", o.chunk_tokens, 64, 1 << 20));
  KVTIER_RETURN_IF_ERROR(OneOf("--device", o.device, {"auto", "gpu", "cpu"}));
  // The geometry's rule (the cache's 0, "the device region's", is no replay page size).
  KVTIER_RETURN_IF_ERROR(ValidatePageSize(o.cache.page_size, "--page-size"));
  KVTIER_RETURN_IF_ERROR(Bound("--device-tokens", o.device_tokens, o.cache.page_size, kMaxTokens));
  if (o.host_tokens != -1 || o.host_tokens_given) {  // -1 unless given: 4 x --device-tokens
    KVTIER_RETURN_IF_ERROR(Bound("--host-tokens", o.host_tokens, 0, kMaxTokens));
  }
  if (o.host_tokens == 0 && o.storage != "none") {
    return Status::InvalidArgument(
        "--host-tokens 0 (no host tier) needs --storage none: prefetches from storage land in "
        "host memory");
  }
  KVTIER_RETURN_IF_ERROR(Bound("--storage-bytes", o.storage_bytes, 0, int64_t{1} << 50));
  KVTIER_RETURN_IF_ERROR(
      OneOf("--hicache-io-backend", o.io_backend, {"auto", "kernel", "dma", "cpu"}));
  {
    // The cache's settings, through the cache's own Validate (a host tier and a storage tier
    // stand in so that every field the flags set is checked).
    HierarchicalCacheConfig c = o.cache;
    c.host_capacity_bytes = 1;
    c.storage.url = "memory://";
    KVTIER_RETURN_IF_ERROR(c.Validate(ReplayFlagOf));
  }
  return Status::OK();
}

// The runs, the checks, KV events, pins, faults, sweeps, the shared host tier and the outputs.
Status ValidateRunFlags(const ReplayOptions& o) {
  KVTIER_RETURN_IF_ERROR(OneOf("--verify", o.verify, {"all", "sample"}));
  KVTIER_RETURN_IF_ERROR(OneOf("--runs", o.runs, {"all", "hierarchy", "no_cache,hierarchy"}));
  KVTIER_RETURN_IF_ERROR(BoundReal("--slow-class-margin", o.slow_class_margin, 0, 10));
  if (o.kv_events.empty() && (!o.kv_events_replay.empty() || !o.kv_events_topic.empty())) {
    return Status::InvalidArgument("--kv-events-replay and --kv-events-topic need --kv-events");
  }
  KVTIER_RETURN_IF_ERROR(CheckEventEndpoint(o.kv_events, "--kv-events"));
  KVTIER_RETURN_IF_ERROR(CheckEventEndpoint(o.kv_events_replay, "--kv-events-replay"));
  KVTIER_RETURN_IF_ERROR(BoundReal("--kv-events-hold", o.kv_events_hold_s, 0, 3600));
  if (o.kv_events.empty() && o.kv_events_hold_s > 0) {
    return Status::InvalidArgument("--kv-events-hold needs --kv-events");
  }
  if (!o.pin_system_prompt.empty()) {
    KVTIER_ASSIGN_OR_RETURN(std::vector<CacheTier> tiers, ParsePinTiers(o.pin_system_prompt));
    for (CacheTier t : tiers) {
      if ((t == CacheTier::kHost && o.host_tokens == 0) ||
          (t == CacheTier::kStorage &&
           (o.storage == "none" || o.host_tokens == 0 || !o.shared_host.empty()))) {
        return Status::InvalidArgument(
            fmt::format("--pin-system-prompt {}: the hierarchy run has no {} tier",
                        o.pin_system_prompt, CacheTierName(t)));
      }
    }
  }
  KVTIER_RETURN_IF_ERROR(BoundReal("--pin-ttl", o.pin_ttl_s, 0, 1e7));
  if (o.pin_system_prompt.empty() && o.pin_ttl_s > 0) {
    return Status::InvalidArgument("--pin-ttl needs --pin-system-prompt");
  }
  if (!o.kv_events.empty() && !o.sweep.empty()) {
    return Status::InvalidArgument(
        "--kv-events publishes one hierarchy run's events; --sweep makes several");
  }
  if (!o.fault.empty()) {
    KVTIER_RETURN_IF_ERROR(ParseFault(o.fault).status());
    if (o.storage == "none") {
      return Status::InvalidArgument("--fault needs a storage tier (not --storage none)");
    }
  }
  if (!o.sweep.empty()) KVTIER_RETURN_IF_ERROR(ParseSweep(o.sweep).status());
  if (!o.shared_host.empty() &&
      ((o.storage != "file" && o.storage != "none") || !o.fault.empty() || o.host_tokens == 0)) {
    return Status::InvalidArgument(fmt::format(
        "--shared-host {} is the host tier, with no storage tier below it: it needs a host tier "
        "(--host-tokens > 0) and takes neither --storage {} nor --fault",
        o.shared_host, RedactUrl(o.storage)));
  }
  if (o.storage != "none" && o.storage != "file" && o.storage != "redis" &&
      o.storage.find("://") == std::string::npos) {
    return Status::InvalidArgument(
        fmt::format("--storage = '{}' must be none, file (a temporary file store), redis (a "
                    "redis-server the run starts) or a URL such as file:///path, "
                    "redis://host:port, memory://",
                    RedactUrl(o.storage)));
  }
  if (!o.json_path.empty()) KVTIER_RETURN_IF_ERROR(CheckOutputPath(o.json_path, "--json"));
  // Devices (/dev/full, /dev/null) and full filesystems refused before the run (CheckOutputPath).
  if (!o.plot_path.empty()) KVTIER_RETURN_IF_ERROR(CheckOutputPath(o.plot_path, "--plot"));
  return Status::OK();
}

}  // namespace

Status ReplayOptions::Validate() const {
  KVTIER_RETURN_IF_ERROR(ValidateWorkloadFlags(*this));
  KVTIER_RETURN_IF_ERROR(ValidateTierFlags(*this));
  return ValidateRunFlags(*this);
}

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

}  // namespace kvtier::tools
