// The device page ledger (see cache/device_page_ledger.h).
#include "cache/device_page_ledger.h"

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <new>

#include "kvtier/layout.h"

namespace kvtier {

namespace {

// Set on an owner byte while Free checks a call (a repeat within the call finds it set).
constexpr uint8_t kFreeing = 0x80;

}  // namespace

Result<std::unique_ptr<DevicePageLedger>> DevicePageLedger::Create(int64_t num_slots,
                                                                   int64_t page_size) {
  KVTIER_RETURN_IF_ERROR(ValidatePageSize(page_size, "device page ledger: page_size"));
  if (num_slots <= 0 || num_slots % page_size != 0) {
    return Status::InvalidArgument(fmt::format(
        "device page ledger: num_slots = {} is not a positive multiple of page_size = {}",
        num_slots, page_size));
  }
  auto ledger = std::unique_ptr<DevicePageLedger>(new DevicePageLedger());
  ledger->page_size_ = page_size;
  ledger->log2_page_ = std::countr_zero(static_cast<uint64_t>(page_size));
  const int64_t pages = num_slots / page_size;
  ledger->num_pages_ = pages;
  try {
    ledger->owners_.assign(static_cast<size_t>(pages), kFree);
    ledger->free_.resize(static_cast<size_t>(pages));
  } catch (const std::bad_alloc&) {
    return Status::OutOfMemory(
        fmt::format("device page ledger: cannot allocate the bookkeeping for {} pages", pages));
  }
  // Lowest page on top: a fresh ledger hands out pages in ascending order.
  for (int64_t i = 0; i < pages; ++i) {
    ledger->free_[static_cast<size_t>(i)] = (pages - 1 - i) << ledger->log2_page_;
  }
  ledger->counts_[kFree] = pages;
  return ledger;
}

bool DevicePageLedger::IsAllocated(int64_t page_start) const {
  if (page_start < 0 || (page_start & (page_size_ - 1)) != 0 ||
      (page_start >> log2_page_) >= num_pages_) {
    return false;
  }
  return owner(page_start) != kFree;
}

Result<std::vector<int64_t>> DevicePageLedger::Allocate(int64_t n, Owner owner) {
  if (n < 0) {
    return Status::InvalidArgument(fmt::format("device page ledger: {} pages asked for", n));
  }
  if (n > free_pages()) {
    return Status::OutOfMemory(
        fmt::format("device page ledger: {} pages asked for, {} free", n, free_pages()));
  }
  std::vector<int64_t> pages(free_.rbegin(), free_.rbegin() + n);
  free_.resize(free_.size() - static_cast<size_t>(n));
  // Rising, as the host tier's pages (SlotAllocator): a load or backup between them then pairs
  // pages that lie together on both sides in the same order, which the dma plan merges.
  std::sort(pages.begin(), pages.end());
  for (int64_t p : pages) owners_[static_cast<size_t>(p >> log2_page_)] = owner;
  counts_[kFree] -= n;
  counts_[owner] += n;
  return pages;
}

void DevicePageLedger::Transfer(std::span<const int64_t> page_starts, Owner to) {
  for (int64_t p : page_starts) {
    uint8_t& o = owners_[static_cast<size_t>(p >> log2_page_)];
    --counts_[o];
    ++counts_[to];
    o = to;
  }
}

Status DevicePageLedger::Free(std::span<const int64_t> page_starts) {
  // Pass 1: every page is a page start in range, allocated, and named once (marked kFreeing).
  size_t checked = 0;
  Status bad;
  for (; checked < page_starts.size(); ++checked) {
    const int64_t p = page_starts[checked];
    const char* why = nullptr;
    if (p < 0 || (p & (page_size_ - 1)) != 0 || (p >> log2_page_) >= num_pages_) {
      why = "is not a page start of the pool";
    } else {
      uint8_t& o = owners_[static_cast<size_t>(p >> log2_page_)];
      if (o == kFree) {
        why = "is free already";
      } else if ((o & kFreeing) != 0) {
        why = "appears twice in the call";
      } else {
        o |= kFreeing;
      }
    }
    if (why != nullptr) {
      bad = Status::Internal(fmt::format(
          "freeing device pages: page at slot {} (page {} of the call) {}", p, checked, why));
      break;
    }
  }
  if (!bad.ok()) {
    for (size_t i = 0; i < checked; ++i) {
      owners_[static_cast<size_t>(page_starts[i] >> log2_page_)] &= ~kFreeing;
    }
    return bad;
  }
  // Pass 2: commit. free_ has capacity for every page, so push_back does not allocate.
  for (int64_t p : page_starts) {
    uint8_t& o = owners_[static_cast<size_t>(p >> log2_page_)];
    --counts_[o & ~kFreeing];
    o = kFree;
    free_.push_back(p);
  }
  counts_[kFree] += static_cast<int64_t>(page_starts.size());
  return Status::OK();
}

Status DevicePageLedger::CheckPages(std::span<const int64_t> slots, std::string_view arg,
                                    std::vector<int64_t>* pages) const {
  const int64_t P = page_size_;
  if (slots.size() % static_cast<size_t>(P) != 0) {
    return Status::InvalidArgument(
        fmt::format("{} has {} slots, not a multiple of page_size = {}", arg, slots.size(), P));
  }
  const int64_t N = num_slots();
  pages->reserve(pages->size() + slots.size() / static_cast<size_t>(P));
  for (size_t k = 0; k < slots.size(); k += static_cast<size_t>(P)) {
    const int64_t s = slots[k];
    if (s < 0 || s >= N) {
      return Status::InvalidArgument(
          fmt::format("{}[{}] = {} is outside the device pool [0, {})", arg, k, s, N));
    }
    if (s % P != 0) {
      return Status::InvalidArgument(fmt::format(
          "{}[{}] = {} starts a page but is not a multiple of page_size = {}", arg, k, s, P));
    }
    // N is a multiple of P, so the rest of an aligned page is in range too.
    for (int64_t j = 1; j < P; ++j) {
      if (slots[k + static_cast<size_t>(j)] != s + j) {
        return Status::InvalidArgument(
            fmt::format("{}[{}] = {} does not continue its page (expected {})", arg,
                        k + static_cast<size_t>(j), slots[k + static_cast<size_t>(j)], s + j));
      }
    }
    pages->push_back(s);
  }
  return Status::OK();
}

Status DevicePageLedger::CheckEngineHeld(std::span<const int64_t> pages, std::string_view arg,
                                         const std::vector<bool>* skip) {
  constexpr uint8_t kMark = 0xFF;  // catches repeats within the call
  Status bad;
  size_t i = 0;
  for (; i < pages.size(); ++i) {
    if (skip != nullptr && (*skip)[i]) continue;
    uint8_t& o = owners_[static_cast<size_t>(pages[i] >> log2_page_)];
    if (o != kEngine) {
      const char* why = o == kFree   ? "is not allocated"
                        : o == kTree ? "is cached by another prefix"
                        : o == kCopy ? "is being filled by a load-back"
                                     : "appears twice in this call";
      bad = Status::InvalidArgument(fmt::format(
          "{}: page at slot {} (page {} of the call) {}; only pages from AllocateDeviceSlots "
          "may be passed",
          arg, pages[i], i, why));
      break;
    }
    o = kMark;
  }
  for (size_t j = 0; j < i; ++j) {
    uint8_t& o = owners_[static_cast<size_t>(pages[j] >> log2_page_)];
    if (o == kMark) o = kEngine;
  }
  return bad;
}

void DevicePageLedger::AddWriteFence(std::shared_ptr<CudaEventHandle> fence) {
  fences_.push_back(std::move(fence));
}

void DevicePageLedger::PruneWriteFences() {
  size_t keep = 0;
  for (size_t i = 0; i < fences_.size(); ++i) {
    Result<bool> done = fences_[i]->Query();
    if (done.ok() && *done) continue;  // an error keeps it: waiting on it stays harmless
    fences_[keep++] = std::move(fences_[i]);
  }
  fences_.resize(keep);
}

}  // namespace kvtier
