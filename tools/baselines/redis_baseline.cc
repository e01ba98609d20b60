// redis-benchmark as the baseline of the Redis storage bench (see redis_baseline.h).
#include "redis_baseline.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstring>
#include <thread>

#include "kvtier/testing/redis.h"

namespace kvtier::tools {
namespace {

// The fields of one CSV line, quotes removed.
std::vector<std::string> CsvFields(std::string_view line) {
  std::vector<std::string> fields;
  std::string field;
  bool quoted = false;
  for (char c : line) {
    if (c == '"') {
      quoted = !quoted;
    } else if (c == ',' && !quoted) {
      fields.push_back(std::move(field));
      field.clear();
    } else if (c != '\r') {
      field.push_back(c);
    }
  }
  fields.push_back(std::move(field));
  return fields;
}

bool ParseDouble(const std::string& text, double* value) {
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), *value);
  return ec == std::errc() && end == text.data() + text.size();
}

// The literal key redis-benchmark SETs and GETs without -r (not on a cluster, where it adds a
// hash tag per node).
constexpr std::string_view kLiteralKey = "key:__rand_int__";

#if KVTIER_HAVE_HIREDIS
// The keys redis-benchmark -r N sends: "key:__rand_int__" with the number [0, N) written as 12
// zero-padded digits.
std::vector<std::string> KeySpaceKeys(int64_t count) {
  std::vector<std::string> keys;
  keys.reserve(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) keys.push_back(fmt::format("key:{:012d}", i));
  return keys;
}

#endif  // KVTIER_HAVE_HIREDIS

// Deletes redis-benchmark's literal key, so the baseline leaves nothing on the server.
Status DeleteLiteralKey(std::string_view url) {
#if KVTIER_HAVE_HIREDIS
  return testing::RedisExecuteAll(url, "DEL", {std::string(kLiteralKey)}, {}, 1);
#else
  (void)url;
  return Status::OK();
#endif
}

}  // namespace

Result<std::vector<RedisBaselineRow>> ParseRedisBenchmarkCsv(std::string_view csv,
                                                             int64_t value_bytes) {
  std::vector<RedisBaselineRow> rows;
  std::vector<std::string> header;
  size_t start = 0;
  while (start < csv.size()) {
    size_t end = csv.find('\n', start);
    if (end == std::string_view::npos) end = csv.size();
    const std::string_view line = csv.substr(start, end - start);
    start = end + 1;
    if (line.empty() || line == "\r") continue;
    std::vector<std::string> fields = CsvFields(line);
    if (header.empty()) {
      header = std::move(fields);
      continue;
    }
    if (fields.size() != header.size()) {
      return Status::Unavailable(fmt::format("redis-benchmark: bad CSV line '{}'", line));
    }
    RedisBaselineRow row;
    row.test = fields[0];
    for (size_t i = 1; i < fields.size(); ++i) {
      double value = 0;
      if (!ParseDouble(fields[i], &value)) {
        return Status::Unavailable(fmt::format("redis-benchmark: bad number in '{}'", line));
      }
      if (header[i] == "rps") row.requests_per_second = value;
      if (header[i] == "avg_latency_ms") row.avg_ms = value;
      if (header[i] == "p50_latency_ms") row.p50_ms = value;
      if (header[i] == "p99_latency_ms") row.p99_ms = value;
    }
    row.gb_per_second = row.requests_per_second * static_cast<double>(value_bytes) / 1e9;
    rows.push_back(std::move(row));
  }
  if (rows.empty()) return Status::Unavailable("redis-benchmark printed no results");
  return rows;
}

