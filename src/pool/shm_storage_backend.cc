// The shared host tier behind the StorageBackend interface (OpenSharedHostStorage in
// kvtier/shared_host_pool.h), so that a HierarchicalCache shares pages with other processes
// through its storage tier: QueryStorage (Exists) finds the pages other processes published after
// the local tree match, Prefetch (Get) copies them out of the segment, and backups (Set) publish
// pages — a page another process published already is not copied again.
//
// A page's payload is its bytes in the segment: buffer 0's range of the page, then buffer 1's
// (page_first, page_first_direct and page_head keep one page of one buffer contiguous), exactly
// the PageBuffer a cache hands over for a host page of the same layout.
//
// Thread safety: the hooks run on the backend's I/O threads; the pool's index serialises them
// with every other process.
#include <fmt/format.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <optional>
#include <unordered_set>
#include <utility>
#include <vector>

#include "kvtier/shared_host_pool.h"
#include "kvtier/storage_backend.h"

namespace kvtier {

namespace {

using Clock = std::chrono::steady_clock;

class SharedHostStorage final : public StorageBackend {
 public:
  SharedHostStorage(std::shared_ptr<SharedHostPool> pool, const StorageNamespace& ns,
                    const StorageOptions& options)
      : StorageBackend("shm://" + pool->name(), ns, options),
        pool_(std::move(pool)),
        namespace_hash_(ns.Hash()) {
    const KvGeometry& g = pool_->geometry();
    page_buffer_bytes_ = g.num_layers * g.page_size * g.slot_bytes;
  }
  ~SharedHostStorage() override { Close(); }

  Status Open() { return Start(); }

 protected:
  ExistsResult DoExists(std::span<const PageKey> keys, Clock::time_point) override {
    ExistsResult r;
    Result<std::vector<int64_t>> pages = pool_->PinPrefix(namespace_hash_, keys);
    if (!pages.ok()) {
      r.status = pages.status();
      return r;
    }
    r.leading = static_cast<int64_t>(pages->size());
    r.status = pool_->Unpin(*pages);
    if (!r.status.ok()) r.leading = 0;
    return r;
  }

  void DoGet(std::span<const PageKey> keys, std::span<const PageBuffer> buffers,
             std::span<PageStatus> out, Clock::time_point deadline) override {
    Result<std::vector<int64_t>> pages = pool_->PinPrefix(namespace_hash_, keys);
    if (!pages.ok()) {
      for (PageStatus& s : out) s = PageStatus::kFailed;
      return;
    }
    for (size_t i = 0; i < keys.size(); ++i) {
      if (i >= pages->size()) {
        out[i] = PageStatus::kAbsent;
      } else if (Clock::now() > deadline) {
        out[i] = PageStatus::kTimedOut;
      } else {
        CopyPage((*pages)[i], buffers[i], /*to_pool=*/false);
        out[i] = PageStatus::kOk;
      }
    }
    if (!pool_->Unpin(*pages).ok()) {
      for (PageStatus& s : out) s = PageStatus::kFailed;
    }
  }

  void DoSet(std::span<const PageKey> keys, std::span<const PageBuffer> buffers,
             std::span<PageStatus> out, Clock::time_point deadline) override {
    Publish(keys, buffers, {}, out, deadline);
  }

  // The segment records each page's parent and evicts a chain's tail before its head; a page
  // whose parent is not in the segment is not written (kFailed: no lookup would reach it). A
  // parent that another batch of this store is still writing (a long prompt's store is several
  // batches, which may run out of order) is not taken for gone: that one link is left out (the
  // page is published as a chain's first) rather than the batch refused.
  void DoSetChained(std::span<const PageKey> keys, std::span<const PageBuffer> buffers,
                    std::span<const std::optional<PageKey>> parents, std::span<PageStatus> out,
                    Clock::time_point deadline) override {
    std::vector<std::optional<PageKey>> linked(parents.begin(), parents.end());
    std::unordered_set<PageKey, PageKeyHash> batch(keys.begin(), keys.end());
    for (std::optional<PageKey>& parent : linked) {
      if (parent && batch.count(*parent) == 0 && WritePending(*parent)) parent.reset();
    }
    Publish(keys, buffers, linked, out, deadline);
  }

  // The shared tier evicts by its own LRU across processes; removing one process's keys is not
  // offered.
  void DoRemove(std::span<const PageKey>, std::span<PageStatus> out, Clock::time_point) override {
    for (PageStatus& s : out) s = PageStatus::kFailed;
  }

  void FillStats(StorageStats& stats) const override {
    const KvGeometry& g = pool_->geometry();
    stats.capacity_bytes = g.num_pages() * page_buffer_bytes_ * pool_->region().num_buffers();
  }

