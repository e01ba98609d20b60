// scripts/probes/host_latency.cu — how long one GPU read of pinned host memory takes, per 2 MiB
// of a pinned pool (BENCHMARKS.md, GPU: "MLA loads"). Stand-alone (CUDA runtime only):
//   nvcc -O2 -arch=sm_90 -o host_latency scripts/probes/host_latency.cu && ./host_latency
// A pool of 2 GiB (cudaHostAlloc, like the bench's MLA pool) is split into 2 MiB chunks; in each,
// the CPU writes a chain of 64 pointers at random 128-byte-aligned places, and one GPU thread
// follows the chain with uncached loads (ld.global.cv), so each load waits for the previous:
// the time per load is the round trip of one read to that chunk. Every chunk is measured twice
// (two passes over the pool); then a second pool is allocated and measured once. Prints the
// distribution of the per-chunk latency, and how well the two passes over the same chunks agree.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "probe_check.h"

constexpr size_t kChunk = size_t{2} << 20;
constexpr int kHops = 64;

__global__ void Chase(const uint64_t* pool, size_t chunks, double* ns_per_load) {
  for (size_t c = 0; c < chunks; ++c) {
    const uint64_t* base = pool + c * (kChunk / 8);
    uint64_t next = 0;
    // warm the translation of the chunk's first line, then time the chain
    next = __ldcv(base);
    uint64_t t0, t1;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    for (int h = 0; h < kHops; ++h) next = __ldcv(base + next);
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t1));
    ns_per_load[c] = static_cast<double>(t1 - t0) / kHops + (next == 0xffffffffffffffffull ? 1 : 0);
  }
}

std::vector<double> Measure(uint64_t* pool, size_t chunks, double* d_out) {
  Chase<<<1, 1>>>(pool, chunks, d_out);
  CHECK(cudaGetLastError());
  CHECK(cudaDeviceSynchronize());
  std::vector<double> out(chunks);
  CHECK(cudaMemcpy(out.data(), d_out, chunks * sizeof(double), cudaMemcpyDeviceToHost));
  return out;
}

void WriteChains(uint64_t* pool, size_t chunks, uint64_t seed) {
  std::mt19937_64 rng(seed);
  const size_t lines = kChunk / 128;
  std::vector<uint32_t> order(lines);
  for (size_t c = 0; c < chunks; ++c) {
    for (size_t i = 0; i < lines; ++i) order[i] = static_cast<uint32_t>(i);
    std::shuffle(order.begin() + 1, order.end(), rng);  // the chain starts at line 0
    uint64_t* base = pool + c * (kChunk / 8);
    for (int h = 0; h <= kHops; ++h) base[order[h] * 16] = order[h + 1] * 16ull;  // in uint64s
  }
}

void Report(const char* name, std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  std::printf("%-28s chunks %zu  min %.0f  p10 %.0f  median %.0f  p90 %.0f  max %.0f ns\n", name, n,
              v[0], v[n / 10], v[n / 2], v[n * 9 / 10], v[n - 1]);
  // histogram in 100 ns buckets
  std::printf("%-28s histogram (100 ns buckets):", "");
  size_t i = 0;
  while (i < n) {
    const int bucket = static_cast<int>(v[i] / 100);
    size_t j = i;
    while (j < n && static_cast<int>(v[j] / 100) == bucket) ++j;
    std::printf(" %d00:%zu", bucket, j - i);
    i = j;
  }
  std::printf("\n");
}

int main() {
  constexpr size_t kBytes = size_t{2} << 30;
  const size_t chunks = kBytes / kChunk;
  double* d_out = nullptr;
  CHECK(cudaMalloc(&d_out, chunks * sizeof(double)));
  uint64_t* pool = nullptr;
  CHECK(cudaHostAlloc(reinterpret_cast<void**>(&pool), kBytes, cudaHostAllocDefault));
  WriteChains(pool, chunks, 1);
  const std::vector<double> a = Measure(pool, chunks, d_out);
  const std::vector<double> b = Measure(pool, chunks, d_out);
  Report("pool 1, pass 1", a);
  Report("pool 1, pass 2", b);
  // agreement of the two passes: chunks slow (above the median by > 15 %) in both
  std::vector<double> sorted = a;
  std::sort(sorted.begin(), sorted.end());
  const double med = sorted[chunks / 2];
  size_t slow_a = 0, slow_both = 0;
  double sxy = 0, sx = 0, sy = 0, sxx = 0, syy = 0;
  for (size_t c = 0; c < chunks; ++c) {
    const bool sa = a[c] > 1.15 * med, sb = b[c] > 1.15 * med;
    slow_a += sa;
    slow_both += sa && sb;
    sx += a[c];
    sy += b[c];
    sxy += a[c] * b[c];
    sxx += a[c] * a[c];
    syy += b[c] * b[c];
  }
  const double n = static_cast<double>(chunks);
  const double corr = (sxy - sx * sy / n) / std::sqrt((sxx - sx * sx / n) * (syy - sy * sy / n));
  std::printf("pool 1: %zu chunks > 1.15 x median in pass 1, %zu of them also in pass 2; "
              "correlation of the passes %.2f\n", slow_a, slow_both, corr);
  uint64_t* pool2 = nullptr;
  CHECK(cudaHostAlloc(reinterpret_cast<void**>(&pool2), kBytes, cudaHostAllocDefault));
  WriteChains(pool2, chunks, 2);
  Report("pool 2", Measure(pool2, chunks, d_out));
  CHECK(cudaFreeHost(pool2));
  CHECK(cudaFreeHost(pool));
  CHECK(cudaFree(d_out));
  return 0;
}
