#include "kv_test_util.h"

#include <algorithm>
#include <cstdlib>
#include <numeric>

namespace kvtier::testing {

HostRegion::HostRegion(const KvGeometry& geometry, bool mla, bool layer_table) {
  region_.geometry = geometry;
  region_.mla = mla;
  region_.memory = MemoryKind::kHost;
  const int buffers = mla ? 1 : 2;
  if (layer_table && geometry.layout == KvLayout::kLayerFirst) {
    for (int b = 0; b < buffers; ++b) {
      auto& table = b == 0 ? k_table_ : v_table_;
      for (int64_t l = 0; l < geometry.num_layers; ++l) {
        storage_.emplace_back(static_cast<size_t>(geometry.layer_bytes()));
        table.push_back(storage_.back().data());
      }
    }
    region_.k_layers = k_table_;
    region_.v_layers = v_table_;
  } else {
    for (int b = 0; b < buffers; ++b) {
      storage_.emplace_back(static_cast<size_t>(geometry.buffer_bytes()));
    }
    region_.k = storage_[0].data();
    region_.v = mla ? nullptr : storage_[1].data();
  }
}

std::vector<std::byte> HostRegion::Snapshot() const {
  std::vector<std::byte> out;
  for (const auto& s : storage_) out.insert(out.end(), s.begin(), s.end());
  return out;
}

void HostRegion::FillRandom(std::mt19937_64& rng) {
  for (auto& s : storage_) {
    size_t i = 0;
    for (; i + 8 <= s.size(); i += 8) {
      const uint64_t r = rng();
      std::copy_n(reinterpret_cast<const std::byte*>(&r), 8, s.data() + i);
    }
    for (; i < s.size(); ++i) s[i] = static_cast<std::byte>(rng());
  }
}

void HostRegion::Fill(std::byte value) {
  for (auto& s : storage_) std::fill(s.begin(), s.end(), value);
}

namespace {
std::vector<int64_t> DistinctSample(std::mt19937_64& rng, int64_t universe, int64_t count) {
  std::vector<int64_t> all(static_cast<size_t>(universe));
  std::iota(all.begin(), all.end(), 0);
  std::shuffle(all.begin(), all.end(), rng);
  all.resize(static_cast<size_t>(count));
  return all;
}
}  // namespace

SlotPairs RandomPagePairs(std::mt19937_64& rng, int64_t src_slots, int64_t dst_slots,
                          int64_t page_size, int64_t num_pages) {
  SlotPairs out;
  const auto sp = DistinctSample(rng, src_slots / page_size, num_pages);
  const auto dp = DistinctSample(rng, dst_slots / page_size, num_pages);
  for (int64_t p = 0; p < num_pages; ++p) {
    for (int64_t o = 0; o < page_size; ++o) {
      out.src.push_back(sp[p] * page_size + o);
      out.dst.push_back(dp[p] * page_size + o);
    }
  }
  return out;
}

SlotPairs RandomTokenPairs(std::mt19937_64& rng, int64_t src_slots, int64_t dst_slots,
                           int64_t count) {
  return {DistinctSample(rng, src_slots, count), DistinctSample(rng, dst_slots, count)};
}

uint64_t TestSeed() {
  if (const char* s = std::getenv("KVTIER_TEST_SEED")) return std::strtoull(s, nullptr, 10);
  return 20261122;
}

}  // namespace kvtier::testing
