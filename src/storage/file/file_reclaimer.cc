// The unlinks of a file store's evicted pages (file_reclaimer.h).
#include "storage/file/file_reclaimer.h"

#include <fcntl.h>
#include <pthread.h>
#include <unistd.h>

#include <algorithm>
#include <utility>

namespace kvtier::storage {

FileReclaimer::FileReclaimer(int64_t bound, int threads, UnlinkFn unlink)
    : bound_(std::max<int64_t>(0, bound)),
      unlink_(unlink ? std::move(unlink) : [](int dir, const std::string& name) {
        ::unlinkat(dir, name.c_str(), 0);  // gone already (ENOENT): nothing to free
      }) {
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
    queue_.push_back({std::move(dir), std::move(name), bytes, next_ticket_++});
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
  const int64_t upto = next_ticket_;
  while (AnyBefore(upto)) {
    // The queue is in ticket order: its front is the oldest waiting file.
    if (!queue_.empty() && queue_.front().ticket < upto) {
      UnlinkOne(lock, &counts_.unlinked_inline);
    } else {
      room_.wait(lock);  // one of ours is being unlinked by a thread or another caller
    }
  }
}

bool FileReclaimer::AnyBefore(int64_t ticket) const {
  if (!queue_.empty() && queue_.front().ticket < ticket) return true;
  return std::any_of(unlinking_.begin(), unlinking_.end(),
                     [ticket](int64_t t) { return t < ticket; });
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
  unlinking_.push_back(f.ticket);
  lock.unlock();
  unlink_(f.dir.get(), f.name);
  f.dir = Fd();
  lock.lock();
  unlinking_.erase(std::find(unlinking_.begin(), unlinking_.end(), f.ticket));
  pending_ -= f.bytes;
  ++*counter;
  room_.notify_all();
  return true;
}

void FileReclaimer::Run() {
  // Named, so tools and `top -H` can tell the reclaimer's CPU time from the I/O threads' (the
  // storage bench sums it during its Get passes: kReclaimThreadName).
  ::pthread_setname_np(::pthread_self(), kReclaimThreadName);
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    work_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stopping, nothing left
    if (stopping_) return;       // Stop's Drain unlinks the rest on its caller
    UnlinkOne(lock, &counts_.unlinked_background);
  }
}

}  // namespace kvtier::storage
