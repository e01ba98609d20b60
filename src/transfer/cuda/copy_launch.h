// Internal: host entry point of the copy kernel (copy_kernels.cuh), callable from plain C++.
//
// Thread safety: stateless; launches may be issued from several threads.
#pragma once

#include <cuda_runtime.h>

#include "transfer/cuda/copy_view.h"

namespace kvtier::transfer::cuda {

// Threads per block and W-byte loads each thread keeps in flight (see copy_kernels.cuh).
int CopyThreadsPerBlock();
int CopyLoadsInFlight();

// Loads every copy kernel into the current device's context now. With lazy module loading (the
// default since CUDA 12.2) a kernel is loaded at its first launch, and that load can wait for
// the device to go idle: a process's first load launched while a backup runs on another stream
// would stall until the backup finished (measured: a held backup stalled it until its 30 s
// gate gave up). Engines call this once when they are made.
cudaError_t PreloadCopyKernels();

// Launches CopyChunksKernel<width> with `blocks` blocks on `stream` and returns the launch error
// (cudaGetLastError). Returns a cudaError_t, not a Status, so that no .cu file includes the
// Status headers; the engine wraps it with KVTIER_CUDA_RETURN_IF_ERROR.
// REQUIRES: width in {16, 8, 4} (else cudaErrorInvalidValue), view filled by the engine.
cudaError_t LaunchCopyKernel(const CopyView& view, int width, int blocks, cudaStream_t stream);

}  // namespace kvtier::transfer::cuda
