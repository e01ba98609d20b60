// The KV pattern of a TP rank's heads (kvtier/testing/tp_shard_pattern.h).
#include "kvtier/testing/tp_shard_pattern.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "kvtier/testing/kv_pattern.h"
#include "kvtier/tp_group.h"

namespace kvtier {

namespace {

// Tokens per scratch block: the full-slot pattern of at most this many tokens is built at once.
constexpr int64_t kBlockTokens = 64;

Status CheckShardArgs(const KvRegion& region, int rank, int tp_size, std::span<const int64_t> slots,
                      std::span<const uint64_t> hashes) {
  KVTIER_RETURN_IF_ERROR(region.Validate("region"));
  if (region.memory != MemoryKind::kHost) {
    return Status::InvalidArgument("tp shard pattern: the region must be host memory");
  }
  if (tp_size < 1 || tp_size > kMaxTpSize || rank < 0 || rank >= tp_size) {
    return Status::InvalidArgument(
        fmt::format("tp shard pattern: rank {} of tp_size {} out of range", rank, tp_size));
  }
  if (slots.size() != hashes.size()) {
    return Status::InvalidArgument(
        fmt::format("tp shard pattern: {} slots but {} token hashes", slots.size(), hashes.size()));
  }
  for (size_t k = 0; k < slots.size(); ++k) {
    if (slots[k] < 0 || slots[k] >= region.geometry.num_slots) {
      return Status::InvalidArgument(fmt::format("tp shard pattern: slots[{}] = {} not in [0, {})",
                                                 k, slots[k], region.geometry.num_slots));
    }
  }
  return Status::OK();
}

// Walks the rank's chunks of every (slot, layer, buffer): f(k, slot, layer, buffer, rank_bytes,
// full_bytes, len) with `full_bytes` the chunk's bytes in the full slot's pattern.
template <typename F>
Status ForEachShardChunk(const KvRegion& region, bool mla, int rank, int tp_size,
                         std::span<const int64_t> slots, std::span<const uint64_t> hashes, F&& f) {
  const KvGeometry& g = region.geometry;
  const int64_t shard_bytes = g.slot_bytes;
  const int64_t full_bytes = mla ? shard_bytes : shard_bytes * tp_size;
  const int64_t first = mla ? 0 : rank * shard_bytes;
  const int64_t chunks = g.head_num;  // page_head keeps heads apart; others are contiguous
  const int64_t chunk = shard_bytes / chunks;
  const int64_t n = static_cast<int64_t>(slots.size());
  const int64_t block = std::min(n, kBlockTokens);
  KvRegion full;
  full.geometry = KvGeometry{
      KvLayout::kLayerFirst, g.num_layers, std::max<int64_t>(block, 1), full_bytes, 1, 1};
  full.mla = mla;
  std::vector<std::byte> kbuf(static_cast<size_t>(full.geometry.buffer_bytes()));
  std::vector<std::byte> vbuf(mla ? 0 : kbuf.size());
  full.k = kbuf.data();
  full.v = mla ? nullptr : vbuf.data();
  std::vector<int64_t> local;
  for (int64_t from = 0; from < n; from += block) {
    const int64_t to = std::min(n, from + block);
    local.resize(static_cast<size_t>(to - from));
    for (int64_t i = 0; i < to - from; ++i) local[static_cast<size_t>(i)] = i;
    KVTIER_RETURN_IF_ERROR(FillKvPattern(full, local, hashes.subspan(from, to - from)));
    for (int64_t k = from; k < to; ++k) {
      for (int b = 0; b < region.num_buffers(); ++b) {
        for (int64_t l = 0; l < g.num_layers; ++l) {
          const std::byte* want = full.LayerBase(b, l) + full.LayerOffset(l, k - from, 0) + first;
          for (int64_t c = 0; c < chunks; ++c) {
            std::byte* have = region.LayerBase(b, l) + region.LayerOffset(l, slots[k], c);
            KVTIER_RETURN_IF_ERROR(f(k, slots[k], l, b, have, want + c * chunk, chunk));
          }
        }
      }
    }
  }
  return Status::OK();
}

}  // namespace

Status FillTpShardPattern(const KvRegion& region, bool mla, int rank, int tp_size,
                          std::span<const int64_t> slots, std::span<const uint64_t> token_hashes) {
  KVTIER_RETURN_IF_ERROR(CheckShardArgs(region, rank, tp_size, slots, token_hashes));
  return ForEachShardChunk(
      region, mla, rank, tp_size, slots, token_hashes,
      [](int64_t, int64_t, int64_t, int, std::byte* have, const std::byte* want, int64_t len) {
        std::memcpy(have, want, static_cast<size_t>(len));
        return Status::OK();
      });
}

Status VerifyTpShardPattern(const KvRegion& region, bool mla, int rank, int tp_size,
                            std::span<const int64_t> slots,
                            std::span<const uint64_t> token_hashes) {
  KVTIER_RETURN_IF_ERROR(CheckShardArgs(region, rank, tp_size, slots, token_hashes));
  return ForEachShardChunk(
      region, mla, rank, tp_size, slots, token_hashes,
      [rank](int64_t k, int64_t slot, int64_t layer, int b, std::byte* have, const std::byte* want,
             int64_t len) {
        if (std::memcmp(have, want, static_cast<size_t>(len)) == 0) return Status::OK();
        return Status::Corruption(fmt::format(
            "tp rank {}: token {} (slot {}) layer {} buffer {} does not hold its KV pattern", rank,
            k, slot, layer, b == 0 ? "K" : "V"));
      });
}

}  // namespace kvtier
