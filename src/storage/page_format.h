// Internal: the value every storage backend stores for one page — a fixed header followed by the
// payload — and the checks that turn anything that does not check out into a miss.
//
// Header (kPageHeaderBytes = 72 bytes, little-endian):
//   offset  size  field
//        0     4  magic "KVTP"
//        4     2  format version (kPageFormatVersion; any other version is a miss)
//        6     1  checksum kind (1 = XXH3-64; every other value is a miss)
//        7     1  reserved, 0
//        8     8  namespace hash (StorageNamespace::Hash)
//       16    32  page key
//       48     8  payload length in bytes
//       56     8  checksum of the payload
//       64     8  checksum of bytes [0, 64) of this header
// The payload (K then V of a page_first page, or the one MLA buffer) follows at byte 72.
//
// A header of 72 zero bytes is blank: the Redis backend writes large pages header-last (the value
// with a blank header first, the header once the payload's checksum is known) and reads a blank
// header as absent. Everywhere else it fails the header checksum like any other damage (kCorrupt).
//
// Order of the checks (so each fault has one outcome): length, header checksum, magic, version,
// checksum kind → kCorrupt; namespace hash → kWrongNamespace; key, payload length, payload
// checksum → kCorrupt. The format does not depend on the build: every build writes and reads
// XXH3-64 (libxxhash is a required dependency). Kind 2 (SHA-256, once written by builds without
// libxxhash) is no longer read: such a value is a miss (kCorrupt), never unchecked bytes.
//
// Thread safety: pure functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>

#include "kvtier/page_key.h"
#include "kvtier/storage.h"

namespace kvtier::storage {

inline constexpr size_t kPageHeaderBytes = kStoredPageHeaderBytes;
inline constexpr uint16_t kPageFormatVersion = 1;
inline constexpr uint8_t kChecksumXxh3 = 1;

// The checksum kind every build writes: XXH3-64.
constexpr uint8_t DefaultChecksumKind() { return kChecksumXxh3; }

struct PageHeader {
  uint16_t version = kPageFormatVersion;
  uint8_t checksum_kind = kChecksumXxh3;
  uint64_t namespace_hash = 0;
  PageKey key;
  uint64_t payload_bytes = 0;
  uint64_t payload_checksum = 0;
};

// The header written for a payload of `payload_bytes` under `key`: XXH3-64, the payload
// checksum still 0 (the writer fills it in).
PageHeader NewPageHeader(uint64_t namespace_hash, const PageKey& key, uint64_t payload_bytes);

// Checksum of `segments` concatenated, of the given kind. Returns false for an unknown kind.
bool PayloadChecksum(uint8_t kind, std::span<const std::span<const std::byte>> segments,
                     uint64_t* checksum);
// Of one page buffer's segments.
bool PayloadChecksum(uint8_t kind, const PageBuffer& payload, uint64_t* checksum);

// The checksum of a payload fed in pieces (the file backend hashes each chunk of a page right
// after reading it, or right before writing it, while it is still in cache). Same values as
// PayloadChecksum over the pieces concatenated.
class PayloadHasher {
 public:
  // ok() is false for an unknown kind.
  explicit PayloadHasher(uint8_t kind);
  ~PayloadHasher();
  PayloadHasher(const PayloadHasher&) = delete;
  PayloadHasher& operator=(const PayloadHasher&) = delete;

  bool ok() const { return state_ != nullptr; }
  uint8_t kind() const { return kind_; }
  void Update(std::span<const std::byte> bytes);  // REQUIRES: ok()
  uint64_t Digest();                              // REQUIRES: ok(); once, after the last Update

 private:
  struct State;
  uint8_t kind_;
  std::unique_ptr<State> state_;
};

// Writes the header for `payload` (its length and XXH3-64 checksum) into
// `out`, the header checksum last.
void EncodePageHeader(uint64_t namespace_hash, const PageKey& key, const PageBuffer& payload,
                      std::span<std::byte, kPageHeaderBytes> out);
// The same from a header whose payload fields are already filled (`header.version` and
// `header.checksum_kind` are written as given: tests write old versions with it).
void EncodePageHeader(const PageHeader& header, std::span<std::byte, kPageHeaderBytes> out);

// Parses and checks a header alone: size, header checksum, magic, version, checksum kind, then
// the namespace hash, the key and the payload length against what the reader expects. kOk fills
// `*out` (payload checksum still to be checked against the payload).
PageStatus ParsePageHeader(std::span<const std::byte> bytes, uint64_t namespace_hash,
                           const PageKey& key, uint64_t payload_bytes, PageHeader* out);

// True when the first kPageHeaderBytes of `bytes` are all zero (see "blank" above).
// REQUIRES: bytes.size() >= kPageHeaderBytes.
bool IsBlankPageHeader(std::span<const std::byte> bytes);

// Checks the payload already in `payload` against a parsed header's checksum.
PageStatus CheckPayload(const PageHeader& header, const PageBuffer& payload);

// A whole value (header ‖ payload, as a Redis GET returns it): checks it and copies the payload
// into `dst` (whose bytes() is the expected payload length). Anything but kOk leaves `dst`
// contents undefined. Never reads outside `value` nor writes outside `dst`.
PageStatus ReadPageValue(std::span<const std::byte> value, uint64_t namespace_hash,
                         const PageKey& key, const PageBuffer& dst);

// The bytes of header ‖ payload for `payload`, as one buffer (memory and Redis backends).
void EncodePageValue(uint64_t namespace_hash, const PageKey& key, const PageBuffer& payload,
                     std::span<std::byte> out);  // REQUIRES: out.size() == 72 + payload.bytes()

}  // namespace kvtier::storage
