// kvtier/cuda_check.h — the one checking macro for CUDA runtime calls (one macro, as NCCL and
// CUB have); the library, tests and tools all use it.
//
// `KVTIER_CUDA_RETURN_IF_ERROR(call)` evaluates a CUDA runtime call and, when it does not return
// cudaSuccess, returns `Status::CudaError` from the enclosing function with a message naming the
// call text, file, line, the error's name and `cudaGetErrorString`:
//   "cudaMemcpyAsync(dst, src, n, cudaMemcpyDefault, stream) failed at src/x.cc:42:
//    cudaErrorInvalidValue (invalid argument)"
// On failure the runtime's last-error state is cleared (cudaGetLastError), so a non-sticky error
// that is now a Status does not resurface from an unrelated later check; sticky errors (a faulted
// context) persist in the runtime regardless.
//
// Only for code built with CUDA (it includes <cuda_runtime.h>). Thread safety: stateless.
#pragma once

#include <cuda_runtime.h>

#include "kvtier/status.h"

namespace kvtier::util {

// The Status for a failed CUDA call. Out of line so that .cu files need no fmt.
Status CudaCallError(cudaError_t error, const char* call, const char* file, int line);

}  // namespace kvtier::util

#define KVTIER_CUDA_RETURN_IF_ERROR(call)                                                  \
  do {                                                                                     \
    const cudaError_t kvtier_cuda_error_ = (call);                                         \
    if (kvtier_cuda_error_ != cudaSuccess) {                                               \
      return ::kvtier::util::CudaCallError(kvtier_cuda_error_, #call, __FILE__, __LINE__); \
    }                                                                                      \
  } while (0)
