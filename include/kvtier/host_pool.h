// kvtier/host_pool.h — the host (L2) KV pool: mmap'd buffers in any layout, page-allocated.
//
// A HostKvPool owns one anonymous `mmap` per buffer (K and V, or the one MLA buffer), sized from a
// byte budget or from a ratio of the device pool and rounded down to whole pages. It asks for
// huge pages (MAP_HUGETLB) when configured and falls back to normal pages, with a warning, when
// the system has none to give. When kvtier is built with CUDA and a GPU is present, the buffers
// are registered with `cudaHostRegister` (pinned, and device-addressable through UVA) so the
// kernel and dma transfer backends can read and write them directly. The pool's slots are handed
// out page by page through a SlotAllocator.
//
// Running out of memory (mmap failure, allocator exhausted) is `OutOfMemory`, never an abort.
// Pages are mapped lazily by the kernel unless CUDA registration pins them.
//
// Thread safety: region(), capacity_bytes() and the flags are immutable after Create; the
// allocator (and AllocatePages/FreePages) is thread-safe. The bytes themselves are the caller's
// to synchronise.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "kvtier/layout.h"
#include "kvtier/slot_allocator.h"
#include "kvtier/status.h"
#include "kvtier/transfer.h"

namespace kvtier {

struct HostKvPoolConfig {
  // The pool's shape: layout, num_layers, slot_bytes (a multiple of kSlotBytesAlignment),
  // page_size and head_num (page_head: slot_bytes / head_num a multiple of kSlotBytesAlignment).
  // geometry.num_slots is not read: the pool derives it from the capacity below (see
  // HostKvPool::geometry()), so a device pool's geometry can be copied in as it is.
  KvGeometry geometry{.layout = KvLayout::kPageFirst};
  bool mla = false;  // one buffer instead of K and V

  // Capacity: exactly one of capacity_bytes and device_ratio.
  int64_t capacity_bytes = 0;     // total bytes of all buffers (K+V, or the MLA buffer)
  double device_ratio = 0;        // capacity = ratio * device_pool_bytes
  int64_t device_pool_bytes = 0;  // bytes of the device pool (for device_ratio)

  // Try MAP_HUGETLB (reserved huge pages); fall back to normal pages with a warning. Normal
  // pages are always advised to transparent huge pages (MADV_HUGEPAGE).
  bool huge_pages = false;
  bool register_with_cuda = true;  // cudaHostRegister when built with CUDA and a GPU is present

  // InvalidArgument naming the bad field and its value.
  Status Validate() const;
};

class HostKvPool {
 public:
  // Validates `config`, derives the number of slots (capacity rounded down to whole pages;
  // InvalidArgument if less than one page), maps the buffers and registers them with CUDA.
  // OutOfMemory naming the bytes when a mapping fails; CudaError when a GPU is present and
  // registration fails (nothing stays mapped or registered then).
  static Result<std::unique_ptr<HostKvPool>> Create(const HostKvPoolConfig& config);

  HostKvPool(HostKvPool&&) noexcept;
  HostKvPool& operator=(HostKvPool&&) noexcept;
  HostKvPool(const HostKvPool&) = delete;
  HostKvPool& operator=(const HostKvPool&) = delete;
  ~HostKvPool();  // unregisters from CUDA, then unmaps

  // memory = kHost, geometry from the config with the derived num_slots, base pointers k (and v).
  const KvRegion& region() const { return region_; }
  const KvGeometry& geometry() const { return region_.geometry; }
  int64_t num_slots() const { return region_.geometry.num_slots; }
  int64_t num_pages() const { return region_.geometry.num_pages(); }

  SlotAllocator& allocator() { return *allocator_; }
  const SlotAllocator& allocator() const { return *allocator_; }
  // Forward to allocator(); see SlotAllocator.
  Result<std::vector<int64_t>> AllocatePages(int64_t n) { return allocator_->AllocatePages(n); }
  Status FreePages(std::span<const int64_t> page_starts) {
    return allocator_->FreePages(page_starts);
  }

  // Bytes of all buffers together (num_buffers * num_layers * num_slots * slot_bytes): the
  // configured capacity rounded down to whole pages.
  int64_t capacity_bytes() const;
  // True when every buffer is backed by MAP_HUGETLB pages.
  bool huge_pages() const;
  // True when the buffers are registered with CUDA (pinned).
  bool cuda_registered() const;

 private:
  struct Buffers;  // the mappings and their CUDA registration (host_pool.cc)
  HostKvPool(std::unique_ptr<Buffers> buffers, std::unique_ptr<SlotAllocator> allocator,
             KvRegion region);

  std::unique_ptr<Buffers> buffers_;
  std::unique_ptr<SlotAllocator> allocator_;
  KvRegion region_;
};

}  // namespace kvtier
