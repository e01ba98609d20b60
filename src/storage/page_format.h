// Internal: the value every storage backend stores for one page — a fixed header followed by the
// payload — and the checks that turn anything that does not check out into a miss.
//
// Header, version 1 (kPageHeaderBytes = 72 bytes, little-endian):
//   offset  size  field
//        0     4  magic "KVTP"
//        4     2  format version (1 or 2; any other version is a miss)
//        6     1  checksum kind (1 = XXH3-64; every other value is a miss)
//        7     1  flags: 0 in version 1
//        8     8  namespace hash (StorageNamespace::Hash)
//       16    32  page key
//       48     8  payload length in bytes
//       56     8  checksum of the payload
//       64     8  checksum of bytes [0, 64) of this header
// Version 2 (kPageHeaderV2Bytes = 104 bytes) adds the key of the page's parent (the page before it
// in its prompt), so that a store which finds its pages again after a restart (the file store's
// scan, file_index.h) knows their chains:
//   [0, 64)       as in version 1, but for:
//        4     2  format version 2
//        7     1  flags: bit 0 (kHasParent) = the parent field holds a key; every other bit 0
//       64    32  parent key (all zero when kHasParent is clear)
//       96     8  checksum of bytes [0, 96) of this header
// The payload (K then V of a page_first page, or the one MLA buffer) follows the header (at byte
// 72 or 104; the file store moves it to 4 KiB, file_backend.h).
//
// Who writes which: the file store writes version 2 (with or without a parent); the memory and
// Redis stores write version 1, as before version 2 existed — they have no restart scan to feed
// (a memory store dies with its process; Redis evicts by its own policy), so their values keep the
// 72-byte header (kStoredPageHeaderBytes). Every reader reads both versions: a version-1 page of
// an older file store reads as before, with no parent.
//
// A header of 72 zero bytes is blank: the Redis backend writes large pages header-last (the value
// with a blank header first, the header once the payload's checksum is known) and reads a blank
// header as absent. Everywhere else it fails the header checksum like any other damage (kCorrupt).
//
// Order of the checks (so each fault has one outcome): length; the header checksum (at the place
// the version field names: a damaged version fails it); magic, version, flags, a version-2 parent
// field that is not zero without kHasParent, checksum kind → kCorrupt; namespace hash →
// kWrongNamespace; key, payload length, payload checksum → kCorrupt. The format does not depend
// on the build: every build writes and reads XXH3-64 (libxxhash is a required dependency). Kind 2
// (SHA-256, once written by builds without libxxhash) is no longer read: such a value is a miss
// (kCorrupt), never unchecked bytes.
//
// Thread safety: pure functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>

#include "kvtier/page_key.h"
#include "kvtier/storage.h"

namespace kvtier::storage {

inline constexpr uint16_t kPageFormatV1 = 1;  // no parent; written by the memory and Redis stores
inline constexpr uint16_t kPageFormatV2 = 2;  // with the parent's key; written by the file store
inline constexpr uint16_t kPageFormatVersion = kPageFormatV2;       // the newest
inline constexpr size_t kPageHeaderBytes = kStoredPageHeaderBytes;  // a version-1 header
inline constexpr size_t kPageHeaderV2Bytes = 104;
inline constexpr size_t kMaxPageHeaderBytes = kPageHeaderV2Bytes;
inline constexpr uint8_t kHasParent = 1;  // version 2's flag: the parent field holds a key
inline constexpr uint8_t kChecksumXxh3 = 1;

// The bytes of a header of `version`: version 2's, or version 1's for every other value (the
// layout an unknown version is checked with, and tests write unknown versions in).
constexpr size_t PageHeaderBytes(uint16_t version) {
  return version == kPageFormatV2 ? kPageHeaderV2Bytes : kPageHeaderBytes;
}

// The checksum kind every build writes: XXH3-64.
constexpr uint8_t DefaultChecksumKind() { return kChecksumXxh3; }

struct PageHeader {
  uint16_t version = kPageFormatV1;
  uint8_t checksum_kind = kChecksumXxh3;
  uint64_t namespace_hash = 0;
  PageKey key;
  uint64_t payload_bytes = 0;
  uint64_t payload_checksum = 0;
  std::optional<PageKey> parent;  // version 2 only (written as kHasParent and the key)

  size_t bytes() const { return PageHeaderBytes(version); }
};

// The version-1 header (the memory and Redis stores') for a payload of `payload_bytes` under
// `key`: XXH3-64, the payload checksum still 0 (the writer fills it in).
PageHeader NewPageHeader(uint64_t namespace_hash, const PageKey& key, uint64_t payload_bytes);
// The same as version 2, naming `parent` (nullopt: none known; the flag stays clear).
PageHeader NewPageHeaderWithParent(uint64_t namespace_hash, const PageKey& key,
                                   uint64_t payload_bytes, const std::optional<PageKey>& parent);

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

// Writes the version-1 header for `payload` (its length and XXH3-64 checksum) into `out`, the
// header checksum last.
void EncodePageHeader(uint64_t namespace_hash, const PageKey& key, const PageBuffer& payload,
                      std::span<std::byte, kPageHeaderBytes> out);
// The same from a header whose payload fields are already filled (`header.version`,
// `header.checksum_kind` and `header.parent` are written as given: tests write old and unknown
// versions with it; a parent is written in version 2 only). Writes header.bytes() bytes.
// REQUIRES: out.size() >= header.bytes() (a smaller `out` is zeroed instead: a blank header).
void EncodePageHeader(const PageHeader& header, std::span<std::byte> out);

// Parses and checks a header alone (`bytes` may run past it: the header's own length comes from
// its version): size, header checksum, magic, version, flags, checksum kind, then the namespace
// hash, the key and the payload length against what the reader expects. kOk fills `*out`
// (payload checksum still to be checked against the payload; `out->bytes()` is where the payload
// follows in a value; `out->parent` the parent a version-2 header names).
PageStatus ParsePageHeader(std::span<const std::byte> bytes, uint64_t namespace_hash,
                           const PageKey& key, uint64_t payload_bytes, PageHeader* out);

// True when the first kPageHeaderBytes of `bytes` are all zero (see "blank" above).
// REQUIRES: bytes.size() >= kPageHeaderBytes.
bool IsBlankPageHeader(std::span<const std::byte> bytes);

// Checks the payload already in `payload` against a parsed header's checksum.
PageStatus CheckPayload(const PageHeader& header, const PageBuffer& payload);

// A whole value (header ‖ payload, as a Redis GET returns it; either version): checks it and
// copies the payload
// into `dst` (whose bytes() is the expected payload length). Anything but kOk leaves `dst`
// contents undefined. Never reads outside `value` nor writes outside `dst`.
PageStatus ReadPageValue(std::span<const std::byte> value, uint64_t namespace_hash,
                         const PageKey& key, const PageBuffer& dst);

// The bytes of a version-1 header ‖ payload for `payload`, as one buffer (memory and Redis
// backends).
void EncodePageValue(uint64_t namespace_hash, const PageKey& key, const PageBuffer& payload,
                     std::span<std::byte> out);  // REQUIRES: out.size() == 72 + payload.bytes()

}  // namespace kvtier::storage
