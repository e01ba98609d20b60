// The `memory://` backend (memory_backend.h).
//
// A MemoryStore maps (namespace hash, key) to an encoded value (header ‖ payload, page_format.h)
// and keeps their eviction order: LRU among the pages no stored page names as parent (a chain's
// tail before its head, chain_lru.h), skipping pinned keys (`pins`, shared by every backend on
// the store); a Set that finds no unpinned room is refused (kNoSpace). Invariants (under `mu`):
// `order` holds exactly the map's names; its bytes, the sum of the values' sizes, never exceed
// `capacity` after a Set returns. Values are immutable once stored and shared by pointer, so a Get
// copies its bytes out without holding the lock.
//
// Thread safety: a store's state is guarded by its mutex; the registry of named stores by its own.
#include "storage/memory/memory_backend.h"

#include <fmt/format.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <mutex>
#include <new>
#include <optional>
#include <unordered_map>

#include "storage/chain_lru.h"
#include "storage/page_format.h"
#include "storage/page_pins.h"
#include "storage/storage_url.h"
#include "util/log.h"

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
    if (touch) order_.Touch(name);
    return it->second;
  }

  // False when the value alone exceeds the capacity. `parent`: the page before it in its prompt
  // (nullopt: a first page, unknown, or the one recorded before). Evicts down to the capacity,
  // a chain's tail before its head (chain_lru.h).
  // The names it evicted are appended to `evicted` (when given).
  bool Insert(const StoredName& name, std::shared_ptr<const Value> value,
              const std::optional<StoredName>& parent, std::vector<StoredName>* evicted = nullptr) {
    const int64_t size = static_cast<int64_t>(value->size());
    if (size > capacity_) return false;
    std::lock_guard<std::mutex> lock(mu_);
    map_[name] = std::move(value);
    order_.Add(name, size, parent, /*newest=*/true);
    const auto pinned = [this](const StoredName& n) { return pins.Pinned(n.key); };
    using Reason = ChainLru<StoredName, StoredNameHash>::VictimReason;
    while (order_.bytes() > capacity_) {
      const auto victim = order_.Victim(&name, pinned);
      // Pinned pages leave no room for it: nothing else to evict, or only itself where it would
      // not go without pins (a chain's tail longer than the room still goes, and the Set is ok).
      if (victim.reason == Reason::kNone || victim.reason == Reason::kKeepSkipped) {
        map_.erase(name);
        order_.Erase(name);
        return false;
      }
      if (evicted != nullptr) evicted->push_back(*victim.key);
      map_.erase(*victim.key);
      order_.Evict(*victim.key);
      ++evicted_;
    }
    return true;
  }

  // Whether `name` is not stored and was evicted here (OrphansToSkip in chain_lru.h).
  bool Gone(const StoredName& name) const {
    std::lock_guard<std::mutex> lock(mu_);
    return map_.count(name) == 0 && order_.Evicted(name);
  }

  // Evicts `name` when `parent` is not stored and either in the same Set or evicted here
  // (DropOrphans in chain_lru.h). Whether it did.
  bool DropOrphan(const StoredName& name, const StoredName& parent, bool parent_in_batch) {
    std::lock_guard<std::mutex> lock(mu_);
    if (map_.count(parent) != 0 || map_.count(name) == 0) return false;
    if (!parent_in_batch && !order_.Evicted(parent)) return false;
    map_.erase(name);
    order_.Evict(name);
    ++evicted_;
    return true;
  }

  void Erase(const StoredName& name) {
    std::lock_guard<std::mutex> lock(mu_);
    map_.erase(name);
    order_.Erase(name);
  }

  // The keys of namespace `namespace_hash`'s pages.
  std::vector<PageKey> Keys(uint64_t namespace_hash) const {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<PageKey> keys;
    for (const auto& [name, value] : map_) {
      if (name.namespace_hash == namespace_hash) keys.push_back(name.key);
    }
    return keys;
  }

  PagePins pins;  // keys eviction skips (its own lock, a leaf under mu_)

  void Fill(StorageStats& stats) const {
    std::lock_guard<std::mutex> lock(mu_);
    stats.stored_pages = static_cast<int64_t>(map_.size());
    stats.stored_bytes = order_.bytes();
    stats.capacity_bytes = capacity_;
    stats.evicted_pages = evicted_;
  }

 private:
  const int64_t capacity_;
  mutable std::mutex mu_;
  std::unordered_map<StoredName, std::shared_ptr<const Value>, StoredNameHash> map_;
  ChainLru<StoredName, StoredNameHash> order_;  // the same names, their sizes and parents
  int64_t evicted_ = 0;
};

