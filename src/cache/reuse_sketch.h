// Internal: how often page keys were accessed, approximately and with a bounded memory — a
// count-min sketch with TinyLFU's aging (Einziger, Friedman, Manes: "TinyLFU: A Highly Efficient
// Cache Admission Policy", 2017), for the storage admission policy `frequency`
// (kvtier/hierarchical_cache.h, StorageAdmission).
//
// kRows rows of `width` 4-bit counters (a power of two, at least 16), blocked: a key's counter in
// every row lies in one 64-byte block (one cache line per key). Record(key) adds one to the
// key's counter in each row where it is the smallest of the key's counters (conservative update:
// a key never raises a counter above its own estimate + 1, so collisions inflate estimates less);
// Estimate(key) is the smallest of its counters, an overestimate of the key's accesses since the
// last halving, never an underestimate, capped at kMaxCount. Every `sample` = 10 x width records,
// every counter is halved (rounded down): what was frequent long ago fades, so the sketch follows
// a changing working set. Deterministic: the same records give the same estimates.
//
// Thread safety: none; the cache's mutex guards it.
#pragma once

#include <cstdint>
#include <vector>

#include "kvtier/page_key.h"

namespace kvtier {

class ReuseSketch {
 public:
  static constexpr int kRows = 4;
  static constexpr int64_t kMaxCount = 15;

  // `width`: counters per row, rounded up to a power of two in [16, 2^26].
  explicit ReuseSketch(int64_t width);

  void Record(const PageKey& key);
  int64_t Estimate(const PageKey& key) const;

  int64_t width() const { return width_; }
  int64_t sample() const { return sample_; }
  // Records since the last halving, and halvings so far.
  int64_t records() const { return records_; }
  int64_t halvings() const { return halvings_; }

 private:
  // The key's counter in each row: all in one 64-byte block of `counters_`.
  void Counters(const PageKey& key, size_t at[kRows]) const;
  void Halve();

  int64_t width_;
  int64_t sample_;
  int64_t records_ = 0;
  int64_t halvings_ = 0;
  // [width_ / 16 blocks, kRows, 16], one counter a byte: a key's kRows counters share a block.
  std::vector<uint8_t> counters_;
};

}  // namespace kvtier
