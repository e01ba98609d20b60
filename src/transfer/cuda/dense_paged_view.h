// Internal: the by-value view of one dense <-> paged kernel launch (dense_paged_kernels.cuh),
// shared by the launcher and the host code that fills it. Plain data, host- and device-usable.
#pragma once

#include <cstdint>

#include "transfer/cuda/copy_view.h"

namespace kvtier::transfer::cuda {

inline constexpr int kDenseThreads = 256;
inline constexpr int kDenseUnroll = 4;
// Rows (layer x buffer) of one launch: the view travels as a kernel parameter (< 4 KiB).
inline constexpr int kDenseMaxRows = 64;

// One (layer, buffer) of the request.
struct DenseRow {
  char* pool = nullptr;   // the layer's base in the pool: + slot_addressing.Offset(slot) + head *
                          // pool_head_stride
  char* dense = nullptr;  // element (0, 0, 0, 0) of the dense tensor
  int64_t batch_stride = 0, head_stride = 0, seq_stride = 0;  // dense, bytes
  int64_t dim_stride = 0;  // dense: bytes between consecutive W-byte units of head_dim
};

struct DensePagedView {
  DenseRow rows[kDenseMaxRows];    // [gridDim.y]
  SlotAddressing slot_addressing;  // slot -> offset of (layer, slot, head 0) from row.pool
  const void* slots = nullptr;     // [batch * seq] int32 / int64, device memory
  int32_t slots64 = 1;
  int32_t to_pool = 0;           // 1: dense -> pool; 0: pool -> dense
  int64_t pool_head_stride = 0;  // bytes between heads of one slot in the pool
  int64_t num_slots = 0;
  uint32_t token_offset = 0;  // first token of this launch
  uint32_t positions = 0;     // tokens of this launch x units_per_row, <= 2^31
  FastDivmod units_per_row;   // heads x units_per_head
  FastDivmod units_per_head;
  FastDivmod seq;  // token -> (b, t)
  unsigned long long* errors = nullptr;
};

// Kernel parameters are limited to 4 KiB on every architecture this builds for.
static_assert(sizeof(DensePagedView) <= 4096, "the view must fit the kernel parameter space");

}  // namespace kvtier::transfer::cuda
