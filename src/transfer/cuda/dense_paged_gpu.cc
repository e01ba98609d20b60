// The CUDA part of CopyDensePaged (kvtier/dense_paged.h): picks the access width, fills the
// kernel's view and launches it over at most kDenseMaxRows (layer, buffer) rows at a time.
//
// Thread safety: launches are stateless; the per-device error counters are created once under a
// mutex and updated atomically by the kernels.
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <vector>

#include "kvtier/cuda_check.h"
#include "transfer/cuda/dense_paged_launch.h"
#include "transfer/cuda/device_guard.h"
#include "transfer/dense_paged_internal.h"

namespace kvtier::transfer {
namespace {

using cuda::DensePagedView;
using cuda::DenseRow;
using cuda::FastDivmod;
using cuda::SlotAddressing;

constexpr int kMaxDevices = 64;

std::mutex counters_mutex;
std::array<unsigned long long*, kMaxDevices> counters{};  // guarded by counters_mutex

// The device's skipped-slot counter, created on first use. REQUIRES: `device` is current.
Result<unsigned long long*> ErrorCounter(int device) {
  if (device < 0 || device >= kMaxDevices) {
    return Status::InvalidArgument("device ordinal out of range for the dense <-> paged kernel");
  }
  std::lock_guard<std::mutex> lock(counters_mutex);
  if (counters[device] == nullptr) {
    void* p = nullptr;
    KVTIER_CUDA_RETURN_IF_ERROR(cudaMalloc(&p, sizeof(unsigned long long)));
    KVTIER_CUDA_RETURN_IF_ERROR(cudaMemset(p, 0, sizeof(unsigned long long)));
    counters[device] = static_cast<unsigned long long*>(p);  // lives as long as the process
  }
  return counters[device];
}

// The widest of 16, 8, 4, 2, 1 that divides every value.
int WidestDividing(const std::vector<uint64_t>& values) {
  for (int w : {16, 8, 4, 2}) {
    if (std::all_of(values.begin(), values.end(), [w](uint64_t v) { return v % w == 0; })) {
      return w;
    }
  }
  return 1;
}

Status Launch(const KvRegion& pool, const DenseKv& d, int64_t first_layer, DenseDirection direction,
              const void* device_slots, IndexType index_type, unsigned long long* errors,
              CudaStream stream);

}  // namespace

Status CopyDensePagedOnGpu(const KvRegion& pool, SlotIndices slots, const DenseKv& d,
                           int64_t first_layer, DenseDirection direction, CudaStream stream) {
  cuda::DeviceGuard guard;
  KVTIER_RETURN_IF_ERROR(guard.Set(pool.device));
  KVTIER_ASSIGN_OR_RETURN(unsigned long long* errors, ErrorCounter(pool.device));

  // Host slot lists go to the device for the kernel through a pageable copy (a copy from
  // pageable memory has consumed its source when cudaMemcpyAsync returns, so the caller's list
  // may go at once, pinned or not); the device copy is stream-ordered and freed after the kernel.
  const void* device_slots = slots.data;
  void* staged = nullptr;
  const int64_t tokens = d.batch * d.seq;
  const size_t index_bytes = slots.type == IndexType::kInt64 ? 8 : 4;
  if (slots.memory == MemoryKind::kHost) {
    std::vector<std::byte> pageable(static_cast<size_t>(tokens) * index_bytes);
    std::memcpy(pageable.data(), slots.data, pageable.size());
    KVTIER_CUDA_RETURN_IF_ERROR(cudaMallocAsync(&staged, pageable.size(), stream));
    const cudaError_t copied =
        cudaMemcpyAsync(staged, pageable.data(), pageable.size(), cudaMemcpyHostToDevice, stream);
    if (copied != cudaSuccess) {
      (void)cudaFreeAsync(staged, stream);
      KVTIER_CUDA_RETURN_IF_ERROR(copied);
    }
    device_slots = staged;
  }
  Status status = Launch(pool, d, first_layer, direction, device_slots, slots.type, errors, stream);
  if (staged != nullptr) {
    const cudaError_t freed = cudaFreeAsync(staged, stream);
    if (status.ok()) KVTIER_CUDA_RETURN_IF_ERROR(freed);
  }
  return status;
}

namespace {

Status Launch(const KvRegion& pool, const DenseKv& d, int64_t first_layer, DenseDirection direction,
              const void* device_slots, IndexType index_type, unsigned long long* errors,
              CudaStream stream) {
  const int64_t tokens = d.batch * d.seq;

  const int64_t head_bytes = DenseHeadBytes(d);
  const bool has_table = pool.has_layer_table();
  const int64_t layer_stride = has_table ? 0 : pool.geometry.layer_stride();
  DensePagedView view;
  view.slot_addressing = SlotAddressing::Make(pool.geometry, has_table, 0);
  view.slots = device_slots;
  view.slots64 = index_type == IndexType::kInt64 ? 1 : 0;
  view.to_pool = direction == DenseDirection::kToPool ? 1 : 0;
  view.pool_head_stride = PoolHeadStride(pool, d);
  view.num_slots = pool.geometry.num_slots;
  view.errors = errors;
  view.seq = FastDivmod::Make(static_cast<uint32_t>(std::max<int64_t>(d.seq, 1)));

  // Rows in (buffer, layer) order; the width must suit every row of the request.
  struct Row {
    DenseRow row;
    const DenseTensor* tensor;
  };
  std::vector<Row> rows;
  bool contiguous = true;
  std::vector<uint64_t> alignment = {static_cast<uint64_t>(head_bytes),
                                     static_cast<uint64_t>(view.pool_head_stride),
                                     static_cast<uint64_t>(view.slot_addressing.page_stride),
                                     static_cast<uint64_t>(view.slot_addressing.token_stride)};
  for (int buffer = 0; buffer < pool.num_buffers(); ++buffer) {
    const std::span<const DenseTensor> tensors = buffer == 0 ? d.k : d.v;
    for (size_t i = 0; i < tensors.size(); ++i) {
      const int64_t layer = first_layer + static_cast<int64_t>(i);
      const DenseTensor& t = tensors[i];
      DenseRow r;
      r.pool = reinterpret_cast<char*>(pool.LayerBase(buffer, layer)) + layer * layer_stride;
      r.dense = static_cast<char*>(t.data);
      r.batch_stride = t.strides[0];
      r.head_stride = t.strides[1];
      r.seq_stride = t.strides[2];
      rows.push_back({r, &t});
      if (t.strides[3] != d.elem_bytes && d.head_dim > 1) contiguous = false;
      for (uint64_t v :
           {reinterpret_cast<uint64_t>(r.pool), reinterpret_cast<uint64_t>(r.dense),
            static_cast<uint64_t>(r.batch_stride), static_cast<uint64_t>(r.head_stride),
            static_cast<uint64_t>(r.seq_stride)}) {
        alignment.push_back(v);
      }
    }
  }
  // Contiguous head_dim everywhere: W-byte units along it. Otherwise one element per unit, each
  // row stepping by its own tensor's head_dim stride.
  int width;
  uint32_t units_per_head;
  if (contiguous) {
    width = std::min<int>(WidestDividing(alignment), 16);
    units_per_head = static_cast<uint32_t>(head_bytes / width);
    for (Row& r : rows) r.row.dim_stride = width;
  } else {
    alignment.push_back(static_cast<uint64_t>(d.elem_bytes));
    for (const Row& r : rows) alignment.push_back(static_cast<uint64_t>(r.tensor->strides[3]));
    if (WidestDividing(alignment) < d.elem_bytes) {
      return Status::InvalidArgument(
          "dense tensors with a strided head_dim must be aligned to their element size");
    }
    width = static_cast<int>(d.elem_bytes);
    units_per_head = static_cast<uint32_t>(d.head_dim);
    for (Row& r : rows) r.row.dim_stride = r.tensor->strides[3];
  }
  const uint64_t units_per_row = uint64_t{units_per_head} * static_cast<uint64_t>(d.heads);
  if (units_per_row > (uint64_t{1} << 31)) {
    return Status::InvalidArgument("a slot of more than 2^31 copy units is not supported");
  }
  view.units_per_head = FastDivmod::Make(units_per_head);
  view.units_per_row = FastDivmod::Make(static_cast<uint32_t>(units_per_row));
  // At most 2^31 positions per launch, so that a thread's 32-bit position never wraps.
  const uint64_t tokens_per_launch = std::max<uint64_t>(1, (uint64_t{1} << 31) / units_per_row);

  for (size_t first = 0; first < rows.size(); first += cuda::kDenseMaxRows) {
    const int n = static_cast<int>(std::min<size_t>(cuda::kDenseMaxRows, rows.size() - first));
    for (int i = 0; i < n; ++i) view.rows[i] = rows[first + i].row;
    for (uint64_t t0 = 0; t0 < static_cast<uint64_t>(tokens); t0 += tokens_per_launch) {
      const uint64_t count = std::min<uint64_t>(tokens_per_launch, tokens - t0);
      view.token_offset = static_cast<uint32_t>(t0);
      view.positions = static_cast<uint32_t>(count * units_per_row);
      KVTIER_CUDA_RETURN_IF_ERROR(cuda::LaunchDensePaged(view, width, n, stream));
    }
  }
  return Status::OK();
}

}  // namespace

Result<int64_t> TakeDensePagedErrorsOnGpu(int device) {
  cuda::DeviceGuard guard;
  KVTIER_RETURN_IF_ERROR(guard.Set(device));
  KVTIER_ASSIGN_OR_RETURN(unsigned long long* errors, ErrorCounter(device));
  KVTIER_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
  unsigned long long count = 0;
  KVTIER_CUDA_RETURN_IF_ERROR(cudaMemcpy(&count, errors, sizeof(count), cudaMemcpyDeviceToHost));
  KVTIER_CUDA_RETURN_IF_ERROR(cudaMemset(errors, 0, sizeof(count)));
  return static_cast<int64_t>(count);
}

}  // namespace kvtier::transfer