 private:
  // Reserve (with `parents`: empty or one per key) -> copy -> Commit.
  void Publish(std::span<const PageKey> keys, std::span<const PageBuffer> buffers,
               std::span<const std::optional<PageKey>> parents, std::span<PageStatus> out,
               Clock::time_point deadline) {
    Result<std::vector<PageReservation>> reserved = pool_->Reserve(namespace_hash_, keys, parents);
    if (!reserved.ok()) {
      for (PageStatus& s : out) s = PageStatus::kFailed;
      return;
    }
    std::vector<int64_t> written, abandoned;
    for (size_t i = 0; i < keys.size(); ++i) {
      const PageReservation& r = (*reserved)[i];
      switch (r.outcome) {
        case ReserveOutcome::kReserved:
          if (Clock::now() > deadline) {
            abandoned.push_back(r.page);
            out[i] = PageStatus::kTimedOut;
          } else {
            CopyPage(r.page, buffers[i], /*to_pool=*/true);
            written.push_back(r.page);
            out[i] = PageStatus::kOk;
          }
          break;
        case ReserveOutcome::kAlreadyReady:  // published already: not copied twice
          out[i] = PageStatus::kOk;
          break;
        case ReserveOutcome::kBeingWritten:  // another process is publishing the same bytes
        case ReserveOutcome::kNoSpace:
        case ReserveOutcome::kNoParent:
          out[i] = PageStatus::kFailed;
          break;
      }
    }
    const bool committed = pool_->Commit(written).ok();
    (void)pool_->Abort(abandoned);
    if (!committed) {
      for (PageStatus& s : out) {
        if (s == PageStatus::kOk) s = PageStatus::kFailed;
      }
    }
  }

  // REQUIRES: the page pinned (reading) or WRITING for this process (writing); the buffer holds
  // ns().page_bytes() bytes.
  void CopyPage(int64_t page, const PageBuffer& buffer, bool to_pool) const {
    const KvRegion& region = pool_->region();
    int segment = 0;
    size_t offset = 0;  // within buffer.segments[segment]
    for (int b = 0; b < region.num_buffers(); ++b) {
      std::byte* base = region.LayerBase(b, 0) + page * page_buffer_bytes_;
      int64_t left = page_buffer_bytes_;
      while (left > 0) {
        std::span<std::byte> seg = buffer.segments[segment];
        const int64_t n = std::min<int64_t>(left, static_cast<int64_t>(seg.size() - offset));
        std::byte* chunk = seg.data() + offset;
        if (to_pool) {
          std::memcpy(base, chunk, static_cast<size_t>(n));
        } else {
          std::memcpy(chunk, base, static_cast<size_t>(n));
        }
        base += n;
        left -= n;
        offset += static_cast<size_t>(n);
        if (offset == seg.size()) {
          ++segment;
          offset = 0;
        }
      }
    }
  }

  std::shared_ptr<SharedHostPool> pool_;
  const uint64_t namespace_hash_;
  int64_t page_buffer_bytes_ = 0;  // one buffer's bytes of one page: L * P * S
};

}  // namespace

Result<std::unique_ptr<StorageBackend>> OpenSharedHostStorage(std::shared_ptr<SharedHostPool> pool,
                                                              const StorageNamespace& ns,
                                                              const StorageOptions& options) {
  if (pool == nullptr) return Status::InvalidArgument("OpenSharedHostStorage: pool is null");
  KVTIER_RETURN_IF_ERROR(ns.Validate());
  KVTIER_RETURN_IF_ERROR(options.Validate());
  const KvGeometry& g = pool->geometry();
  const auto mismatch = [&](const char* field, auto pool_value, auto ns_value) {
    return Status::InvalidArgument(fmt::format(
        "OpenSharedHostStorage: {} is {} in shared host pool '{}' but {} in the namespace", field,
        pool_value, pool->name(), ns_value));
  };
  if (g.layout == KvLayout::kLayerFirst) {
    return Status::InvalidArgument(fmt::format(
        "OpenSharedHostStorage: shared host pool '{}' is layer_first; a storage tier needs a "
        "layout that keeps a page contiguous (page_first, page_first_direct, page_head)",
        pool->name()));
  }
  if (g.layout != ns.layout) return mismatch("layout", LayoutName(g.layout), LayoutName(ns.layout));
  if (pool->region().mla != ns.mla) return mismatch("mla", pool->region().mla, ns.mla);
  if (g.num_layers != ns.num_layers) return mismatch("num_layers", g.num_layers, ns.num_layers);
  if (g.slot_bytes != ns.slot_bytes) return mismatch("slot_bytes", g.slot_bytes, ns.slot_bytes);
  if (g.page_size != ns.page_size) return mismatch("page_size", g.page_size, ns.page_size);
  if (g.head_num != ns.head_num) return mismatch("head_num", g.head_num, ns.head_num);
  auto backend = std::make_unique<SharedHostStorage>(std::move(pool), ns, options);
  KVTIER_RETURN_IF_ERROR(backend->Open());
  return std::unique_ptr<StorageBackend>(std::move(backend));
}

}  // namespace kvtier
