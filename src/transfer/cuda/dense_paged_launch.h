// Internal: host entry point of the dense <-> paged kernel (dense_paged_kernels.cuh), callable
// from plain C++.
//
// Thread safety: stateless; launches may be issued from several threads.
#pragma once

#include <cuda_runtime.h>

#include "transfer/cuda/dense_paged_view.h"

namespace kvtier::transfer::cuda {

// Launches DensePagedKernel<width> over `rows` rows (gridDim.y) on `stream` and returns the launch
// error. REQUIRES: width in {16, 8, 4, 2, 1} (else cudaErrorInvalidValue), 1 <= rows <=
// kDenseMaxRows, view filled by CopyDensePaged.
cudaError_t LaunchDensePaged(const DensePagedView& view, int width, int rows, cudaStream_t stream);

}  // namespace kvtier::transfer::cuda
