#include "util/thread_pool.h"

#include <fmt/format.h>

#include <system_error>

namespace kvtier::util {

ThreadPool::ThreadPool(int num_threads) {
  if (num_threads > kMaxThreads) num_threads = kMaxThreads;
  workers_.reserve(static_cast<size_t>(std::max(0, num_threads - 1)));
  for (int i = 1; i < num_threads; ++i) {
    try {
      workers_.emplace_back([this] { WorkerLoop(); });
    } catch (const std::system_error& e) {
      start_status_ = Status::Unavailable(fmt::format(
          "could start only {} of {} worker threads: {}", i - 1, num_threads - 1, e.what()));
      break;
    }
  }
}

Result<std::unique_ptr<ThreadPool>> ThreadPool::Create(int num_threads) {
  if (num_threads < 1 || num_threads > kMaxThreads) {
    return Status::InvalidArgument(
        fmt::format("a thread pool of {} threads: must be in [1, {}]", num_threads, kMaxThreads));
  }
  auto pool = std::make_unique<ThreadPool>(num_threads);
  if (!pool->start_status().ok()) return pool->start_status();
  return pool;
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
    std::function<void()> task;
    {
      std::unique_lock<std::mutex> lock(mu_);
      work_cv_.wait(lock, [&] { return stop_ || generation_ != seen || !posted_.empty(); });
      if (generation_ == seen && !posted_.empty()) {
        task = std::move(posted_.front());
        posted_.pop_front();
      } else if (stop_ && generation_ == seen) {
        return;  // posted_ is empty: every posted task has run
      } else {
        seen = generation_;
      }
    }
    if (task) {
      task();
    } else {
      RunTasks();
    }
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

void ThreadPool::Post(std::function<void()> task) {
  if (workers_.empty()) {
    task();
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    posted_.push_back(std::move(task));
  }
  work_cv_.notify_one();
}

}  // namespace kvtier::util
