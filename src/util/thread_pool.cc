#include "util/thread_pool.h"

namespace kvtier::util {

ThreadPool::ThreadPool(int num_threads) {
  for (int i = 1; i < num_threads; ++i) workers_.emplace_back([this] { WorkerLoop(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  work_cv_.notify_all();
  for (auto& t : workers_) t.join();
}

// Takes tasks until none is left. Invariant: finished_tasks_ <= next_task_ <= num_tasks_.
void ThreadPool::RunTasks() {
  std::unique_lock<std::mutex> lock(mu_);
  while (fn_ != nullptr && next_task_ < num_tasks_) {
    const int64_t task = next_task_++;
    const auto* fn = fn_;
    lock.unlock();
    (*fn)(task);
    lock.lock();
    if (++finished_tasks_ == num_tasks_) done_cv_.notify_all();
  }
}

void ThreadPool::WorkerLoop() {
  uint64_t seen = 0;
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      work_cv_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
    }
    RunTasks();
  }
}

void ThreadPool::ParallelFor(int64_t num_tasks, const std::function<void(int64_t)>& fn) {
  if (num_tasks <= 0) return;
  if (workers_.empty() || num_tasks == 1) {
    for (int64_t t = 0; t < num_tasks; ++t) fn(t);
    return;
  }
  std::lock_guard<std::mutex> loop_lock(loop_mu_);
  {
    std::lock_guard<std::mutex> lock(mu_);
    fn_ = &fn;
    num_tasks_ = num_tasks;
    next_task_ = 0;
    finished_tasks_ = 0;
    ++generation_;
  }
  work_cv_.notify_all();
  RunTasks();
  std::unique_lock<std::mutex> lock(mu_);
  done_cv_.wait(lock, [&] { return finished_tasks_ == num_tasks_; });
  fn_ = nullptr;
}

}  // namespace kvtier::util
