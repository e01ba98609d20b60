// EncodeKvEventBatch against vLLM's array-like msgspec layout: golden bytes (as Python's msgpack
// packs the same lists, which is how msgspec lays them out), random batches decoded field by field
// with msgpack-cxx, and BlockHashOf against SGLang's page-key test vector.
#include <gtest/gtest.h>

#include <random>

#include "events/kv_event_decode.h"
#include "kvtier/kv_events.h"
#include "kvtier/page_key.h"

namespace kvtier {
namespace {

std::string Hex(std::string_view bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  for (unsigned char c : bytes) {
    out.push_back(kDigits[c >> 4]);
    out.push_back(kDigits[c & 15]);
  }
  return out;
}

TEST(KvEventEncodingTest, GoldenBytesMatchPythonMsgpack) {
  // msgpack.packb([1.5, [["BlockStored", [1, 2**64 - 1], None, [1, 2], 1, None, "GPU", None],
  //                      ["BlockRemoved", [300], "CPU_PINNED"], ["AllBlocksCleared"]]])
  KvEventBatch batch;
  batch.ts = 1.5;
  batch.events.push_back(
      BlockStored{{1, UINT64_MAX}, std::nullopt, {1, 2}, 1, std::nullopt, "GPU"});
  batch.events.push_back(BlockRemoved{{300}, "CPU_PINNED"});
  batch.events.push_back(AllBlocksCleared{});
  EXPECT_EQ(Hex(EncodeKvEventBatch(batch)),
            "92cb3ff80000000000009398ab426c6f636b53746f7265649201cfffffffffffffffffc092010201c0a34"
            "75055c093ac426c6f636b52656d6f76656491cd012caa4350555f50494e4e454491b0416c6c426c6f636b"
            "73436c6561726564");
  // msgpack.packb([0.25, [], 3]): data_parallel_rank written only when set.
  KvEventBatch ranked;
  ranked.ts = 0.25;
  ranked.data_parallel_rank = 3;
  EXPECT_EQ(Hex(EncodeKvEventBatch(ranked)), "93cb3fd00000000000009003");
  // msgpack.packb([0.0, []]) and msgpack.packb([1700000000.0, []]): integral times stay float64.
  EXPECT_EQ(Hex(EncodeKvEventBatch(KvEventBatch{})), "92cb000000000000000090");
  EXPECT_EQ(Hex(EncodeKvEventBatch(KvEventBatch{1700000000.0, {}, std::nullopt})),
            "92cb41d954fc4000000090");
}

TEST(KvEventEncodingTest, RandomBatchesDecodeToTheirFields) {
  std::mt19937_64 rng(20261125);
  for (int i = 0; i < 2000; ++i) {
    const KvEventBatch batch = testing::RandomBatch(rng);
    const std::string bytes = EncodeKvEventBatch(batch);
    const std::optional<KvEventBatch> decoded = testing::DecodeVllmBatch(bytes);
    ASSERT_TRUE(decoded.has_value()) << "batch " << i;
    ASSERT_EQ(*decoded, batch) << "batch " << i;
  }
}

TEST(KvEventEncodingTest, LargeBatchesKeepEveryElement) {
  // Array lengths past msgpack's 16-bit array header.
  KvEventBatch batch;
  BlockStored stored;
  stored.block_size = 1;
  for (uint32_t i = 0; i < 70000; ++i) {
    stored.block_hashes.push_back(uint64_t{i} * 0x9e3779b97f4a7c15ull);
    stored.token_ids.push_back(static_cast<Token>(i));
  }
  stored.parent_block_hash = 7;
  stored.medium = "DISK";
  batch.events.push_back(stored);
  const std::optional<KvEventBatch> decoded = testing::DecodeVllmBatch(EncodeKvEventBatch(batch));
  ASSERT_TRUE(decoded.has_value());
  EXPECT_EQ(*decoded, batch);
}

TEST(KvEventEncodingTest, BlockHashIsTheLastEightBytesOfThePageKeyBigEndian) {
  // SGLang's vector: page_keys([1, 2, 3, 4], 4) ==
  // cf97adeedb59e05bfd73a2b4c2a8885708c4f4f70c84c64b27120e72ab733b72
  const std::vector<int32_t> tokens = {1, 2, 3, 4};
  auto keys = ComputePageKeys(std::span<const int32_t>(tokens), 4, std::nullopt);
  ASSERT_TRUE(keys.ok());
  ASSERT_EQ(keys.value().size(), 1u);
  EXPECT_EQ(BlockHashOf(keys.value()[0]), 0x27120e72ab733b72ull);
  PageKey all_ones;
  all_ones.bytes.fill(0xff);
  EXPECT_EQ(BlockHashOf(all_ones), UINT64_MAX);
  PageKey low;
  low.bytes[31] = 1;
  low.bytes[24] = 0x80;  // the 8th byte from the end is the most significant
  EXPECT_EQ(BlockHashOf(low), 0x8000000000000001ull);
}

TEST(KvEventEncodingTest, StorageMediumComesFromTheSchemeOnly) {
  EXPECT_EQ(StorageMediumOf("file:///var/kv"), "DISK");
  EXPECT_EQ(StorageMediumOf("redis://:secret@127.0.0.1:6379/0"), "REDIS");
  EXPECT_EQ(StorageMediumOf("redis+cluster://127.0.0.1:7000"), "REDIS");
  EXPECT_EQ(StorageMediumOf("memory://?capacity=1GiB"), "MEMORY");
  EXPECT_EQ(StorageMediumOf("s3://bucket/x"), "S3");
  EXPECT_EQ(StorageMediumOf("no-scheme"), "STORAGE");
  EXPECT_EQ(StorageMediumOf("://x"), "STORAGE");
}

}  // namespace
}  // namespace kvtier
