// redis-benchmark as the baseline of the Redis storage bench (see redis_baseline.h).
#include "redis_baseline.h"

#include <fmt/format.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <thread>

#include "storage/redis_url.h"

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

Result<std::vector<RedisBaselineRow>> RunRedisBenchmark(std::string_view url,
                                                        const RedisBaselineOptions& options) {
  KVTIER_ASSIGN_OR_RETURN(storage::RedisUrl parsed, storage::ParseRedisUrl(url));
  if (options.value_bytes < 1 || options.clients < 1 || options.pipeline < 1 ||
      options.requests < 1) {
    return Status::InvalidArgument("redis baseline: sizes, clients, pipeline and requests >= 1");
  }
  const storage::RedisEndpoint& server = parsed.endpoints.front();
  std::vector<std::string> argv = {"redis-benchmark",
                                   "-h",
                                   server.host,
                                   "-p",
                                   std::to_string(server.port),
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
  if (!parsed.password.empty()) {
    argv.insert(argv.end(), {"-a", parsed.password});
    if (!parsed.user.empty()) argv.insert(argv.end(), {"--user", parsed.user});
  }

  int out[2];
  if (::pipe(out) != 0) return Status::Unavailable("redis baseline: pipe failed");
  const pid_t pid = ::fork();
  if (pid < 0) {
    ::close(out[0]);
    ::close(out[1]);
    return Status::Unavailable("redis baseline: fork failed");
  }
  if (pid == 0) {
    ::setpgid(0, 0);
    ::dup2(out[1], 1);
    ::close(out[0]);
    ::close(out[1]);
    std::vector<char*> args;
    for (std::string& a : argv) args.push_back(a.data());
    args.push_back(nullptr);
    ::execvp(args[0], args.data());
    ::_exit(127);
  }
  ::setpgid(pid, pid);
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
  const auto deadline = std::chrono::steady_clock::now() + options.time_limit;
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
    return Status::Unavailable(
        fmt::format("redis-benchmark ran past {} s", options.time_limit.count()));
  }
  if (WIFEXITED(status) && WEXITSTATUS(status) == 127) {
    return Status::NotFound("redis-benchmark is not installed (Debian: redis-tools)");
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    return Status::Unavailable(fmt::format("redis-benchmark failed: {}", output));
  }
  return ParseRedisBenchmarkCsv(output, options.value_bytes);
}

}  // namespace kvtier::tools
