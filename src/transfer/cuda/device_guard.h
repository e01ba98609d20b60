// Internal: makes a CUDA device current for a scope and restores the previous one.
//
// Thread safety: affects the calling thread's current device only.
#pragma once

#include <cuda_runtime.h>

#include "kvtier/cuda_check.h"

namespace kvtier::transfer::cuda {

class DeviceGuard {
 public:
  DeviceGuard() = default;
  ~DeviceGuard() {
    if (previous_ >= 0) cudaSetDevice(previous_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

  // Makes `device` current (a no-op when it already is).
  Status Set(int device) {
    int current = 0;
    KVTIER_CUDA_RETURN_IF_ERROR(cudaGetDevice(&current));
    if (current != device) {
      KVTIER_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
      previous_ = current;
    }
    return Status::OK();
  }

 private:
  int previous_ = -1;
};

}  // namespace kvtier::transfer::cuda
