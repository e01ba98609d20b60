// Test support: real redis-server processes on free loopback ports, and a 3-master Redis Cluster
// made of them with `redis-cli --cluster create`.
//
// Each server runs in its own process group and temporary directory; every wait is bounded; the
// destructor kills the process group and removes the directory, so a failing test leaves nothing
// behind (and a server gets SIGKILL when the test process dies without unwinding). Tests call
// RedisTestSkipReason() first and GTEST_SKIP with it when redis-server is not installed (the GPU
// machine); CI installs it (deps/debian-packages.txt).
//
// Thread safety: a fixture object is used by one test thread.
#pragma once

#if KVTIER_HAVE_HIREDIS

#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <hiredis/hiredis.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "storage/redis/redis_connection.h"
#include "storage/redis_url.h"

namespace kvtier::testing {

// Hang guards of the test fixtures' own waits (a server starting, an administration command, a
// cluster agreeing on its slots): far above what a loaded 2-core machine needs, never reached
// by a passing run, so no result depends on the machine's speed.
inline constexpr std::chrono::seconds kRedisStartGuard{60};
inline constexpr std::chrono::seconds kRedisAdminGuard{30};

using namespace std::chrono_literals;

// Empty when the redis-server and redis-cli binaries are found on PATH, else why not.
inline std::string RedisTestSkipReason() {
  const char* path = std::getenv("PATH");
  std::stringstream dirs(path != nullptr ? path : "/usr/bin:/bin");
  bool server = false, cli = false;
  for (std::string dir; std::getline(dirs, dir, ':');) {
    server = server || ::access((dir + "/redis-server").c_str(), X_OK) == 0;
    cli = cli || ::access((dir + "/redis-cli").c_str(), X_OK) == 0;
  }
  if (server && cli) return "";
  return "redis-server / redis-cli not installed (Debian: redis-server redis-tools); "
         "the Redis storage tests need a real server";
}

// A port P such that P and P + 10000 (the cluster bus) can be bound on 127.0.0.1 now.
inline int FreeLoopbackPort() {
  static std::mt19937 rng(std::random_device{}());
  auto bindable = [](int port) {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_port = htons(static_cast<uint16_t>(port));
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0;
    ::close(fd);
    return ok;
  };
  for (int attempt = 0; attempt < 200; ++attempt) {
    const int port = std::uniform_int_distribution<int>(20000, 45000)(rng);
    if (bindable(port) && bindable(port + 10000)) return port;
  }
  return -1;
}

// Starts `argv` in a new process group with stdout and stderr to `log`; the pid or -1.
inline pid_t SpawnProcess(const std::vector<std::string>& argv, const std::string& log) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::setpgid(0, 0);
    // If the test process dies without its destructors (a crash, a kill by ctest's timeout),
    // the server dies with it.
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0600);
    if (fd >= 0) {
      ::dup2(fd, 1);
      ::dup2(fd, 2);
    }
    std::vector<char*> args;
    for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    ::execvp(args[0], args.data());
    ::_exit(127);
  }
  if (pid > 0) ::setpgid(pid, pid);
  return pid;
}

