// Internal: a fixed pool of worker threads that runs blocking parallel-for loops.
//
// Thread safety: ParallelFor may be called from several threads at once; calls are serialised
// (one loop runs on the pool at a time) and the calling thread takes part in its own loop.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace kvtier::util {

class ThreadPool {
 public:
  // `num_threads` counts the caller: a pool of 1 runs everything on the calling thread.
  explicit ThreadPool(int num_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const { return static_cast<int>(workers_.size()) + 1; }

  // Runs fn(task) for task in [0, num_tasks) and returns when all have finished.
  void ParallelFor(int64_t num_tasks, const std::function<void(int64_t)>& fn);

 private:
  void WorkerLoop();
  void RunTasks();

  std::vector<std::thread> workers_;
  std::mutex loop_mu_;  // one loop at a time
  std::mutex mu_;
  std::condition_variable work_cv_;
  std::condition_variable done_cv_;
  const std::function<void(int64_t)>* fn_ = nullptr;  // guarded by mu_
  int64_t num_tasks_ = 0;
  int64_t next_task_ = 0;
  int64_t finished_tasks_ = 0;
  uint64_t generation_ = 0;
  bool stop_ = false;
};

}  // namespace kvtier::util
