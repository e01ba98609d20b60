// Internal: moves whole pages of a host KV pool to and from a storage backend, for the layouts
// where a page is not one contiguous range per buffer.
//
// A page of a page_first, page_first_direct or page_head pool is one contiguous range of K (and
// one of V), so it goes to the backend as it is: the backend reads and writes the pool's memory
// (zero copies). A page of a layer_first pool is num_layers ranges per buffer; it is gathered
// into a staging buffer in page_first order (K of the page, then V) with the cpu transfer backend
// before a Set, and a Get lands in a staging buffer that is scattered into the pool afterwards
// (its hits only). Either way a stored page of a layer_first pool holds the same bytes a
// page_first pool of that geometry would store.
//
// Staging buffers belong to one call; a few are kept for reuse, so a steady stream of batches
// does not fault in fresh memory for every call.
//
// Thread safety: GetAsync and SetAsync may be called from any thread and run concurrently; the
// pool's pages named by one call must not be touched by anyone else until its `done` has run.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <vector>

#include "kvtier/storage_backend.h"
#include "kvtier/transfer.h"

namespace kvtier::storage {

class PageStaging {
 public:
  // `host` is the pool's region (host memory, pointers valid for this object's life); pages
  // start at slots that are multiples of `host.geometry.page_size`. InvalidArgument for a region
  // in device memory or one that does not validate.
  static Result<std::unique_ptr<PageStaging>> Create(const KvRegion& host);
  ~PageStaging();

  // True when pages go to the backend straight from the pool's memory (not layer_first).
  bool zero_copy() const { return zero_copy_; }
  // Bytes of one page (every buffer): the backend's ns().page_bytes().
  int64_t page_bytes() const { return page_bytes_; }

  // Reads page keys[i] into the pool's page that starts at slot page_starts[i], through
  // backend.GetAsync; `done` gets the backend's result (a layer_first page is in the pool when its
  // status is kOk; the pool's bytes of any other page are unchanged).
  // REQUIRES: keys.size() == page_starts.size(); each start a page start of the pool, distinct.
  void GetAsync(StorageBackend& backend, std::vector<PageKey> keys,
                std::span<const int64_t> page_starts, std::function<void(BatchResult)> done);
  // Writes the pool's pages through backend.SetAsync. A layer_first batch is gathered in the
  // calling thread before the call is queued. Same requirements as GetAsync.
  void SetAsync(StorageBackend& backend, std::vector<PageKey> keys,
                std::span<const int64_t> page_starts, std::function<void(BatchResult)> done);
  // The same with each page's parent (StorageBackend::SetAsync with parents; empty: unknown).
  void SetAsync(StorageBackend& backend, std::vector<PageKey> keys,
                std::vector<std::optional<PageKey>> parents, std::span<const int64_t> page_starts,
                std::function<void(BatchResult)> done);

 private:
  // One call's staging memory: `pages` pages, K of all pages then V of all pages (MLA: K only),
  // as a page_first region of pages * page_size slots.
  struct Staging {
    std::unique_ptr<std::byte[]> memory;
    int64_t capacity_pages = 0;
    KvRegion region;
  };

  PageStaging(const KvRegion& host, std::unique_ptr<TransferEngine> cpu);
  PageBuffer PoolPage(int64_t page_start) const;
  // The backend's page buffers straight over these pool pages (zero copy).
  std::vector<PageBuffer> PoolPages(std::span<const int64_t> page_starts) const;
  std::shared_ptr<Staging> TakeStaging(int64_t pages);
  void ReturnStaging(std::shared_ptr<Staging> staging);
  // The backend's page buffers over the first `n` pages of `staging`.
  std::vector<PageBuffer> StagedPages(const Staging& staging, int64_t n) const;
  // Copies the listed pages between the pool and `staging` (page i of the list <-> staging page
  // `staged[i]`); to_staging: pool -> staging (gather), else staging -> pool (scatter).
  Status Move(Staging& staging, std::span<const int64_t> page_starts,
              std::span<const int64_t> staged, bool to_staging) const;

  const KvRegion host_;
  const bool zero_copy_;
  const int64_t page_bytes_;
  std::unique_ptr<TransferEngine> cpu_;  // layer_first only

  std::mutex mu_;
  std::vector<std::shared_ptr<Staging>> idle_;  // guarded by mu_
};

}  // namespace kvtier::storage