// Runs `argv` to completion within `timeout`; its exit code, or -1 (killed at the timeout).
inline int RunProcess(const std::vector<std::string>& argv, const std::string& log,
                      std::chrono::milliseconds timeout) {
  const pid_t pid = SpawnProcess(argv, log);
  if (pid < 0) return -1;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  int status = 0;
  while (::waitpid(pid, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() >= deadline) {
      ::kill(-pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      return -1;
    }
    std::this_thread::sleep_for(20ms);
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

inline std::string ReadTextFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// One command to a server on a fresh connection (test administration: CLUSTER ..., MIGRATE).
// The reply, or nullptr with `error` set.
inline storage::RedisReplyPtr RedisCommand(const storage::RedisEndpoint& endpoint,
                                           std::initializer_list<std::string_view> args,
                                           std::string* error = nullptr,
                                           const storage::RedisAuth& auth = {}) {
  const auto deadline = std::chrono::steady_clock::now() + kRedisAdminGuard;
  auto connection = storage::RedisConnection::Connect(endpoint, auth, deadline);
  if (!connection.ok()) {
    if (error != nullptr) *error = connection.status().ToString();
    return nullptr;
  }
  (*connection)->Append(args);
  std::vector<storage::RedisReplyPtr> replies;
  storage::RedisConnection* connections[] = {connection->get()};
  std::vector<storage::RedisReplyPtr>* lists[] = {&replies};
  storage::PipelineOutcome outcome[1];
  storage::RunPipelines(connections, lists, deadline, outcome);
  if (!outcome[0].status.ok()) {
    if (error != nullptr) *error = outcome[0].status.ToString();
    return nullptr;
  }
  return std::move(replies.front());
}

inline std::string ReplyText(const redisReply* reply) {
  if (reply == nullptr) return "(no reply)";
  if (reply->type == REDIS_REPLY_STRING || reply->type == REDIS_REPLY_STATUS ||
      reply->type == REDIS_REPLY_ERROR) {
    return std::string(reply->str, reply->len);
  }
  if (reply->type == REDIS_REPLY_INTEGER) return std::to_string(reply->integer);
  return storage::DescribeReply(reply);
}

// One redis-server process.
class RedisTestServer {
 public:
  // `extra_args`: more redis-server options ("--requirepass", "pw", ...).
  explicit RedisTestServer(std::vector<std::string> extra_args = {}, bool cluster = false)
      : extra_args_(std::move(extra_args)), cluster_(cluster) {
    char dir_template[] = "/tmp/kvtier-redis-XXXXXX";
    if (::mkdtemp(dir_template) != nullptr) dir_ = dir_template;
    port_ = FreeLoopbackPort();
  }
  ~RedisTestServer() {
    Kill();
    if (!dir_.empty()) {
      std::error_code ignored;
      std::filesystem::remove_all(dir_, ignored);
    }
  }
  RedisTestServer(const RedisTestServer&) = delete;
  RedisTestServer& operator=(const RedisTestServer&) = delete;

  // Starts the server (again, after Kill: same port, directory and options) and waits until it
  // answers. Empty on success, else what went wrong (with the server's log).
  std::string Start() {
    if (dir_.empty() || port_ < 0) return "no temporary directory or free port";
    std::vector<std::string> argv = {"redis-server", "--port",    std::to_string(port_),
                                     "--bind",       "127.0.0.1", "--dir",
                                     dir_,           "--save",    "",
                                     "--appendonly", "no",        "--daemonize",
                                     "no",           "--logfile", dir_ + "/redis.log"};
    if (cluster_) {
      for (const char* a : {"--cluster-enabled", "yes", "--cluster-node-timeout", "3000",
                            "--cluster-require-full-coverage", "no"}) {
        argv.emplace_back(a);
      }
      argv.emplace_back("--cluster-config-file");
      argv.push_back(dir_ + "/nodes.conf");
    }
    argv.insert(argv.end(), extra_args_.begin(), extra_args_.end());
    pid_ = SpawnProcess(argv, dir_ + "/stdout.log");
    if (pid_ < 0) return "fork failed";
    const auto deadline = std::chrono::steady_clock::now() + kRedisStartGuard;
    while (std::chrono::steady_clock::now() < deadline) {
      int status = 0;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        return "redis-server exited at start: " + ReadTextFile(dir_ + "/stdout.log") +
               ReadTextFile(dir_ + "/redis.log");
      }
      // Any reply (PONG, or NOAUTH with a password) means the server is up.
      if (RedisCommand(endpoint(), {"PING"}) != nullptr) return "";
      std::this_thread::sleep_for(20ms);
    }
    Kill();
    return "redis-server did not answer within " + std::to_string(kRedisStartGuard.count()) +
           " s: " + ReadTextFile(dir_ + "/redis.log");
  }

  // SIGKILL to the process group; waits for it. No-op when not running.
  void Kill() {
    if (pid_ <= 0) return;
    ::kill(-pid_, SIGKILL);
    int status = 0;
    ::waitpid(pid_, &status, 0);
    pid_ = -1;
  }
  // SIGSTOP / SIGCONT: a server that accepts connections but does not answer.
  void Pause() {
    if (pid_ > 0) ::kill(-pid_, SIGSTOP);
  }
  void Resume() {
    if (pid_ > 0) ::kill(-pid_, SIGCONT);
  }

  int port() const { return port_; }
  storage::RedisEndpoint endpoint() const { return {"127.0.0.1", port_}; }
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }
  const std::string& dir() const { return dir_; }

 private:
  std::vector<std::string> extra_args_;
  bool cluster_ = false;
  std::string dir_;
  int port_ = -1;
  pid_t pid_ = -1;
};

// Three masters, no replicas, all 16384 slots assigned by `redis-cli --cluster create`.
class RedisTestCluster {
 public:
  static constexpr int kNodes = 3;

  // Empty on success, else what went wrong.
  std::string Start() {
    for (int i = 0; i < kNodes; ++i) {
      nodes_.push_back(std::make_unique<RedisTestServer>(std::vector<std::string>{}, true));
      if (std::string error = nodes_.back()->Start(); !error.empty()) return error;
    }
    std::vector<std::string> argv = {"redis-cli", "--cluster", "create"};
    for (const auto& node : nodes_) argv.push_back(node->address());
    for (const char* a : {"--cluster-replicas", "0", "--cluster-yes"}) argv.emplace_back(a);
    const std::string log = nodes_.front()->dir() + "/create.log";
    if (const int code = RunProcess(argv, log, kRedisStartGuard); code != 0) {
      return "redis-cli --cluster create failed (" + std::to_string(code) +
             "): " + ReadTextFile(log);
    }
    return WaitUntilHealthy();
  }

  // Waits (kRedisStartGuard at most) until every running node says cluster_state:ok with every
  // slot served.
  std::string WaitUntilHealthy() {
    const auto deadline = std::chrono::steady_clock::now() + kRedisStartGuard;
    std::string last;
    while (std::chrono::steady_clock::now() < deadline) {
      bool all_ok = true;
      for (const auto& node : nodes_) {
        auto reply = RedisCommand(node->endpoint(), {"CLUSTER", "INFO"}, &last);
        const std::string info = ReplyText(reply.get());
        if (info.find("cluster_state:ok") == std::string::npos ||
            info.find("cluster_slots_ok:16384") == std::string::npos) {
          all_ok = false;
          last = info;
          break;
        }
      }
      if (all_ok) return "";
      std::this_thread::sleep_for(50ms);
    }
    return "the cluster did not become healthy within " + std::to_string(kRedisStartGuard.count()) +
           " s: " + last;
  }

  RedisTestServer& node(int i) { return *nodes_[static_cast<size_t>(i)]; }
  // "redis+cluster://127.0.0.1:P0,127.0.0.1:P1" (the first `seeds` nodes).
  std::string Url(int seeds = 1) const {
    std::string url = "redis+cluster://";
    for (int i = 0; i < seeds; ++i) {
      if (i > 0) url += ',';
      url += nodes_[static_cast<size_t>(i)]->address();
    }
    return url;
  }
  // The node whose port serves `owner` ("127.0.0.1:port"), or -1.
  int IndexOf(const std::string& owner) const {
    for (int i = 0; i < kNodes; ++i) {
      if (nodes_[static_cast<size_t>(i)]->address() == owner) return i;
    }
    return -1;
  }
  std::string NodeId(int i) {
    return ReplyText(RedisCommand(node(i).endpoint(), {"CLUSTER", "MYID"}).get());
  }

 private:
  std::vector<std::unique_ptr<RedisTestServer>> nodes_;
};

}  // namespace kvtier::testing

#endif  // KVTIER_HAVE_HIREDIS
