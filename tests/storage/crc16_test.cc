// Tests of Redis Cluster key hashing: the CRC16 check value, known slots, the hashtag rules.
#include "storage/redis/crc16.h"

#include <gtest/gtest.h>

namespace kvtier::storage {
namespace {

TEST(Crc16Test, CheckValueOfXmodem) {
  // The check value of CRC16/XMODEM, also given by the Redis Cluster specification.
  EXPECT_EQ(Crc16("123456789"), 0x31C3);
  EXPECT_EQ(Crc16(""), 0);
}

TEST(HashSlotTest, KnownSlots) {
  // Slots that `CLUSTER KEYSLOT` reports (the cluster test checks object names live too).
  EXPECT_EQ(HashSlot("foo"), 12182);
  EXPECT_EQ(HashSlot("bar"), 5061);
  EXPECT_EQ(HashSlot("somekey"), 11058);
  EXPECT_EQ(HashSlot("hello"), 866);
}

TEST(HashSlotTest, HashtagRules) {
  // The text between the first '{' and the next '}' is hashed when non-empty.
  EXPECT_EQ(HashSlot("{user1000}.following"), HashSlot("user1000"));
  EXPECT_EQ(HashSlot("{user1000}.followers"), HashSlot("user1000"));
  EXPECT_EQ(HashSlot("foo{bar}{zap}"), HashSlot("bar"));
  // An empty tag hashes the whole key; only the first '{' opens a tag.
  EXPECT_EQ(HashSlot("foo{}{bar}"), Crc16("foo{}{bar}") % 16384);
  EXPECT_EQ(HashSlot("foo{{bar}}zap"), HashSlot("{bar"));
  // No closing brace: the whole key.
  EXPECT_EQ(HashSlot("foo{bar"), Crc16("foo{bar") % 16384);
  // Binary keys (embedded zero bytes) are hashed byte for byte.
  EXPECT_EQ(HashSlot(std::string_view("a\0b", 3)), Crc16(std::string_view("a\0b", 3)) % 16384);
}

TEST(HashSlotTest, SlotsAreInRange) {
  for (int i = 0; i < 10000; ++i) {
    const int slot = HashSlot("kv0123456789abcdef/" + std::to_string(i));
    ASSERT_GE(slot, 0);
    ASSERT_LT(slot, kRedisClusterSlots);
  }
}

}  // namespace
}  // namespace kvtier::storage
