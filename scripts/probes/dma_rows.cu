// scripts/probes/dma_rows.cu — what the host pays to submit strided copies, per operation and per
// row (BENCHMARKS.md, GPU: "Host submission (dma)"). Stand-alone (CUDA >= 12.8 runtime):
//   nvcc -O2 -arch=sm_90 -o dma_rows scripts/probes/dma_rows.cu && ./dma_rows
// 1,024 device -> pinned host copies of 16 KiB rows (a page of one layer), `height` rows each
// with a 16 MiB pitch on both sides (a page across `height` layers of a layer-first pool), at
// random row offsets; submitted as one cudaMemcpy3DBatchAsync (depth 1) and as 1,024
// cudaMemcpy2DAsync calls. Host wall time of the submission alone (the stream is idle before),
// median of 5, for heights 1, 8, 32 and 61.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "probe_check.h"

int main() {
  constexpr size_t kWidth = 16 << 10, kPitch = 16 << 20, kOps = 1024;
  constexpr size_t kMaxHeight = 61;
  const size_t bytes = kPitch * kMaxHeight;
  char* dev = nullptr;
  char* host = nullptr;
  CHECK(cudaMalloc(&dev, bytes));
  CHECK(cudaHostAlloc(reinterpret_cast<void**>(&host), bytes, cudaHostAllocDefault));
  cudaStream_t stream;
  CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  std::mt19937_64 rng(3);
  std::vector<size_t> src_off(kOps), dst_off(kOps);
  for (size_t i = 0; i < kOps; ++i) {
    src_off[i] = (rng() % (kPitch / kWidth)) * kWidth;
    dst_off[i] = (rng() % (kPitch / kWidth)) * kWidth;
  }
  std::printf("%-8s %-22s %10s %12s %12s\n", "height", "submission", "host_ms", "us_per_op", "ns_per_row");
  for (size_t height : {size_t{1}, size_t{8}, size_t{32}, kMaxHeight}) {
    std::vector<cudaMemcpy3DBatchOp> ops(kOps);
    for (size_t i = 0; i < kOps; ++i) {
      cudaMemcpy3DBatchOp& op = ops[i];
      op = cudaMemcpy3DBatchOp{};
      op.src.type = cudaMemcpyOperandTypePointer;
      op.src.op.ptr.ptr = dev + src_off[i];
      op.src.op.ptr.rowLength = kPitch;
      op.src.op.ptr.layerHeight = height;
      op.dst.type = cudaMemcpyOperandTypePointer;
      op.dst.op.ptr.ptr = host + dst_off[i];
      op.dst.op.ptr.rowLength = kPitch;
      op.dst.op.ptr.layerHeight = height;
      op.extent = make_cudaExtent(kWidth, height, 1);
      op.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
      op.flags = cudaMemcpyFlagPreferOverlapWithCompute;
    }
    for (int mode = 0; mode < 2; ++mode) {
      std::vector<double> ms;
      for (int trial = 0; trial < 6; ++trial) {
        CHECK(cudaStreamSynchronize(stream));
        const auto t0 = std::chrono::steady_clock::now();
        if (mode == 0) {
          CHECK(cudaMemcpy3DBatchAsync(ops.size(), ops.data(), 0, stream));
        } else {
          for (size_t i = 0; i < kOps; ++i) {
            CHECK(cudaMemcpy2DAsync(host + dst_off[i], kPitch, dev + src_off[i], kPitch, kWidth,
                                    height, cudaMemcpyDeviceToHost, stream));
          }
        }
        const double t = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
        if (t > 0 && ms.size() < 6) ms.push_back(t);
      }
      ms.erase(ms.begin());  // warm-up
      std::sort(ms.begin(), ms.end());
      const double med = ms[ms.size() / 2];
      std::printf("%-8zu %-22s %10.3f %12.2f %12.1f\n", height,
                  mode == 0 ? "1 x 3DBatchAsync" : "1024 x 2DAsync", med, 1e3 * med / kOps,
                  1e6 * med / (kOps * height));
    }
  }
  CHECK(cudaStreamSynchronize(stream));
  CHECK(cudaFreeHost(host));
  CHECK(cudaFree(dev));
  return 0;
}
