// The checksum pool (checksum_pool.h).
#include "storage/redis/checksum_pool.h"

#include <algorithm>

#include "storage/page_format.h"

namespace kvtier::storage {

ChecksumPool::ChecksumPool(int threads) {
  threads_.reserve(static_cast<size_t>(std::max(1, threads)));
  for (int i = 0; i < std::max(1, threads); ++i) threads_.emplace_back([this] { Loop(); });
}

ChecksumPool::~ChecksumPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  wake_.notify_all();
  for (std::thread& t : threads_) t.join();
}

void ChecksumPool::Run(const Job& job) {
  // DefaultChecksumKind is always one this build computes.
  PayloadChecksum(DefaultChecksumKind(), job.payload, job.out);
}

void ChecksumPool::FinishLocked(const Job& job) {
  if (--job.batch->pending_ == 0) job.batch->done_.notify_all();
}

void ChecksumPool::Loop() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    wake_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stopping, and nothing left
    const Job job = queue_.front();
    queue_.pop_front();
    lock.unlock();
    Run(job);
    lock.lock();
    FinishLocked(job);
  }
}

void ChecksumPool::Batch::Add(const PageBuffer& payload, uint64_t* out) {
  {
    std::lock_guard<std::mutex> lock(pool_.mu_);
    ++pending_;
    pool_.queue_.push_back(Job{this, payload, out});
  }
  pool_.wake_.notify_one();
}

void ChecksumPool::Batch::Wait() {
  std::unique_lock<std::mutex> lock(pool_.mu_);
  // Run here what no pool thread has started.
  for (auto it = pool_.queue_.begin(); it != pool_.queue_.end();) {
    if (it->batch != this) {
      ++it;
      continue;
    }
    const Job job = *it;
    pool_.queue_.erase(it);
    lock.unlock();
    Run(job);
    lock.lock();
    pool_.FinishLocked(job);
    it = pool_.queue_.begin();  // the queue may have changed while unlocked
  }
  done_.wait(lock, [this] { return pending_ == 0; });
}

}  // namespace kvtier::storage
