// Internal: the cache's host tier — where the host pages of the tree come from and where they go
// back to. Two implementations, one job each:
//   LocalHostTier   the cache's own HostKvPool: pages are allocated anonymously (keys unused) and
//                   freed; a page is held from Acquire until Release.
//   SharedHostTier  a SharedHostPool segment shared by several processes: a page is published by
//                   key (Reserve -> write -> Commit), found by key (PinPrefix), and held while
//                   this process pins it. Release unpins: the page stays READY and findable by
//                   key (by this process and others) until the segment's LRU evicts it for a
//                   Reserve. The per-process budget (num_pages) counts the pages held.
// Page numbers are page starts (the first host slot of a page) in both, as the tree keeps them.
//
// Thread safety: none; the cache calls it under its mutex. The segment calls take the segment's
// own (process-shared) lock for bookkeeping only; no page byte is touched here.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "kvtier/host_pool.h"
#include "kvtier/layout.h"
#include "kvtier/page_key.h"
#include "kvtier/shared_host_pool.h"
#include "kvtier/status.h"

namespace kvtier {

class HostTier {
 public:
  // What Acquire got for one page.
  enum class Got : uint8_t {
    kWrite = 0,  // a page to write the bytes into; Publish or Abandon it afterwards
    kReady = 1,  // a page that holds the bytes already (published by someone); held, no write
    kBusy = 2,   // nothing: another process is writing this key now
    kNone = 3,   // nothing: no room
  };
  struct Page {
    Got got = Got::kNone;
    int64_t start = -1;  // page start, for kWrite and kReady
  };

  virtual ~HostTier() = default;

  virtual const KvRegion& region() const = 0;
  // The pages this cache may hold at once, pages held now, and what is left.
  virtual int64_t num_pages() const = 0;
  virtual int64_t held_pages() const = 0;
  int64_t free_pages() const { return num_pages() - held_pages(); }
  virtual int64_t capacity_bytes() const = 0;
  // Whether the cache holds the page starting at `start`.
  virtual bool Holds(int64_t start) const = 0;
  // Whether pages are found and published by key (and keys are required).
  virtual bool shared() const = 0;

  // Pages for `count` pages of bytes, in order. `keys`: empty or one per page (the shared tier
  // needs them), one chain: keys[i]'s parent is keys[i - 1] and keys[0]'s is `first_parent` (the
  // last key of the node above, nullopt at the root), which the shared tier records so that its
  // segment evicts a chain's tail before its head. REQUIRES: count <= free_pages(). The local
  // tier answers kWrite for all or fails (OutOfMemory); the shared tier answers per key.
  virtual Result<std::vector<Page>> Acquire(
      int64_t count, std::span<const PageKey> keys,
      const std::optional<PageKey>& first_parent = std::nullopt) = 0;
  // The kWrite pages' bytes are complete (a GPU copy into them synchronised); they stay held.
  virtual Status Publish(std::span<const int64_t> starts) = 0;
  // The write into these kWrite pages failed: they are let go, unpublished.
  virtual Status Abandon(std::span<const int64_t> starts) = 0;
  // Lets go held pages (written and published, or kReady).
  virtual Status Release(std::span<const int64_t> starts) = 0;
  // Holds the pages of the longest prefix of `keys` that holds the bytes already, at most
  // `max_pages`; returns their starts. The local tier finds nothing.
  virtual Result<std::vector<int64_t>> FindPrefix(std::span<const PageKey> keys,
                                                  int64_t max_pages) = 0;
};

// REQUIRES: pool != null.
std::unique_ptr<HostTier> MakeLocalHostTier(std::unique_ptr<HostKvPool> pool);
// The segment's pages for a cache whose device tier is `device`: keys are published and found
// under the hash of a StorageNamespace (model_id, the segment's layout, the device's shape), at
// most `budget_bytes` of pages held at once (at least one page, at most the segment).
// InvalidArgument naming the field when the segment's pages do not fit the device's (page_size,
// num_layers, slot_bytes, MLA) or, with `gpu`, the segment is not registered with CUDA in this
// process. REQUIRES: pool != null.
Result<std::unique_ptr<HostTier>> OpenSharedHostTier(std::shared_ptr<SharedHostPool> pool,
                                                     const KvRegion& device, bool gpu,
                                                     const std::string& model_id,
                                                     int64_t budget_bytes);

}  // namespace kvtier
