// Out-of-line half of util/cuda_check.h.
#include "util/cuda_check.h"

#include <fmt/format.h>

namespace kvtier::util {

Status CudaCallError(cudaError_t error, const char* call, const char* file, int line) {
  return Status::CudaError(fmt::format("{} failed at {}:{}: {} ({})", call, file, line,
                                       cudaGetErrorName(error), cudaGetErrorString(error)));
}

}  // namespace kvtier::util
