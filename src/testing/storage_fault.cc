// FaultInjectingStorage (kvtier/testing/storage_fault.h): decides a batch's faults, forwards the
// remaining pages to the wrapped backend through its public (queued) API, waits for it, and merges
// the outcomes.
//
// The wrapped backend completes every call it accepts (its contract), so waiting for it without a
// bound cannot hang; its buffers are the caller's, which stay valid until this wrapper completes.
//
// Thread safety: settings are atomics; the generator and the counts are guarded by `mu_`.
#include "kvtier/testing/storage_fault.h"

#include <fmt/format.h>

#include <algorithm>
#include <optional>
#include <thread>
#include <vector>

namespace kvtier {

using Clock = std::chrono::steady_clock;

namespace {

Status CheckFraction(const char* name, double fraction) {
  if (!(fraction >= 0.0 && fraction <= 1.0)) {  // also rejects NaN
    return Status::InvalidArgument(
        fmt::format("storage faults: {} must be in [0, 1], got {}", name, fraction));
  }
  return Status::OK();
}

// A page the wrapped backend did not run (its call rejected, or it left the page skipped) is a
// failed page to our caller: a miss, or a set that did not happen.
PageStatus FromInner(const BatchResult& r, size_t i) {
  if (!r.status.ok() || i >= r.pages.size() || r.pages[i] == PageStatus::kSkipped) {
    return PageStatus::kFailed;
  }
  return r.pages[i];
}

// Splits a batch: page i is answered here with `fault(i)` when that returns an outcome (called
// once per page, in order, so the seeded draws do not depend on the call); the other pages go on
// together through `forward(keys, buffers, index)` (the wrapped backend's call, waited for;
// `index`: each forwarded page's place in the batch), and their
// outcomes land in `out` at their places. `buffers` is empty for a Remove.
template <typename Fault, typename Forward>
void SplitAndForward(std::span<const PageKey> keys, std::span<const PageBuffer> buffers,
                     std::span<PageStatus> out, Fault fault, Forward forward) {
  std::vector<size_t> index;
  std::vector<PageKey> fwd_keys;
  std::vector<PageBuffer> fwd_buffers;
  for (size_t i = 0; i < keys.size(); ++i) {
    if (const std::optional<PageStatus> answered = fault(i)) {
      out[i] = *answered;
      continue;
    }
    index.push_back(i);
    fwd_keys.push_back(keys[i]);
    if (!buffers.empty()) fwd_buffers.push_back(buffers[i]);
  }
  if (index.empty()) return;
  const BatchResult r = forward(std::move(fwd_keys), std::move(fwd_buffers), index);
  for (size_t j = 0; j < index.size(); ++j) out[index[j]] = FromInner(r, j);
}

}  // namespace

Result<std::unique_ptr<FaultInjectingStorage>> FaultInjectingStorage::Wrap(
    std::unique_ptr<StorageBackend> inner, uint64_t seed, const StorageOptions& options) {
  if (inner == nullptr) {
    return Status::InvalidArgument("storage faults: no backend to wrap");
  }
  KVTIER_RETURN_IF_ERROR(options.Validate());
  std::unique_ptr<FaultInjectingStorage> wrapper(
      new FaultInjectingStorage(std::move(inner), seed, options));
  KVTIER_RETURN_IF_ERROR(wrapper->Start());
  return wrapper;
}

FaultInjectingStorage::FaultInjectingStorage(std::unique_ptr<StorageBackend> inner, uint64_t seed,
                                             const StorageOptions& options)
    : StorageBackend("faulty+" + inner->url(), inner->ns(), options),
      inner_(std::move(inner)),
      rng_(seed) {}

FaultInjectingStorage::~FaultInjectingStorage() {
  Close();  // our I/O threads first: they may be waiting on the wrapped backend
  inner_->Close();
}

Status FaultInjectingStorage::SetDelay(std::chrono::milliseconds delay) {
  if (delay.count() < 0) {
    return Status::InvalidArgument(
        fmt::format("storage faults: delay must be non-negative, got {} ms", delay.count()));
  }
  delay_ms_.store(delay.count());
  return Status::OK();
}

Status FaultInjectingStorage::SetErrorFraction(double fraction) {
  KVTIER_RETURN_IF_ERROR(CheckFraction("error_fraction", fraction));
  error_fraction_.store(fraction);
  return Status::OK();
}

Status FaultInjectingStorage::SetCorruptFraction(double fraction) {
  KVTIER_RETURN_IF_ERROR(CheckFraction("corrupt_fraction", fraction));
  corrupt_fraction_.store(fraction);
  return Status::OK();
}

Status FaultInjectingStorage::SetDropFraction(double fraction) {
  KVTIER_RETURN_IF_ERROR(CheckFraction("drop_fraction", fraction));
  drop_fraction_.store(fraction);
  return Status::OK();
}

void FaultInjectingStorage::SetDown(bool down) { down_.store(down); }

void FaultInjectingStorage::HoldWrites(bool hold) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    hold_writes_ = hold;
  }
  writes_cv_.notify_all();
}

