// Internal: Redis Cluster key hashing — CRC16 (XMODEM: polynomial 0x1021, initial value 0, no
// reflection) and the hash slot of a key, with the cluster's `{hashtag}` rule.
//
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <string_view>

namespace kvtier::storage {

inline constexpr int kRedisClusterSlots = 16384;

// CRC16/XMODEM of `data`; Crc16("123456789") == 0x31C3.
uint16_t Crc16(std::string_view data);

// The cluster slot of `key`, in [0, 16384): CRC16 of the hashed part, modulo 16384. The hashed
// part is the text between the first '{' and the first '}' after it, when that text is non-empty;
// otherwise the whole key.
int HashSlot(std::string_view key);

}  // namespace kvtier::storage
