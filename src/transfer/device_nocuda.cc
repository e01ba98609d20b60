// kvtier/device.h in a build without CUDA: no device is present, so CudaDeviceCount() is 0 and
// every factory answers Unavailable. Nothing can be created, so the remaining members only free
// what they never hold; the moves carry the fields as the CUDA build's do (a defaulted move
// would leave `device_` unread in this file, clang's -Wunused-private-field). The CUDA build uses
// src/transfer/cuda/device.cc instead.
#if !defined(KVTIER_WITH_CUDA)

#include <string>

#include "kvtier/device.h"

namespace kvtier {
namespace {

Status NoCuda(const char* what) {
  return Status::Unavailable(std::string(what) +
                             ": kvtier was built without CUDA (KVTIER_CUDA=OFF or no nvcc)");
}

}  // namespace

int CudaDeviceCount() { return 0; }

Result<CudaStreamHandle> CudaStreamHandle::Create(int, bool) { return NoCuda("CudaStreamHandle"); }
CudaStreamHandle::~CudaStreamHandle() = default;
CudaStreamHandle::CudaStreamHandle(CudaStreamHandle&& o) noexcept
    : stream_(o.stream_), device_(o.device_) {}
CudaStreamHandle& CudaStreamHandle::operator=(CudaStreamHandle&& o) noexcept {
  stream_ = o.stream_;
  device_ = o.device_;
  return *this;
}
Status CudaStreamHandle::Synchronize() const { return NoCuda("CudaStreamHandle::Synchronize"); }

Result<CudaEventHandle> CudaEventHandle::Create(int, bool) { return NoCuda("CudaEventHandle"); }
CudaEventHandle::~CudaEventHandle() = default;
CudaEventHandle::CudaEventHandle(CudaEventHandle&& o) noexcept
    : event_(o.event_), device_(o.device_) {}
CudaEventHandle& CudaEventHandle::operator=(CudaEventHandle&& o) noexcept {
  event_ = o.event_;
  device_ = o.device_;
  return *this;
}
Status CudaEventHandle::Record(CudaStream) { return NoCuda("CudaEventHandle::Record"); }
Status CudaEventHandle::WaitOn(CudaStream) const { return NoCuda("CudaEventHandle::WaitOn"); }
Status CudaEventHandle::Synchronize() const { return NoCuda("CudaEventHandle::Synchronize"); }
Result<bool> CudaEventHandle::Query() const { return NoCuda("CudaEventHandle::Query"); }
Result<float> CudaEventHandle::ElapsedMsSince(const CudaEventHandle&) const {
  return NoCuda("CudaEventHandle::ElapsedMsSince");
}

Result<LayerEvents> LayerEvents::Create(int, int) { return NoCuda("LayerEvents"); }
Status LayerEvents::CheckLayer(int) const { return NoCuda("LayerEvents"); }
Status LayerEvents::Record(int, CudaStream) { return NoCuda("LayerEvents::Record"); }
Status LayerEvents::Wait(int, CudaStream) const { return NoCuda("LayerEvents::Wait"); }
Status LayerEvents::Synchronize(int) const { return NoCuda("LayerEvents::Synchronize"); }
Result<bool> LayerEvents::Query(int) const { return NoCuda("LayerEvents::Query"); }

Result<DeviceBuffer> DeviceBuffer::Allocate(int64_t, int) { return NoCuda("DeviceBuffer"); }
DeviceBuffer::~DeviceBuffer() = default;
DeviceBuffer::DeviceBuffer(DeviceBuffer&&) noexcept = default;
DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&&) noexcept = default;

Result<PinnedHostBuffer> PinnedHostBuffer::Allocate(int64_t) { return NoCuda("PinnedHostBuffer"); }
PinnedHostBuffer::~PinnedHostBuffer() = default;
PinnedHostBuffer::PinnedHostBuffer(PinnedHostBuffer&&) noexcept = default;
PinnedHostBuffer& PinnedHostBuffer::operator=(PinnedHostBuffer&&) noexcept = default;

Result<PinnedRegistration> PinnedRegistration::Register(void*, int64_t) {
  return NoCuda("PinnedRegistration");
}
PinnedRegistration::~PinnedRegistration() = default;
PinnedRegistration::PinnedRegistration(PinnedRegistration&&) noexcept = default;
PinnedRegistration& PinnedRegistration::operator=(PinnedRegistration&&) noexcept = default;

Result<DeviceKvPool> DeviceKvPool::Create(const KvGeometry&, bool, int) {
  return NoCuda("DeviceKvPool");
}
void* DeviceKvPool::v() const { return nullptr; }
KvRegion DeviceKvPool::region() const { return KvRegion{}; }

}  // namespace kvtier

#endif  // !KVTIER_WITH_CUDA
