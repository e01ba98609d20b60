// Test support: host-owned KV regions, random data, poisoned outputs and random slot lists.
// Shared by every test binary (tests/support/*.cc is linked into each).
#pragma once

#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

#include "kvtier/transfer.h"

namespace kvtier::testing {

inline constexpr std::byte kPoison{0xA5};

// A KV region whose buffers live in host vectors owned by this object.
class HostRegion {
 public:
  // Region with base pointers, or (layer_table && layout == layer_first) per-layer allocations.
  HostRegion(const KvGeometry& geometry, bool mla, bool layer_table = false);
  HostRegion(const HostRegion&) = delete;
  HostRegion& operator=(const HostRegion&) = delete;

  const KvRegion& region() const { return region_; }
  KvRegion& mutable_region() { return region_; }
  // Every byte of every buffer, in a fixed order (for whole-buffer comparisons).
  std::vector<std::byte> Snapshot() const;
  void FillRandom(std::mt19937_64& rng);
  void Fill(std::byte value);

 private:
  KvRegion region_;
  std::vector<std::vector<std::byte>> storage_;  // one per allocation
  std::vector<void*> k_table_, v_table_;
};

// Random (src, dst) slot lists: `num_pages` pages drawn independently on each side (distinct
// within a side), each page's tokens in order; with `partial`, token-level random distinct slots.
struct SlotPairs {
  std::vector<int64_t> src, dst;
};
SlotPairs RandomPagePairs(std::mt19937_64& rng, int64_t src_slots, int64_t dst_slots,
                          int64_t page_size, int64_t num_pages);
SlotPairs RandomTokenPairs(std::mt19937_64& rng, int64_t src_slots, int64_t dst_slots,
                           int64_t count);

// Seed from KVTIER_TEST_SEED or a fixed default; printed by tests on failure.
uint64_t TestSeed();

}  // namespace kvtier::testing
