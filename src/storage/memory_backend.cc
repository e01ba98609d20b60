// The `memory://` backend (memory_backend.h).
//
// A MemoryStore maps (namespace hash, key) to an encoded value (header ‖ payload, page_format.h)
// and keeps an LRU list over them. Invariants (under `mu`): `bytes` is the sum of the values'
// sizes and never exceeds `capacity` after a Set returns; `lru` holds exactly the map's entries,
// most recently used first. Values are immutable once stored and shared by pointer, so a Get
// copies its bytes out without holding the lock.
//
// Thread safety: a store's state is guarded by its mutex; the registry of named stores by its own.
#include "storage/memory_backend.h"

#include <fmt/format.h>

#include <list>
#include <map>
#include <mutex>
#include <unordered_map>

#include "storage/page_format.h"
#include "storage/storage_url.h"

namespace kvtier::storage {
namespace {

using Clock = std::chrono::steady_clock;
using Value = std::vector<std::byte>;
constexpr int64_t kDefaultCapacity = int64_t{1} << 30;

struct StoredName {
  uint64_t namespace_hash;
  PageKey key;
  friend bool operator==(const StoredName&, const StoredName&) = default;
};
struct StoredNameHash {
  size_t operator()(const StoredName& n) const noexcept {
    return PageKeyHash{}(n.key) ^ static_cast<size_t>(n.namespace_hash);
  }
};

class MemoryStore {
 public:
  explicit MemoryStore(int64_t capacity) : capacity_(capacity) {}
  int64_t capacity() const { return capacity_; }

  std::shared_ptr<const Value> Find(const StoredName& name, bool touch) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = map_.find(name);
    if (it == map_.end()) return nullptr;
    if (touch) lru_.splice(lru_.begin(), lru_, it->second.lru_pos);
    return it->second.value;
  }

  // False when the value alone exceeds the capacity.
  bool Insert(const StoredName& name, std::shared_ptr<const Value> value) {
    const int64_t size = static_cast<int64_t>(value->size());
    if (size > capacity_) return false;
    std::lock_guard<std::mutex> lock(mu_);
    EraseLocked(name);
    while (bytes_ + size > capacity_ && !lru_.empty()) {
      EraseLocked(lru_.back());
      ++evicted_;
    }
    lru_.push_front(name);
    map_.emplace(name, Entry{std::move(value), lru_.begin()});
    bytes_ += size;
    return true;
  }

  void Erase(const StoredName& name) {
    std::lock_guard<std::mutex> lock(mu_);
    EraseLocked(name);
  }

  void Fill(StorageStats& stats) const {
    std::lock_guard<std::mutex> lock(mu_);
    stats.stored_pages = static_cast<int64_t>(map_.size());
    stats.stored_bytes = bytes_;
    stats.capacity_bytes = capacity_;
    stats.evicted_pages = evicted_;
  }

 private:
  struct Entry {
    std::shared_ptr<const Value> value;
    std::list<StoredName>::iterator lru_pos;
  };

  void EraseLocked(const StoredName& name) {
    auto it = map_.find(name);
    if (it == map_.end()) return;
    bytes_ -= static_cast<int64_t>(it->second.value->size());
    lru_.erase(it->second.lru_pos);
    map_.erase(it);
  }

  const int64_t capacity_;
  mutable std::mutex mu_;
  std::unordered_map<StoredName, Entry, StoredNameHash> map_;
  std::list<StoredName> lru_;
  int64_t bytes_ = 0;
  int64_t evicted_ = 0;
};

// Named stores shared within the process; a store lives while a backend holds it.
std::mutex registry_mu;
std::map<std::string, std::weak_ptr<MemoryStore>, std::less<>>& Registry() {
  static auto* registry = new std::map<std::string, std::weak_ptr<MemoryStore>, std::less<>>();
  return *registry;
}

class MemoryBackend final : public StorageBackend {
 public:
  MemoryBackend(std::string url, const StorageNamespace& ns, const StorageOptions& options,
                std::shared_ptr<MemoryStore> store)
      : StorageBackend(std::move(url), ns, options),
        store_(std::move(store)),
        namespace_hash_(ns.Hash()) {}
  ~MemoryBackend() override { Close(); }

  Status Open() { return Start(); }