int FaultInjectingStorage::held_writes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return held_writes_;
}

bool FaultInjectingStorage::WaitForWrites(Clock::time_point deadline) {
  std::unique_lock<std::mutex> lock(mu_);
  ++held_writes_;
  const bool released = writes_cv_.wait_until(lock, deadline, [&] { return !hold_writes_; });
  --held_writes_;
  if (!released) ++counts_.timed_out_calls;
  return released;
}

void FaultInjectingStorage::HoldReads(std::vector<PageKey> keys) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    held_read_keys_ = std::move(keys);
  }
  writes_cv_.notify_all();
}

int FaultInjectingStorage::held_reads() const {
  std::lock_guard<std::mutex> lock(mu_);
  return held_reads_;
}

bool FaultInjectingStorage::WaitForReads(std::span<const PageKey> keys,
                                         Clock::time_point deadline) {
  std::unique_lock<std::mutex> lock(mu_);
  auto held = [&] {
    for (const PageKey& k : keys) {
      if (std::find(held_read_keys_.begin(), held_read_keys_.end(), k) != held_read_keys_.end()) {
        return true;
      }
    }
    return false;
  };
  if (!held()) return true;
  ++held_reads_;
  const bool released = writes_cv_.wait_until(lock, deadline, [&] { return !held(); });
  --held_reads_;
  if (!released) ++counts_.timed_out_calls;
  return released;
}

void FaultInjectingStorage::ClearFaults() {
  HoldWrites(false);
  HoldReads({});
  delay_ms_.store(0);
  error_fraction_.store(0);
  corrupt_fraction_.store(0);
  drop_fraction_.store(0);
  down_.store(false);
}

void FaultInjectingStorage::SetCallerCheck(std::function<Status(std::string_view call)> check) {
  auto shared =
      check ? std::make_shared<const std::function<Status(std::string_view)>>(std::move(check))
            : nullptr;
  std::lock_guard<std::mutex> lock(mu_);
  caller_check_ = std::move(shared);
}

Status FaultInjectingStorage::CheckCaller(std::string_view call) const {
  std::shared_ptr<const std::function<Status(std::string_view)>> check;
  {
    std::lock_guard<std::mutex> lock(mu_);
    check = caller_check_;
  }
  return check ? (*check)(call) : Status::OK();  // outside mu_: the check may take its time
}

StorageFaults FaultInjectingStorage::faults() const {
  StorageFaults f;
  f.delay = std::chrono::milliseconds(delay_ms_.load());
  f.error_fraction = error_fraction_.load();
  f.corrupt_fraction = corrupt_fraction_.load();
  f.drop_fraction = drop_fraction_.load();
  f.down = down_.load();
  return f;
}

InjectedFaults FaultInjectingStorage::injected() const {
  std::lock_guard<std::mutex> lock(mu_);
  return counts_;
}

bool FaultInjectingStorage::AnsweredWithoutForwarding(std::span<PageStatus> out,
                                                      Clock::time_point deadline, bool write) {
  if (down_.load()) {
    std::lock_guard<std::mutex> lock(mu_);
    ++counts_.down_calls;
    std::fill(out.begin(), out.end(), PageStatus::kFailed);
    return true;
  }
  if (!Delay(deadline) || (write && !WaitForWrites(deadline))) {
    std::fill(out.begin(), out.end(), PageStatus::kTimedOut);
    return true;
  }
  return false;
}

bool FaultInjectingStorage::Draw(double fraction) {
  if (fraction <= 0) return false;
  if (fraction >= 1) return true;
  std::lock_guard<std::mutex> lock(mu_);
  return std::uniform_real_distribution<double>(0.0, 1.0)(rng_) < fraction;
}

uint64_t FaultInjectingStorage::DrawIndex(uint64_t n) {
  std::lock_guard<std::mutex> lock(mu_);
  return std::uniform_int_distribution<uint64_t>(0, n - 1)(rng_);
}

bool FaultInjectingStorage::Delay(Clock::time_point deadline) {
  const auto delay = std::chrono::milliseconds(delay_ms_.load());
  if (delay.count() == 0) return true;
  const auto wake = Clock::now() + delay;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++counts_.delayed_calls;
    if (wake > deadline) ++counts_.timed_out_calls;
  }
  if (wake > deadline) {
    std::this_thread::sleep_until(deadline);
    return false;
  }
  std::this_thread::sleep_until(wake);
  return true;
}

ExistsResult FaultInjectingStorage::DoExists(std::span<const PageKey> keys,
                                             Clock::time_point deadline) {
  if (down_.load()) {
    std::lock_guard<std::mutex> lock(mu_);
    ++counts_.down_calls;
    return {Status::Unavailable(fmt::format("storage {} is down (fault injection)", url())), 0};
  }
  if (!Delay(deadline)) {
    return {Status::Unavailable(fmt::format("storage {}: Exists timed out", url())), 0};
  }
  if (Draw(error_fraction_.load())) {
    std::lock_guard<std::mutex> lock(mu_);
    ++counts_.failed_exists;
    return {Status::Unavailable(fmt::format("storage {}: Exists failed (fault injection)", url())),
            0};
  }
  return inner_->Exists(std::vector<PageKey>(keys.begin(), keys.end())).get();
}

