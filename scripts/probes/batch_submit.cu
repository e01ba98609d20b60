// scripts/probes/batch_submit.cu — host cost of one cudaMemcpyBatchAsync of N single copies
// (pinned host -> device, random pages), by attribute flags and source access order.
// Build: nvcc -O2 -std=c++17 -arch=sm_90 batch_submit.cu -o batch_submit
// Prints: copies, bytes each, flags, order, median host us of the call, GPU GB/s (events around it).
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <vector>

#define CHECK(x)                                                                     \
  do {                                                                               \
    cudaError_t e = (x);                                                             \
    if (e != cudaSuccess) {                                                          \
      std::printf("%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e)); \
      return 1;                                                                      \
    }                                                                                \
  } while (0)

int main() {
  const size_t pool = size_t{2} << 30;
  char* host = nullptr;
  char* dev = nullptr;
  CHECK(cudaHostAlloc(&host, pool, cudaHostAllocDefault));
  CHECK(cudaMalloc(&dev, pool));
  for (size_t i = 0; i < pool; i += 4096) host[i] = static_cast<char>(i);
  cudaStream_t s;
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaEvent_t a, b;
  CHECK(cudaEventCreate(&a));
  CHECK(cudaEventCreate(&b));
  std::mt19937_64 rng(7);
  struct Case { size_t count, bytes; };
  for (Case c : {Case{256, 128 << 10}, Case{512, 128 << 10}, Case{2048, 32 << 10},
                 Case{256, 72 << 10}}) {
    const size_t pages = pool / c.bytes;
    std::vector<size_t> sp(pages), dp(pages);
    for (size_t i = 0; i < pages; ++i) sp[i] = dp[i] = i;
    std::shuffle(sp.begin(), sp.end(), rng);
    std::shuffle(dp.begin(), dp.end(), rng);
    std::vector<void*> dsts(c.count);
    std::vector<const void*> srcs(c.count);
    std::vector<size_t> sizes(c.count, c.bytes);
    for (size_t i = 0; i < c.count; ++i) {
      srcs[i] = host + sp[i] * c.bytes;
      dsts[i] = dev + dp[i] * c.bytes;
    }
    for (int flags : {0, static_cast<int>(cudaMemcpyFlagPreferOverlapWithCompute)}) {
      for (auto order : {cudaMemcpySrcAccessOrderStream, cudaMemcpySrcAccessOrderAny}) {
        cudaMemcpyAttributes attr{};
        attr.srcAccessOrder = order;
        attr.flags = flags;
        size_t idx = 0;
        std::vector<double> host_us, gbps;
        for (int r = 0; r < 23; ++r) {
          CHECK(cudaStreamSynchronize(s));
          CHECK(cudaEventRecord(a, s));
          const auto t0 = std::chrono::steady_clock::now();
          CHECK(cudaMemcpyBatchAsync(dsts.data(), srcs.data(), sizes.data(), c.count, &attr, &idx,
                                     1, s));
          const auto t1 = std::chrono::steady_clock::now();
          CHECK(cudaEventRecord(b, s));
          CHECK(cudaEventSynchronize(b));
          float ms = 0;
          CHECK(cudaEventElapsedTime(&ms, a, b));
          if (r >= 3) {
            host_us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
            gbps.push_back(static_cast<double>(c.count * c.bytes) / ms / 1e6);
          }
        }
        std::sort(host_us.begin(), host_us.end());
        std::sort(gbps.begin(), gbps.end());
        std::printf("copies %5zu x %6zu B  flags %d  order %s  host %8.1f us (%.2f us/copy)  "
                    "%.1f GB/s incl. submission\n",
                    c.count, c.bytes, flags, order == cudaMemcpySrcAccessOrderStream ? "stream" : "any",
                    host_us[host_us.size() / 2], host_us[host_us.size() / 2] / c.count,
                    gbps[gbps.size() / 2]);
      }
    }
  }
  return 0;
}
