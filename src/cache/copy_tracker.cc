// Operations in flight (see cache/copy_tracker.h).
#include "cache/copy_tracker.h"

#include <algorithm>

namespace kvtier {

std::vector<std::shared_ptr<CopyOp>> CopyTracker::TakeDone() {
  std::vector<std::shared_ptr<CopyOp>> done;
  size_t keep = 0;
  for (size_t i = 0; i < ops_.size(); ++i) {
    if (!ops_[i]->unpublished && IsDone(*ops_[i])) {
      done.push_back(std::move(ops_[i]));
    } else {
      if (keep != i) ops_[keep] = std::move(ops_[i]);
      ++keep;
    }
  }
  ops_.resize(keep);
  return done;
}

void CopyTracker::MarkSubmitted(CopyOp& op, Status status) {
  std::lock_guard<std::mutex> lk(mu_);
  if (!status.ok() && op.status.ok()) op.status = std::move(status);
  op.submitted = true;
  cv_.notify_all();  // under the mutex: a waiter cannot destroy the tracker before this returns
}

void CopyTracker::Complete(CopyOp& op, Status status) {
  std::lock_guard<std::mutex> lk(mu_);
  if (!status.ok() && op.status.ok()) op.status = std::move(status);
  op.submitted = true;
  op.finished = std::chrono::steady_clock::now();
  op.done.store(true, std::memory_order_release);
  cv_.notify_all();
}

bool CopyTracker::CompleteBatch(CopyOp& op, int64_t batch, const Status& status,
                                const std::vector<PageStatus>& statuses,
                                const std::function<void(const CopyOp&)>& on_last) {
  std::lock_guard<std::mutex> lk(mu_);
  if (!status.ok() && op.status.ok()) op.status = status;
  if (status.code() == StatusCode::kUnavailable) {
    op.rejected_pages += std::count(statuses.begin(), statuses.end(), PageStatus::kSkipped);
  }
  const int64_t first = batch * op.batch_pages;
  for (size_t i = 0; i < statuses.size(); ++i) {
    const size_t at = static_cast<size_t>(first) + i;
    if (at < op.page_status.size()) op.page_status[at] = statuses[i];
  }
  op.batch_done[static_cast<size_t>(batch)] = 1;
  const bool last = --op.batches_left == 0;
  if (last) {
    op.finished = std::chrono::steady_clock::now();
    if (on_last) on_last(op);
    op.done.store(true, std::memory_order_release);
  }
  cv_.notify_all();
  return last;
}

void CopyTracker::AddPresent(CopyOp& op, int64_t present_pages) {
  std::lock_guard<std::mutex> lk(mu_);
  op.present_pages += present_pages;
}

bool CopyTracker::IsDone(CopyOp& op) {
  if (op.done.load(std::memory_order_acquire)) return true;
  if (!op.gpu) return false;
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (!op.submitted) return false;
  }
  Result<bool> q = op.event.Query();
  if (q.ok() && !*q) return false;
  Complete(op, q.ok() ? Status::OK() : q.status());
  return true;
}

void CopyTracker::Wait(CopyOp& op) {
  if (op.gpu) {
    {
      std::unique_lock<std::mutex> lk(mu_);
      cv_.wait(lk, [&] { return op.submitted; });
    }
    if (!op.done.load(std::memory_order_acquire)) Complete(op, op.event.Synchronize());
    return;
  }
  std::unique_lock<std::mutex> lk(mu_);
  cv_.wait(lk, [&] { return op.done.load(std::memory_order_acquire); });
}

bool CopyTracker::WaitUntil(CopyOp& op, std::chrono::steady_clock::time_point deadline) {
  if (op.gpu) {
    Wait(op);  // GPU copies are bounded by the device; the deadline is for storage
    return true;
  }
  std::unique_lock<std::mutex> lk(mu_);
  return cv_.wait_until(lk, deadline, [&] { return op.done.load(std::memory_order_acquire); });
}

CopyTracker::Arrival CopyTracker::ArrivalLocked(const CopyOp& op) const {
  Arrival a;
  const int64_t total = static_cast<int64_t>(op.page_status.size());
  auto batch_done = [&](int64_t page) {
    return op.batch_done[static_cast<size_t>(page / op.batch_pages)] != 0;
  };
  while (a.pages < total && batch_done(a.pages) &&
         op.page_status[static_cast<size_t>(a.pages)] == PageStatus::kOk) {
    ++a.pages;
  }
  a.final = a.pages == total || batch_done(a.pages) || op.abandoned ||
            op.done.load(std::memory_order_acquire);
  return a;
}

int64_t CopyTracker::ArrivedPages(CopyOp& op) {
  std::lock_guard<std::mutex> lk(mu_);
  return ArrivalLocked(op).pages;
}

CopyTracker::Arrival CopyTracker::WaitArrival(CopyOp& op, int64_t pages,
                                              std::chrono::steady_clock::time_point deadline) {
  std::unique_lock<std::mutex> lk(mu_);
  Arrival a;
  auto moved = [&] {
    a = ArrivalLocked(op);
    return a.pages > pages || a.final;
  };
  if (deadline == std::chrono::steady_clock::time_point::max()) {
    cv_.wait(lk, moved);  // storage calls are bounded by their own deadlines
  } else {
    cv_.wait_until(lk, deadline, moved);
  }
  return a;
}

void CopyTracker::Abandon(CopyOp& op) {
  std::lock_guard<std::mutex> lk(mu_);
  op.abandoned = true;
  cv_.notify_all();
}

void CopyTracker::Snapshot(CopyOp& op, std::vector<PageStatus>* pages,
                           std::vector<uint8_t>* batches, Status* status) {
  std::lock_guard<std::mutex> lk(mu_);
  *pages = op.page_status;
  *batches = op.batch_done;
  *status = op.status;
}

}  // namespace kvtier
