// The memory of `kvtier bench`'s GPU rows (bench_gpu_memory.h).
#include "bench_gpu_memory.h"

#if defined(KVTIER_WITH_CUDA)

#include <fmt/format.h>
#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <thread>
#include <utility>
#include <vector>

namespace kvtier::tools::gpu_bench {
namespace {

template <typename Fn>
void ParallelChunks(int64_t bytes, Fn fn) {
  const int threads = std::max(1u, std::min(16u, std::thread::hardware_concurrency()));
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    const int64_t b = bytes * t / threads, e = bytes * (t + 1) / threads;
    pool.emplace_back([=] { fn(b, e); });
  }
  for (auto& th : pool) th.join();
}

}  // namespace

void ParallelFill(std::byte* p, int64_t bytes, uint8_t value) {
  ParallelChunks(bytes, [&](int64_t b, int64_t e) { std::memset(p + b, value, size_t(e - b)); });
}

void ParallelRandom(std::byte* p, int64_t bytes, uint64_t seed) {
  ParallelChunks(bytes, [&](int64_t b, int64_t e) {
    uint64_t state = seed ^ (static_cast<uint64_t>(b) * 0x9E3779B97F4A7C15ull);
    int64_t i = b;
    for (; i + 8 <= e; i += 8) {
      uint64_t z = (state += 0x9E3779B97F4A7C15ull);
      z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
      z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
      z ^= z >> 31;
      std::memcpy(p + i, &z, 8);
    }
    for (; i < e; ++i) p[i] = std::byte{0x5A};
  });
}

int64_t ParallelFirstDifference(const std::byte* a, const std::byte* b, int64_t bytes) {
  std::vector<int64_t> first(64, -1);
  int slot = 0;
  std::vector<std::pair<int64_t, int64_t> > ranges;
  const int threads = std::max(1u, std::min(16u, std::thread::hardware_concurrency()));
  for (int t = 0; t < threads; ++t)
    ranges.emplace_back(bytes * t / threads, bytes * (t + 1) / threads);
  std::vector<std::thread> pool;
  for (auto [lo, hi] : ranges) {
    const int s = slot++;
    pool.emplace_back([&, lo, hi, s] {
      if (std::memcmp(a + lo, b + lo, size_t(hi - lo)) == 0) return;
      for (int64_t i = lo; i < hi; ++i) {
        if (a[i] != b[i]) {
          first[s] = i;
          return;
        }
      }
    });
  }
  for (auto& th : pool) th.join();
  for (int64_t f : first) {
    if (f >= 0) return f;
  }
  return -1;
}

KvRegion RegionOver(std::byte* base, const KvGeometry& g, bool mla, MemoryKind memory) {
  KvRegion r;
  r.geometry = g;
  r.mla = mla;
  r.memory = memory;
  r.device = memory == MemoryKind::kDevice ? 0 : -1;
  r.k = base;
  r.v = mla ? nullptr : base + g.buffer_bytes();
  return r;
}

Result<PinnedPool> PinnedPool::Allocate(int64_t bytes, const std::string& host_pages) {
  PinnedPool p;
  const int mode = host_pages == "thp" ? 1 : host_pages == "hugetlb" ? 2 : 0;
  if (mode == 0) {
    KVTIER_ASSIGN_OR_RETURN(p.alloc_, PinnedHostBuffer::Allocate(bytes));
    p.data_ = p.alloc_.data();
    return p;
  }
  constexpr size_t kHuge = size_t{2} << 20;
  const size_t n = (static_cast<size_t>(bytes) + kHuge - 1) / kHuge * kHuge;
  // hugetlb mappings are 2 MiB-aligned already; the THP one is over-allocated and aligned.
  const size_t mapped = mode == 2 ? n : n + kHuge;
  void* raw = mmap(nullptr, mapped, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | (mode == 2 ? MAP_HUGETLB : 0), -1, 0);
  if (raw == MAP_FAILED) {
    return Status::OutOfMemory(
        fmt::format("mmap of {} bytes{} failed: {}", n,
                    mode == 2 ? " on reserved huge pages (see /proc/sys/vm/nr_hugepages)" : "",
                    std::strerror(errno)));
  }
  p.map_.reset(new Mapping{raw, mapped});
  auto* aligned =
      reinterpret_cast<std::byte*>((reinterpret_cast<uintptr_t>(raw) + kHuge - 1) / kHuge * kHuge);
  if (mode == 1) (void)madvise(aligned, n, MADV_HUGEPAGE);
  KVTIER_ASSIGN_OR_RETURN(p.registration_,
                          PinnedRegistration::Register(aligned, static_cast<int64_t>(n)));
  p.data_ = aligned;
  return p;
}

PinnedPool::Mapping::~Mapping() { munmap(base, bytes); }

}  // namespace kvtier::tools::gpu_bench

#endif  // KVTIER_WITH_CUDA
