// Deterministic KV pattern (see kvtier/testing/kv_pattern.h).
#include "kvtier/testing/kv_pattern.h"

#include <fmt/format.h>

#include <cstring>

#include "kvtier/testing/kv_pattern_value.h"

namespace kvtier {
namespace {

// Fills `out` (slot_bytes, a multiple of 4) with the bytes of (hash, layer, buffer).
void Generate(uint64_t hash, int64_t layer, int buffer, std::byte* out, int64_t n) {
  const uint64_t state = KvPatternState(hash, layer, buffer);
  for (int64_t i = 0; i < n; i += 8) {
    const uint64_t v = KvPatternValue(state, i / 8);
    std::memcpy(out + i, &v, static_cast<size_t>(n - i < 8 ? n - i : 8));
  }
}

Status CheckArgs(const KvRegion& region, std::span<const int64_t> slots,
                 std::span<const uint64_t> hashes) {
  KVTIER_RETURN_IF_ERROR(region.Validate("region"));
  if (region.memory != MemoryKind::kHost) {
    return Status::InvalidArgument(fmt::format(
        "region.memory = {}: the KV pattern reads and writes host memory only; copy device "
        "slots to a host region first",
        MemoryKindName(region.memory)));
  }
  if (slots.size() != hashes.size()) {
    return Status::InvalidArgument(
        fmt::format("slots has {} entries but token_hashes has {}", slots.size(), hashes.size()));
  }
  for (size_t k = 0; k < slots.size(); ++k) {
    if (slots[k] < 0 || slots[k] >= region.geometry.num_slots) {
      return Status::InvalidArgument(fmt::format("slots[{}] = {} is out of range [0, {})", k,
                                                 slots[k], region.geometry.num_slots));
    }
  }
  return Status::OK();
}

// Head chunks of one (layer, slot): page_head keeps each head apart, the rest are contiguous.
template <typename Fn>
void ForEachChunk(const KvRegion& region, int b, int64_t layer, int64_t slot, Fn&& fn) {
  const KvGeometry& g = region.geometry;
  const int64_t heads = g.layout == KvLayout::kPageHead ? g.head_num : 1;
  const int64_t chunk = g.slot_bytes / heads;
  std::byte* base = region.LayerBase(b, layer);
  for (int64_t h = 0; h < heads; ++h) {
    fn(base + region.LayerOffset(layer, slot, h), h * chunk, chunk);
  }
}

}  // namespace

uint64_t KvPatternSalt(std::string_view name_space) {
  uint64_t h = 0x243F6A8885A308D3ull;
  for (char c : name_space) h = KvPatternMix(h ^ static_cast<uint8_t>(c));
  return h;
}

std::vector<uint64_t> KvPatternHashes(std::span<const Token> tokens, uint64_t salt) {
  std::vector<uint64_t> out(tokens.size());
  uint64_t h = KvPatternMix(salt);
  for (size_t i = 0; i < tokens.size(); ++i) {
    h = KvPatternMix(
        h ^ (static_cast<uint64_t>(static_cast<uint32_t>(tokens[i])) + 0x632BE59BD9B4E019ull));
    out[i] = h;
  }
  return out;
}

namespace {

// Checks the arguments, then calls fn(k, b, layer, at, expected, off, n) for every head chunk of
// every (slot k, buffer b, layer): `at` is the chunk in the region, `expected` the pattern's bytes
// [off, off + n) of that slot and layer. Stops at the first error fn returns.
template <typename Fn>
Status ForEachPatternChunk(const KvRegion& region, std::span<const int64_t> slots,
                           std::span<const uint64_t> token_hashes, Fn&& fn) {
  KVTIER_RETURN_IF_ERROR(CheckArgs(region, slots, token_hashes));
  const int64_t S = region.geometry.slot_bytes;
  std::vector<std::byte> buf(static_cast<size_t>(S));
  for (size_t k = 0; k < slots.size(); ++k) {
    for (int b = 0; b < region.num_buffers(); ++b) {
      for (int64_t l = 0; l < region.geometry.num_layers; ++l) {
        Generate(token_hashes[k], l, b, buf.data(), S);
        Status st;
        ForEachChunk(region, b, l, slots[k], [&](std::byte* at, int64_t off, int64_t n) {
          if (st.ok()) st = fn(k, b, l, at, buf.data() + off, off, n);
        });
        KVTIER_RETURN_IF_ERROR(st);
      }
    }
  }
  return Status::OK();
}

}  // namespace

Status FillKvPattern(const KvRegion& region, std::span<const int64_t> slots,
                     std::span<const uint64_t> token_hashes) {
  return ForEachPatternChunk(
      region, slots, token_hashes,
      [](size_t, int, int64_t, std::byte* at, const std::byte* expected, int64_t, int64_t n) {
        std::memcpy(at, expected, static_cast<size_t>(n));
        return Status::OK();
      });
}

Status VerifyKvPattern(const KvRegion& region, std::span<const int64_t> slots,
                       std::span<const uint64_t> token_hashes) {
  return ForEachPatternChunk(
      region, slots, token_hashes,
      [&](size_t k, int b, int64_t l, std::byte* at, const std::byte* expected, int64_t off,
          int64_t n) {
        if (std::memcmp(at, expected, static_cast<size_t>(n)) == 0) return Status::OK();
        int64_t i = 0;
        while (i < n && at[i] == expected[i]) ++i;
        return Status::Corruption(fmt::format(
            "token {} (slot {}), layer {}, {} buffer, byte {}: found 0x{:02x}, pattern 0x{:02x}", k,
            slots[k], l, region.mla ? "MLA" : (b == 0 ? "K" : "V"), off + i,
            static_cast<unsigned>(at[i]), static_cast<unsigned>(expected[i])));
      });
}

}  // namespace kvtier
