// The reuse sketch (see cache/reuse_sketch.h).
#include "cache/reuse_sketch.h"

#include <algorithm>
#include <cstring>

namespace kvtier {

namespace {

int64_t RoundWidth(int64_t width) {
  int64_t w = 16;
  while (w < width && w < (int64_t{1} << 26)) w <<= 1;
  return w;
}

// splitmix64's finaliser: every input bit moves every output bit.
uint64_t Mix(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return x;
}

}  // namespace

ReuseSketch::ReuseSketch(int64_t width)
    : width_(RoundWidth(width)),
      sample_(10 * width_),
      counters_(static_cast<size_t>(kRows * width_), 0) {}

void ReuseSketch::Counters(const PageKey& key, size_t at[kRows]) const {
  // Page keys are SHA-256 chains (kvtier/page_key.h): any 8 bytes are uniform; mixed once. The
  // low bits pick a 64-byte block (one cache line: kRows rows of 16 counters), 4 bits each the
  // row's counter in it, as Caffeine's blocked FrequencySketch does: one miss per key, not kRows.
  uint64_t word = 0;
  std::memcpy(&word, key.bytes.data(), sizeof(word));
  const uint64_t h = Mix(word);
  const size_t block = static_cast<size_t>(h & static_cast<uint64_t>(width_ / 16 - 1)) * 64;
  for (int r = 0; r < kRows; ++r) {
    at[r] = block + static_cast<size_t>(r * 16) + static_cast<size_t>((h >> (32 + 4 * r)) & 15);
  }
}

void ReuseSketch::Record(const PageKey& key) {
  size_t at[kRows];
  Counters(key, at);
  uint8_t least = kMaxCount;
  for (int r = 0; r < kRows; ++r) least = std::min(least, counters_[at[r]]);
  if (least < kMaxCount) {
    for (int r = 0; r < kRows; ++r) {
      if (counters_[at[r]] == least) ++counters_[at[r]];
    }
  }
  if (++records_ >= sample_) Halve();
}

int64_t ReuseSketch::Estimate(const PageKey& key) const {
  size_t at[kRows];
  Counters(key, at);
  uint8_t least = kMaxCount;
  for (int r = 0; r < kRows; ++r) least = std::min(least, counters_[at[r]]);
  return least;
}

void ReuseSketch::Halve() {
  for (uint8_t& c : counters_) c = static_cast<uint8_t>(c >> 1);
  records_ /= 2;
  ++halvings_;
}

}  // namespace kvtier