// Named stores shared within the process; a store lives while a backend holds it.
std::mutex registry_mu;
std::map<std::string, std::weak_ptr<MemoryStore>, std::less<>>& Registry() {
  static auto* registry = new std::map<std::string, std::weak_ptr<MemoryStore>, std::less<>>();
  return *registry;
}

// Page i's outcome is `one(i)`, in order, or kTimedOut once the deadline has passed.
template <typename One>
void EachBeforeDeadline(std::span<PageStatus> out, Clock::time_point deadline, One one) {
  for (size_t i = 0; i < out.size(); ++i) {
    out[i] = Clock::now() > deadline ? PageStatus::kTimedOut : one(i);
  }
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
    EachBeforeDeadline(out, deadline, [&](size_t i) {
      auto value = store_->Find({namespace_hash_, keys[i]}, /*touch=*/true);
      return value == nullptr ? PageStatus::kAbsent
                              : ReadPageValue(*value, namespace_hash_, keys[i], buffers[i]);
    });
  }

  void DoSet(std::span<const PageKey> keys, std::span<const PageBuffer> buffers,
             std::span<PageStatus> out, Clock::time_point deadline) override {
    DoSetChained(keys, buffers, {}, out, deadline);
  }

  // `parents` empty: unknown.
  void DoSetChained(std::span<const PageKey> keys, std::span<const PageBuffer> buffers,
                    std::span<const std::optional<PageKey>> parents, std::span<PageStatus> out,
                    Clock::time_point deadline) override {
    const std::vector<uint8_t> skip = OrphansToSkip(keys, parents, [this](const PageKey& p) {
      return !WritePending(p) && store_->Gone({namespace_hash_, p});
    });
    EachBeforeDeadline(out, deadline, [&](size_t i) {
      if (skip[i]) return PageStatus::kSkipped;
      std::shared_ptr<Value> value;
      try {
        value = std::make_shared<Value>(kPageHeaderBytes + static_cast<size_t>(buffers[i].bytes()));
      } catch (const std::bad_alloc&) {
        // The process cannot allocate the page (an address-space limit, an exhausted machine):
        // no room, like a full store; said at the 1st, 2nd, 4th ... time.
        const int64_t n = alloc_failed_.fetch_add(1, std::memory_order_relaxed) + 1;
        if ((n & (n - 1)) == 0) {
          util::Log(util::LogLevel::kWarning,
                    "storage {}: out of memory: a page of {} bytes could not be allocated ({} "
                    "so far; lower ?capacity=)",
                    url(), static_cast<int64_t>(kPageHeaderBytes) + buffers[i].bytes(), n);
        }
        return PageStatus::kNoSpace;
      }
      EncodePageValue(namespace_hash_, keys[i], buffers[i], *value);
      std::optional<StoredName> parent;
      if (i < parents.size() && parents[i]) parent = StoredName{namespace_hash_, *parents[i]};
      std::vector<StoredName> evicted;
      const bool ok =
          store_->Insert({namespace_hash_, keys[i]}, std::move(value), parent, &evicted);
      // KV events: the cache tells its listeners (TrackEvictions). Pages of other namespaces a
      // named store shares are their backends' (which do not learn of this eviction: tests).
      for (const StoredName& e : evicted) {
        if (e.namespace_hash == namespace_hash_) NoteEvicted({&e.key, 1});
      }
      return ok ? PageStatus::kOk : PageStatus::kNoSpace;
    });
    DropOrphans(
        keys, parents, out, [this](const PageKey& p) { return WritePending(p); },
        [this](const PageKey& k, const PageKey& p, bool in_batch) {
          // A dropped page counts as evicted (chain_lru.h): its listeners learn of it as the file
          // store's do (FileIndex's removal callback).
          const bool dropped =
              store_->DropOrphan({namespace_hash_, k}, {namespace_hash_, p}, in_batch);
          if (dropped) NoteEvicted({&k, 1});
          return dropped;
        });
  }

  void DoRemove(std::span<const PageKey> keys, std::span<PageStatus> out,
                Clock::time_point /*deadline*/) override {
    for (size_t i = 0; i < keys.size(); ++i) {
      store_->Erase({namespace_hash_, keys[i]});
      out[i] = PageStatus::kOk;
    }
  }

  Result<uint64_t> DoPinPages(std::span<const PageKey> keys,
                              std::chrono::nanoseconds ttl) override {
    return store_->pins.Add(keys, ttl);
  }
  Status DoUnpinPages(uint64_t pin) override {
    if (store_->pins.Remove(pin)) return Status::OK();
    return Status::InvalidArgument(fmt::format("UnpinPages: no live pin {}", pin));
  }

  Result<std::vector<PageKey>> DoStoredKeys() override { return store_->Keys(namespace_hash_); }

  void FillStats(StorageStats& stats) const override { store_->Fill(stats); }

 private:
  const std::shared_ptr<MemoryStore> store_;
  const uint64_t namespace_hash_;
  std::atomic<int64_t> alloc_failed_{0};
};

