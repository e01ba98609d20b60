// kvtier/dense_paged.h — copies between an engine's dense per-layer K/V tensors and pool slots.
//
// Frameworks such as Hugging Face transformers keep a request's KV dense, one tensor per layer
// and buffer, shaped [batch, heads, seq, head_dim] with any strides; kvtier's pools keep it in
// slots (kvtier/layout.h). `CopyDensePaged` moves every layer of a request between the two in one
// call: token (b, t) of the dense side is slot `slots[b * seq + t]` of the pool, and its `heads`
// heads of head_dim elements are the slot's bytes in head order (for a page_head pool, head h is
// the pool's head chunk h, so heads must equal the pool's head_num). A copy is a byte copy in
// units of `elem_bytes` (bf16, fp16, fp8, fp32 ... alike); vectors of up to 16 bytes are used
// where head_dim is contiguous and every address and stride is aligned to them.
//
// MHA pools move K and V; MLA pools (one buffer) move `k` only (heads is then usually 1 and
// head_dim the latent width).
//
// Backends: both sides in host memory run on the CPU (synchronous); both on one CUDA device run a
// kernel enqueued on `stream` (the grid spans tokens and layers). Device slot lists are checked in
// the kernel: a slot outside the pool is skipped (never accessed) and counted; the count is read
// and reset by `TakeDensePagedErrors`.
//
// Thread safety: stateless; requests that write the same bytes must not run at once.
#pragma once

#include <array>
#include <cstdint>
#include <span>

#include "kvtier/status.h"
#include "kvtier/transfer.h"

namespace kvtier {

// One layer's dense K or V tensor: element (b, h, t, d) is at
// data + b*strides[0] + h*strides[1] + t*strides[2] + d*strides[3] bytes. Strides are in bytes,
// non-negative (a stride may be anything for a dimension of size 1).
struct DenseTensor {
  void* data = nullptr;
  std::array<int64_t, 4> strides{};  // [batch, heads, seq, head_dim], bytes
};

// The dense side of a copy: the same shape for every layer and buffer.
struct DenseKv {
  int64_t batch = 0;
  int64_t heads = 0;
  int64_t seq = 0;
  int64_t head_dim = 0;
  int64_t elem_bytes = 0;  // 1, 2, 4 or 8
  MemoryKind memory = MemoryKind::kHost;
  int device = -1;  // CUDA device ordinal when memory == kDevice
  // layers[i] is pool layer first_layer + i. MLA: v of every layer is unused (null).
  std::span<const DenseTensor> k;
  std::span<const DenseTensor> v;
};

enum class DenseDirection : uint8_t {
  kToPool = 0,    // scatter: dense -> pool slots
  kFromPool = 1,  // gather: pool slots -> dense
};

// Copies layers [first_layer, first_layer + dense.k.size()) of the request between `pool` and
// `dense` in `direction`. `slots` holds batch * seq slot indices (host or device memory; device
// only with a device pool). REQUIRES: destination slots / elements distinct.
// InvalidArgument, naming the argument, for a shape that does not fit the pool (heads * head_dim *
// elem_bytes != slot_bytes, layers out of range, ...), host slots out of range, or memories that
// do not agree; Unavailable for device memory without CUDA. The tensors' extents are the
// caller's to vouch for (the Python layer checks them).
Status CopyDensePaged(const KvRegion& pool, SlotIndices slots, const DenseKv& dense,
                      int64_t first_layer, DenseDirection direction, CudaStream stream = nullptr);

// Device slots the kernels skipped on `device` since the last call (0 without CUDA). Waits for
// the device's work so far.
Result<int64_t> TakeDensePagedErrors(int device);

}  // namespace kvtier
