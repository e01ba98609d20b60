// kvtier/layout.h — the KV layouts and their address math, in one place.
//
// Every backend (CPU, CUDA kernels, DMA) and every test reference computes byte offsets through
// `KvGeometry`, so the math of docs/architecture.md §2 exists exactly once. The struct is a plain
// aggregate usable from host and device code (`__host__ __device__` when compiled by nvcc) and is
// passed to kernels by value.
//
// Notation: L = num_layers, N = num_slots, S = slot_bytes, P = page_size, H = head_num,
// l = layer, i = slot index, p = i / P, o = i % P, h = head. Offsets are in bytes from the base of
// one buffer (K, V, or the single MLA buffer); K and V share a geometry.
//
//   layout              shape of one buffer      offset of (l, i[, h])
//   layer_first         [L, N, S]                l*N*S + i*S            (or layer_ptr[l] + i*S)
//   page_first          [N, L, S]                i*L*S + l*S
//   page_first_direct   [N/P, L, P, S]           p*L*P*S + l*P*S + o*S
//   page_head           [N/P, H, P, L, S/H]      p*H*P*L*(S/H) + h*P*L*(S/H) + o*L*(S/H) + l*(S/H)
//
// In every layout but page_head the S bytes of one (l, i) are contiguous, and head h of them
// starts at h*(S/H). In page_head each head's S/H bytes stand apart; a copy between a page_head
// buffer and any other is therefore done head by head ("head chunks" of S/H bytes).
//
// Thread safety: plain values; no shared state.
#pragma once

#include <cstdint>
#include <string_view>

#include "kvtier/status.h"

#if defined(__CUDACC__)
#define KVTIER_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define KVTIER_HOST_DEVICE inline
#endif

namespace kvtier {

enum class KvLayout : uint8_t {
  kLayerFirst = 0,
  kPageFirst = 1,
  kPageFirstDirect = 2,
  kPageHead = 3,
};
inline constexpr int kNumLayouts = static_cast<int>(KvLayout::kPageHead) + 1;

// Where the bytes of a buffer live.
enum class MemoryKind : uint8_t {
  kHost = 0,    // host memory (pinned or pageable); readable by the CPU
  kDevice = 1,  // CUDA device memory
};

// slot_bytes (and, for page_head, slot_bytes / head_num) must be a multiple of this: 4 bytes is
// the narrowest access of the CUDA copy kernels, and every real KV slot (bf16/fp8 heads of 64+
// elements) is a multiple of it. Regions (KvRegion::Validate) and pools (HostKvPoolConfig)
// check it.
inline constexpr int64_t kSlotBytesAlignment = 4;

// The page-size rule of every tier: a power of two in [1, kMaxKvPageSize] (a page is the unit the
// cache's tiers and storage move; the device page ledger and the page keys rely on it).
inline constexpr int64_t kMaxKvPageSize = 256;
// OK, or InvalidArgument "<name> = <page_size> must be a power of two in [1, 256]".
Status ValidatePageSize(int64_t page_size, std::string_view name = "page_size");

// Shape and layout of one KV buffer (K, V, or the MLA buffer).
struct KvGeometry {
  KvLayout layout = KvLayout::kLayerFirst;
  int64_t num_layers = 0;  // L
  int64_t num_slots = 0;   // N, a multiple of page_size
  int64_t slot_bytes = 0;  // S, bytes of one token in one layer
  int64_t page_size = 1;   // P
  int64_t head_num = 1;    // H; only page_head depends on it (S must be a multiple of H)

  KVTIER_HOST_DEVICE int64_t head_bytes() const { return slot_bytes / head_num; }
  KVTIER_HOST_DEVICE int64_t num_pages() const { return num_slots / page_size; }
  // Bytes of one whole buffer; every layout holds the same L*N*S bytes.
  KVTIER_HOST_DEVICE int64_t buffer_bytes() const { return num_layers * num_slots * slot_bytes; }
  // Bytes of one layer of one buffer when the layers are separate allocations (layer_first).
  KVTIER_HOST_DEVICE int64_t layer_bytes() const { return num_slots * slot_bytes; }

  // Offset of the first byte of (layer, slot). For page_head this is head 0's chunk.
  KVTIER_HOST_DEVICE int64_t SlotOffset(int64_t layer, int64_t slot) const {
    return HeadOffset(layer, slot, 0);
  }

  // Every layout is affine in (layer, head) once the slot is fixed:
  //   HeadOffset(l, i, h) = SlotBase(i) + l * layer_stride() + h * head_stride()
  // which lets copy loops walk layers and heads by addition. The table of the file comment is
  // this decomposition written out.
  KVTIER_HOST_DEVICE int64_t SlotBase(int64_t slot) const {
    const int64_t S = slot_bytes;
    switch (layout) {
      case KvLayout::kLayerFirst:
        return slot * S;
      case KvLayout::kPageFirst:
        return slot * num_layers * S;
      case KvLayout::kPageFirstDirect:
        return (slot / page_size) * num_layers * page_size * S + (slot % page_size) * S;
      case KvLayout::kPageHead:
      default:
        return (slot / page_size) * page_size * num_layers * S +
               (slot % page_size) * num_layers * (S / head_num);
    }
  }
  KVTIER_HOST_DEVICE int64_t layer_stride() const {
    switch (layout) {
      case KvLayout::kLayerFirst:
        return num_slots * slot_bytes;
      case KvLayout::kPageFirst:
        return slot_bytes;
      case KvLayout::kPageFirstDirect:
        return page_size * slot_bytes;
      case KvLayout::kPageHead:
      default:
        return slot_bytes / head_num;
    }
  }
  KVTIER_HOST_DEVICE int64_t head_stride() const {
    return layout == KvLayout::kPageHead ? page_size * num_layers * (slot_bytes / head_num)
                                         : slot_bytes / head_num;
  }

  // Offset of head `head`'s S/H bytes of (layer, slot); valid for every layout.
  KVTIER_HOST_DEVICE int64_t HeadOffset(int64_t layer, int64_t slot, int64_t head) const {
    return SlotBase(slot) + layer * layer_stride() + head * head_stride();
  }

  // Offset of (layer, slot) inside the allocation of one layer, for layer_first buffers given as
  // a per-layer pointer table: slot * S (+ head chunk).
  KVTIER_HOST_DEVICE int64_t OffsetInLayer(int64_t slot, int64_t head) const {
    return slot * slot_bytes + head * (slot_bytes / head_num);
  }

  // True when the S bytes of one (layer, slot) are contiguous (every layout but page_head).
  KVTIER_HOST_DEVICE bool slot_contiguous() const { return layout != KvLayout::kPageHead; }

  // A known layout; L, N, S, P, H positive; S a multiple of kSlotBytesAlignment; P divides N and
  // follows ValidatePageSize; page_head: H divides S into aligned heads; L*N*S fits int64_t.
  // InvalidArgument "<name>.<field> = <value> ..." otherwise.
  Status Validate(std::string_view name = "geometry") const;
};

// "layer_first", "page_first", "page_first_direct", "page_head".
const char* LayoutName(KvLayout layout);
const char* MemoryKindName(MemoryKind kind);
// Inverse of LayoutName; InvalidArgument naming the accepted spellings otherwise.
Result<KvLayout> ParseLayout(std::string_view name);

}  // namespace kvtier
