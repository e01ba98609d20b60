// tools/kvtier/bench_gpu_memory.h — the memory of `kvtier bench`'s GPU rows (bench_gpu.cc): host
// helpers that fill and compare GiB pools in parallel, the pinned host pool (cudaHostAlloc, or an
// mmap on huge pages registered with CUDA), and the buffers of one shape. Built only with CUDA.
//
// Thread safety: used from the one benchmark thread (the helpers start and join their own).
#pragma once

#if defined(KVTIER_WITH_CUDA)

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "kvtier/device.h"
#include "kvtier/status.h"
#include "kvtier/transfer.h"

namespace kvtier::tools::gpu_bench {

constexpr uint8_t kPoisonByte = 0xA5;

// ---- host helpers (parallel over the machine's cores: the pools are GiBs) ---------------------

// Every byte of [p, p + bytes) to `value`.
void ParallelFill(std::byte* p, int64_t bytes, uint8_t value);
// Pseudo-random bytes from `seed` (the same bytes for the same seed and range).
void ParallelRandom(std::byte* p, int64_t bytes, uint64_t seed);
// Offset of the first differing byte, or -1.
int64_t ParallelFirstDifference(const std::byte* a, const std::byte* b, int64_t bytes);

struct HostBytes {
  std::unique_ptr<std::byte[]> data;
  int64_t bytes = 0;
  static HostBytes Allocate(int64_t n) {
    return HostBytes{std::unique_ptr<std::byte[]>(new std::byte[static_cast<size_t>(n)]), n};
  }
  std::byte* get() const { return data.get(); }
};

// A region over `bytes` of memory split into K then V (or one MLA buffer).
KvRegion RegionOver(std::byte* base, const KvGeometry& g, bool mla, MemoryKind memory);

// The pinned host pool: cudaHostAlloc, or an anonymous mmap registered with cudaHostRegister —
// on transparent huge pages (--host-pages thp, madvise) or on reserved 2 MiB huge pages
// (--host-pages hugetlb, MAP_HUGETLB: needs /proc/sys/vm/nr_hugepages) — to measure how much
// the host's page size matters to scattered SM accesses.
class PinnedPool {
 public:
  // `host_pages` (BenchOptions): "thp" and "hugetlb" map and register; anything else is
  // cudaHostAlloc.
  static Result<PinnedPool> Allocate(int64_t bytes, const std::string& host_pages);
  void* data() const { return data_; }

 private:
  struct Mapping {
    void* base;
    size_t bytes;
    ~Mapping();  // munmap
  };
  // Destroyed in reverse order: the registration goes before the mapping.
  std::unique_ptr<Mapping> map_;
  PinnedHostBuffer alloc_;
  PinnedRegistration registration_;
  void* data_ = nullptr;
};

// ---- the GPU state of one shape ---------------------------------------------------------------

struct ShapeBuffers {
  int64_t bytes = 0;         // of each pool (all buffers)
  PinnedPool host_pool;      // the host pool (any layout), pinned
  PinnedPool host_pool2;     // the backup destination of "both directions at once"
  DeviceKvPool device_pool;  // layer_first
  HostBytes device_mirror;   // what the device pool holds before a backup
  HostBytes expected;        // the cpu backend's result of the row
  bool device_dirty = true;  // device pool != device_mirror
};

}  // namespace kvtier::tools::gpu_bench

#endif  // KVTIER_WITH_CUDA
