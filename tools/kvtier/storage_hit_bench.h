// tools/kvtier/storage_hit_bench.h — `kvtier bench --storage-hit URL`: what a storage hit costs a
// request, streamed and not (StorageTierConfig::stream_load_back).
//
// One prefix of --storage-hit-tokens random tokens (Llama-3-8B pages: 32 layers, 8 KV heads of
// 128 bf16, 128 KiB a token; --storage-hit-page 16: 2 MiB a page) is stored at URL through a
// HierarchicalCache, then, each repeat, evicted from device and host memory and brought back with
// Match -> Prefetch (wait_complete) -> LoadBack, timed from the Prefetch to the load's completion
// (GPU: the stream synchronized), with stream_load_back on and off (two caches over the store,
// taking turns each round, so that the machine's drift hits both alike). Beside them, in the same
// run: the read alone (Prefetch -> FinishPrefetch) and the load of a host hit alone (LoadBack of
// the pages already in host memory) — streamed, a storage hit should cost about the read, not the
// read plus the load — and, for a file:// store, N threads (the store's I/O threads) of plain open
// + pread + close over the store's own page files, each round after the read: the read alone is a
// prefetch end to end, and the bench prints it as a share of that baseline. Every loaded byte is
// checked against the KV pattern. Prints a table (median of the repeats).
//
// Thread safety: run from one thread.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>

#include "kvtier/storage.h"

namespace kvtier::tools {

struct StorageHitBenchOptions {
  std::string url;  // empty: not this bench
  int64_t tokens = 8192;
  int64_t page_size = 16;       // tokens a page
  std::string backend = "cpu";  // cpu, kernel or dma (the cache's transfer backend)
  // The store's options: io_threads from StorageOptionsSchema (--storage-hit-threads; 0: the
  // machine's default); the bench gives every call 60 s.
  StorageOptions storage;
  int repeats = 5;
};

// Adds --storage-hit and its flags to `bench`.
void AddStorageHitBenchOptions(CLI::App* bench, StorageHitBenchOptions* options);

// Runs it; returns the process exit code (0 ok, 1 a failed check or run).
int RunStorageHitBench(const StorageHitBenchOptions& options);

}  // namespace kvtier::tools
