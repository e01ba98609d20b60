// KV events as msgpack, the way vLLM's msgspec structs (array_like=True, tag=True,
// omit_defaults=True) encode them. The layout of each struct is written in kvtier/kv_events.h.
//
// Thread safety: pure functions.
#include <bit>
#include <cctype>
#include <msgpack.hpp>

#include "kvtier/kv_events.h"

namespace kvtier {
namespace {

using Packer = msgpack::packer<msgpack::sbuffer>;

template <typename T>
void PackOptional(Packer& pk, const std::optional<T>& value) {
  if (value) {
    pk.pack(*value);
  } else {
    pk.pack_nil();
  }
}

void PackHashes(Packer& pk, const std::vector<uint64_t>& hashes) {
  pk.pack_array(static_cast<uint32_t>(hashes.size()));
  for (uint64_t h : hashes) pk.pack_uint64(h);
}

void PackEvent(Packer& pk, const BlockStored& e) {
  // ["BlockStored", block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium,
  //  lora_name]: lora_name has no default in the vLLM versions that have it, so it is written
  //  (nil); older decoders ignore it.
  pk.pack_array(8);
  pk.pack(std::string_view("BlockStored"));
  PackHashes(pk, e.block_hashes);
  PackOptional(pk, e.parent_block_hash);
  pk.pack_array(static_cast<uint32_t>(e.token_ids.size()));
  for (Token t : e.token_ids) pk.pack_int64(t);
  pk.pack_int64(e.block_size);
  PackOptional(pk, e.lora_id);
  PackOptional(pk, e.medium);
  pk.pack_nil();
}

void PackEvent(Packer& pk, const BlockRemoved& e) {
  pk.pack_array(3);
  pk.pack(std::string_view("BlockRemoved"));
  PackHashes(pk, e.block_hashes);
  PackOptional(pk, e.medium);
}

void PackEvent(Packer& pk, const AllBlocksCleared&) {
  pk.pack_array(1);
  pk.pack(std::string_view("AllBlocksCleared"));
}

// Always a msgpack float64, as msgspec writes a Python float (msgpack-cxx's pack_double writes
// integral values as integers).
void PackFloat64(msgpack::sbuffer& buffer, double value) {
  char bytes[9];
  bytes[0] = static_cast<char>(0xcb);
  uint64_t bits = std::bit_cast<uint64_t>(value);
  for (int i = 8; i >= 1; --i) {
    bytes[i] = static_cast<char>(bits & 0xff);
    bits >>= 8;
  }
  buffer.write(bytes, sizeof(bytes));
}

}  // namespace

uint64_t BlockHashOf(const PageKey& key) {
  uint64_t value = 0;
  for (size_t i = key.bytes.size() - 8; i < key.bytes.size(); ++i) {
    value = (value << 8) | key.bytes[i];
  }
  return value;
}

std::string StorageMediumOf(std::string_view url) {
  const std::string_view scheme = StorageUrlScheme(url);
  if (scheme.empty()) return "STORAGE";
  if (const StorageScheme* row = FindStorageScheme(scheme)) return std::string(row->medium);
  std::string out(scheme);
  for (char& c : out) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return out;
}

std::string EncodeKvEventBatch(const KvEventBatch& batch) {
  msgpack::sbuffer buffer;
  Packer pk(buffer);
  // omit_defaults: data_parallel_rank (default None) is left out when unset.
  pk.pack_array(batch.data_parallel_rank ? 3 : 2);
  PackFloat64(buffer, batch.ts);
  pk.pack_array(static_cast<uint32_t>(batch.events.size()));
  for (const KvEvent& event : batch.events) {
    std::visit([&pk](const auto& e) { PackEvent(pk, e); }, event);
  }
  if (batch.data_parallel_rank) pk.pack_int64(*batch.data_parallel_rank);
  return std::string(buffer.data(), buffer.size());
}

}  // namespace kvtier
