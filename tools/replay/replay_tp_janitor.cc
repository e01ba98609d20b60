// The janitor of `kvtier replay --tp N`'s rank 0 (replay_tp_janitor.h).
#include "replay_tp_janitor.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>
#include <vector>

namespace kvtier::tools {
namespace {

// The janitor: reads "dir PATH" and "shm NAME" lines until "done" (exit, removing nothing) or
// the end of its input (rank 0 is gone: remove them). A SIGKILLed rank 0's followers get their
// SIGKILL as rank 0 exits, possibly just after this sees the end of its input, so a follower may
// still create a file in a store for a moment: rm is retried (bounded) until the tree is gone.
constexpr const char* kScript = R"sh(trap '' HUP INT QUIT TERM PIPE
kvtier=$1
shift
rings=
while IFS= read -r line; do
  case $line in
    done) exit 0 ;;
    "dir "*) set -- "$@" "${line#dir }" ;;
    "shm "*) rings="$rings ${line#shm }" ;;
  esac
done
for ring in $rings; do "$kvtier" shm destroy "$ring"; done
tries=0
until rm -rf -- "$@" || [ $tries -ge 50 ]; do
  tries=$((tries + 1))
  sleep 0.1
done
)sh";

}  // namespace

Result<TpJanitor> TpJanitor::Start(const std::string& kvtier) {
  int sv[2];
  // SOCK_CLOEXEC: neither end reaches the follower ranks (an inherited end would keep the
  // janitor waiting for them too); the janitor's end becomes its stdin (dup2 clears the flag).
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
    return Status::IOError(fmt::format("tp janitor: socketpair: {}", std::strerror(errno)));
  }
  const int null_fd = open("/dev/null", O_RDWR | O_CLOEXEC);
  if (null_fd < 0) {
    const int e = errno;
    close(sv[0]);
    close(sv[1]);
    return Status::IOError(fmt::format("tp janitor: open /dev/null: {}", std::strerror(e)));
  }
  // Everything the child needs, made before the fork (it only makes system calls, then execs).
  std::vector<std::string> args = {"/bin/sh", "-c", kScript, "kvtier-tp-janitor", kvtier};
  std::vector<char*> argv;
  for (std::string& s : args) argv.push_back(s.data());
  argv.push_back(nullptr);
  const pid_t pid = fork();
  if (pid == 0) {
    // Its own process group: a signal to rank 0's group (a terminal's Ctrl-C) does not reach it.
    setpgid(0, 0);
    // Not rank 0's stdout/stderr: a reader of rank 0's output sees its end when rank 0 ends.
    if (dup2(sv[1], 0) < 0 || dup2(null_fd, 1) < 0 || dup2(null_fd, 2) < 0) _exit(127);
    execv(argv[0], argv.data());
    _exit(127);
  }
  const int fork_errno = errno;
  close(sv[1]);
  close(null_fd);
  if (pid < 0) {
    close(sv[0]);
    return Status::IOError(fmt::format("tp janitor: fork: {}", std::strerror(fork_errno)));
  }
  TpJanitor j;
  j.fd_ = sv[0];
  j.pid_ = pid;
  return j;
}

TpJanitor::TpJanitor(TpJanitor&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)), pid_(std::exchange(other.pid_, -1)) {}

TpJanitor& TpJanitor::operator=(TpJanitor&& other) noexcept {
  std::swap(fd_, other.fd_);
  std::swap(pid_, other.pid_);
  return *this;
}

TpJanitor::~TpJanitor() {
  if (fd_ >= 0) {
    (void)Send("done");
    close(fd_);
  }
  if (pid_ > 0) {
    int status = 0;
    while (waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
    }
  }
}

Status TpJanitor::RemoveDirOnDeath(const std::string& path) {
  if (path.find('\n') != std::string::npos) {
    return Status::InvalidArgument(fmt::format("tp janitor: a path with a newline: '{}'", path));
  }
  return Send("dir " + path);
}

Status TpJanitor::RemoveSegmentOnDeath(const std::string& name) {
  if (name.find('\n') != std::string::npos || name.find(' ') != std::string::npos) {
    return Status::InvalidArgument(
        fmt::format("tp janitor: a segment name with a space or newline: '{}'", name));
  }
  return Send("shm " + name);
}

Status TpJanitor::Send(const std::string& line) {
  if (fd_ < 0) return Status::IOError("tp janitor: not started");
  const std::string msg = line + "\n";
  size_t sent = 0;
  while (sent < msg.size()) {
    // MSG_NOSIGNAL: a janitor that died is an error here, not a SIGPIPE that kills rank 0.
    const ssize_t n = send(fd_, msg.data() + sent, msg.size() - sent, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      return Status::IOError(fmt::format("tp janitor (pid {}) is gone: {}", pid_,
                                         n < 0 ? std::strerror(errno) : "closed"));
    }
    sent += static_cast<size_t>(n);
  }
  return Status::OK();
}

}  // namespace kvtier::tools
