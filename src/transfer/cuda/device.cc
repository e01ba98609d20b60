// kvtier/device.h with CUDA. See device_nocuda.cc for builds without it.
#include "kvtier/device.h"

#include <fmt/format.h>
#include <sys/resource.h>

#include <utility>

#include "kvtier/cuda_check.h"
#include "transfer/cuda/device_guard.h"
#include "util/log.h"

namespace kvtier {

int CudaDeviceCount() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();  // no driver / no device: clear the non-sticky error
    return 0;
  }
  return count;
}

// ---- CudaStreamHandle ------------------------------------------------------------------------

Result<CudaStreamHandle> CudaStreamHandle::Create(int device, bool non_blocking) {
  transfer::cuda::DeviceGuard guard;
  KVTIER_RETURN_IF_ERROR(guard.Set(device));
  CudaStreamHandle h;
  cudaStream_t s = nullptr;
  KVTIER_CUDA_RETURN_IF_ERROR(
      cudaStreamCreateWithFlags(&s, non_blocking ? cudaStreamNonBlocking : cudaStreamDefault));
  h.stream_ = s;
  h.device_ = device;
  return h;
}

CudaStreamHandle::~CudaStreamHandle() {
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
}
CudaStreamHandle::CudaStreamHandle(CudaStreamHandle&& o) noexcept
    : stream_(std::exchange(o.stream_, nullptr)), device_(o.device_) {}
CudaStreamHandle& CudaStreamHandle::operator=(CudaStreamHandle&& o) noexcept {
  if (this != &o) {
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
    stream_ = std::exchange(o.stream_, nullptr);
    device_ = o.device_;
  }
  return *this;
}
Status CudaStreamHandle::Synchronize() const {
  KVTIER_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  return Status::OK();
}

// ---- CudaEventHandle -------------------------------------------------------------------------

Result<CudaEventHandle> CudaEventHandle::Create(int device, bool timing) {
  transfer::cuda::DeviceGuard guard;
  KVTIER_RETURN_IF_ERROR(guard.Set(device));
  CudaEventHandle h;
  cudaEvent_t e = nullptr;
  KVTIER_CUDA_RETURN_IF_ERROR(
      cudaEventCreateWithFlags(&e, timing ? cudaEventDefault : cudaEventDisableTiming));
  h.event_ = e;
  h.device_ = device;
  return h;
}
CudaEventHandle::~CudaEventHandle() {
  if (event_ != nullptr) cudaEventDestroy(event_);
}
CudaEventHandle::CudaEventHandle(CudaEventHandle&& o) noexcept
    : event_(std::exchange(o.event_, nullptr)), device_(o.device_) {}
CudaEventHandle& CudaEventHandle::operator=(CudaEventHandle&& o) noexcept {
  if (this != &o) {
    if (event_ != nullptr) cudaEventDestroy(event_);
    event_ = std::exchange(o.event_, nullptr);
    device_ = o.device_;
  }
  return *this;
}
Status CudaEventHandle::Record(CudaStream stream) {
  KVTIER_CUDA_RETURN_IF_ERROR(cudaEventRecord(event_, stream));
  return Status::OK();
}
Status CudaEventHandle::WaitOn(CudaStream stream) const {
  KVTIER_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(stream, event_, 0));
  return Status::OK();
}
Status CudaEventHandle::Synchronize() const {
  KVTIER_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(event_));
  return Status::OK();
}
Result<bool> CudaEventHandle::Query() const {
  const cudaError_t e = cudaEventQuery(event_);
  if (e == cudaSuccess) return true;
  if (e == cudaErrorNotReady) {
    (void)cudaGetLastError();
    return false;
  }
  KVTIER_CUDA_RETURN_IF_ERROR(e);
  return false;
}
Result<float> CudaEventHandle::ElapsedMsSince(const CudaEventHandle& start) const {
  float ms = 0;
  KVTIER_CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, start.event_, event_));
  return ms;
}

// ---- LayerEvents -----------------------------------------------------------------------------

