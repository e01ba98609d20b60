// scripts/probes/submit_cost.cu — where the host time of a kernel-backend call goes right after
// a large copy (BENCHMARKS.md, GPU: "Host submission (kernel)"). Stand-alone (CUDA runtime only):
//   nvcc -O2 -arch=sm_90 -o submit_cost scripts/probes/submit_cost.cu && ./submit_cost
// For each "before" state (idle; after an SM copy that writes 512 MiB of pinned host memory;
// after one that reads it; after the CPU writes 256 MiB of ordinary memory; after a 10 ms sleep,
// a 10 ms busy loop, or a cudaStreamSynchronize on a device-only copy) and each host
// operation a call makes (two cudaPointerGetAttributes, one kernel launch, both), the wall time
// of the operation alone, median / min / max of 15 trials, each trial in a freshly made state.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "probe_check.h"

__global__ void Copy16(const uint4* __restrict__ src, uint4* __restrict__ dst, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x) {
    dst[i] = src[i];
  }
}

int main() {
  constexpr size_t kBytes = size_t{512} << 20;
  void* host = nullptr;
  void* dev = nullptr;
  CHECK(cudaHostAlloc(&host, kBytes, cudaHostAllocDefault));
  CHECK(cudaMalloc(&dev, kBytes));
  std::memset(host, 1, kBytes);
  CHECK(cudaMemset(dev, 2, kBytes));
  std::vector<char> cpu_buf(size_t{256} << 20, 0);
  cudaStream_t stream;
  CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const size_t n = kBytes / 16;
  auto before = [&](int state) {
    if (state == 1) Copy16<<<4, 1024, 0, stream>>>(static_cast<uint4*>(dev), static_cast<uint4*>(host), n);
    if (state == 2) Copy16<<<4, 1024, 0, stream>>>(static_cast<uint4*>(host), static_cast<uint4*>(dev), n);
    CHECK(cudaGetLastError());
    CHECK(cudaStreamSynchronize(stream));
    if (state == 3) std::memset(cpu_buf.data(), state, cpu_buf.size());
    if (state == 4) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    if (state == 5) {
      const auto t0 = std::chrono::steady_clock::now();
      while (std::chrono::steady_clock::now() - t0 < std::chrono::milliseconds(10)) {
      }
    }
    if (state == 6) {
      Copy16<<<4, 1024, 0, stream>>>(static_cast<uint4*>(dev), static_cast<uint4*>(dev) + n / 2, n / 2);
      CHECK(cudaGetLastError());
      CHECK(cudaStreamSynchronize(stream));
    }
  };
  auto op = [&](int which) {
    cudaPointerAttributes a{}, b{};
    if (which == 0 || which == 2) {
      CHECK(cudaPointerGetAttributes(&a, host));
      CHECK(cudaPointerGetAttributes(&b, dev));
    }
    if (which == 1 || which == 2) {
      Copy16<<<4, 1024, 0, stream>>>(static_cast<uint4*>(dev), static_cast<uint4*>(dev) + 64, 64);
      CHECK(cudaGetLastError());
    }
  };
  const char* states[] = {"idle", "after SM copy writing 512 MiB host", "after SM copy reading 512 MiB host",
                          "after CPU writes 256 MiB", "after a 10 ms sleep", "after a 10 ms busy loop",
                          "after a device-only copy (sync wait)"};
  const char* ops[] = {"2x cudaPointerGetAttributes", "1 kernel launch", "both"};
  before(1);
  op(2);
  CHECK(cudaStreamSynchronize(stream));
  std::printf("%-38s %-30s %8s %8s %8s\n", "state", "operation", "med_us", "min_us", "max_us");
  for (int s = 0; s < 7; ++s) {
    for (int o = 0; o < 3; ++o) {
      std::vector<double> us;
      for (int t = 0; t < 15; ++t) {
        before(s);
        const auto t0 = std::chrono::steady_clock::now();
        op(o);
        us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
        CHECK(cudaStreamSynchronize(stream));
      }
      std::sort(us.begin(), us.end());
      std::printf("%-38s %-30s %8.1f %8.1f %8.1f\n", states[s], ops[o], us[us.size() / 2], us.front(), us.back());
    }
  }
  CHECK(cudaFreeHost(host));
  CHECK(cudaFree(dev));
  return 0;
}
