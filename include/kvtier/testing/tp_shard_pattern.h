// kvtier/testing/tp_shard_pattern.h — the KV pattern (kv_pattern.h) of a tensor-parallel rank's
// share of a pool (TpShardGeometry, tp_group.h), for the TP tests and tools.
//
// Thread safety: pure functions over caller memory.
#pragma once

#include <cstdint>
#include <span>

#include "kvtier/status.h"
#include "kvtier/transfer.h"

namespace kvtier {

// The KV pattern (kv_pattern.h) of rank `rank`'s heads: the bytes [rank * S/tp,
// (rank + 1) * S/tp) of each slot's full S = slot_bytes * tp bytes (MLA: all of them) — what
// rank `rank` holds of a TP=1 pool's pattern. `region` is the rank's (host memory).
Status FillTpShardPattern(const KvRegion& region, bool mla, int rank, int tp_size,
                          std::span<const int64_t> slots, std::span<const uint64_t> token_hashes);
// Corruption naming k, the slot, the layer and the buffer of the first mismatch.
Status VerifyTpShardPattern(const KvRegion& region, bool mla, int rank, int tp_size,
                            std::span<const int64_t> slots, std::span<const uint64_t> token_hashes);

}  // namespace kvtier