// The most bytes this process can hope to allocate: the machine's memory, the address-space and
// data limits (RLIMIT_AS, RLIMIT_DATA: `ulimit -v`, `ulimit -d`) where set.
int64_t AllocatableBytes(const char** limited_by) {
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
  int64_t most = pages > 0 && page > 0 ? int64_t{pages} * page : int64_t{1} << 62;
  *limited_by = "the machine's memory";
  for (auto [resource, name] : {std::pair{RLIMIT_AS, "the address-space limit (ulimit -v)"},
                                std::pair{RLIMIT_DATA, "the data limit (ulimit -d)"}}) {
    rlimit limit;
    if (::getrlimit(resource, &limit) == 0 && limit.rlim_cur != RLIM_INFINITY &&
        static_cast<uint64_t>(limit.rlim_cur) < static_cast<uint64_t>(most)) {
      most = static_cast<int64_t>(limit.rlim_cur);
      *limited_by = name;
    }
  }
  return most;
}

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
  const int64_t page_value_bytes = static_cast<int64_t>(kPageHeaderBytes) + ns.page_bytes();
  if (capacity && *capacity < page_value_bytes) {
    return Status::InvalidArgument(fmt::format(
        "storage URL '{}': capacity must hold at least one page ({} bytes: the page's {} and "
        "its {}-byte header)",
        RedactUrl(url), page_value_bytes, ns.page_bytes(), kPageHeaderBytes));
  }
  const std::string& name = parsed.rest;
  if (!IsStoreName(name)) {
    return Status::InvalidArgument(
        fmt::format("storage URL '{}': a memory store name is letters, digits, '-', '_' and '.'",
                    RedactUrl(url)));
  }
  // A capacity the process could never fill would end in a failed allocation deep in a Set:
  // refused here, naming what limits it.
  const char* limited_by = "";
  const int64_t allocatable = AllocatableBytes(&limited_by);
  if (capacity.value_or(kDefaultCapacity) > allocatable) {
    return Status::OutOfMemory(fmt::format(
        "storage URL '{}': capacity {} bytes is more than this process can allocate ({} bytes: "
        "{}); give a smaller ?capacity=",
        RedactUrl(url), capacity.value_or(kDefaultCapacity), allocatable, limited_by));
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
