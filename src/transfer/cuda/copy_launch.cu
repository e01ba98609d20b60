// Launcher of the copy kernel: the width switch (the only compile-time parameter).
// nvcc (13.0) warns (#2810) on status.h, which layout.h includes, for assigning a [[nodiscard]]
// class; the assignment is deliberate there and this file uses no Status.
#pragma nv_diag_suppress 2810
#include <cuda_runtime.h>

#include "transfer/cuda/copy_kernels.cuh"
#include "transfer/cuda/copy_launch.h"

namespace kvtier::transfer::cuda {

int CopyThreadsPerBlock() { return kCopyThreads; }
int CopyLoadsInFlight() { return kLoadsInFlight; }

cudaError_t PreloadCopyKernels() {
  cudaFuncAttributes attributes{};
  for (const void* kernel : {reinterpret_cast<const void*>(CopyChunksKernel<16>),
                             reinterpret_cast<const void*>(CopyChunksKernel<8>),
                             reinterpret_cast<const void*>(CopyChunksKernel<4>)}) {
    if (const cudaError_t e = cudaFuncGetAttributes(&attributes, kernel); e != cudaSuccess) {
      return e;
    }
  }
  return cudaSuccess;
}

cudaError_t LaunchCopyKernel(const CopyView& view, int width, int blocks, cudaStream_t stream) {
  (void)cudaGetLastError();  // report this launch's error, not an earlier one's
  const cudaError_t e = ForWidth<16, 8, 4>(width, [&](auto w) {
    CopyChunksKernel<decltype(w)::value><<<blocks, kCopyThreads, 0, stream>>>(view);
  });
  return e != cudaSuccess ? e : cudaGetLastError();
}

}  // namespace kvtier::transfer::cuda
