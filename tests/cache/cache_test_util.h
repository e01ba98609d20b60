// Shared helpers for the cache tests: an engine-side "device tier" (kvtier/testing/device_tier.h:
// host memory on the cpu backend, a DeviceKvPool on kernel/dma), a transfer engine wrapper with a
// gate that holds copies back (to open race windows on purpose), wrappers that fail engine and
// storage calls made under the cache's mutex, the backend choice from the environment, and the
// model of what was inserted that the random model tests check matches against.
#pragma once

#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "kvtier/device.h"
#include "kvtier/hierarchical_cache.h"
#include "kvtier/testing/device_tier.h"
#include "kvtier/testing/kv_pattern.h"
#include "kvtier/testing/storage_fault.h"
#include "kvtier/transfer.h"

namespace kvtier::testing {

// KVTIER_TEST_BACKEND=cpu|kernel|dma (default cpu).
inline TransferBackend BackendFromEnv() {
  const char* v = std::getenv("KVTIER_TEST_BACKEND");
  if (v == nullptr || *v == '\0') return TransferBackend::kCpu;
  Result<TransferBackend> b = ParseTransferBackend(v);
  return b.ok() ? *b : TransferBackend::kCpu;
}

inline int64_t EnvInt(const char* name, int64_t fallback) {
  const char* v = std::getenv(name);
  return (v == nullptr || *v == '\0') ? fallback : std::atoll(v);
}

// What every engine wrapper below checks first: a call made while the calling thread holds the
// mutex of `cache` (set once the cache exists) fails with Internal and is counted in under_lock.
struct CacheMutexCheck {
  std::atomic<const HierarchicalCache*> cache{nullptr};
  std::atomic<int> under_lock{0};
  Status Check(const char* call) {
    const HierarchicalCache* c = cache.load();
    if (c == nullptr || !c->MutexHeldByCurrentThread()) return Status::OK();
    ++under_lock;
    return Status::Internal(std::string(call) + " with the cache's mutex held");
  }
};

// Wraps a real engine; while closed, copies out of the region whose K buffer is `gated_source`
// (the device tier: backups and write-backs) wait at the gate.
class GatedEngine final : public TransferEngine, public CacheMutexCheck {
 public:
  GatedEngine(std::unique_ptr<TransferEngine> inner, const void* gated_source)
      : inner_(std::move(inner)), gated_source_(gated_source) {}
  TransferBackend backend() const override { return inner_->backend(); }
  Status Synchronize(CudaStream stream) override {
    KVTIER_RETURN_IF_ERROR(Check("Synchronize"));
    return inner_->Synchronize(stream);
  }

  void Close() {
    std::lock_guard<std::mutex> lk(mu_);
    closed_ = true;
  }
  void Open() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      closed_ = false;
    }
    cv_.notify_all();
  }
  // Blocks until `n` copies are waiting at the gate.
  void AwaitWaiting(int n) {
    std::unique_lock<std::mutex> lk(mu_);
    cv_.wait(lk, [&] { return waiting_ >= n; });
  }
  int copies_to_host() {
    std::lock_guard<std::mutex> lk(mu_);
    return copies_to_host_;
  }

 protected:
  Status DoTransfer(const TransferRequest& request, const TransferOptions& options) override {
    KVTIER_RETURN_IF_ERROR(Check("Transfer"));
    if (request.src->k == gated_source_) {
      std::unique_lock<std::mutex> lk(mu_);
      ++copies_to_host_;
      ++waiting_;
      cv_.notify_all();
      cv_.wait(lk, [&] { return !closed_; });
      --waiting_;
    }
    return inner_->Transfer(request, options);
  }

 private:
  std::unique_ptr<TransferEngine> inner_;
  const void* gated_source_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool closed_ = false;
  int waiting_ = 0;
  int copies_to_host_ = 0;
};

// Wraps a real engine. Fails every call made while the calling thread holds `cache`'s mutex
// (counted in under_lock), and, while failures_left > 0, copies into the region whose K buffer is
// `fail_to` (an injected copy failure).
class CheckingEngine final : public TransferEngine, public CacheMutexCheck {
 public:
  explicit CheckingEngine(std::unique_ptr<TransferEngine> inner) : inner_(std::move(inner)) {}
  TransferBackend backend() const override { return inner_->backend(); }
  Status Synchronize(CudaStream stream) override {
    KVTIER_RETURN_IF_ERROR(Check("Synchronize"));
    return inner_->Synchronize(stream);
  }

  std::atomic<const void*> fail_to{nullptr};
  std::atomic<int> failures_left{0};
  std::atomic<int> calls{0};

 protected:
  Status DoTransfer(const TransferRequest& request, const TransferOptions& options) override {
    ++calls;
    KVTIER_RETURN_IF_ERROR(Check("Transfer"));
    if (request.dst->k == fail_to.load() && failures_left.fetch_sub(1) > 0) {
      return Status::IOError("injected copy failure");
    }
    return inner_->Transfer(request, options);
  }

