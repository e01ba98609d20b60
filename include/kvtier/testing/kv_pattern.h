// kvtier/testing/kv_pattern.h — deterministic KV contents for tests and tools.
//
// The bytes a pattern puts in (token position, layer, buffer) are a pure function of the tokens
// up to and including that position (as a model's KV is), the namespace salt, the layer and the
// buffer (K/V, or the MLA buffer). So any slot that a cache hands back can be checked without
// keeping a copy: compute the token hashes of the sequence once, fill slots when the KV is
// "computed", and verify them wherever they end up (device tier, host tier, any layout).
//
//   hash[i] = mix(hash[i-1], tokens[i])      hash[-1] = mix(salt)
//   bytes(hash, layer, buffer) = splitmix64 stream seeded by mix(hash, layer, buffer)
//
// Thread safety: pure functions; regions are read/written only at the given slots.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "kvtier/status.h"
#include "kvtier/token.h"
#include "kvtier/transfer.h"

namespace kvtier {

// Salt of a namespace name ("" gives a fixed value too).
uint64_t KvPatternSalt(std::string_view name_space);

// One hash per token: hash[i] depends on tokens[0..i] and `salt`.
std::vector<uint64_t> KvPatternHashes(std::span<const Token> tokens, uint64_t salt);

// Writes the pattern of token_hashes[k] into every layer and buffer of slot slots[k].
// InvalidArgument when the region is not host memory, is invalid, the lengths differ or a slot
// is out of range; nothing is written then.
Status FillKvPattern(const KvRegion& region, std::span<const int64_t> slots,
                     std::span<const uint64_t> token_hashes);

// Checks that every layer and buffer of slot slots[k] holds the pattern of token_hashes[k].
// Corruption naming k, the slot, the layer, the buffer and the byte of the first mismatch;
// InvalidArgument for bad arguments (as FillKvPattern).
Status VerifyKvPattern(const KvRegion& region, std::span<const int64_t> slots,
                       std::span<const uint64_t> token_hashes);

}  // namespace kvtier
