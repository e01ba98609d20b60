// kvtier/slot_allocator.h — page-granular allocator over the slots of a KV pool.
//
// A pool of `num_slots` slots (tokens) is cut into pages of `page_size` consecutive slots; a page
// is named by its first slot, a multiple of `page_size`. The allocator hands out and takes back
// whole pages, in O(1) per page, and rejects what would corrupt its bookkeeping: freeing a page
// twice, freeing a slot that is not a page start ("foreign"), out-of-range indices, and the same
// page twice within one call. Every operation is all or nothing: on error nothing changes.
// Used for both the device pool and the host pool.
//
// Thread safety: every method may be called from any thread; an internal mutex serialises them.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <vector>

#include "kvtier/status.h"

namespace kvtier {

class SlotAllocator {
 public:
  // InvalidArgument if num_slots <= 0, page_size <= 0 or page_size does not divide num_slots;
  // OutOfMemory if the bookkeeping (about 9 bytes per page) cannot be allocated.
  static Result<std::unique_ptr<SlotAllocator>> Create(int64_t num_slots, int64_t page_size);

  SlotAllocator(const SlotAllocator&) = delete;
  SlotAllocator& operator=(const SlotAllocator&) = delete;
  ~SlotAllocator() = default;

  int64_t num_slots() const { return num_slots_; }
  int64_t page_size() const { return page_size_; }
  int64_t num_pages() const { return num_pages_; }
  int64_t free_pages() const;
  int64_t used_pages() const;

  // `n` pages (their first slots), all or nothing, in ascending order (the most recently freed
  // ones, sorted: a copy of pages that lie together then moves as few, large pieces whichever
  // order they were freed in). InvalidArgument if n < 0; OutOfMemory naming n and free_pages()
  // if fewer than n pages are free. n == 0 gives an empty list.
  Result<std::vector<int64_t>> AllocatePages(int64_t n);

  // Returns the pages to the free list, all or nothing: InvalidArgument naming the index (its
  // position in `page_starts` and its value) if any is out of range, not a page start
  // ("foreign"), not allocated (freed twice), or repeated within the call; nothing is freed then.
  Status FreePages(std::span<const int64_t> page_starts);

  // True when `page_start` is a page start in range that is currently allocated; false for
  // out-of-range and foreign indices.
  bool IsAllocated(int64_t page_start) const;

 private:
  SlotAllocator(int64_t num_slots, int64_t page_size);

  const int64_t num_slots_;
  const int64_t page_size_;
  const int64_t num_pages_;

  mutable std::mutex mu_;
  // Invariants (under mu_): free_list_ holds exactly the page numbers p (page start p*page_size)
  // whose state_[p] == kFree, each once; state_[p] is kPendingFree only inside FreePages.
  std::vector<int64_t> free_list_;  // page numbers, used as a stack (top = back)
  std::vector<uint8_t> state_;      // per page number: PageState
};

// Slot indices of the given pages, page by page:
// [p0, p0+1, ..., p0+page_size-1, p1, ..., p1+page_size-1, ...].
std::vector<int64_t> PageSlots(std::span<const int64_t> page_starts, int64_t page_size);

}  // namespace kvtier
