// Launcher of the dense <-> paged kernel: the width switch and the grid size.
// nvcc (13.0) warns (#2810) on status.h, which layout.h includes, for assigning a [[nodiscard]]
// class; the assignment is deliberate there and this file uses no Status.
#pragma nv_diag_suppress 2810
#include <cuda_runtime.h>

#include <algorithm>

#include "transfer/cuda/dense_paged_kernels.cuh"
#include "transfer/cuda/dense_paged_launch.h"

namespace kvtier::transfer::cuda {

cudaError_t LaunchDensePaged(const DensePagedView& view, int width, int rows, cudaStream_t stream) {
  (void)cudaGetLastError();  // report this launch's error, not an earlier one's
  if (rows < 1 || rows > kDenseMaxRows) return cudaErrorInvalidValue;
  // Enough blocks for every SM several times over across the rows, none idle for a short row.
  const uint32_t per_block = kDenseThreads * kDenseUnroll;
  const uint32_t wanted = (view.positions + per_block - 1) / per_block;
  const uint32_t cap = std::max<uint32_t>(1, 4096 / static_cast<uint32_t>(rows));
  const dim3 grid(std::max<uint32_t>(1, std::min(wanted, cap)), static_cast<uint32_t>(rows));
  const cudaError_t e = ForWidth<16, 8, 4, 2, 1>(width, [&](auto w) {
    DensePagedKernel<decltype(w)::value><<<grid, kDenseThreads, 0, stream>>>(view);
  });
  return e != cudaSuccess ? e : cudaGetLastError();
}

}  // namespace kvtier::transfer::cuda
