// Test support: a worker process — fork + exec of shared_host_pool_worker (whose path CMake
// passes as KVTIER_SHM_WORKER), or a plain fork() running RunSharedHostPoolWorker where that is
// linked in (a fraction of the start-up cost, most of all under the sanitizers) — with a pipe from
// its stdout, for the multi-process shared host pool tests. Killed (if still running) and reaped
// on destruction, so a failed assertion leaves no process behind.
//
// Thread safety: one thread drives a Worker.
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

namespace kvtier::testing {

// The worker program's main (shared_host_pool_worker.cc); defined where it is linked in
// (KVTIER_SHM_WORKER_IN_TEST).
int RunSharedHostPoolWorker(int argc, char** argv);

// kFork runs the worker in a plain fork() where it is linked in, and execs it otherwise.
enum class WorkerStart { kExec, kFork };

class Worker {
 public:
  // kFork: REQUIRES no other thread in this process (the child runs on after fork()).
  explicit Worker(const std::vector<std::string>& args,
                  [[maybe_unused]] WorkerStart start = WorkerStart::kExec) {
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) != 0) return;
    std::vector<std::string> argv_storage = {WorkerPath()};
    argv_storage.insert(argv_storage.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (std::string& a : argv_storage) argv.push_back(a.data());
    argv.push_back(nullptr);
    pid_ = fork();
    if (pid_ == 0) {
      dup2(fds[1], STDOUT_FILENO);  // dup2 clears O_CLOEXEC on the copy
#if defined(KVTIER_SHM_WORKER_IN_TEST)
      if (start == WorkerStart::kFork) {
        const int code = RunSharedHostPoolWorker(static_cast<int>(argv.size()) - 1, argv.data());
        std::fflush(nullptr);
        _exit(code);
      }
#endif
      execv(argv[0], argv.data());
      _exit(127);
    }
    close(fds[1]);
    out_ = fds[0];
  }
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;
  ~Worker() {
    if (pid_ > 0 && !reaped_) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    if (out_ >= 0) close(out_);
  }

  pid_t pid() const { return pid_; }

  // True once the worker wrote `signal` ('A': attached, 'R': stopped where it was told to),
  // within `timeout_ms`.
  bool WaitFor(char signal, int timeout_ms) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    for (;;) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      pollfd p{out_, POLLIN, 0};
      if (left.count() <= 0 || poll(&p, 1, static_cast<int>(left.count())) != 1) return false;
      char c = 0;
      if (read(out_, &c, 1) != 1) return false;
      if (c == signal) return true;
    }
  }

  void Kill() {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
    reaped_ = true;
  }

  // Waits up to `timeout_ms` for the exit; -1 on timeout (then kills it), else the exit code
  // (128 + signal for a signal). `output` gets what it printed.
  int Wait(int timeout_ms, std::string* output) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    int status = 0;
    while (waitpid(pid_, &status, WNOHANG) == 0) {
      if (std::chrono::steady_clock::now() > deadline) {
        Kill();
        return -1;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    reaped_ = true;
    char buf[512];
    ssize_t n;
    while ((n = read(out_, buf, sizeof(buf))) > 0) output->append(buf, static_cast<size_t>(n));
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }

 private:
  static const char* WorkerPath() {
#if defined(KVTIER_SHM_WORKER)
    return KVTIER_SHM_WORKER;
#else
    return "shared_host_pool_worker";  // kFork only
#endif
  }

  pid_t pid_ = -1;
  int out_ = -1;
  bool reaped_ = false;
};

}  // namespace kvtier::testing
