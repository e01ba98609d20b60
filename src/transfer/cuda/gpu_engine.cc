#include "transfer/cuda/gpu_engine.h"

#include <cuda_runtime.h>
#include <fmt/format.h>

#include "kvtier/cuda_check.h"
#include "kvtier/device.h"

namespace kvtier::testing {

const GpuTransferStats* LastTransferStats(const TransferEngine& engine) {
  const auto* gpu = dynamic_cast<const transfer::cuda::GpuTransferEngine*>(&engine);
  return gpu == nullptr ? nullptr : &gpu->last_stats();
}

}  // namespace kvtier::testing

namespace kvtier::transfer::cuda {

Status RequireDevice(const char* backend, int device) {
  if (CudaDeviceCount() > device) return Status::OK();
  return Status::Unavailable(
      fmt::format("the {} transfer backend needs CUDA device {}, but {} device(s) are present",
                  backend, device, CudaDeviceCount()));
}

Status CheckResidency(const KvRegion& r, const char* name, bool need_pinned_host, bool* pageable) {
  const void* p = r.has_layer_table() ? r.k_layers[0] : r.k;
  cudaPointerAttributes attr{};
  const cudaError_t e = cudaPointerGetAttributes(&attr, p);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    attr.type = cudaMemoryTypeUnregistered;
  }
  if (pageable != nullptr) {
    *pageable = r.memory == MemoryKind::kHost && attr.type == cudaMemoryTypeUnregistered;
  }
  if (r.memory == MemoryKind::kDevice) {
    if (attr.type != cudaMemoryTypeDevice && attr.type != cudaMemoryTypeManaged) {
      return Status::InvalidArgument(
          fmt::format("{}.memory is device but {} ({}) is not CUDA device memory", name,
                      r.has_layer_table() ? "k_layers[0]" : "k", p));
    }
    return Status::OK();
  }
  if (need_pinned_host && attr.type == cudaMemoryTypeUnregistered) {
    return Status::InvalidArgument(fmt::format(
        "{}.{} ({}) is pageable host memory; the kernel backend reads host memory through UVA and "
        "needs it pinned (HostKvPool, PinnedHostBuffer or PinnedRegistration), or use the dma or "
        "cpu backend",
        name, r.has_layer_table() ? "k_layers[0]" : "k", p));
  }
  if (attr.type == cudaMemoryTypeDevice) {
    return Status::InvalidArgument(
        fmt::format("{}.memory is host but {} ({}) is CUDA device memory", name,
                    r.has_layer_table() ? "k_layers[0]" : "k", p));
  }
  return Status::OK();
}

}  // namespace kvtier::transfer::cuda
