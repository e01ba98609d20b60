// The redis-server that `kvtier replay --storage redis` starts for itself (see redis_server.h).
#include "redis_server.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>
#include <vector>

namespace kvtier::tools {
namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

// The redis-server binary on PATH, or "".
std::string FindRedisServer() {
  const char* path = std::getenv("PATH");
  std::stringstream dirs(path != nullptr && *path != '\0' ? path : "/usr/local/bin:/usr/bin:/bin");
  for (std::string dir; std::getline(dirs, dir, ':');) {
    if (dir.empty()) continue;
    const std::string candidate = dir + "/redis-server";
    if (::access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return "";
}

// A port the kernel considers free on 127.0.0.1 now (bind to port 0), or -1.
int FreeLoopbackPort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = 0;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  int port = -1;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0) {
    port = ntohs(a.sin_port);
  }
  ::close(fd);
  return port;
}

// True when a server on 127.0.0.1:port answers PING with +PONG within ~200 ms.
bool AnswersPing(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  timeval tv{0, 200'000};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bool ok = false;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0) {
    static constexpr char kPing[] = "PING\r\n";
    char reply[16] = {};
    if (::send(fd, kPing, sizeof(kPing) - 1, MSG_NOSIGNAL) == sizeof(kPing) - 1) {
      const ssize_t n = ::recv(fd, reply, sizeof(reply) - 1, 0);
      ok = n >= 5 && std::strncmp(reply, "+PONG", 5) == 0;
    }
  }
  ::close(fd);
  return ok;
}

std::string ReadText(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  std::string s = text.str();
  if (s.size() > 2000) s = "..." + s.substr(s.size() - 2000);
  return s;
}

}  // namespace

Result<std::unique_ptr<LocalRedisServer>> LocalRedisServer::Start(int64_t max_bytes) {
  const std::string binary = FindRedisServer();
  if (binary.empty()) {
    return Status::Unavailable(
        "--storage redis starts a redis-server of its own, and none was found on PATH (Debian: "
        "apt-get install redis-server); give a running server's URL (redis://host:port) instead");
  }
  std::unique_ptr<LocalRedisServer> server(new LocalRedisServer());
  const char* tmp = std::getenv("TMPDIR");
  std::string templ =
      fmt::format("{}/kvtier-redis-XXXXXX", tmp != nullptr && *tmp != '\0' ? tmp : "/tmp");
  if (::mkdtemp(templ.data()) == nullptr) {
    return Status::IOError(fmt::format("cannot create a temporary directory {}", templ));
  }
  server->dir_ = templ;
  const std::string log = server->dir_ + "/redis.log";
  std::string last_error;
  // A port found free can be taken before the server binds it: a few attempts.
  for (int attempt = 0; attempt < 3; ++attempt) {
    const int port = FreeLoopbackPort();
    if (port <= 0) return Status::Unavailable("no free TCP port on 127.0.0.1");
    // No persistence (nothing outlives the run); LRU eviction beyond max_bytes.
    std::vector<std::string> args = {binary,      "--port", std::to_string(port), "--bind",
                                     "127.0.0.1", "--dir",  server->dir_};
    args.insert(args.end(), {"--save", "", "--appendonly", "no", "--daemonize", "no"});
    args.insert(args.end(),
                {"--logfile", log, "--maxmemory", std::to_string(std::max<int64_t>(max_bytes, 0))});
    args.insert(args.end(), {"--maxmemory-policy", "allkeys-lru"});
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    const std::string out = server->dir_ + "/stdout.log";
    const pid_t parent = ::getpid();
    const pid_t pid = ::fork();
    if (pid < 0) return Status::Unavailable(fmt::format("fork: {}", std::strerror(errno)));
    if (pid == 0) {
      // Only async-signal-safe calls until exec (the replay has other threads).
      ::setpgid(0, 0);
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // dies with the replay, however it ends
      if (::getppid() != parent) ::_exit(126);
      const int fd = ::open(out.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
      if (fd >= 0) {
        ::dup2(fd, 1);
        ::dup2(fd, 2);
      }
      ::execv(argv[0], argv.data());
      ::_exit(127);
    }
    ::setpgid(pid, pid);
    server->pid_ = pid;
    server->port_ = port;
    const auto deadline = Clock::now() + 10s;
    bool up = false;
    while (Clock::now() < deadline) {
      int status = 0;
      if (::waitpid(pid, &status, WNOHANG) == pid) {
        server->pid_ = -1;
        last_error =
            fmt::format("redis-server exited at start: {}{}", ReadText(out), ReadText(log));
        break;
      }
      if (AnswersPing(port)) {
        up = true;
        break;
      }
      std::this_thread::sleep_for(20ms);
    }
    if (up) return server;
    if (server->pid_ > 0) {
      server->Stop(0);
      last_error = "redis-server did not answer PING within 10 s: " + ReadText(log);
      break;  // not a port clash: no point trying again
    }
  }
  return Status::Unavailable(last_error);
}

LocalRedisServer::~LocalRedisServer() {
  Stop();
  if (!dir_.empty()) {
    std::error_code ignored;
    std::filesystem::remove_all(dir_, ignored);
  }
}

std::string LocalRedisServer::url() const { return fmt::format("redis://127.0.0.1:{}", port_); }

std::string LocalRedisServer::Stop(int grace_ms) {
  if (pid_ <= 0) return "not running";
  const auto t0 = Clock::now();
  ::kill(pid_, SIGTERM);
  const auto deadline = t0 + std::chrono::milliseconds(grace_ms);
  int status = 0;
  while (Clock::now() < deadline) {
    if (::waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      return fmt::format("exited after {:.0f} ms",
                         std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
    }
    std::this_thread::sleep_for(5ms);
  }
  ::kill(-pid_, SIGKILL);
  ::waitpid(pid_, &status, 0);
  pid_ = -1;
  return fmt::format("killed after {} ms", grace_ms);
}

}  // namespace kvtier::tools