 protected:
  ExistsResult DoExists(std::span<const PageKey> keys, Clock::time_point deadline) override {
    ExistsResult r;
    for (const PageKey& key : keys) {
      if (Clock::now() > deadline) break;  // what is known so far is a valid (shorter) prefix
      if (store_->Find({namespace_hash_, key}, /*touch=*/false) == nullptr) break;
      ++r.leading;
    }
    return r;
  }

  void DoGet(std::span<const PageKey> keys, std::span<const PageBuffer> buffers,
             std::span<PageStatus> out, Clock::time_point deadline) override {
    for (size_t i = 0; i < keys.size(); ++i) {
      if (Clock::now() > deadline) {
        out[i] = PageStatus::kTimedOut;
        continue;
      }
      auto value = store_->Find({namespace_hash_, keys[i]}, /*touch=*/true);
      out[i] = value == nullptr ? PageStatus::kAbsent
                                : ReadPageValue(*value, namespace_hash_, keys[i], buffers[i]);
    }
  }

  void DoSet(std::span<const PageKey> keys, std::span<const PageBuffer> buffers,
             std::span<PageStatus> out, Clock::time_point deadline) override {
    for (size_t i = 0; i < keys.size(); ++i) {
      if (Clock::now() > deadline) {
        out[i] = PageStatus::kTimedOut;
        continue;
      }
      auto value =
          std::make_shared<Value>(kPageHeaderBytes + static_cast<size_t>(buffers[i].bytes()));
      EncodePageValue(namespace_hash_, keys[i], buffers[i], *value);
      out[i] = store_->Insert({namespace_hash_, keys[i]}, std::move(value)) ? PageStatus::kOk
                                                                            : PageStatus::kNoSpace;
    }
  }

  void DoRemove(std::span<const PageKey> keys, std::span<PageStatus> out,
                Clock::time_point /*deadline*/) override {
    for (size_t i = 0; i < keys.size(); ++i) {
      store_->Erase({namespace_hash_, keys[i]});
      out[i] = PageStatus::kOk;
    }
  }

  void FillStats(StorageStats& stats) const override { store_->Fill(stats); }

 private:
  const std::shared_ptr<MemoryStore> store_;
  const uint64_t namespace_hash_;
};

bool IsStoreName(std::string_view name) {
  for (char c : name) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '-' || c == '_' || c == '.';
    if (!ok) return false;
  }
  return true;
}

}  // namespace

Result<std::unique_ptr<StorageBackend>> OpenMemoryStorage(std::string_view url,
                                                          const StorageNamespace& ns,
                                                          const StorageOptions& options) {
  KVTIER_ASSIGN_OR_RETURN(StorageUrl parsed, ParseStorageUrl(url));
  KVTIER_ASSIGN_OR_RETURN(std::optional<int64_t> capacity, parsed.TakeByteSize("capacity"));
  KVTIER_RETURN_IF_ERROR(parsed.CheckAllTaken(url));
  if (capacity && *capacity < 1) {
    return Status::InvalidArgument(
        fmt::format("storage URL '{}': capacity must be at least 1 byte", RedactUrl(url)));
  }
  const std::string& name = parsed.rest;
  if (!IsStoreName(name)) {
    return Status::InvalidArgument(
        fmt::format("storage URL '{}': a memory store name is letters, digits, '-', '_' and '.'",
                    RedactUrl(url)));
  }
  std::shared_ptr<MemoryStore> store;
  if (name.empty()) {
    store = std::make_shared<MemoryStore>(capacity.value_or(kDefaultCapacity));
  } else {
    std::lock_guard<std::mutex> lock(registry_mu);
    auto& slot = Registry()[name];
    store = slot.lock();
    if (store == nullptr) {
      store = std::make_shared<MemoryStore>(capacity.value_or(kDefaultCapacity));
      slot = store;
    } else if (capacity && *capacity != store->capacity()) {
      return Status::InvalidArgument(
          fmt::format("storage URL '{}': memory store '{}' is open with capacity {} bytes, not {}",
                      url, name, store->capacity(), *capacity));
    }
  }
  auto backend = std::make_unique<MemoryBackend>(fmt::format("memory://{}", name), ns, options,
                                                 std::move(store));
  KVTIER_RETURN_IF_ERROR(backend->Open());
  return std::unique_ptr<StorageBackend>(std::move(backend));
}

}  // namespace kvtier::storage
