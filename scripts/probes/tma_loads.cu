// scripts/probes/tma_loads.cu — can the SMs read pinned host memory faster with bulk copies
// (TMA, cp.async.bulk) than with 16-byte loads? (BENCHMARKS.md, GPU: "MLA loads".)
// Stand-alone (CUDA runtime only, sm_90):
//   nvcc -O2 -arch=sm_90 -o tma_loads scripts/probes/tma_loads.cu && ./tma_loads
// Copies host -> device on 4 SMs, 18.9 MB (an MLA per-layer load): contiguous 4 KiB chunks, and
// 1,152-byte chunks from random slots of a 2 GiB pinned pool (MLA page 1). Two kernels:
//   vec: 1024 threads per block, 4 x 16-byte loads in flight per thread, then the stores (the
//        shape of the kernel backend's register kernel);
//   tma: kIssuers threads per block each keep a ring of bulk loads (global -> shared, mbarrier)
//        in flight and bulk-store each landed chunk (shared -> global).
// Median of 7 after a warm-up, by CUDA events; next to one cudaMemcpyAsync of the same bytes.
// Every result is compared with the source on the host.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "probe_check.h"
#include "probe_tma.h"

constexpr int kBlocks = 4;
constexpr int kSmemBytes = 192 * 1024;

// Chunk i: bytes [src_off[i], +chunk) of src -> [i * chunk, +chunk) of dst.
__global__ void __launch_bounds__(1024, 1)
    VecCopy(const char* __restrict__ src, char* __restrict__ dst, const uint64_t* __restrict__ src_off,
            uint32_t chunks, uint32_t chunk) {
  const uint32_t vpc = chunk / 16;
  const uint64_t total = uint64_t(chunks) * vpc;
  const uint64_t stride = uint64_t(gridDim.x) * blockDim.x * 4;
  for (uint64_t base = (uint64_t(blockIdx.x) * blockDim.x + threadIdx.x / 32 * 32) * 4 + threadIdx.x % 32;
       base < total; base += stride) {
    uint4 v[4];
    uint64_t pos[4];
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      pos[r] = base + uint64_t(r) * 32;
      if (pos[r] < total) {
        const uint64_t c = pos[r] / vpc, e = pos[r] % vpc;
        v[r] = __ldcs(reinterpret_cast<const uint4*>(src + src_off[c]) + e);
      }
    }
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      if (pos[r] < total) __stcs(reinterpret_cast<uint4*>(dst) + pos[r], v[r]);
    }
  }
}

// kIssuers threads per block (lane 0 of each warp), each with a ring of bulk loads in flight
// (probe_tma.h).
constexpr int kIssuers = 8;

__global__ void TmaCopy(const char* __restrict__ src, char* __restrict__ dst,
                        const uint64_t* __restrict__ src_off, uint32_t chunks, uint32_t chunk) {
  extern __shared__ __align__(128) unsigned char smem[];
  __shared__ __align__(8) uint64_t bars[256];
  const uint32_t slots = min(256u, uint32_t(kSmemBytes) / chunk) / kIssuers;  // per issuer
  const uint32_t w = threadIdx.x / 32;
  if (threadIdx.x % 32 != 0 || w >= kIssuers || slots <= kBulkStoreLag) return;
  // this issuer's chunks: g, g + G, g + 2G, ... with g its index among all G issuers
  const uint32_t g = blockIdx.x * kIssuers + w, G = gridDim.x * kIssuers;
  const uint32_t mine = chunks > g ? (chunks - g + G - 1) / G : 0;
  BulkRingCopy([&](uint64_t c) { return src + src_off[c]; }, dst, chunk, g, G, mine,
               smem + size_t(w) * slots * chunk, bars + w * slots, slots);
}

int main() {
  constexpr size_t kPool = size_t{2} << 30;
  constexpr size_t kBytes = 16384ull * 1152;  // 18.9 MB
  char* host = nullptr;
  CHECK(cudaHostAlloc(reinterpret_cast<void**>(&host), kPool, cudaHostAllocDefault));
  std::mt19937_64 rng(5);
  for (size_t i = 0; i < kPool / 8; ++i) reinterpret_cast<uint64_t*>(host)[i] = rng();
  char* dev = nullptr;
  uint64_t* d_off = nullptr;
  CHECK(cudaMalloc(&dev, kBytes));
  CHECK(cudaMalloc(&d_off, sizeof(uint64_t) * 65536));
  CHECK(cudaFuncSetAttribute(TmaCopy, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes));
  cudaStream_t stream;
  CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaEvent_t a, b;
  CHECK(cudaEventCreate(&a));
  CHECK(cudaEventCreate(&b));
  std::vector<char> got(kBytes);
  std::printf("%-28s %-6s %8s %8s %s\n", "pattern", "kernel", "ms", "GB/s", "check");
  for (int pattern = 0; pattern < 2; ++pattern) {
    const uint32_t chunk = pattern == 0 ? 4096 : 1152;
    const uint32_t chunks = static_cast<uint32_t>(kBytes / chunk);
    std::vector<uint64_t> off(chunks);
    if (pattern == 0) {
      for (uint32_t i = 0; i < chunks; ++i) off[i] = uint64_t(i) * chunk + (64u << 20);
    } else {
      std::vector<uint32_t> slots(kPool / chunk - 1);
      for (size_t i = 0; i < slots.size(); ++i) slots[i] = static_cast<uint32_t>(i);
      std::shuffle(slots.begin(), slots.end(), rng);
      for (uint32_t i = 0; i < chunks; ++i) off[i] = uint64_t(slots[i]) * chunk;
    }
    CHECK(cudaMemcpy(d_off, off.data(), off.size() * 8, cudaMemcpyHostToDevice));
    for (int k = 0; k < 3; ++k) {
      std::vector<float> ms;
      for (int t = 0; t < 8; ++t) {
        CHECK(cudaEventRecord(a, stream));
        if (k == 0) {
          VecCopy<<<kBlocks, 1024, 0, stream>>>(host, dev, d_off, chunks, chunk);
        } else if (k == 1) {
          TmaCopy<<<kBlocks, 32 * kIssuers, kSmemBytes, stream>>>(host, dev, d_off, chunks, chunk);
        } else {
          if (pattern == 1) break;
          CHECK(cudaMemcpyAsync(dev, host + (64u << 20), kBytes, cudaMemcpyHostToDevice, stream));
        }
        CHECK(cudaGetLastError());
        CHECK(cudaEventRecord(b, stream));
        CHECK(cudaEventSynchronize(b));
        float m = 0;
        CHECK(cudaEventElapsedTime(&m, a, b));
        if (t > 0) ms.push_back(m);
      }
      if (ms.empty()) continue;
      std::sort(ms.begin(), ms.end());
      const float med = ms[ms.size() / 2];
      CHECK(cudaMemcpy(got.data(), dev, kBytes, cudaMemcpyDeviceToHost));
      bool ok = true;
      for (uint32_t i = 0; i < chunks && ok; ++i) ok = std::memcmp(got.data() + size_t(i) * chunk, host + off[i], chunk) == 0;
      std::printf("%-28s %-6s %8.3f %8.2f %s\n",
                  pattern == 0 ? "contiguous 4 KiB chunks" : "random 1,152-byte slots",
                  k == 0 ? "vec" : k == 1 ? "tma" : "dma", med, kBytes / (med * 1e-3) / 1e9,
                  ok ? "ok" : "MISMATCH");
      CHECK(cudaMemset(dev, 0, kBytes));
    }
  }
  return 0;
}