void FaultInjectingStorage::DoGet(std::span<const PageKey> keys,
                                  std::span<const PageBuffer> buffers, std::span<PageStatus> out,
                                  Clock::time_point deadline) {
  if (!WaitForReads(keys, deadline)) {
    std::fill(out.begin(), out.end(), PageStatus::kTimedOut);
    return;
  }
  if (AnsweredWithoutForwarding(out, deadline, /*write=*/false)) return;
  const double error_fraction = error_fraction_.load();
  int64_t failed = 0;
  SplitAndForward(
      keys, buffers, out,
      [&](size_t) -> std::optional<PageStatus> {
        if (!Draw(error_fraction)) return std::nullopt;
        ++failed;
        return PageStatus::kFailed;
      },
      [&](std::vector<PageKey> k, std::vector<PageBuffer> b, const std::vector<size_t>&) {
        return inner_->Get(std::move(k), std::move(b)).get();
      });
  const double corrupt_fraction = corrupt_fraction_.load();
  int64_t corrupted = 0;
  for (size_t i = 0; i < keys.size(); ++i) {
    if (out[i] != PageStatus::kOk || !Draw(corrupt_fraction)) continue;
    const PageBuffer& b = buffers[i];
    uint64_t at = DrawIndex(static_cast<uint64_t>(b.bytes()));
    for (int s = 0; s < b.num_segments; ++s) {
      const auto& seg = b.segments[static_cast<size_t>(s)];
      if (at < seg.size()) {
        seg[at] ^= std::byte{0x5A};
        break;
      }
      at -= seg.size();
    }
    out[i] = PageStatus::kCorrupt;
    ++corrupted;
  }
  std::lock_guard<std::mutex> lock(mu_);
  counts_.failed_pages += failed;
  counts_.corrupted_pages += corrupted;
}

void FaultInjectingStorage::DoSet(std::span<const PageKey> keys,
                                  std::span<const PageBuffer> buffers, std::span<PageStatus> out,
                                  Clock::time_point deadline) {
  DoSetChained(keys, buffers, {}, out, deadline);
}

void FaultInjectingStorage::DoSetChained(std::span<const PageKey> keys,
                                         std::span<const PageBuffer> buffers,
                                         std::span<const std::optional<PageKey>> parents,
                                         std::span<PageStatus> out, Clock::time_point deadline) {
  if (AnsweredWithoutForwarding(out, deadline, /*write=*/true)) return;
  const double error_fraction = error_fraction_.load();
  const double drop_fraction = drop_fraction_.load();
  int64_t failed = 0, dropped = 0;
  SplitAndForward(
      keys, buffers, out,
      [&](size_t) -> std::optional<PageStatus> {
        if (Draw(error_fraction)) {
          ++failed;
          return PageStatus::kFailed;
        }
        if (Draw(drop_fraction)) {
          ++dropped;
          return PageStatus::kOk;  // reported written, never stored
        }
        return std::nullopt;
      },
      [&](std::vector<PageKey> k, std::vector<PageBuffer> b, const std::vector<size_t>& index) {
        if (parents.empty()) return inner_->Set(std::move(k), std::move(b)).get();
        std::vector<std::optional<PageKey>> p;  // one per forwarded key
        p.reserve(index.size());
        for (size_t i : index) p.push_back(parents[i]);
        return inner_->Set(std::move(k), std::move(b), std::move(p)).get();
      });
  std::lock_guard<std::mutex> lock(mu_);
  counts_.failed_pages += failed;
  counts_.dropped_pages += dropped;
}

void FaultInjectingStorage::DoRemove(std::span<const PageKey> keys, std::span<PageStatus> out,
                                     Clock::time_point deadline) {
  if (AnsweredWithoutForwarding(out, deadline, /*write=*/true)) return;
  const double error_fraction = error_fraction_.load();
  int64_t failed = 0;
  SplitAndForward(
      keys, {}, out,
      [&](size_t) -> std::optional<PageStatus> {
        if (!Draw(error_fraction)) return std::nullopt;
        ++failed;
        return PageStatus::kFailed;
      },
      [&](std::vector<PageKey> k, std::vector<PageBuffer>, const std::vector<size_t>&) {
        return inner_->Remove(std::move(k)).get();
      });
  std::lock_guard<std::mutex> lock(mu_);
  counts_.failed_pages += failed;
}

void FaultInjectingStorage::FillStats(StorageStats& stats) const {
  const StorageStats inner = inner_->Stats();
  stats.stored_pages = inner.stored_pages;
  stats.stored_bytes = inner.stored_bytes;
  stats.capacity_bytes = inner.capacity_bytes;
  stats.evicted_pages = inner.evicted_pages;
  stats.get_cached_pages = inner.get_cached_pages;
  stats.get_disk_pages = inner.get_disk_pages;
}

}  // namespace kvtier