Result<LayerEvents> LayerEvents::Create(int num_layers, int device) {
  if (num_layers <= 0) {
    return Status::InvalidArgument(
        fmt::format("LayerEvents: num_layers = {} must be positive", num_layers));
  }
  LayerEvents events;
  events.events_.reserve(static_cast<size_t>(num_layers));
  for (int l = 0; l < num_layers; ++l) {
    KVTIER_ASSIGN_OR_RETURN(CudaEventHandle e, CudaEventHandle::Create(device, false));
    events.events_.push_back(std::move(e));
  }
  return events;
}
Status LayerEvents::CheckLayer(int layer) const {
  if (layer < 0 || layer >= size()) {
    return Status::InvalidArgument(
        fmt::format("LayerEvents: layer = {} is out of range [0, {})", layer, size()));
  }
  return Status::OK();
}
Status LayerEvents::Record(int layer, CudaStream stream) {
  KVTIER_RETURN_IF_ERROR(CheckLayer(layer));
  return events_[static_cast<size_t>(layer)].Record(stream);
}
Status LayerEvents::Wait(int layer, CudaStream consumer) const {
  KVTIER_RETURN_IF_ERROR(CheckLayer(layer));
  return events_[static_cast<size_t>(layer)].WaitOn(consumer);
}
Status LayerEvents::Synchronize(int layer) const {
  KVTIER_RETURN_IF_ERROR(CheckLayer(layer));
  return events_[static_cast<size_t>(layer)].Synchronize();
}
Result<bool> LayerEvents::Query(int layer) const {
  KVTIER_RETURN_IF_ERROR(CheckLayer(layer));
  return events_[static_cast<size_t>(layer)].Query();
}

// ---- DeviceBuffer ----------------------------------------------------------------------------

Result<DeviceBuffer> DeviceBuffer::Allocate(int64_t bytes, int device) {
  if (bytes < 0) {
    return Status::InvalidArgument(fmt::format("DeviceBuffer: bytes = {} is negative", bytes));
  }
  transfer::cuda::DeviceGuard guard;
  KVTIER_RETURN_IF_ERROR(guard.Set(device));
  DeviceBuffer b;
  b.device_ = device;
  if (bytes == 0) return b;
  void* p = nullptr;
  const cudaError_t e = cudaMalloc(&p, static_cast<size_t>(bytes));
  if (e == cudaErrorMemoryAllocation) {
    (void)cudaGetLastError();
    size_t free_bytes = 0, total_bytes = 0;
    (void)cudaMemGetInfo(&free_bytes, &total_bytes);
    return Status::OutOfMemory(
        fmt::format("cudaMalloc of {} bytes on device {} failed: {} bytes free of {}", bytes,
                    device, free_bytes, total_bytes));
  }
  KVTIER_CUDA_RETURN_IF_ERROR(e);
  b.data_ = p;
  b.bytes_ = bytes;
  return b;
}
DeviceBuffer::~DeviceBuffer() {
  if (data_ != nullptr) cudaFree(data_);
}
DeviceBuffer::DeviceBuffer(DeviceBuffer&& o) noexcept
    : data_(std::exchange(o.data_, nullptr)),
      bytes_(std::exchange(o.bytes_, 0)),
      device_(o.device_) {}
DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  if (this != &o) {
    if (data_ != nullptr) cudaFree(data_);
    data_ = std::exchange(o.data_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
    device_ = o.device_;
  }
  return *this;
}

// ---- PinnedHostBuffer ------------------------------------------------------------------------

