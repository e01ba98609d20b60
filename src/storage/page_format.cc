// The page value format (page_format.h): header encoding, parsing and checksums.
//
// Thread safety: pure functions.
#include "storage/page_format.h"

#include <algorithm>
#include <cstring>
#include <memory>

#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>
// On x86-64 libxxhash picks the widest vector unit at run time (AVX2/AVX-512 beside the SSE2
// baseline); the values are the same.
#if defined(__x86_64__) && __has_include(<xxh_x86dispatch.h>)
#include <xxh_x86dispatch.h>
#endif

namespace kvtier::storage {
namespace {

constexpr std::byte kMagic[4] = {std::byte{'K'}, std::byte{'V'}, std::byte{'T'}, std::byte{'P'}};
constexpr size_t kParentOffset = 64;  // version 2

// Where a header of `version` keeps its own checksum: its last 8 bytes.
constexpr size_t HeaderChecksumOffset(uint16_t version) { return PageHeaderBytes(version) - 8; }

void PutLe(uint64_t value, int bytes, std::byte* out) {
  for (int i = 0; i < bytes; ++i) out[i] = static_cast<std::byte>(value >> (8 * i));
}

uint64_t GetLe(const std::byte* in, int bytes) {
  uint64_t value = 0;
  for (int i = bytes - 1; i >= 0; --i) value = value << 8 | std::to_integer<uint64_t>(in[i]);
  return value;
}

uint64_t Xxh3(std::span<const std::span<const std::byte>> segments) {
  if (segments.size() == 1) return XXH3_64bits(segments[0].data(), segments[0].size());
  XXH3_state_t state;  // static linking only: the state lives on the stack, no allocation
  XXH3_INITSTATE(&state);
  XXH3_64bits_reset(&state);
  for (const auto& s : segments) XXH3_64bits_update(&state, s.data(), s.size());
  return XXH3_64bits_digest(&state);
}

}  // namespace

struct PayloadHasher::State {
  XXH3_state_t xxh3;  // 64-byte aligned; State is allocated with operator new, which honours it
};

PayloadHasher::PayloadHasher(uint8_t kind) : kind_(kind) {
  if (kind != kChecksumXxh3) return;
  state_ = std::make_unique<State>();
  XXH3_INITSTATE(&state_->xxh3);
  XXH3_64bits_reset(&state_->xxh3);
}

PayloadHasher::~PayloadHasher() = default;

void PayloadHasher::Update(std::span<const std::byte> bytes) {
  if (!bytes.empty()) XXH3_64bits_update(&state_->xxh3, bytes.data(), bytes.size());
}

uint64_t PayloadHasher::Digest() { return XXH3_64bits_digest(&state_->xxh3); }

bool PayloadChecksum(uint8_t kind, std::span<const std::span<const std::byte>> segments,
                     uint64_t* checksum) {
  if (kind != kChecksumXxh3) return false;
  *checksum = Xxh3(segments);
  return true;
}

bool PayloadChecksum(uint8_t kind, const PageBuffer& payload, uint64_t* checksum) {
  std::span<const std::byte> segments[PageBuffer::kMaxSegments];
  const int n = std::clamp(payload.num_segments, 0, PageBuffer::kMaxSegments);
  for (int i = 0; i < n; ++i) segments[i] = payload.segments[static_cast<size_t>(i)];
  return PayloadChecksum(kind, std::span(segments, static_cast<size_t>(n)), checksum);
}

void EncodePageHeader(const PageHeader& header, std::span<std::byte> out) {
  const size_t header_bytes = header.bytes();
  if (out.size() < header_bytes) {  // a caller's bug: a blank header, which no reader takes
    std::fill(out.begin(), out.end(), std::byte{0});
    return;
  }
  const bool v2 = header.version == kPageFormatV2;
  std::byte* p = out.data();
  std::memcpy(p, kMagic, 4);
  PutLe(header.version, 2, p + 4);
  p[6] = static_cast<std::byte>(header.checksum_kind);
  p[7] = std::byte{v2 && header.parent ? kHasParent : uint8_t{0}};
  PutLe(header.namespace_hash, 8, p + 8);
  std::memcpy(p + 16, header.key.bytes.data(), 32);
  PutLe(header.payload_bytes, 8, p + 48);
  PutLe(header.payload_checksum, 8, p + 56);
  if (v2) {
    if (header.parent) {
      std::memcpy(p + kParentOffset, header.parent->bytes.data(), 32);
    } else {
      std::memset(p + kParentOffset, 0, 32);
    }
  }
  const size_t checksum_at = HeaderChecksumOffset(header.version);
  const std::span<const std::byte> covered(p, checksum_at);
  uint64_t header_checksum = 0;
  // An unknown kind (only tests write one) leaves a zero header checksum: a miss when read.
  PayloadChecksum(header.checksum_kind, std::span(&covered, 1), &header_checksum);
  PutLe(header_checksum, 8, p + checksum_at);
}

PageHeader NewPageHeader(uint64_t namespace_hash, const PageKey& key, uint64_t payload_bytes) {
  PageHeader header;
  header.checksum_kind = DefaultChecksumKind();
  header.namespace_hash = namespace_hash;
  header.key = key;
  header.payload_bytes = payload_bytes;
  return header;
}

PageHeader NewPageHeaderWithParent(uint64_t namespace_hash, const PageKey& key,
                                   uint64_t payload_bytes, const std::optional<PageKey>& parent) {
  PageHeader header = NewPageHeader(namespace_hash, key, payload_bytes);
  header.version = kPageFormatV2;
  header.parent = parent;
  return header;
}

void EncodePageHeader(uint64_t namespace_hash, const PageKey& key, const PageBuffer& payload,
                      std::span<std::byte, kPageHeaderBytes> out) {
  PageHeader header = NewPageHeader(namespace_hash, key, static_cast<uint64_t>(payload.bytes()));
  PayloadChecksum(header.checksum_kind, payload, &header.payload_checksum);
  EncodePageHeader(header, out);
}

PageStatus ParsePageHeader(std::span<const std::byte> bytes, uint64_t namespace_hash,
                           const PageKey& key, uint64_t payload_bytes, PageHeader* out) {
  if (bytes.size() < kPageHeaderBytes) return PageStatus::kCorrupt;
  const std::byte* p = bytes.data();
  PageHeader h;
  // The version (not yet checked) says how long the header is and where its checksum lies; a
  // damaged version byte then fails that checksum (or, naming no version, the version check).
  h.version = static_cast<uint16_t>(GetLe(p + 4, 2));
  if (bytes.size() < h.bytes()) return PageStatus::kCorrupt;
  const size_t checksum_at = HeaderChecksumOffset(h.version);
  h.checksum_kind = std::to_integer<uint8_t>(p[6]);
  uint64_t header_checksum = 0;
  const std::span<const std::byte> covered(p, checksum_at);
  if (!PayloadChecksum(h.checksum_kind, std::span(&covered, 1), &header_checksum) ||
      header_checksum != GetLe(p + checksum_at, 8)) {
    return PageStatus::kCorrupt;
  }
  if (std::memcmp(p, kMagic, 4) != 0) return PageStatus::kCorrupt;
  if (h.version != kPageFormatV1 && h.version != kPageFormatV2) return PageStatus::kCorrupt;
  const uint8_t flags = std::to_integer<uint8_t>(p[7]);
  if (h.version == kPageFormatV1 && flags != 0) return PageStatus::kCorrupt;
  if (h.version == kPageFormatV2) {
    if ((flags & ~kHasParent) != 0) return PageStatus::kCorrupt;
    PageKey parent;
    std::memcpy(parent.bytes.data(), p + kParentOffset, 32);
    if (flags & kHasParent) {
      h.parent = parent;
    } else if (parent != PageKey{}) {
      return PageStatus::kCorrupt;  // bytes where none belong
    }
  }
  h.namespace_hash = GetLe(p + 8, 8);
  if (h.namespace_hash != namespace_hash) return PageStatus::kWrongNamespace;
  std::memcpy(h.key.bytes.data(), p + 16, 32);
  if (h.key != key) return PageStatus::kCorrupt;
  h.payload_bytes = GetLe(p + 48, 8);
  if (h.payload_bytes != payload_bytes) return PageStatus::kCorrupt;
  h.payload_checksum = GetLe(p + 56, 8);
  if (out != nullptr) *out = h;
  return PageStatus::kOk;
}

PageStatus CheckPayload(const PageHeader& header, const PageBuffer& payload) {
  if (static_cast<uint64_t>(payload.bytes()) != header.payload_bytes) return PageStatus::kCorrupt;
  uint64_t checksum = 0;
  if (!PayloadChecksum(header.checksum_kind, payload, &checksum) ||
      checksum != header.payload_checksum) {
    return PageStatus::kCorrupt;
  }
  return PageStatus::kOk;
}

bool IsBlankPageHeader(std::span<const std::byte> bytes) {
  return std::all_of(bytes.begin(), bytes.begin() + kPageHeaderBytes,
                     [](std::byte b) { return b == std::byte{0}; });
}

PageStatus ReadPageValue(std::span<const std::byte> value, uint64_t namespace_hash,
                         const PageKey& key, const PageBuffer& dst) {
  const uint64_t expected = static_cast<uint64_t>(dst.bytes());
  PageHeader header;
  const PageStatus st = ParsePageHeader(value, namespace_hash, key, expected, &header);
  if (st != PageStatus::kOk) return st;
  if (value.size() - header.bytes() != expected) return PageStatus::kCorrupt;
  // Check the stored bytes first, so a corrupt value never reaches the caller's buffer.
  const std::span<const std::byte> stored = value.subspan(header.bytes());
  uint64_t checksum = 0;
  if (!PayloadChecksum(header.checksum_kind, std::span(&stored, 1), &checksum) ||
      checksum != header.payload_checksum) {
    return PageStatus::kCorrupt;
  }
  size_t at = 0;
  for (int i = 0; i < dst.num_segments; ++i) {
    const auto& seg = dst.segments[static_cast<size_t>(i)];
    if (!seg.empty()) std::memcpy(seg.data(), stored.data() + at, seg.size());
    at += seg.size();
  }
  return PageStatus::kOk;
}

void EncodePageValue(uint64_t namespace_hash, const PageKey& key, const PageBuffer& payload,
                     std::span<std::byte> out) {
  EncodePageHeader(namespace_hash, key, payload, out.first<kPageHeaderBytes>());
  size_t at = kPageHeaderBytes;
  for (int i = 0; i < payload.num_segments; ++i) {
    const auto& seg = payload.segments[static_cast<size_t>(i)];
    if (!seg.empty()) std::memcpy(out.data() + at, seg.data(), seg.size());
    at += seg.size();
  }
}

}  // namespace kvtier::storage
