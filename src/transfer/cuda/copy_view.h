// Internal: the plain, by-value description of one copy kernel launch (host and device code).
//
// A request is cut into "chunks": one chunk is the bytes of one (buffer b, slot pair k, layer l,
// head h), contiguous on both sides (S bytes, or S/H for page_head pairs). Chunks are numbered
// 0 .. num_chunks-1 in `order`, chosen so that consecutive chunks are adjacent in the host-side
// layout; every chunk is copied as `vecs_per_chunk` accesses of the kernel's width W.
//
// Thread safety: plain values.
#pragma once

#include <cstdint>

#include "kvtier/layout.h"

namespace kvtier::transfer::cuda {

// q = n / d and r = n % d for 32-bit n by multiply-high and shift (Granlund–Montgomery), so the
// kernels divide by run-time shapes without the slow integer divide.
struct FastDivmod {
  uint32_t divisor = 1;
  uint32_t multiplier = 1;
  uint32_t shift = 0;

  // REQUIRES: 1 <= d <= 2^31.
  static FastDivmod Make(uint32_t d) {
    FastDivmod f;
    f.divisor = d;
    uint32_t l = 0;
    while ((uint64_t{1} << l) < d) ++l;
    f.shift = l;
    f.multiplier = static_cast<uint32_t>(((uint64_t{1} << 32) * ((uint64_t{1} << l) - d)) / d + 1);
    return f;
  }
  KVTIER_HOST_DEVICE uint32_t Div(uint32_t n) const {
#if defined(__CUDA_ARCH__)
    const uint64_t hi = __umulhi(n, multiplier);
#else
    const uint64_t hi = (static_cast<uint64_t>(n) * multiplier) >> 32;
#endif
    return static_cast<uint32_t>((hi + n) >> shift);
  }
  KVTIER_HOST_DEVICE void DivMod(uint32_t n, uint32_t* q, uint32_t* r) const {
    *q = Div(n);
    *r = n - *q * divisor;
  }
};

// Chunk numbering. Fastest-varying index last.
enum class ChunkOrder : int32_t {
  kLayerSlotHead =
      0,  // (b, l, k, h): runs of slots within a layer (layer_first, page_first_direct)
  kSlotLayerHead = 1,  // (b, k, l, h): all layers of a slot (page_first)
  kSlotHeadLayer = 2,  // (b, k, h, l): all layers of a head of a slot (page_head)
};

// Out-of-range device indices found by the kernels. One per engine, in device memory.
struct DeviceErrorRecord {
  unsigned long long count;  // slot pairs skipped since the engine was created (monotonic)
  int claimed;               // 0: the fields below are free to be filled by the next error
  int side;                  // 0 = src_slots, 1 = dst_slots
  long long position;        // k of the bad pair within the launch's index list
  long long value;           // the bad index
  long long limit;           // num_slots of that side
};

// One side of the copy.
struct RegionView {
  KvGeometry geometry;  // head_num = the request's head chunks per slot (see CopyView::heads)
  // Buffer bases: [0] K or the MLA buffer, [1] V. Each laid out per `geometry.layout`, e.g.
  // layer_first [L, N, S], page_first [N, L, S], page_first_direct [N/P, L, P, S],
  // page_head [N/P, H, P, L, S/H]. Null when `layer_table` is set.
  std::byte* base[2];
  // layer_first with separate layer allocations: device array [num_buffers * L] of layer bases
  // (K layers 0..L-1, then V layers), each [N, S]. Null otherwise.
  std::byte* const* layer_table;
  int64_t first_layer;   // request layer 0 is this layer of the region
  int64_t head_stride;   // bytes from head chunk h to h + 1 of one (layer, slot): S/H, or P*L*(S/H)
                         // on a page_head side
  int64_t layer_stride;  // bytes from layer l to l + 1 of one slot (every layout is linear in the
                         // layer for a fixed slot: N*S, S, P*S, S/H); unused with layer_table
  const void* slots;     // [count] slot indices in device memory, int32 or int64
  int32_t slots_int64;   // 1: int64, 0: int32
  int32_t pad_;
};

struct CopyView {
  RegionView src;
  RegionView dst;
  uint32_t count;           // slot pairs in this launch
  uint32_t num_layers;      // layers in this launch
  uint32_t num_buffers;     // 2 (K, V) or 1 (MLA)
  uint32_t heads;           // chunks per slot: page_head's head_num when either side is page_head
  uint32_t num_chunks;      // num_buffers * count * num_layers * heads  (< 2^31)
  uint32_t vecs_per_chunk;  // chunk bytes / W
  ChunkOrder order;
  int32_t report_errors;  // 1: count bad pairs (only one launch of a per-layer split does)
  int64_t position_base;  // k of this launch's first pair in the request (for messages)
  FastDivmod div_heads, div_count, div_layers, div_vecs;
  // Per-lane walk through the flattened (chunk, vector) space: every lane advances by 32 vectors
  // between its loads and by `grid_stride` vectors between tiles, precomputed as (chunks, vecs).
  uint32_t step32_chunks, step32_vecs;
  uint32_t grid_chunks, grid_vecs;
  DeviceErrorRecord* error;
};

}  // namespace kvtier::transfer::cuda
