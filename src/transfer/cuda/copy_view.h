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

// The slot part of an address without 64-bit division (the kernel resolves it once per slot
// pair; a 64-bit `/` is a ~100-instruction routine on the GPU, and with the page_head and
// page_first_direct math it made MLA loads instruction-bound: measured with Nsight Compute on an
// H100, 9.8 M instead of 7.4 M warp instructions for the same bytes, 25-30 % slower):
//   offset of (first_layer, slot, head 0) = (slot / pages.divisor) * page_stride
//                                           + (slot % pages.divisor) * token_stride + layer0
// Every layout has this form: page-based layouts (page_first_direct, page_head) with the page
// size as divisor, the others with divisor 1. Built from KvGeometry's own SlotBase, so the
// layout math stays in one place (tests/transfer/copy_view_test.cc checks the identity).
struct SlotAddressing {
  FastDivmod pages;
  int64_t page_stride = 0;
  int64_t token_stride = 0;
  int64_t layer0 = 0;      // first_layer's offset (0 with per-layer tables)
  int32_t wide_slots = 0;  // 1: slot indices may exceed 32 bits, divide in 64 bits

  // `layer_table`: offsets within one layer's allocation (OffsetInLayer) instead.
  static SlotAddressing Make(const KvGeometry& g, bool layer_table, int64_t first_layer) {
    SlotAddressing a;
    const bool paged =
        !layer_table && (g.layout == KvLayout::kPageFirstDirect || g.layout == KvLayout::kPageHead);
    const int64_t p = paged ? g.page_size : 1;
    auto slot_base = [&](int64_t slot) {
      return layer_table ? g.OffsetInLayer(slot, 0) : g.SlotBase(slot);
    };
    a.pages = FastDivmod::Make(static_cast<uint32_t>(p));
    a.page_stride = slot_base(p) - slot_base(0);
    a.token_stride = p > 1 ? slot_base(1) - slot_base(0) : 0;
    a.layer0 = layer_table ? 0 : first_layer * g.layer_stride();
    a.wide_slots = g.num_slots > int64_t{0xffffffff} ? 1 : 0;
    return a;
  }
  // REQUIRES: 0 <= slot < num_slots of the geometry it was made from.
  KVTIER_HOST_DEVICE int64_t Offset(int64_t slot) const {
    int64_t page, token;
    if (wide_slots != 0) {
      page = slot / pages.divisor;
      token = slot - page * pages.divisor;
    } else {
      uint32_t q, r;
      pages.DivMod(static_cast<uint32_t>(slot), &q, &r);
      page = q;
      token = r;
    }
    return page * page_stride + token * token_stride + layer0;
  }
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
  int64_t first_layer;             // request layer 0 is this layer of the region
  SlotAddressing slot_addressing;  // offset of (first_layer, slot, head 0), or within a layer
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
  // 1: each warp resolves its tile's chunks once, one chunk per lane, and shares the addresses
  // by shuffle (register kernel; set when a tile spans 2..32 chunks, see kernel_engine.cc).
  int32_t cooperative;
  int64_t position_base;  // k of this launch's first pair in the request (for messages)
  FastDivmod div_heads, div_count, div_layers, div_vecs;
  // Per-lane walk through the flattened (chunk, vector) space: every lane advances by 32 vectors
  // between its loads and by `grid_stride` vectors between tiles, precomputed as (chunks, vecs).
  uint32_t step32_chunks, step32_vecs;
  uint32_t grid_chunks, grid_vecs;
  DeviceErrorRecord* error;
};

}  // namespace kvtier::transfer::cuda
