// Out-of-line half of kvtier/cuda_check.h.
#include "kvtier/cuda_check.h"

#include <fmt/format.h>

namespace kvtier::util {

Status CudaCallError(cudaError_t error, const char* call, const char* file, int line) {
  // The error is returned as a value: clear the runtime's last-error state so that it does not
  // resurface from an unrelated later cudaGetLastError (sticky errors stay regardless).
  (void)cudaGetLastError();
  return Status::CudaError(fmt::format("{} failed at {}:{}: {} ({})", call, file, line,
                                       cudaGetErrorName(error), cudaGetErrorString(error)));
}

}  // namespace kvtier::util