namespace {

// Starts argv[0] (found on PATH) with its stdout on `out_fd`, in a process group of its own (so a
// timeout kills all of it) and with PR_SET_PDEATHSIG = SIGKILL (so it dies with this process,
// also when this process is SIGKILLed: a killed bench left redis-benchmark running for good).
// vfork, not fork: a fork would mark every page of the bench's page buffers copy-on-write, and
// the bench's next writes to them would each take a fault; posix_spawn cannot set the death
// signal. The child makes only system calls before exec, and reports an exec failure through
// the shared memory, as glibc's posix_spawn does. 0, else the errno of the failure.
int SpawnDyingWithParent(char* const* argv, int out_fd, pid_t* pid) {
  const pid_t parent = ::getpid();
  volatile int child_errno = 0;
  const pid_t child = ::vfork();
  if (child < 0) return errno;
  if (child == 0) {
    ::setpgid(0, 0);
    if (::dup2(out_fd, STDOUT_FILENO) < 0 || ::prctl(PR_SET_PDEATHSIG, SIGKILL) != 0) {
      child_errno = errno;
      ::_exit(127);
    }
    if (::getppid() != parent) {  // the parent already gone: nobody to die with
      child_errno = ESRCH;
      ::_exit(127);
    }
    ::execvp(argv[0], argv);
    child_errno = errno;
    ::_exit(127);
  }
  if (child_errno != 0) {
    ::waitpid(child, nullptr, 0);
    return child_errno;
  }
  *pid = child;
  return 0;
}

Result<std::string> RunChild(std::vector<std::string> argv, std::chrono::seconds time_limit,
                             bool* timed_out_out) {
  int out[2];
  if (::pipe2(out, O_CLOEXEC) != 0) return Status::Unavailable("redis baseline: pipe failed");
  std::vector<char*> args;
  for (std::string& a : argv) args.push_back(a.data());
  args.push_back(nullptr);
  pid_t pid = -1;
  const int spawned = SpawnDyingWithParent(args.data(), out[1], &pid);
  if (spawned != 0) {
    ::close(out[0]);
    ::close(out[1]);
    if (spawned == ENOENT) {
      return Status::NotFound("redis-benchmark is not installed (Debian: redis-tools)");
    }
    return Status::Unavailable(
        fmt::format("redis baseline: cannot start redis-benchmark: {}", std::strerror(spawned)));
  }
  ::close(out[1]);
  // The output is a few lines; read it on a thread so the wait below can enforce the limit.
  std::string output;
  std::thread reader([&] {
    char chunk[4096];
    ssize_t got;
    while ((got = ::read(out[0], chunk, sizeof(chunk))) > 0 || (got < 0 && errno == EINTR)) {
      if (got > 0) output.append(chunk, static_cast<size_t>(got));
    }
  });
  const auto deadline = std::chrono::steady_clock::now() + time_limit;
  int status = 0;
  bool timed_out = false;
  while (::waitpid(pid, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() >= deadline) {
      ::kill(-pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      timed_out = true;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  reader.join();
  ::close(out[0]);
  if (timed_out) {
    *timed_out_out = true;
    return Status::Unavailable(
        fmt::format("redis-benchmark ran past {} s (killed with its process group and reaped)",
                    time_limit.count()));
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    return Status::Unavailable(fmt::format("redis-benchmark failed: {}", output));
  }
  return output;
}

}  // namespace

Result<std::vector<RedisBaselineRow>> RunRedisBenchmark(std::string_view url,
                                                        const RedisBaselineOptions& options,
                                                        bool* timed_out_out) {
  if (timed_out_out != nullptr) *timed_out_out = false;
  KVTIER_ASSIGN_OR_RETURN(testing::RedisServer parsed, testing::ParseRedisServer(url));
  if (options.value_bytes < 1 || options.clients < 1 || options.pipeline < 1 ||
      options.requests < 1 || options.key_space < 0) {
    return Status::InvalidArgument(
        "redis baseline: sizes, clients, pipeline and requests >= 1, key space >= 0");
  }
  if (options.key_space > 0 && parsed.cluster) {
    return Status::InvalidArgument("redis baseline: a key space is not supported on a cluster");
  }
  std::vector<std::string> argv = {"redis-benchmark",
                                   "-h",
                                   parsed.host,
                                   "-p",
                                   std::to_string(parsed.port),
                                   "-t",
                                   "set,get",
                                   "-d",
                                   std::to_string(options.value_bytes),
                                   "-c",
                                   std::to_string(options.clients),
                                   "-P",
                                   std::to_string(options.pipeline),
                                   "-n",
                                   std::to_string(options.requests),
                                   "--csv"};
  if (parsed.cluster) argv.emplace_back("--cluster");
  if (options.key_space > 0) argv.insert(argv.end(), {"-r", std::to_string(options.key_space)});
  if (!parsed.password.empty()) {
    argv.insert(argv.end(), {"-a", parsed.password});
    if (!parsed.user.empty()) argv.insert(argv.end(), {"--user", parsed.user});
  }

  // redis-benchmark now and then prints only its CSV header (a client that lost its connection
  // to a busy server): one failed run is retried once before it counts. A run killed at the time
  // limit is not: the server did not answer (a paused server cost the replay two limits).
  Result<std::vector<RedisBaselineRow>> rows = Status::Unavailable("not run");
  bool timed_out = false;
  for (int attempt = 0; attempt < 2; ++attempt) {
    Result<std::string> output = RunChild(argv, options.time_limit, &timed_out);
    if (!output.ok() && !output.status().IsUnavailable()) return output.status();  // not installed
    rows = output.ok() ? ParseRedisBenchmarkCsv(*output, options.value_bytes) : output.status();
    if (rows.ok() || timed_out) break;
  }
  if (timed_out_out != nullptr) *timed_out_out = timed_out;
  if (timed_out) {
    // The server did not answer: a DEL of the literal key would wait for it again (its client's
    // own timeouts), past the limit the caller gave.
    return Status::Unavailable(fmt::format("{}; its key '{}' may be left on the server",
                                           rows.status().message(), kLiteralKey));
  }
  if (options.key_space == 0 && !parsed.cluster) KVTIER_RETURN_IF_ERROR(DeleteLiteralKey(url));
  if (!rows.ok()) {
    return Status::Unavailable(fmt::format("{} (twice)", rows.status().message()));
  }
  return rows;
}

bool RedisKeySpace::Fits(std::string_view url) {
  Result<testing::RedisServer> parsed = testing::ParseRedisServer(url);
  return parsed.ok() && !parsed->cluster;
}

#if KVTIER_HAVE_HIREDIS
struct RedisKeySpace::Client {
  std::string url;
};

Result<std::unique_ptr<RedisKeySpace>> RedisKeySpace::Fill(std::string_view url, int64_t keys,
                                                           int64_t value_bytes) {
  KVTIER_ASSIGN_OR_RETURN(testing::RedisServer parsed, testing::ParseRedisServer(url));
  if (parsed.cluster) {
    return Status::InvalidArgument("redis baseline: a key space is not supported on a cluster");
  }
  if (keys < 1 || value_bytes < 1) {
    return Status::InvalidArgument("redis baseline: a key space needs keys and value bytes >= 1");
  }
  auto client = std::make_unique<Client>();
  client->url = std::string(url);
  std::unique_ptr<RedisKeySpace> space(new RedisKeySpace(std::move(client), keys));
  // Values of the size asked for (the contents do not matter to the server), pipelined in groups
  // of about 64 MiB.
  std::vector<std::byte> value(static_cast<size_t>(value_bytes));
  for (size_t i = 0; i < value.size(); ++i) value[i] = static_cast<std::byte>(i * 131 + 7);
  const size_t group = static_cast<size_t>(std::max<int64_t>(1, (int64_t{64} << 20) / value_bytes));
  KVTIER_RETURN_IF_ERROR(
      testing::RedisExecuteAll(space->client_->url, "SET", KeySpaceKeys(keys), value, group));
  return space;
}

Status RedisKeySpace::Delete() {
  if (deleted_) return Status::OK();
  deleted_ = true;
  return testing::RedisExecuteAll(client_->url, "DEL", KeySpaceKeys(keys_), {}, 1024);
}
#else
struct RedisKeySpace::Client {};

Result<std::unique_ptr<RedisKeySpace>> RedisKeySpace::Fill(std::string_view, int64_t, int64_t) {
  return Status::Unavailable("redis baseline: a key space needs kvtier built with hiredis");
}

Status RedisKeySpace::Delete() { return Status::OK(); }
#endif  // KVTIER_HAVE_HIREDIS

RedisKeySpace::RedisKeySpace(std::unique_ptr<Client> client, int64_t keys)
    : client_(std::move(client)), keys_(keys) {}

RedisKeySpace::~RedisKeySpace() { (void)Delete(); }

}  // namespace kvtier::tools
