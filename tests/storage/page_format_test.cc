// The page value format: round trips (one and two segments), and every way a value can fail to
// check out — each a miss with the right PageStatus and no byte written past the buffer.
#include "storage/page_format.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <optional>
#include <random>
#include <vector>

namespace kvtier::storage {
namespace {

constexpr uint64_t kNs = 0x1234'5678'9abc'def0ull;

PageKey KeyOf(uint8_t seed) {
  PageKey k;
  for (size_t i = 0; i < k.bytes.size(); ++i) k.bytes[i] = static_cast<uint8_t>(seed * 31 + i);
  return k;
}

std::vector<std::byte> RandomBytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<std::byte> v(n);
  for (auto& b : v) b = static_cast<std::byte>(rng());
  return v;
}

std::vector<std::byte> Encode(const PageKey& key, std::vector<std::byte>& payload) {
  std::vector<std::byte> value(kPageHeaderBytes + payload.size());
  EncodePageValue(kNs, key, PageBuffer::Of(payload), value);
  return value;
}

TEST(PageFormatTest, RoundTripOneAndTwoSegments) {
  const PageKey key = KeyOf(1);
  std::vector<std::byte> payload = RandomBytes(4096, 1);
  const std::vector<std::byte> value = Encode(key, payload);
  ASSERT_EQ(value.size(), kPageHeaderBytes + 4096);
  EXPECT_EQ(std::memcmp(value.data() + kPageHeaderBytes, payload.data(), 4096), 0);

  std::vector<std::byte> out(4096, std::byte{0xAB});
  EXPECT_EQ(ReadPageValue(value, kNs, key, PageBuffer::Of(out)), PageStatus::kOk);
  EXPECT_EQ(out, payload);

  // The same payload split over two segments (K and V) encodes to the same bytes.
  std::vector<std::byte> k(payload.begin(), payload.begin() + 1000);
  std::vector<std::byte> v(payload.begin() + 1000, payload.end());
  std::vector<std::byte> split(value.size());
  EncodePageValue(kNs, key, PageBuffer::Of(k, v), split);
  EXPECT_EQ(split, value);
  std::vector<std::byte> k_out(1000), v_out(3096);
  EXPECT_EQ(ReadPageValue(value, kNs, key, PageBuffer::Of(k_out, v_out)), PageStatus::kOk);
  EXPECT_EQ(k_out, k);
  EXPECT_EQ(v_out, v);

  PageHeader header;
  EXPECT_EQ(ParsePageHeader(std::span(value).first(kPageHeaderBytes), kNs, key, 4096, &header),
            PageStatus::kOk);
  EXPECT_EQ(header.version, kPageFormatV1);  // what the memory and Redis stores write
  EXPECT_FALSE(header.parent);
  EXPECT_EQ(header.checksum_kind, DefaultChecksumKind());
  EXPECT_EQ(header.key, key);
  EXPECT_EQ(CheckPayload(header, PageBuffer::Of(payload)), PageStatus::kOk);
}

// A version-2 value (the file store's header, here followed directly by the payload).
std::vector<std::byte> EncodeV2(const PageKey& key, const std::optional<PageKey>& parent,
                                std::vector<std::byte>& payload) {
  PageHeader h = NewPageHeaderWithParent(kNs, key, payload.size(), parent);
  EXPECT_TRUE(PayloadChecksum(h.checksum_kind, PageBuffer::Of(payload), &h.payload_checksum));
  std::vector<std::byte> value(kPageHeaderV2Bytes + payload.size());
  EncodePageHeader(h, value);
  std::memcpy(value.data() + kPageHeaderV2Bytes, payload.data(), payload.size());
  return value;
}

// Writes a valid header checksum over a header of `header_bytes` whose bytes were changed.
void Reseal(std::vector<std::byte>& value, size_t header_bytes) {
  const std::span<const std::byte> covered(value.data(), header_bytes - 8);
  uint64_t checksum = 0;
  ASSERT_TRUE(PayloadChecksum(kChecksumXxh3, std::span(&covered, 1), &checksum));
  for (int i = 0; i < 8; ++i) {
    value[header_bytes - 8 + static_cast<size_t>(i)] = static_cast<std::byte>(checksum >> (8 * i));
  }
}

TEST(PageFormatTest, VersionTwoCarriesTheParentOrNone) {
  const PageKey key = KeyOf(11), parent = KeyOf(12);
  std::vector<std::byte> payload = RandomBytes(777, 11);
  for (const std::optional<PageKey>& p :
       {std::optional<PageKey>(parent), std::optional<PageKey>()}) {
    const std::vector<std::byte> value = EncodeV2(key, p, payload);
    EXPECT_EQ(std::to_integer<int>(value[4]), 2);
    EXPECT_EQ(std::to_integer<int>(value[7]), p ? 1 : 0);
    std::vector<std::byte> out(777, std::byte{0xAB});
    EXPECT_EQ(ReadPageValue(value, kNs, key, PageBuffer::Of(out)), PageStatus::kOk);
    EXPECT_EQ(out, payload);
    PageHeader header;
    // The header parses from a span that runs past it (the file store's 4 KiB header block).
    ASSERT_EQ(ParsePageHeader(value, kNs, key, 777, &header), PageStatus::kOk);
    EXPECT_EQ(header.version, kPageFormatV2);
    EXPECT_EQ(header.bytes(), kPageHeaderV2Bytes);
    EXPECT_EQ(header.parent, p);
    EXPECT_EQ(CheckPayload(header, PageBuffer::Of(payload)), PageStatus::kOk);
    EXPECT_EQ(ReadPageValue(value, kNs + 1, key, PageBuffer::Of(out)), PageStatus::kWrongNamespace);
    // Cut anywhere inside its 104 bytes, the header is a miss (the version-1 length is not enough).
    for (size_t n = 0; n < kPageHeaderV2Bytes; ++n) {
      EXPECT_EQ(ParsePageHeader(std::span(value).first(n), kNs, key, 777, nullptr),
                PageStatus::kCorrupt)
          << n;
    }
    std::vector<std::byte> longer = value;
    longer.push_back(std::byte{0});
    EXPECT_EQ(ReadPageValue(longer, kNs, key, PageBuffer::Of(out)), PageStatus::kCorrupt);
  }
}

TEST(PageFormatTest, VersionTwoHeaderByteFlipsAndStrayFlagsAreMisses) {
  const PageKey key = KeyOf(13);
  std::vector<std::byte> payload = RandomBytes(200, 13);
  const std::vector<std::byte> value = EncodeV2(key, KeyOf(14), payload);
  std::vector<std::byte> out(200);
  for (size_t i = 0; i < value.size(); ++i) {
    for (uint8_t bit : {uint8_t{0x01}, uint8_t{0x80}}) {
      std::vector<std::byte> bad = value;
      bad[i] ^= std::byte{bit};
      EXPECT_EQ(ReadPageValue(bad, kNs, key, PageBuffer::Of(out)), PageStatus::kCorrupt)
          << "byte " << i << " bit " << int{bit};
    }
  }
  // Well sealed, but: an unknown flag bit; a parent field holding bytes without kHasParent; a
  // version-1 header with a flag set.
  std::vector<std::byte> stray_flag = value;
  stray_flag[7] |= std::byte{0x02};
  Reseal(stray_flag, kPageHeaderV2Bytes);
  EXPECT_EQ(ReadPageValue(stray_flag, kNs, key, PageBuffer::Of(out)), PageStatus::kCorrupt);
  std::vector<std::byte> stray_parent = value;
  stray_parent[7] = std::byte{0};
  Reseal(stray_parent, kPageHeaderV2Bytes);
  EXPECT_EQ(ReadPageValue(stray_parent, kNs, key, PageBuffer::Of(out)), PageStatus::kCorrupt);
  std::vector<std::byte> v1 = Encode(key, payload);
  v1[7] = std::byte{kHasParent};
  Reseal(v1, kPageHeaderBytes);
  EXPECT_EQ(ReadPageValue(v1, kNs, key, PageBuffer::Of(out)), PageStatus::kCorrupt);
  // The checks hold: unchanged but resealed, each reads again.
  std::vector<std::byte> resealed = value;
  Reseal(resealed, kPageHeaderV2Bytes);
  EXPECT_EQ(ReadPageValue(resealed, kNs, key, PageBuffer::Of(out)), PageStatus::kOk);
}

TEST(PageFormatTest, EveryHeaderOrPayloadByteFlipIsAMiss) {
  const PageKey key = KeyOf(2);
  std::vector<std::byte> payload = RandomBytes(256, 2);
  const std::vector<std::byte> value = Encode(key, payload);
  std::vector<std::byte> out(256);
  for (size_t i = 0; i < value.size(); ++i) {
    for (uint8_t bit : {uint8_t{0x01}, uint8_t{0x80}}) {
      std::vector<std::byte> bad = value;
      bad[i] ^= std::byte{bit};
      const PageStatus st = ReadPageValue(bad, kNs, key, PageBuffer::Of(out));
      EXPECT_EQ(st, PageStatus::kCorrupt) << "byte " << i << " bit " << int{bit};
    }
  }
}

TEST(PageFormatTest, WrongNamespaceKeyLengthAndTruncation) {
  const PageKey key = KeyOf(3);
  std::vector<std::byte> payload = RandomBytes(512, 3);
  const std::vector<std::byte> value = Encode(key, payload);
  std::vector<std::byte> out(512);
  EXPECT_EQ(ReadPageValue(value, kNs + 1, key, PageBuffer::Of(out)), PageStatus::kWrongNamespace);
  EXPECT_EQ(ReadPageValue(value, kNs, KeyOf(4), PageBuffer::Of(out)), PageStatus::kCorrupt);
  std::vector<std::byte> shorter(511);
  EXPECT_EQ(ReadPageValue(value, kNs, key, PageBuffer::Of(shorter)), PageStatus::kCorrupt);
  for (size_t n :
       {size_t{0}, size_t{1}, kPageHeaderBytes - 1, kPageHeaderBytes, kPageHeaderBytes + 511}) {
    EXPECT_EQ(ReadPageValue(std::span(value).first(n), kNs, key, PageBuffer::Of(out)),
              PageStatus::kCorrupt)
        << n;
  }
  std::vector<std::byte> longer = value;
  longer.push_back(std::byte{0});
  EXPECT_EQ(ReadPageValue(longer, kNs, key, PageBuffer::Of(out)), PageStatus::kCorrupt);
}

TEST(PageFormatTest, OlderVersionAndUnknownChecksumKindAreMisses) {
  const PageKey key = KeyOf(5);
  std::vector<std::byte> payload = RandomBytes(128, 5);
  std::vector<std::byte> out(128);
  for (uint16_t version : {uint16_t{0}, uint16_t{kPageFormatVersion + 1}}) {
    PageHeader h;
    h.version = version;
    h.checksum_kind = DefaultChecksumKind();
    h.namespace_hash = kNs;
    h.key = key;
    h.payload_bytes = payload.size();
    ASSERT_TRUE(PayloadChecksum(h.checksum_kind, PageBuffer::Of(payload), &h.payload_checksum));
    std::vector<std::byte> value(kPageHeaderBytes + payload.size());
    EncodePageHeader(h, std::span(value).first<kPageHeaderBytes>());
    std::memcpy(value.data() + kPageHeaderBytes, payload.data(), payload.size());
    // A well-formed header in every other respect: only the version is wrong.
    EXPECT_EQ(ReadPageValue(value, kNs, key, PageBuffer::Of(out)), PageStatus::kCorrupt) << version;
  }
  PageHeader h;
  h.checksum_kind = 7;
  h.namespace_hash = kNs;
  h.key = key;
  h.payload_bytes = payload.size();
  std::vector<std::byte> value(kPageHeaderBytes + payload.size());
  EncodePageHeader(h, std::span(value).first<kPageHeaderBytes>());
  EXPECT_EQ(ReadPageValue(value, kNs, key, PageBuffer::Of(out)), PageStatus::kCorrupt);
}

TEST(PageFormatTest, Sha256KindIsAMiss) {
  // Kind 2 (SHA-256, written once by builds without libxxhash) is not read by any build: a miss,
  // never unchecked bytes. The header below is otherwise well formed.
  const PageKey key = KeyOf(6);
  std::vector<std::byte> payload = RandomBytes(1000, 6);
  std::vector<std::byte> value = Encode(key, payload);
  value[6] = std::byte{2};
  std::vector<std::byte> out(1000);
  EXPECT_EQ(ReadPageValue(value, kNs, key, PageBuffer::Of(out)), PageStatus::kCorrupt);
  uint64_t checksum = 0;
  EXPECT_FALSE(PayloadChecksum(2, PageBuffer::Of(payload), &checksum));
  EXPECT_FALSE(PayloadHasher(2).ok());
}

// The streaming hasher gives PayloadChecksum's value however the payload is cut into pieces.
TEST(PageFormatTest, StreamingHasherMatchesOneShotChecksum) {
  std::vector<std::byte> payload(1'000'003);
  std::mt19937 rng(5);
  for (auto& b : payload) b = static_cast<std::byte>(rng());
  const std::span<const std::byte> whole(payload);
  for (uint8_t kind : {kChecksumXxh3}) {
    uint64_t expected = 0;
    ASSERT_TRUE(PayloadChecksum(kind, std::span(&whole, 1), &expected));
    for (size_t piece : {size_t{1} << 18, size_t{4097}, payload.size()}) {
      PayloadHasher hasher(kind);
      ASSERT_TRUE(hasher.ok());
      for (size_t at = 0; at < payload.size(); at += piece) {
        hasher.Update(whole.subspan(at, std::min(piece, payload.size() - at)));
      }
      EXPECT_EQ(hasher.Digest(), expected) << int{kind} << " " << piece;
    }
  }
  EXPECT_FALSE(PayloadHasher(7).ok());
}

TEST(PageFormatTest, CorruptPayloadNeverReachesTheBuffer) {
  const PageKey key = KeyOf(8);
  std::vector<std::byte> payload = RandomBytes(300, 8);
  std::vector<std::byte> value = Encode(key, payload);
  value[kPageHeaderBytes + 150] ^= std::byte{0x10};
  std::vector<std::byte> out(300, std::byte{0xEE});
  EXPECT_EQ(ReadPageValue(value, kNs, key, PageBuffer::Of(out)), PageStatus::kCorrupt);
  for (auto b : out) ASSERT_EQ(b, std::byte{0xEE});
}

}  // namespace
}  // namespace kvtier::storage
