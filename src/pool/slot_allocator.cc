// SlotAllocator: a stack of free page numbers plus one state byte per page.
//
// Allocation pops from the stack, freeing pushes; both are O(1) per page. The per-page state
// detects double frees and, during FreePages, repeats within one call (a page seen twice in the
// same call is found in state kPendingFree). FreePages validates every index before it changes
// anything, so a bad call leaves the allocator as it was.
//
// Thread safety: all state is guarded by mu_.
#include "kvtier/slot_allocator.h"

#include <fmt/format.h>

#include <algorithm>
#include <new>

namespace kvtier {
namespace {

enum PageState : uint8_t {
  kFree = 0,
  kAllocated = 1,
  kPendingFree = 2,  // allocated and named earlier in the FreePages call in progress
};

}  // namespace

SlotAllocator::SlotAllocator(int64_t num_slots, int64_t page_size)
    : num_slots_(num_slots), page_size_(page_size), num_pages_(num_slots / page_size) {}

Result<std::unique_ptr<SlotAllocator>> SlotAllocator::Create(int64_t num_slots, int64_t page_size) {
  if (num_slots <= 0) {
    return Status::InvalidArgument(
        fmt::format("SlotAllocator: num_slots = {} must be positive", num_slots));
  }
  if (page_size <= 0) {
    return Status::InvalidArgument(
        fmt::format("SlotAllocator: page_size = {} must be positive", page_size));
  }
  if (num_slots % page_size != 0) {
    return Status::InvalidArgument(fmt::format(
        "SlotAllocator: page_size = {} does not divide num_slots = {}", page_size, num_slots));
  }
  std::unique_ptr<SlotAllocator> allocator(new SlotAllocator(num_slots, page_size));
  const int64_t pages = allocator->num_pages_;
  try {
    allocator->state_.assign(static_cast<size_t>(pages), kFree);
    allocator->free_list_.resize(static_cast<size_t>(pages));
  } catch (const std::bad_alloc&) {
    return Status::OutOfMemory(
        fmt::format("SlotAllocator: cannot allocate the bookkeeping for {} pages ({} bytes)", pages,
                    pages * static_cast<int64_t>(sizeof(int64_t) + sizeof(uint8_t))));
  } catch (const std::length_error&) {
    return Status::OutOfMemory(
        fmt::format("SlotAllocator: {} pages are more than a vector can hold", pages));
  }
  // Highest page at the bottom of the stack: a fresh allocator hands out pages in ascending order.
  for (int64_t i = 0; i < pages; ++i) allocator->free_list_[i] = pages - 1 - i;
  return allocator;
}

int64_t SlotAllocator::free_pages() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int64_t>(free_list_.size());
}

int64_t SlotAllocator::used_pages() const {
  std::lock_guard<std::mutex> lock(mu_);
  return num_pages_ - static_cast<int64_t>(free_list_.size());
}

Result<std::vector<int64_t>> SlotAllocator::AllocatePages(int64_t n) {
  if (n < 0) {
    return Status::InvalidArgument(fmt::format("AllocatePages: n = {} must not be negative", n));
  }
  std::vector<int64_t> pages;
  {
    std::lock_guard<std::mutex> lock(mu_);
    const int64_t free = static_cast<int64_t>(free_list_.size());
    if (n > free) {
      return Status::OutOfMemory(fmt::format(
          "AllocatePages: n = {} pages requested but only {} of {} pages (page_size {}) are free",
          n, free, num_pages_, page_size_));
    }
    pages.resize(static_cast<size_t>(n));  // n <= free_list_.size(), which already fit in memory
    for (int64_t i = 0; i < n; ++i) {
      const int64_t page = free_list_.back();
      free_list_.pop_back();
      state_[page] = kAllocated;
      pages[i] = page * page_size_;
    }
  }
  // The free list is a stack: pages freed rising come back falling. Sorted, pages that lie
  // together come out rising on every tier, so a copy between two tiers merges them (dma_plan.h).
  std::sort(pages.begin(), pages.end());
  return pages;
}

Status SlotAllocator::FreePages(std::span<const int64_t> page_starts) {
  std::lock_guard<std::mutex> lock(mu_);
  const size_t n = page_starts.size();
  // Pass 1: check every index and mark it pending, so a repeat within the call is seen.
  Status error;
  size_t checked = 0;
  for (; checked < n; ++checked) {
    const int64_t start = page_starts[checked];
    if (start < 0 || start >= num_slots_) {
      error = Status::InvalidArgument(fmt::format(
          "FreePages: page_starts[{}] = {} is out of range [0, {})", checked, start, num_slots_));
      break;
    }
    if (start % page_size_ != 0) {
      error = Status::InvalidArgument(fmt::format(
          "FreePages: page_starts[{}] = {} is a foreign index: not a page start (a multiple of "
          "page_size = {})",
          checked, start, page_size_));
      break;
    }
    uint8_t& state = state_[start / page_size_];
    if (state == kFree) {
      error = Status::InvalidArgument(fmt::format(
          "FreePages: page_starts[{}] = {} is not allocated (double free)", checked, start));
      break;
    }
    if (state == kPendingFree) {
      size_t first = 0;
      while (page_starts[first] != start) ++first;  // error path only: a linear scan is fine
      error = Status::InvalidArgument(
          fmt::format("FreePages: page_starts[{}] = {} repeats page_starts[{}] in the same call",
                      checked, start, first));
      break;
    }
    state = kPendingFree;
  }
  if (!error.ok()) {
    // Undo the marks of pass 1; every index before `checked` was valid and is marked once.
    for (size_t i = 0; i < checked; ++i) state_[page_starts[i] / page_size_] = kAllocated;
    return error;
  }
  // Pass 2: commit. free_list_ has capacity for every page, so push_back does not allocate.
  for (size_t i = 0; i < n; ++i) {
    const int64_t page = page_starts[i] / page_size_;
    state_[page] = kFree;
    free_list_.push_back(page);
  }
  return Status::OK();
}

bool SlotAllocator::IsAllocated(int64_t page_start) const {
  if (page_start < 0 || page_start >= num_slots_ || page_start % page_size_ != 0) return false;
  std::lock_guard<std::mutex> lock(mu_);
  return state_[page_start / page_size_] == kAllocated;
}

std::vector<int64_t> PageSlots(std::span<const int64_t> page_starts, int64_t page_size) {
  std::vector<int64_t> slots;
  if (page_size <= 0) return slots;
  slots.reserve(page_starts.size() * static_cast<size_t>(page_size));
  for (const int64_t start : page_starts) {
    for (int64_t o = 0; o < page_size; ++o) slots.push_back(start + o);
  }
  return slots;
}

}  // namespace kvtier
