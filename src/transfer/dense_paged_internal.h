// Internal: the pieces of CopyDensePaged (kvtier/dense_paged.h) shared by the CPU part
// (dense_paged.cc) and the CUDA part (cuda/dense_paged_gpu.cc).
//
// Thread safety: stateless (the device error counters are guarded inside the CUDA part).
#pragma once

#include <cstdint>

#include "kvtier/dense_paged.h"

namespace kvtier::transfer {

// Bytes of one head of one token: head_dim * elem_bytes.
inline int64_t DenseHeadBytes(const DenseKv& d) { return d.head_dim * d.elem_bytes; }

// Bytes between heads of one slot in the pool: the pool's head chunks for page_head, else the
// dense head size (heads are packed in a slot).
inline int64_t PoolHeadStride(const KvRegion& pool, const DenseKv& d) {
  return pool.geometry.layout == KvLayout::kPageHead ? pool.geometry.head_stride()
                                                     : DenseHeadBytes(d);
}

// The CUDA part. REQUIRES: a request CopyDensePaged validated, on the device.
Status CopyDensePagedOnGpu(const KvRegion& pool, SlotIndices slots, const DenseKv& dense,
                           int64_t first_layer, DenseDirection direction, CudaStream stream);
Result<int64_t> TakeDensePagedErrorsOnGpu(int device);

}  // namespace kvtier::transfer
