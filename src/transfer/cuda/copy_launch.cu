// Launcher of the copy kernel: the width switch (the only compile-time parameter).
// nvcc (13.0) warns (#2810) on status.h, which layout.h includes, for assigning a [[nodiscard]]
// class; the assignment is deliberate there and this file uses no Status.
#pragma nv_diag_suppress 2810
#include <cuda_runtime.h>

#include "transfer/cuda/copy_kernels.cuh"
#include "transfer/cuda/copy_launch.h"

namespace kvtier::transfer::cuda {

int CopyThreadsPerBlock() { return kCopyThreads; }
int CopyLoadsInFlight(bool staged) { return staged ? kStagedLoadsInFlight : kLoadsInFlight; }

namespace {

template <int W>
cudaError_t LaunchStaged(const CopyView& view, int blocks, cudaStream_t stream) {
  constexpr int kSharedBytes = kCopyThreads * kStagedLoadsInFlight * W;
  // Above 48 KiB a kernel must opt in to its dynamic shared memory, once per process.
  static const cudaError_t opt_in = cudaFuncSetAttribute(
      CopyChunksStagedKernel<W>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSharedBytes);
  if (opt_in != cudaSuccess) return opt_in;
  CopyChunksStagedKernel<W><<<blocks, kCopyThreads, kSharedBytes, stream>>>(view);
  return cudaSuccess;
}

}  // namespace

cudaError_t PreloadCopyKernels() {
  cudaFuncAttributes attributes{};
  for (const void* kernel :
       {reinterpret_cast<const void*>(CopyChunksKernel<16>),
        reinterpret_cast<const void*>(CopyChunksKernel<8>),
        reinterpret_cast<const void*>(CopyChunksKernel<4>),
        reinterpret_cast<const void*>(CopyChunksStagedKernel<16>),
        reinterpret_cast<const void*>(CopyChunksStagedKernel<8>),
        reinterpret_cast<const void*>(CopyChunksStagedKernel<4>)}) {
    if (const cudaError_t e = cudaFuncGetAttributes(&attributes, kernel); e != cudaSuccess) {
      return e;
    }
  }
  return cudaSuccess;
}

cudaError_t LaunchCopyKernel(const CopyView& view, int width, int blocks, cudaStream_t stream,
                             bool staged) {
  (void)cudaGetLastError();  // report this launch's error, not an earlier one's
  cudaError_t e = cudaSuccess;
  switch (width) {
    case 16:
      if (staged) {
        e = LaunchStaged<16>(view, blocks, stream);
      } else {
        CopyChunksKernel<16><<<blocks, kCopyThreads, 0, stream>>>(view);
      }
      break;
    case 8:
      if (staged) {
        e = LaunchStaged<8>(view, blocks, stream);
      } else {
        CopyChunksKernel<8><<<blocks, kCopyThreads, 0, stream>>>(view);
      }
      break;
    case 4:
      if (staged) {
        e = LaunchStaged<4>(view, blocks, stream);
      } else {
        CopyChunksKernel<4><<<blocks, kCopyThreads, 0, stream>>>(view);
      }
      break;
    default:
      return cudaErrorInvalidValue;
  }
  if (e != cudaSuccess) return e;
  return cudaGetLastError();
}

}  // namespace kvtier::transfer::cuda
