// Test helpers for KV events: an independent msgpack decoder of vLLM's array-like KVEventBatch
// (it checks the layout written in kvtier/kv_events.h, element by element, instead of trusting
// the encoder), and random batches.
#pragma once

#include <gtest/gtest.h>

#include <msgpack.hpp>
#include <random>
#include <string>
#include <string_view>

#include "kvtier/kv_events.h"

namespace kvtier::testing {

// Decodes `bytes` (one whole msgpack value, nothing after it) into a batch; a gtest failure and
// nullopt when the layout differs from vLLM's.
inline std::optional<KvEventBatch> DecodeVllmBatch(std::string_view bytes) {
  msgpack::object_handle handle;
  size_t offset = 0;
  try {
    handle = msgpack::unpack(bytes.data(), bytes.size(), offset);
  } catch (const std::exception& e) {
    ADD_FAILURE() << "not msgpack: " << e.what();
    return std::nullopt;
  }
  if (offset != bytes.size()) {
    ADD_FAILURE() << "bytes after the batch: " << bytes.size() - offset;
    return std::nullopt;
  }
  try {
    const msgpack::object& root = handle.get();
    if (root.type != msgpack::type::ARRAY || root.via.array.size < 2 || root.via.array.size > 3) {
      ADD_FAILURE() << "batch is not [ts, events(, dp_rank)]: " << root;
      return std::nullopt;
    }
    const msgpack::object* f = root.via.array.ptr;
    if (f[0].type != msgpack::type::FLOAT64) {
      ADD_FAILURE() << "ts is not a float64: " << f[0];
      return std::nullopt;
    }
    KvEventBatch batch;
    batch.ts = f[0].via.f64;
    if (root.via.array.size == 3) batch.data_parallel_rank = f[2].as<int64_t>();
    if (f[1].type != msgpack::type::ARRAY) {
      ADD_FAILURE() << "events is not an array: " << f[1];
      return std::nullopt;
    }
    for (uint32_t i = 0; i < f[1].via.array.size; ++i) {
      const msgpack::object& ev = f[1].via.array.ptr[i];
      if (ev.type != msgpack::type::ARRAY || ev.via.array.size < 1 ||
          ev.via.array.ptr[0].type != msgpack::type::STR) {
        ADD_FAILURE() << "event is not [tag, ...]: " << ev;
        return std::nullopt;
      }
      const msgpack::object* e = ev.via.array.ptr;
      const std::string tag = e[0].as<std::string>();
      if (tag == "BlockStored" && ev.via.array.size == 8) {
        BlockStored s;
        s.block_hashes = e[1].as<std::vector<uint64_t>>();
        if (!e[2].is_nil()) s.parent_block_hash = e[2].as<uint64_t>();
        s.token_ids = e[3].as<std::vector<Token>>();
        s.block_size = e[4].as<int64_t>();
        if (!e[5].is_nil()) s.lora_id = e[5].as<int64_t>();
        if (!e[6].is_nil()) s.medium = e[6].as<std::string>();
        EXPECT_TRUE(e[7].is_nil()) << "lora_name";
        batch.events.emplace_back(std::move(s));
      } else if (tag == "BlockRemoved" && ev.via.array.size == 3) {
        BlockRemoved r;
        r.block_hashes = e[1].as<std::vector<uint64_t>>();
        if (!e[2].is_nil()) r.medium = e[2].as<std::string>();
        batch.events.emplace_back(std::move(r));
      } else if (tag == "AllBlocksCleared" && ev.via.array.size == 1) {
        batch.events.emplace_back(AllBlocksCleared{});
      } else {
        ADD_FAILURE() << "unknown event or wrong field count: " << ev;
        return std::nullopt;
      }
    }
    return batch;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "wrong field type: " << e.what();
    return std::nullopt;
  }
}

// A random event: hashes over the whole uint64 range (both msgpack int widths), 0..n blocks.
inline KvEvent RandomEvent(std::mt19937_64& rng) {
  const int kind = static_cast<int>(rng() % 8);
  const int blocks = static_cast<int>(rng() % 5);
  std::vector<uint64_t> hashes(blocks);
  for (auto& h : hashes) h = rng() >> (rng() % 64);
  static constexpr std::string_view kMedia[] = {kMediumGpu, kMediumCpuPinned, kMediumDisk,
                                                kMediumRedis};
  std::optional<std::string> medium;
  if (rng() % 4 != 0) medium = std::string(kMedia[rng() % 4]);
  if (kind == 0) return AllBlocksCleared{};
  if (kind <= 2) return BlockRemoved{std::move(hashes), std::move(medium)};
  BlockStored s;
  s.block_hashes = std::move(hashes);
  if (rng() % 2) s.parent_block_hash = rng();
  s.block_size = int64_t{1} << (rng() % 9);
  s.token_ids.resize(s.block_hashes.size() * s.block_size);
  for (auto& t : s.token_ids) t = static_cast<Token>(rng() % (uint64_t{1} << (rng() % 31)));
  if (rng() % 3 == 0) s.lora_id = static_cast<int64_t>(rng() % 1000);
  s.medium = std::move(medium);
  return s;
}

inline KvEventBatch RandomBatch(std::mt19937_64& rng, int max_events = 6) {
  KvEventBatch batch;
  batch.ts = 1.7e9 + static_cast<double>(rng() % 1000000) / 1024.0;
  const int n = static_cast<int>(rng() % (max_events + 1));
  for (int i = 0; i < n; ++i) batch.events.push_back(RandomEvent(rng));
  if (rng() % 2) batch.data_parallel_rank = static_cast<int64_t>(rng() % 8);
  return batch;
}

}  // namespace kvtier::testing
