// kvtier/device.h — CUDA device helpers: RAII streams, events and memory, per-layer readiness
// events, kvtier's own device KV pool, and pinned-host registration.
//
// No CUDA header is included: streams and events are the opaque `CUstream_st*` / `CUevent_st*`
// that `cudaStream_t` / `cudaEvent_t` are, so the header compiles in every build. In a build
// without CUDA (`BuiltWithCuda()` false) `CudaDeviceCount()` returns 0 and every factory below
// returns `Unavailable`; nothing can then be created, so the other members are never reached.
//
// Every factory that touches a device takes the CUDA device ordinal and leaves the calling
// thread's current device as it found it.
//
// Errors of the GPU transfer engines (TransferEngine with backend kernel, dma or auto):
//   - Transfer returns every error it can see without waiting for the device: invalid requests
//     (ValidateTransfer, including out-of-range HOST indices), host regions the backend cannot
//     use (pageable memory for kernel), too few layer_events, CUDA errors of its own calls.
//   - Out-of-range DEVICE indices:
//       kernel: the kernel skips each bad slot pair (no memory access) and counts it on the
//         device. Transfer returns OK. The next `Synchronize(stream)` on that engine waits for
//         `stream`, then returns InvalidArgument "kernel backend: N slot pair(s) with out-of-range
//         device indices were skipped since the last Synchronize (e.g. src_slots[k] = v is not
//         in [0, num_slots))". The count covers every copy of the engine that finished, on any
//         stream; each bad pair is reported by exactly one Synchronize. All valid pairs of the
//         request are copied.
//       dma: the indices are copied to the host (Transfer synchronises `stream` to read them)
//         and checked there: Transfer returns that InvalidArgument and copies nothing.
//       auto: device indices always go to the kernel engine, so as for kernel; its Synchronize
//         waits for both engines and returns the kernel engine's deferred error.
//   - Asynchronous CUDA faults (a bad pointer in a region) surface, as with any CUDA work, from
//     Synchronize (or the next CUDA call) as CudaError.
//
// Thread safety: the handles are move-only values with no internal locking; distinct objects may
// be used from different threads. `LayerEvents::Record` of one layer must not race with `Wait`,
// `Query` or `Synchronize` of the same layer (as for a plain cudaEvent_t); different layers may.
#pragma once

#include <cstdint>
#include <vector>

#include "kvtier/layout.h"
#include "kvtier/status.h"
#include "kvtier/transfer.h"

struct CUevent_st;

namespace kvtier {

using CudaEvent = CUevent_st*;

// Number of CUDA devices visible to this process. 0 — not an error — when kvtier was built
// without CUDA, when no driver is installed, or when no GPU is present.
int CudaDeviceCount();

// A CUDA stream, destroyed with the handle. An empty (default-constructed) handle holds nullptr,
// the legacy default stream, which is never destroyed.
class CudaStreamHandle {
 public:
  // A new stream on `device`. `non_blocking`: does not synchronise with the legacy default
  // stream (cudaStreamNonBlocking).
  static Result<CudaStreamHandle> Create(int device = 0, bool non_blocking = true);

  CudaStreamHandle() = default;
  ~CudaStreamHandle();
  CudaStreamHandle(CudaStreamHandle&& other) noexcept;
  CudaStreamHandle& operator=(CudaStreamHandle&& other) noexcept;
  CudaStreamHandle(const CudaStreamHandle&) = delete;
  CudaStreamHandle& operator=(const CudaStreamHandle&) = delete;

  CudaStream get() const { return stream_; }
  // Blocks the host until all work on the stream has finished.
  Status Synchronize() const;

 private:
  CudaStream stream_ = nullptr;
  int device_ = 0;
};

// A CUDA event, destroyed with the handle.
class CudaEventHandle {
 public:
  // `timing`: the event can be used with ElapsedMs (slightly costlier to record).
  static Result<CudaEventHandle> Create(int device = 0, bool timing = false);

  CudaEventHandle() = default;
  ~CudaEventHandle();
  CudaEventHandle(CudaEventHandle&& other) noexcept;
  CudaEventHandle& operator=(CudaEventHandle&& other) noexcept;
  CudaEventHandle(const CudaEventHandle&) = delete;
  CudaEventHandle& operator=(const CudaEventHandle&) = delete;

  CudaEvent get() const { return event_; }
  Status Record(CudaStream stream);
  // Makes `stream` wait (on the device, not the host) until the recorded work has finished.
  Status WaitOn(CudaStream stream) const;
  Status Synchronize() const;
  // True once the recorded work has finished (or nothing was ever recorded).
  Result<bool> Query() const;
  // Milliseconds from `start` to this event. REQUIRES: both created with timing = true, both
  // recorded and finished.
  Result<float> ElapsedMsSince(const CudaEventHandle& start) const;

 private:
  CudaEvent event_ = nullptr;
  int device_ = 0;
};

// One reusable event per layer of a multi-layer copy (TransferOptions::layer_events).
//
// A GPU transfer engine given `layer_events` records event k on the request's stream once the
// bytes of request layer k (k = 0 .. num_layers-1, relative to the request's first layer) are in
// place. A consumer stream then waits for layer k without blocking the host:
//
//   LayerEvents events = *LayerEvents::Create(num_layers, device);
//   engine->Transfer(load, {.stream = copy_stream, .layer_events = &events});
//   for (int l = 0; l < num_layers; ++l) {
//     events.Wait(l, compute_stream);   // cudaStreamWaitEvent: no host blocking
//     LaunchAttention(l, compute_stream);
//   }
//
// Events are reused by the next transfer that is given the same object, like any cudaEvent_t:
// a Wait issued before the re-record waits for the earlier copy.
class LayerEvents {
 public:
  // REQUIRES: num_layers > 0.
  static Result<LayerEvents> Create(int num_layers, int device = 0);

