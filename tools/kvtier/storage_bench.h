// tools/kvtier/storage_bench.h — `kvtier bench --storage URL`: the storage tier's benchmark.
//
// For each page kind (real page_first pages of the reference workload: mha4 / mha16 = Llama-3-8B at
// page 4 / 16, 512 KiB / 2 MiB; mha64 = page 64, 8 MiB; mla64 = DeepSeek-V3 at page 64, 4.5 MB) it
// Sets N pages of random bytes in batches, Exists them, Gets them back into poisoned buffers and
// checks every byte; it reports GB/s, pages/s and the p50/p99 time of one batch. In the same run it
// measures the platform's baseline for the same bytes (file://: N threads, N = the backend's I/O
// threads, each taking the next page and moving it with open+pwrite+close+rename / open+pread+close
// over the same number of files in a directory beside the store — the reference the kvtier rows'
// "% base" is against — and the same loop on one thread beside it; with O_DIRECT for a direct=1
// store; redis: redis-benchmark)
// and the Exists of 1,000 stored keys. Everything it stored is removed at the end.
//
// Thread safety: run from one thread (the backend uses its own).
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>
#include <vector>

#include "kvtier/storage.h"

namespace kvtier::tools {

struct StorageBenchOptions {
  std::string url;  // empty: not a storage bench
  std::vector<std::string> kinds = {"mha16", "mha64", "mla64"};
  std::string bytes_per_kind = "512MiB";  // pages per kind = this / page bytes (at least 2)
  // Pages per Set / Get call: the batch of the cache's streamed prefetch of an 8,192-token prefix
  // at page 16 (a prefetch reads in at least 8 batches; unstreamed, batches of up to 256 pages).
  // 0: the backend's default: 64 (file, memory), or the pages that carry 8 MiB (Redis: a call
  // must be done within the store's timeout).
  int64_t batch_pages = 0;
  int in_flight = 0;  // batches in flight at once; 0: the backend's default (file, memory: 8, or
                      // more for four pages an I/O thread; Redis: 16 MiB in flight, 1 to 8)
  int repeats = 3;    // Set+Get rounds per kind; each batch's time goes into p50/p99,
                      // throughput is the median round
  int64_t exists_keys = 1000;
  // The backend's options. Flags from StorageOptionsSchema: io_threads (--storage-threads; 0:
  // the machine's default, and the file baseline runs as many threads) and min_free_bytes
  // (--storage-min-free-bytes); the bench sets max_queued_batches for its calls in flight.
  StorageOptions storage;
  bool baseline = true;
  // After each round's Get: the stored pages read again while as many other pages are Set
  // ("get/w" and "set/r" rows: reads under writes against the read ceiling).
  bool mixed = true;
  std::string json_path;
};

// Adds --storage and the flags of the storage bench to `bench`.
void AddStorageBenchOptions(CLI::App* bench, StorageBenchOptions* options);

// Runs it; returns the process exit code (0 ok, 1 a failed check or run, 2 bad options).
int RunStorageBench(const StorageBenchOptions& options, const std::string& command);

}  // namespace kvtier::tools
