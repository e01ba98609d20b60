// Internal: a fixed pool of worker threads that runs blocking parallel-for loops and posted tasks.
//
// Thread safety: ParallelFor and Post may be called from several threads at once. ParallelFor
// calls are serialised (one loop runs on the pool at a time) and the calling thread takes part in
// its own loop, so a loop finishes even while every worker runs a posted task. Posted tasks run
// on the workers in the order they were posted; the destructor runs the ones still queued.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "kvtier/status.h"

namespace kvtier::util {

class ThreadPool {
 public:
  // The most threads a pool may have.
  static constexpr int kMaxThreads = 1024;

  // `num_threads` counts the caller: a pool of 1 runs everything on the calling thread. A thread
  // that cannot be started leaves the pool with fewer workers; start_status() says why.
  explicit ThreadPool(int num_threads);
  // InvalidArgument outside [1, kMaxThreads]; Unavailable (naming the system error) when the
  // threads cannot be started. Never a partly started pool.
  static Result<std::unique_ptr<ThreadPool>> Create(int num_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const { return static_cast<int>(workers_.size()) + 1; }
  const Status& start_status() const { return start_status_; }

  // Runs fn(task) for task in [0, num_tasks) and returns when all have finished.
  void ParallelFor(int64_t num_tasks, const std::function<void(int64_t)>& fn);
  // Queues `task` for a worker and returns at once. REQUIRES: the pool has a worker
  // (num_threads() >= 2); a pool of 1 runs the task in the calling thread before returning.
  void Post(std::function<void()> task);

 private:
  void WorkerLoop();
  void RunTasks();

  std::vector<std::thread> workers_;
  Status start_status_;
  std::mutex loop_mu_;  // one loop at a time
  std::mutex mu_;
  std::condition_variable work_cv_;
  std::condition_variable done_cv_;
  const std::function<void(int64_t)>* fn_ = nullptr;  // guarded by mu_
  int64_t num_tasks_ = 0;
  int64_t next_task_ = 0;
  int64_t finished_tasks_ = 0;
  uint64_t generation_ = 0;
  std::deque<std::function<void()>> posted_;  // guarded by mu_
  bool stop_ = false;
};

}  // namespace kvtier::util
