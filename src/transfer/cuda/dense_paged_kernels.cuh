// Internal: the dense <-> paged copy kernel (kvtier/dense_paged.h). Header-only, framework-free:
// raw pointers and one by-value DensePagedView, templated over the access width W only (16, 8,
// 4, 2 or 1 bytes); directions, layouts and index types are run-time values.
//
// Work decomposition: blockIdx.y picks one (layer, buffer) row of the request; the x blocks walk
// that row's flat space of (token, head, unit) positions, W-byte units fastest, so a warp reads
// and writes consecutive bytes of a head on both sides when head_dim is contiguous. Each thread
// issues kDenseUnroll loads before its first store. Positions are decoded with FastDivmod (32-bit:
// the launcher splits a request whose positions exceed 2^31 by tokens, so that positions plus
// the grid's stride stay below 2^32).
//
// A slot outside [0, num_slots) is skipped (never accessed) and counted once per token in
// `*errors` (by row 0 only).
#pragma once

#include <cstdint>

#include "transfer/cuda/access_vec.cuh"
#include "transfer/cuda/dense_paged_view.h"

namespace kvtier::transfer::cuda {

template <int W>
__global__ void __launch_bounds__(kDenseThreads) DensePagedKernel(const DensePagedView v) {
  using Vec = typename AccessVec<W>::Type;
  const DenseRow& row = v.rows[blockIdx.y];
  const uint32_t step = gridDim.x * blockDim.x * kDenseUnroll;
  for (uint32_t base = blockIdx.x * blockDim.x * kDenseUnroll + threadIdx.x; base < v.positions;
       base += step) {
    Vec value[kDenseUnroll];
    Vec* dst[kDenseUnroll];
#pragma unroll
    for (int u = 0; u < kDenseUnroll; ++u) {
      dst[u] = nullptr;
      const uint32_t i = base + u * blockDim.x;
      if (i >= v.positions) continue;
      uint32_t token, rest, head, unit;
      v.units_per_row.DivMod(i, &token, &rest);
      v.units_per_head.DivMod(rest, &head, &unit);
      token += v.token_offset;
      const int64_t slot = v.slots64 ? static_cast<const int64_t*>(v.slots)[token]
                                     : static_cast<const int32_t*>(v.slots)[token];
      if (slot < 0 || slot >= v.num_slots) {
        if (blockIdx.y == 0 && rest == 0) atomicAdd(v.errors, 1ULL);
        continue;
      }
      uint32_t b, t;
      v.seq.DivMod(token, &b, &t);
      char* pool = row.pool + v.slot_addressing.Offset(slot) + head * v.pool_head_stride +
                   static_cast<int64_t>(unit) * W;
      char* dense = row.dense + b * row.batch_stride + head * row.head_stride + t * row.seq_stride +
                    unit * row.dim_stride;
      const char* src = v.to_pool ? dense : pool;
      dst[u] = reinterpret_cast<Vec*>(v.to_pool ? pool : dense);
      value[u] = *reinterpret_cast<const Vec*>(src);
    }
#pragma unroll
    for (int u = 0; u < kDenseUnroll; ++u) {
      if (dst[u] != nullptr) *dst[u] = value[u];
    }
  }
}

}  // namespace kvtier::transfer::cuda