  LayerEvents() = default;
  LayerEvents(LayerEvents&&) noexcept = default;
  LayerEvents& operator=(LayerEvents&&) noexcept = default;
  LayerEvents(const LayerEvents&) = delete;
  LayerEvents& operator=(const LayerEvents&) = delete;

  int size() const { return static_cast<int>(events_.size()); }
  // Records layer `layer`'s event on `stream`. REQUIRES: 0 <= layer < size() (else
  // InvalidArgument).
  Status Record(int layer, CudaStream stream);
  // cudaStreamWaitEvent(consumer, event[layer]): `consumer` waits on the device; the host does not.
  Status Wait(int layer, CudaStream consumer) const;
  // Blocks the host until layer `layer` is in place.
  Status Synchronize(int layer) const;
  // True once layer `layer` is in place (or its event was never recorded).
  Result<bool> Query(int layer) const;
  // The raw event, for callers that want to hand it to other CUDA code.
  CudaEvent event(int layer) const { return events_[static_cast<size_t>(layer)].get(); }

 private:
  Status CheckLayer(int layer) const;
  std::vector<CudaEventHandle> events_;
};

// Device memory, freed with the handle (cudaMalloc / cudaFree).
class DeviceBuffer {
 public:
  static Result<DeviceBuffer> Allocate(int64_t bytes, int device = 0);

  DeviceBuffer() = default;
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* data() const { return data_; }
  int64_t bytes() const { return bytes_; }
  int device() const { return device_; }

 private:
  void* data_ = nullptr;
  int64_t bytes_ = 0;
  int device_ = 0;
};

// Pinned (page-locked), device-mapped host memory from cudaHostAlloc, freed with the handle.
// Readable by the CPU and, through UVA, by kernels of every device.
class PinnedHostBuffer {
 public:
  static Result<PinnedHostBuffer> Allocate(int64_t bytes);

  PinnedHostBuffer() = default;
  ~PinnedHostBuffer();
  PinnedHostBuffer(PinnedHostBuffer&& other) noexcept;
  PinnedHostBuffer& operator=(PinnedHostBuffer&& other) noexcept;
  PinnedHostBuffer(const PinnedHostBuffer&) = delete;
  PinnedHostBuffer& operator=(const PinnedHostBuffer&) = delete;

  void* data() const { return data_; }
  int64_t bytes() const { return bytes_; }

 private:
  void* data_ = nullptr;
  int64_t bytes_ = 0;
};

// Page-locks and maps an existing host range (cudaHostRegister, portable + mapped) for as long
// as the handle lives; cudaHostUnregister on destruction. The kernel backend needs its host
// regions pinned; the dma backend is fastest with them pinned.
class PinnedRegistration {
 public:
  // REQUIRES: ptr != nullptr, bytes > 0, the range not registered already. When the kernel
  // refuses to lock the pages (typically the locked-memory limit), the error names
  // RLIMIT_MEMLOCK, the current limit and `ulimit -l`.
  static Result<PinnedRegistration> Register(void* ptr, int64_t bytes);
  // The pools' registration: Register when a GPU is present; otherwise (no GPU, or kvtier built
  // without CUDA) an empty registration (registered() false) and the memory stays plain.
  static Result<PinnedRegistration> RegisterIfGpuPresent(void* ptr, int64_t bytes) {
    if (CudaDeviceCount() == 0) return PinnedRegistration();
    return Register(ptr, bytes);
  }

  PinnedRegistration() = default;
  ~PinnedRegistration();
  PinnedRegistration(PinnedRegistration&& other) noexcept;
  PinnedRegistration& operator=(PinnedRegistration&& other) noexcept;
  PinnedRegistration(const PinnedRegistration&) = delete;
  PinnedRegistration& operator=(const PinnedRegistration&) = delete;

  bool registered() const { return ptr_ != nullptr; }
  void* data() const { return ptr_; }
  int64_t bytes() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  int64_t bytes_ = 0;
};

// kvtier's own L1 pool: the K and V buffers (or the one MLA buffer) of a layer_first KV cache
// in device memory, one cudaMalloc for all buffers (V follows K). Contents are uninitialised.
class DeviceKvPool {
 public:
  // REQUIRES: geometry.layout == kLayerFirst and a geometry that KvRegion::Validate accepts.
  static Result<DeviceKvPool> Create(const KvGeometry& geometry, bool mla, int device = 0);

  DeviceKvPool() = default;
  DeviceKvPool(DeviceKvPool&&) noexcept = default;
  DeviceKvPool& operator=(DeviceKvPool&&) noexcept = default;
  DeviceKvPool(const DeviceKvPool&) = delete;
  DeviceKvPool& operator=(const DeviceKvPool&) = delete;

  const KvGeometry& geometry() const { return geometry_; }
  bool mla() const { return mla_; }
  int device() const { return memory_.device(); }
  // K (or the MLA buffer) and V (null for MLA): [L, N, S] each.
  void* k() const { return memory_.data(); }
  void* v() const;
  int64_t bytes() const { return memory_.bytes(); }
  // The region over the pool: memory = kDevice, device = device(), base pointers k()/v().
  KvRegion region() const;

 private:
  KvGeometry geometry_;
  bool mla_ = false;
  DeviceBuffer memory_;
};

}  // namespace kvtier
