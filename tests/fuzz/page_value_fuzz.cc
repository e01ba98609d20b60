// libFuzzer target over the page value parser (src/storage/page_format.h).
//
// Properties checked on every input, for both header versions (1: 72 bytes; 2: 104 bytes naming a
// parent):
//   1. ReadPageValue on arbitrary bytes, read as a value of either header's length, never reads or
//      writes out of bounds (ASan/UBSan), and on kOk the buffer holds exactly the value's payload;
//   2. a value encoded from the input's bytes reads back as kOk with the same payload, whether
//      the reader's buffer has one segment or two (version 2: with the parent it was written
//      with, or none);
//   3. that encoded value with one byte flipped (position from the input) is never kOk.
// Any violation aborts (a finding). Run: build-fuzz/tests/fuzz/kvtier_fuzz_page_value
// -max_total_time=60
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <vector>

#include "storage/page_format.h"

namespace {

using kvtier::PageBuffer;
using kvtier::PageKey;
using kvtier::PageStatus;
namespace storage = kvtier::storage;

constexpr uint64_t kNamespace = 0x6b76746965722121ull;

PageKey KeyFrom(const uint8_t* data, size_t size) {
  PageKey key;
  for (size_t i = 0; i < key.bytes.size() && i < size; ++i) key.bytes[i] = data[i];
  return key;
}

void Check(bool ok) {
  if (!ok) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto* bytes = reinterpret_cast<const std::byte*>(data);
  const uint8_t split = size > 0 ? data[0] : 0;

  // 1. The input as a stored value, read with the key its header would name, as a value of a
  // version-1 header and of a version-2 one.
  for (const size_t header_bytes : {storage::kPageHeaderBytes, storage::kPageHeaderV2Bytes}) {
    const PageKey key = size >= 48 ? KeyFrom(data + 16, size - 16) : PageKey{};
    const size_t payload = size > header_bytes ? size - header_bytes : 0;
    std::vector<std::byte> dst(payload);
    const size_t first = payload == 0 ? 0 : split % (payload + 1);
    const PageBuffer buffer =
        PageBuffer::Of(std::span(dst).first(first), std::span(dst).subspan(first));
    const std::span<const std::byte> value(bytes, size);
    const PageStatus st = storage::ReadPageValue(value, kNamespace, key, buffer);
    if (st == PageStatus::kOk) {
      Check(std::memcmp(dst.data(), bytes + header_bytes, payload) == 0);
    }
    storage::PageHeader header;
    if (storage::ParsePageHeader(value, kNamespace, key, payload, &header) == PageStatus::kOk) {
      Check(header.bytes() <= size);
      Check(header.version == storage::kPageFormatV2 || !header.parent);
    }
  }

  // 2 and 3. Encode the input as a payload (version 1; version 2 with a parent taken from the
  // input when its first byte is odd, none otherwise), read it back, then flip one byte.
  for (const uint16_t version : {storage::kPageFormatV1, storage::kPageFormatV2}) {
    std::vector<std::byte> payload(bytes, bytes + size);
    const PageKey key = KeyFrom(data, size);
    std::optional<PageKey> parent;
    if (split & 1) parent = KeyFrom(size > 32 ? data + 32 : data, size > 32 ? size - 32 : size);
    storage::PageHeader header =
        version == storage::kPageFormatV1
            ? storage::NewPageHeader(kNamespace, key, size)
            : storage::NewPageHeaderWithParent(kNamespace, key, size, parent);
    Check(storage::PayloadChecksum(header.checksum_kind, PageBuffer::Of(payload),
                                   &header.payload_checksum));
    std::vector<std::byte> value(header.bytes() + size);
    storage::EncodePageHeader(header, value);
    if (size > 0) std::memcpy(value.data() + header.bytes(), payload.data(), size);
    if (version == storage::kPageFormatV1) {  // the memory and Redis stores' encoder agrees
      std::vector<std::byte> encoded(value.size());
      storage::EncodePageValue(kNamespace, key, PageBuffer::Of(payload), encoded);
      Check(encoded == value);
    }
    std::vector<std::byte> out(size);
    const size_t first = size == 0 ? 0 : split % (size + 1);
    const PageBuffer buffer =
        PageBuffer::Of(std::span(out).first(first), std::span(out).subspan(first));
    Check(storage::ReadPageValue(value, kNamespace, key, buffer) == PageStatus::kOk);
    Check(out == payload);
    storage::PageHeader parsed;
    Check(storage::ParsePageHeader(value, kNamespace, key, size, &parsed) == PageStatus::kOk);
    Check(parsed.version == version && parsed.bytes() == header.bytes());
    Check(parsed.parent == (version == storage::kPageFormatV2 ? parent : std::nullopt));
    Check(storage::ReadPageValue(value, kNamespace + 1, key, buffer) ==
          PageStatus::kWrongNamespace);
    if (size >= 2) {
      const size_t at = (static_cast<size_t>(data[1]) * 257 + size) % value.size();
      value[at] ^= std::byte{static_cast<uint8_t>(data[size - 1] | 1)};
      Check(storage::ReadPageValue(value, kNamespace, key, buffer) != PageStatus::kOk);
    }
  }
  return 0;
}