Result<PinnedHostBuffer> PinnedHostBuffer::Allocate(int64_t bytes) {
  if (bytes < 0) {
    return Status::InvalidArgument(fmt::format("PinnedHostBuffer: bytes = {} is negative", bytes));
  }
  PinnedHostBuffer b;
  if (bytes == 0) return b;
  void* p = nullptr;
  const cudaError_t e =
      cudaHostAlloc(&p, static_cast<size_t>(bytes), cudaHostAllocPortable | cudaHostAllocMapped);
  if (e == cudaErrorMemoryAllocation) {
    (void)cudaGetLastError();
    return Status::OutOfMemory(
        fmt::format("cudaHostAlloc of {} bytes of pinned host memory failed", bytes));
  }
  KVTIER_CUDA_RETURN_IF_ERROR(e);
  b.data_ = p;
  b.bytes_ = bytes;
  return b;
}
PinnedHostBuffer::~PinnedHostBuffer() {
  if (data_ != nullptr) cudaFreeHost(data_);
}
PinnedHostBuffer::PinnedHostBuffer(PinnedHostBuffer&& o) noexcept
    : data_(std::exchange(o.data_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}
PinnedHostBuffer& PinnedHostBuffer::operator=(PinnedHostBuffer&& o) noexcept {
  if (this != &o) {
    if (data_ != nullptr) cudaFreeHost(data_);
    data_ = std::exchange(o.data_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
  }
  return *this;
}

// ---- PinnedRegistration ----------------------------------------------------------------------

Result<PinnedRegistration> PinnedRegistration::Register(void* ptr, int64_t bytes) {
  if (ptr == nullptr || bytes <= 0) {
    return Status::InvalidArgument(fmt::format(
        "PinnedRegistration: need a non-null pointer and bytes > 0, got {} and {}", ptr, bytes));
  }
  const cudaError_t e = cudaHostRegister(ptr, static_cast<size_t>(bytes),
                                         cudaHostRegisterPortable | cudaHostRegisterMapped);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    if (e == cudaErrorHostMemoryAlreadyRegistered) {
      return Status::InvalidArgument(fmt::format(
          "cudaHostRegister({}, {} bytes): the range is already registered", ptr, bytes));
    }
    struct rlimit lim {};
    std::string limit = "unknown";
    if (getrlimit(RLIMIT_MEMLOCK, &lim) == 0) {
      limit = lim.rlim_cur == RLIM_INFINITY ? "unlimited" : fmt::format("{} bytes", lim.rlim_cur);
    }
    return Status::OutOfMemory(fmt::format(
        "cudaHostRegister({}, {} bytes) failed: {} ({}). The pages could not be locked; the "
        "locked-memory limit RLIMIT_MEMLOCK is {} — raise it with `ulimit -l unlimited` (or "
        "memlock in /etc/security/limits.conf, or --ulimit memlock=-1 for containers)",
        ptr, bytes, cudaGetErrorName(e), cudaGetErrorString(e), limit));
  }
  PinnedRegistration r;
  r.ptr_ = ptr;
  r.bytes_ = bytes;
  return r;
}
PinnedRegistration::~PinnedRegistration() {
  if (ptr_ == nullptr) return;
  const cudaError_t e = cudaHostUnregister(ptr_);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    util::Log(util::LogLevel::kError, "cudaHostUnregister({}) failed: {}", ptr_,
              cudaGetErrorString(e));
  }
}
PinnedRegistration::PinnedRegistration(PinnedRegistration&& o) noexcept
    : ptr_(std::exchange(o.ptr_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}
PinnedRegistration& PinnedRegistration::operator=(PinnedRegistration&& o) noexcept {
  if (this != &o) {
    if (ptr_ != nullptr) cudaHostUnregister(ptr_);
    ptr_ = std::exchange(o.ptr_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
  }
  return *this;
}

// ---- DeviceKvPool ----------------------------------------------------------------------------

Result<DeviceKvPool> DeviceKvPool::Create(const KvGeometry& geometry, bool mla, int device) {
  if (geometry.layout != KvLayout::kLayerFirst) {
    return Status::InvalidArgument(fmt::format(
        "DeviceKvPool: layout = {}; a device pool is layer_first", LayoutName(geometry.layout)));
  }
  KvRegion probe;
  probe.geometry = geometry;
  probe.mla = mla;
  probe.memory = MemoryKind::kDevice;
  probe.k = reinterpret_cast<void*>(uintptr_t{256});  // only the geometry is checked here
  probe.v = mla ? nullptr : probe.k;
  KVTIER_RETURN_IF_ERROR(probe.Validate("DeviceKvPool"));
  DeviceKvPool pool;
  pool.geometry_ = geometry;
  pool.mla_ = mla;
  KVTIER_ASSIGN_OR_RETURN(pool.memory_,
                          DeviceBuffer::Allocate(geometry.buffer_bytes() * (mla ? 1 : 2), device));
  return pool;
}
void* DeviceKvPool::v() const {
  if (mla_ || memory_.data() == nullptr) return nullptr;
  return static_cast<std::byte*>(memory_.data()) + geometry_.buffer_bytes();
}
KvRegion DeviceKvPool::region() const {
  KvRegion r;
  r.geometry = geometry_;
  r.mla = mla_;
  r.memory = MemoryKind::kDevice;
  r.device = memory_.device();
  r.k = k();
  r.v = v();
  return r;
}

}  // namespace kvtier
