// The device page ledger (see cache/device_page_ledger.h).
#include "cache/device_page_ledger.h"

#include <fmt/format.h>

#include <bit>

namespace kvtier {

Result<std::unique_ptr<DevicePageLedger>> DevicePageLedger::Create(int64_t num_slots,
                                                                   int64_t page_size) {
  auto ledger = std::unique_ptr<DevicePageLedger>(new DevicePageLedger());
  KVTIER_ASSIGN_OR_RETURN(ledger->alloc_, SlotAllocator::Create(num_slots, page_size));
  ledger->page_size_ = page_size;
  ledger->log2_page_ = std::countr_zero(static_cast<uint64_t>(page_size));
  ledger->owners_.assign(static_cast<size_t>(ledger->alloc_->num_pages()), kFree);
  ledger->counts_[kFree] = ledger->alloc_->num_pages();
  return ledger;
}

Result<std::vector<int64_t>> DevicePageLedger::Allocate(int64_t n, Owner owner) {
  KVTIER_ASSIGN_OR_RETURN(std::vector<int64_t> pages, alloc_->AllocatePages(n));
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
  if (page_starts.empty()) return Status::OK();
  Status st = alloc_->FreePages(page_starts);
  if (!st.ok()) return Status::Internal(st.WithContext("freeing device pages").ToString());
  Transfer(page_starts, kFree);
  return Status::OK();
}

Status DevicePageLedger::CheckPages(std::span<const int64_t> slots, std::string_view arg,
                                    std::vector<int64_t>* pages) const {
  const int64_t P = page_size_;
  if (slots.size() % static_cast<size_t>(P) != 0) {
    return Status::InvalidArgument(fmt::format(
        "{} has {} slots, not a multiple of page_size = {}", arg, slots.size(), P));
  }
  const int64_t N = alloc_->num_slots();
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
        return Status::InvalidArgument(fmt::format(
            "{}[{}] = {} does not continue its page (expected {})", arg,
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
      const char* why = o == kFree ? "is not allocated"
                        : o == kTree ? "is cached by another prefix"
                        : o == kCopy ? "is being filled by a load-back"
                                     : "appears twice in this call";
      bad = Status::InvalidArgument(fmt::format(
          "{}: page at slot {} (page {} of the call) {}; only pages from AllocateDeviceSlots "
          "may be passed", arg, pages[i], i, why));
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
