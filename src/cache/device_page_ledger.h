// Internal: who holds each page of the device pool — free, the engine (handed out by
// AllocateDeviceSlots, not yet inserted or freed), the tree (a node's device pages) or a copy in
// flight (a LoadBack's destination until it is published or, after a failure, until the copy is
// known to have finished) — and the engine's pending writes (GPU: one event per Insert) that a
// copy into reused pages must wait for.
//
// The ledger is also the pool's allocator: a stack of free page starts beside the owner of each
// page (one byte), so freeing a page is a check of its owner and a push: no second state array,
// lock or division (eviction frees pages by the thousand; docs/perf-notes/cache-eviction.md).
//
// Invariants (CheckConsistency in the cache): the free stack holds exactly the kFree pages, each
// once; the tree's device pages are exactly the kTree pages.
//
// Thread safety: none; the cache's mutex guards every call.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "kvtier/device.h"
#include "kvtier/status.h"

namespace kvtier {

class DevicePageLedger {
 public:
  enum Owner : uint8_t { kFree = 0, kEngine = 1, kTree = 2, kCopy = 3 };

  // InvalidArgument unless page_size is a power of two and num_slots a positive multiple of it;
  // OutOfMemory if the bookkeeping (9 bytes per page) cannot be allocated.
  static Result<std::unique_ptr<DevicePageLedger>> Create(int64_t num_slots, int64_t page_size);

  int64_t page_size() const { return page_size_; }
  int64_t num_slots() const { return num_pages_ << log2_page_; }
  int64_t num_pages() const { return num_pages_; }
  int64_t free_pages() const { return static_cast<int64_t>(free_.size()); }
  int64_t used_pages() const { return num_pages_ - free_pages(); }
  int64_t pages_of(Owner owner) const { return counts_[owner]; }
  Owner owner(int64_t page_start) const {
    return static_cast<Owner>(owners_[static_cast<size_t>(page_start >> log2_page_)]);
  }
  // A page start in range whose owner is not kFree.
  bool IsAllocated(int64_t page_start) const;

  // `n` free pages (page starts, ascending: the most recently freed ones, sorted, as
  // SlotAllocator's) for `owner`; OutOfMemory (nothing changes) when fewer are free.
  Result<std::vector<int64_t>> Allocate(int64_t n, Owner owner);
  // REQUIRES: every page is allocated (owner != kFree).
  void Transfer(std::span<const int64_t> page_starts, Owner to);
  // Returns pages to the free stack, all or nothing: Internal (a bookkeeping bug) naming the
  // page if one is out of range, not a page start, free already or repeated in the call.
  Status Free(std::span<const int64_t> page_starts);

  // Checks that `slots` are whole aligned pages inside the pool; page starts to `pages`.
  Status CheckPages(std::span<const int64_t> slots, std::string_view arg,
                    std::vector<int64_t>* pages) const;
  // Pages the engine passes back must be held by it, each once. `skip[i]` exempts page i.
  Status CheckEngineHeld(std::span<const int64_t> pages, std::string_view arg,
                         const std::vector<bool>* skip);

  // GPU: the engine's writes (an event recorded on its stream at an Insert) that copies into
  // reused device pages are ordered after. Completed ones are dropped by PruneWriteFences.
  void AddWriteFence(std::shared_ptr<CudaEventHandle> fence);
  void PruneWriteFences();
  const std::vector<std::shared_ptr<CudaEventHandle>>& write_fences() const { return fences_; }

 private:
  DevicePageLedger() = default;

  int64_t page_size_ = 1;
  int log2_page_ = 0;
  int64_t num_pages_ = 0;
  std::vector<int64_t> free_;    // free page starts, a stack (top = back); capacity num_pages_
  std::vector<uint8_t> owners_;  // per page
  int64_t counts_[4] = {0, 0, 0, 0};
  std::vector<std::shared_ptr<CudaEventHandle>> fences_;
};

}  // namespace kvtier
