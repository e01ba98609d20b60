// The unlinks of a file store's evicted pages (file_reclaimer.h).
#include "storage/file_reclaimer.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <utility>

namespace kvtier::storage {

FileReclaimer::FileReclaimer(int64_t bound, int threads) : bound_(std::max<int64_t>(0, bound)) {
  counts_.bound = bound_;
  if (bound_ == 0) return;
  for (int i = 0; i < std::max(1, threads); ++i) threads_.emplace_back([this] { Run(); });
}

FileReclaimer::~FileReclaimer() { Stop(); }

void FileReclaimer::Reserve(int64_t bytes) {
  if (bound_ == 0) return;
  std::unique_lock<std::mutex> lock(mu_);
  while (pending_ + reserved_ + bytes > bound_) {
    if (!UnlinkOne(lock, &counts_.unlinked_inline)) {
      // Nothing queued: the rest is being unlinked by the threads or reserved by other writers.
      room_.wait(lock);
    }
  }
  reserved_ += bytes;
}

void FileReclaimer::Release(int64_t bytes) {
  if (bound_ == 0) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    reserved_ -= bytes;
  }
  room_.notify_all();
}

void FileReclaimer::Add(Fd dir, std::string name, int64_t bytes) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back({std::move(dir), std::move(name), bytes});
    pending_ += bytes;
    counts_.max_pending = std::max(counts_.max_pending, pending_);
  }
  if (bound_ > 0) work_.notify_one();
}

void FileReclaimer::Relieve() {
  std::unique_lock<std::mutex> lock(mu_);
  while (pending_ > bound_ && UnlinkOne(lock, &counts_.unlinked_inline)) {
  }
}

void FileReclaimer::Drain() {
  std::unique_lock<std::mutex> lock(mu_);
  while (UnlinkOne(lock, &counts_.unlinked_inline)) {
  }
}

void FileReclaimer::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  work_.notify_all();
  for (std::thread& t : threads_) t.join();
  threads_.clear();
  Drain();
}

FileReclaimer::Counts FileReclaimer::counts() const {
  std::lock_guard<std::mutex> lock(mu_);
  Counts c = counts_;
  c.pending = pending_;
  return c;
}

bool FileReclaimer::UnlinkOne(std::unique_lock<std::mutex>& lock, int64_t* counter) {
  if (queue_.empty()) return false;
  File f = std::move(queue_.front());
  queue_.pop_front();
  lock.unlock();
  ::unlinkat(f.dir.get(), f.name.c_str(), 0);  // gone already (ENOENT): nothing to free
  f.dir = Fd();
  lock.lock();
  pending_ -= f.bytes;
  ++*counter;
  room_.notify_all();
  return true;
}

void FileReclaimer::Run() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    work_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stopping, nothing left
    if (stopping_) return;       // Stop's Drain unlinks the rest on its caller
    UnlinkOne(lock, &counts_.unlinked_background);
  }
}

}  // namespace kvtier::storage
