// The file store's hit stamps written behind the reads (hit_stamper.h).
#include "storage/file/hit_stamper.h"

namespace kvtier::storage {

void HitStamper::Start() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!thread_.joinable() && !stopping_) thread_ = std::thread([this] { Loop(); });
}

void HitStamper::Add(const PageKey& key, int64_t stamp) {
  bool wake = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto [it, added] = stamp_of_.try_emplace(key, stamp);
    if (!added) {
      by_stamp_.erase(it->second);
      it->second = stamp;
    }
    by_stamp_.emplace(stamp, key);
    if (by_stamp_.size() > limit_) {
      stamp_of_.erase(by_stamp_.begin()->second);
      by_stamp_.erase(by_stamp_.begin());
      ++dropped_;
    }
    wake = by_stamp_.size() == wake_at_;
  }
  if (wake) cv_.notify_one();
}

void HitStamper::Stop(Clock::duration budget) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return;
    stopping_ = true;
    stop_deadline_.store((Clock::now() + budget).time_since_epoch().count(),
                         std::memory_order_relaxed);
  }
  cv_.notify_one();
  if (thread_.joinable()) thread_.join();
  WriteAll();  // what was added after the thread's last batch (none when it ran to the end)
}

HitStamper::Counts HitStamper::counts() const {
  std::lock_guard<std::mutex> lock(mu_);
  return {written_, skipped_, dropped_, left_, static_cast<int64_t>(by_stamp_.size())};
}

void HitStamper::Loop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stopping_) {
    cv_.wait_for(lock, period_, [&] { return stopping_ || by_stamp_.size() >= wake_at_; });
    lock.unlock();
    WriteAll();
    lock.lock();
  }
}

void HitStamper::WriteAll() {
  std::map<int64_t, PageKey> batch;
  {
    std::lock_guard<std::mutex> lock(mu_);
    batch.swap(by_stamp_);
    stamp_of_.clear();
  }
  int64_t written = 0, skipped = 0, left = 0;
  for (const auto& [stamp, key] : batch) {
    if (Clock::now().time_since_epoch().count() > stop_deadline_.load(std::memory_order_relaxed)) {
      ++left;
      continue;
    }
    ++(write_(key, stamp) == Outcome::kWritten ? written : skipped);
  }
  std::lock_guard<std::mutex> lock(mu_);
  written_ += written;
  skipped_ += skipped;
  left_ += left;
}

}  // namespace kvtier::storage
