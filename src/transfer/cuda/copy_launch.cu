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
  switch (width) {
    case 16:
      CopyChunksKernel<16><<<blocks, kCopyThreads, 0, stream>>>(view);
      break;
    case 8:
      CopyChunksKernel<8><<<blocks, kCopyThreads, 0, stream>>>(view);
      break;
    case 4:
      CopyChunksKernel<4><<<blocks, kCopyThreads, 0, stream>>>(view);
      break;
    default:
      return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

}  // namespace kvtier::transfer::cuda
