// tools/kvtier/storage_bench_pages.h — the pages of `kvtier bench --storage` (storage_bench.h):
// the page kinds of the reference workload, their storage namespaces, the page buffers and the
// times of one op. Shared by the backend's rows (storage_bench.cc) and the platform baselines
// (storage_bench_baseline.cc).
//
// Thread safety: a PageSet's pages may be read and written from several threads, each page by
// one; everything else is used from the bench's thread.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "kvtier/storage.h"

namespace kvtier::tools {

// A page kind of the reference workload, stored page_first (K then V of each page contiguous).
struct PageKind {
  const char* name;
  const char* model;
  int64_t num_layers, slot_bytes, page_size, head_num;
  bool mla;
};
inline constexpr PageKind kKinds[] = {
    {"mha4", "Llama-3-8B", 32, 2048, 4, 8, false},    // 512 KiB
    {"mha16", "Llama-3-8B", 32, 2048, 16, 8, false},  // 2 MiB
    {"mha64", "Llama-3-8B", 32, 2048, 64, 8, false},  // 8 MiB
    {"mla64", "DeepSeek-V3", 61, 1152, 64, 1, true},  // 4.5 MB
};

// The kind named `name`. REQUIRES: one of kKinds (the options were validated).
const PageKind& KindNamed(std::string_view name);

// Small pages for the Exists measurement (the index, not the bytes, is what it measures).
inline constexpr PageKind kExistsKind = {"exists", "tiny", 1, 64, 16, 1, false};

// The storage namespace of a kind's pages (page_first, bf16, under "kvtier-bench/MODEL").
StorageNamespace NamespaceOf(const PageKind& kind);

// Page buffers of `count` pages of `page_bytes`, uninitialised until filled.
struct PageSet {
  int64_t page_bytes = 0, count = 0;
  struct Free {
    void operator()(std::byte* p) const { std::free(p); }
  };
  std::unique_ptr<std::byte, Free> data;  // 4 KiB-aligned, as pinned host pages are

  static PageSet Make(int64_t page_bytes, int64_t count) {
    PageSet p;
    p.page_bytes = page_bytes;
    p.count = count;
    const size_t bytes = static_cast<size_t>(page_bytes * count + 4095) / 4096 * 4096;
    p.data.reset(static_cast<std::byte*>(std::aligned_alloc(4096, bytes)));
    return p;
  }
  std::span<std::byte> page(int64_t i) const {
    return {data.get() + i * page_bytes, static_cast<size_t>(page_bytes)};
  }
  void FillRandom(uint64_t seed) {
    uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
    const size_t words = static_cast<size_t>(page_bytes * count) / 8;
    auto* w = reinterpret_cast<uint64_t*>(data.get());
    for (size_t i = 0; i < words; ++i) {
      uint64_t z = (x += 0x9E3779B97F4A7C15ull);
      z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
      z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
      w[i] = z ^ (z >> 31);
    }
  }
  void Poison() { std::memset(data.get(), 0xA5, static_cast<size_t>(page_bytes * count)); }
  // Pages that differ from `other`'s.
  int64_t CountDiffering(const PageSet& other) const {
    int64_t n = 0;
    for (int64_t i = 0; i < count; ++i) {
      n += std::memcmp(page(i).data(), other.page(i).data(), static_cast<size_t>(page_bytes)) != 0;
    }
    return n;
  }
};

// Times of one op over the rounds: per-round throughput and every batch's latency.
struct OpTimes {
  std::vector<double> round_seconds;
  std::vector<double> batch_ms;
  // Per round, percentiles reported by an external tool (redis-benchmark) that has no batch
  // times; the row shows the median p50 and the largest p99 of the rounds.
  std::vector<double> reported_p50_ms, reported_p99_ms;
};

// Appends `from`'s times to `to`'s.
void Append(OpTimes& to, const OpTimes& from);

}  // namespace kvtier::tools