 private:
  std::unique_ptr<TransferEngine> inner_;
};

// Wraps a real engine. While armed, the next copy into the region whose K buffer is `split_to`
// (a LoadBack into the device tier) is submitted one layer at a time, and submission `fail_at`
// (1-based) fails with IOError: the layers before it are enqueued (on a GPU they may still be
// running, or waiting behind earlier work on the stream, when the error is returned).
class MidwayFailingEngine final : public TransferEngine, public CacheMutexCheck {
 public:
  MidwayFailingEngine(std::unique_ptr<TransferEngine> inner, const void* split_to, int fail_at)
      : inner_(std::move(inner)), split_to_(split_to), fail_at_(fail_at) {}
  TransferBackend backend() const override { return inner_->backend(); }
  Status Synchronize(CudaStream stream) override {
    KVTIER_RETURN_IF_ERROR(Check("Synchronize"));
    return inner_->Synchronize(stream);
  }

  std::atomic<bool> armed{false};
  std::atomic<int> failures{0};
  std::atomic<int> enqueued_layers{0};  // submitted before the failure

 protected:
  Status DoTransfer(const TransferRequest& request, const TransferOptions& options) override {
    KVTIER_RETURN_IF_ERROR(Check("Transfer"));
    if (request.dst->k != split_to_ || !armed.exchange(false)) {
      return inner_->Transfer(request, options);
    }
    TransferOptions part_options = options;
    part_options.layer_events = nullptr;
    for (int64_t l = 0; l < request.num_layers; ++l) {
      if (l + 1 == fail_at_) {
        ++failures;
        return Status::IOError("injected: submission " + std::to_string(fail_at_) +
                               " of a load failed");
      }
      TransferRequest part = request;
      part.src_layer = request.src_layer + l;
      part.dst_layer = request.dst_layer + l;
      part.num_layers = 1;
      KVTIER_RETURN_IF_ERROR(inner_->Transfer(part, part_options));
      ++enqueued_layers;
    }
    return Status::OK();
  }

 private:
  std::unique_ptr<TransferEngine> inner_;
  const void* split_to_;
  int fail_at_;
};

// Makes every call of `storage` made while the calling thread holds the mutex of `probe->cache`
// fail (Internal), counted in probe->storage_under_lock. The cache's storage calls are made on
// the caller's thread (StorageBackend::CheckCaller runs there), so the check sees the lock.
struct StorageMutexProbe {
  std::atomic<const HierarchicalCache*> cache{nullptr};
  std::atomic<int> storage_under_lock{0};
  std::atomic<int> storage_calls{0};
};
inline std::shared_ptr<StorageMutexProbe> FailStorageCallsUnderCacheMutex(
    FaultInjectingStorage& storage) {
  auto probe = std::make_shared<StorageMutexProbe>();
  storage.SetCallerCheck([probe](std::string_view call) {
    ++probe->storage_calls;
    const HierarchicalCache* c = probe->cache.load();
    if (c == nullptr || !c->MutexHeldByCurrentThread()) return Status::OK();
    ++probe->storage_under_lock;
    return Status::Internal(std::string("storage ") + std::string(call) +
                            " with the cache's mutex held");
  });
  return probe;
}

inline std::vector<uint64_t> Hashes(std::span<const Token> tokens, std::string_view ns) {
  return KvPatternHashes(tokens, KvPatternSalt(ns));
}

// What was ever inserted, by any cache: the whole-page prefixes of each (namespace, prompt). No
// match may be longer than Longest. Thread-safe.
class InsertedPrefixes {
 public:
  explicit InsertedPrefixes(int64_t page) : page_(static_cast<size_t>(page)) {}
  void Add(const std::string& ns, std::span<const Token> tokens) {
    std::lock_guard<std::mutex> lk(mu_);
    for (size_t n = page_; n <= tokens.size(); n += page_) set_.insert(Key(ns, tokens.first(n)));
  }
  int64_t Longest(const std::string& ns, std::span<const Token> tokens) const {
    std::lock_guard<std::mutex> lk(mu_);
    int64_t best = 0;
    for (size_t n = page_; n <= tokens.size(); n += page_) {
      if (!set_.count(Key(ns, tokens.first(n)))) break;
      best = static_cast<int64_t>(n);
    }
    return best;
  }

 private:
  static std::string Key(const std::string& ns, std::span<const Token> t) {
    std::string k = ns + '\0';
    k.append(reinterpret_cast<const char*>(t.data()), t.size() * sizeof(Token));
    return k;
  }
  const size_t page_;
  mutable std::mutex mu_;
  std::set<std::string> set_;
};

}  // namespace kvtier::testing
