// Internal: the copy kernel of the `kernel` transfer backend. Header-only, framework-free:
// raw pointers and one by-value CopyView (copy_view.h), templated over the access width W
// (16, 8 or 4 bytes) only. Layouts, MHA/MLA, index types and directions are run-time values of
// the view, resolved through KvGeometry's address math, so one instantiation per width serves
// every layout pair and the whole file compiles in seconds.
//
// Work decomposition (predict: PCIe-bound, so the design maximises bytes in flight per SM):
//   - The request is a flat space of (chunk, vector) positions, chunks numbered in an order that
//     follows the host-side layout (CopyView::order) so neighbouring lanes and warps touch
//     neighbouring bytes: a warp's 32 lanes read 32 consecutive W-byte vectors (512 B at W = 16),
//     and contiguous runs of chunks (a page of one layer, all layers of a slot, ...) are walked
//     in address order as one stream.
//   - A persistent grid of at most `max_sms` blocks of 1024 threads; each warp takes tiles of
//     32 x kLoadsInFlight vectors. Every lane issues all kLoadsInFlight loads of a tile before the
//     first store (64 B in flight per lane, 64 KiB per SM at W = 16), which is what keeps PCIe
//     reads (non-posted, ~1-2 us round trip) saturated with few SMs.
//   - Positions advance by additions only. A lane decodes a chunk number with fast divmods once
//     per chunk; the slot pair's index loads, bounds check and KvGeometry math run once per pair
//     (PairCache), and each (layer, head) chunk of the pair is two multiply-adds away.
//   - Out-of-range indices: the chunk is skipped (no access) and, once per bad slot pair, counted
//     in the engine's DeviceErrorRecord; the host turns that into a Status in Synchronize.
//   - The loaded vectors are held in registers (kLoadsInFlight per thread; the 64-register cap
//     of 1024-thread blocks bounds it).
//   - Loads and stores use the streaming cache hints (ld.global.cs / st.global.cs): the KV bytes
//     are touched once and should not evict the forward pass's working set from L2.
#pragma once

#include <cstdint>

#include "transfer/cuda/access_vec.cuh"
#include "transfer/cuda/copy_view.h"

namespace kvtier::transfer::cuda {

inline constexpr int kCopyThreads = 1024;
inline constexpr int kLoadsInFlight = 4;  // W-byte loads per thread

__device__ __forceinline__ int64_t LoadSlotIndex(const void* slots, uint32_t k, int32_t is64) {
  return is64 ? static_cast<const int64_t*>(slots)[k]
              : static_cast<int64_t>(static_cast<const int32_t*>(slots)[k]);
}

// The part of a chunk's address that depends on the slot only: with base pointers, the address
// of (first_layer, slot, head 0); with a per-layer table, the offset of the slot in its layer.
// No 64-bit division (SlotAddressing).
__device__ __forceinline__ uintptr_t SlotBase(const RegionView& r, uint32_t b, int64_t slot) {
  const auto offset = static_cast<uintptr_t>(r.slot_addressing.Offset(slot));
  if (r.layer_table != nullptr) return offset;
  return reinterpret_cast<uintptr_t>(r.base[b]) + offset;
}

// Address of head `h` of layer `l` (relative to first_layer) of a slot whose SlotBase is `base`:
// every layout is linear in the layer and the head for a fixed slot (RegionView::layer_stride,
// head_stride), except that per-layer tables are looked up.
__device__ __forceinline__ char* ChunkAddress(const RegionView& r, uint32_t b, uint32_t l,
                                              uint32_t h, uintptr_t base) {
  if (r.layer_table != nullptr) {
    return reinterpret_cast<char*>(r.layer_table[b * r.geometry.num_layers + r.first_layer + l]) +
           base + h * r.head_stride;
  }
  return reinterpret_cast<char*>(base + l * r.layer_stride + h * r.head_stride);
}

// Chunk number -> (buffer, slot pair, layer, head) in the launch's order.
__device__ __forceinline__ void DecodeChunk(const CopyView& v, uint32_t c, uint32_t* b, uint32_t* k,
                                            uint32_t* l, uint32_t* h) {
  uint32_t t;
  switch (v.order) {
    case ChunkOrder::kLayerSlotHead:
      v.div_heads.DivMod(c, &t, h);
      v.div_count.DivMod(t, &t, k);
      v.div_layers.DivMod(t, b, l);
      break;
    case ChunkOrder::kSlotLayerHead:
      v.div_heads.DivMod(c, &t, h);
      v.div_layers.DivMod(t, &t, l);
      v.div_count.DivMod(t, b, k);
      break;
    case ChunkOrder::kSlotHeadLayer:
    default:
      v.div_layers.DivMod(c, &t, l);
      v.div_heads.DivMod(t, &t, h);
      v.div_count.DivMod(t, b, k);
      break;
  }
}

// Per-lane cache of the last resolved slot pair (buffer b, pair k): its indices are loaded,
// bounds-checked and turned into per-side slot bases once; every chunk of the pair (any layer,
// any head) then costs a few multiply-adds. In page_head-led orders a pair has H x L chunks in a
// row, so the layout math runs once per 256 chunks instead of per chunk (measured: MHA page_head
// backups were instruction-bound on the per-chunk resolve).
struct PairCache {
  uint32_t key = 0xffffffffu;  // b * count + k
  bool ok = false;             // the pair's indices are in range
  uintptr_t src = 0;           // SlotBase of each side
  uintptr_t dst = 0;
};

// Source and destination address of chunk `c`, or null pointers when its slot pair is out of
// range. `first_vec`: the lane is at vector 0 of the chunk (exactly one lane per chunk is), which
// is where a bad pair is counted.
__device__ __forceinline__ void ResolveChunk(const CopyView& v, uint32_t c, bool first_vec,
                                             PairCache* cache, const char** src, char** dst) {
  uint32_t b, k, l, h;
  DecodeChunk(v, c, &b, &k, &l, &h);
  const uint32_t key = b * v.count + k;
  if (key != cache->key) {
    cache->key = key;
    const int64_t s = LoadSlotIndex(v.src.slots, k, v.src.slots_int64);
    const int64_t d = LoadSlotIndex(v.dst.slots, k, v.dst.slots_int64);
    const bool s_bad = s < 0 || s >= v.src.geometry.num_slots;
    const bool d_bad = d < 0 || d >= v.dst.geometry.num_slots;
    cache->ok = !s_bad && !d_bad;
    if (cache->ok) {
      cache->src = SlotBase(v.src, b, s);
      cache->dst = SlotBase(v.dst, b, d);
    } else if (v.report_errors && first_vec && b == 0 && l == 0 && h == 0) {
      DeviceErrorRecord* e = v.error;
      atomicAdd(&e->count, 1ull);
      if (atomicCAS(&e->claimed, 0, 1) == 0) {
        e->side = s_bad ? 0 : 1;
        e->position = v.position_base + k;
        e->value = s_bad ? s : d;
        e->limit = s_bad ? v.src.geometry.num_slots : v.dst.geometry.num_slots;
        __threadfence_system();
      }
    }
  }
  // A bad pair is counted exactly once: by the lane at vector 0 of its chunk (b=0, l=0, h=0).
  // That lane cannot have the pair cached already, since in every order chunk (b, k, 0, 0) is the
  // first chunk of pair (b, k) and a lane visits chunks in increasing order.
  if (!cache->ok) {
    *src = nullptr;
    *dst = nullptr;
    return;
  }
  *src = ChunkAddress(v.src, b, l, h, cache->src);
  *dst = ChunkAddress(v.dst, b, l, h, cache->dst);
}

template <int W>
__global__ void __launch_bounds__(kCopyThreads, 1) CopyChunksKernel(const CopyView v) {
  using Vec = typename AccessVec<W>::Type;
  constexpr int R = kLoadsInFlight;
  constexpr unsigned kAllLanes = 0xffffffffu;
  const uint32_t lane = threadIdx.x & 31u;
  const uint64_t warp = (static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32u;
  const uint64_t start = warp * (32u * R) + lane;
  const uint64_t start_chunk = start / v.vecs_per_chunk;
  // Every lane of a warp stays in the loop until lane 0 (the tile's first position) is past the
  // end, so that the cooperative path's shuffles always see the whole warp; positions past the
  // end are skipped below.
  uint32_t c = static_cast<uint32_t>(start_chunk < v.num_chunks ? start_chunk : v.num_chunks);
  uint32_t e = static_cast<uint32_t>(start - start_chunk * v.vecs_per_chunk);

  uint32_t cached = 0xffffffffu;
  const char* chunk_src = nullptr;
  char* chunk_dst = nullptr;
  PairCache pairs;
  while (true) {
    const uint32_t c_first = __shfl_sync(kAllLanes, c, 0);
    if (c_first >= v.num_chunks) break;
    const Vec* from[R];
    Vec* to[R];
    uint32_t pc = c, pe = e;
    if (v.cooperative != 0) {
      // The tile's chunks c_first .. c_first + n - 1 are resolved once, chunk c_first + j by lane
      // j, and each lane takes its chunks' addresses from their lanes by shuffle: one resolve
      // pass per tile instead of one per load step that crosses a chunk boundary.
      const uint32_t e_first = __shfl_sync(kAllLanes, e, 0);
      const uint32_t n = 1u + v.div_vecs.Div(e_first + 32u * R - 1u);
      const uint32_t mine = c_first + lane;
      const char* my_src = nullptr;
      char* my_dst = nullptr;
      if (lane < n && mine < v.num_chunks) {
        // Vector 0 of chunk `mine` lies in this tile unless it is the tile's first chunk entered
        // part-way: exactly one (tile, lane) owns it, which keeps bad pairs counted once.
        ResolveChunk(v, mine, lane > 0 || e_first == 0, &pairs, &my_src, &my_dst);
      }
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const uint32_t from_lane = (pc - c_first) & 31u;
        const auto s = static_cast<uintptr_t>(
            __shfl_sync(kAllLanes, reinterpret_cast<unsigned long long>(my_src), from_lane));
        const auto d = static_cast<uintptr_t>(
            __shfl_sync(kAllLanes, reinterpret_cast<unsigned long long>(my_dst), from_lane));
        from[r] = nullptr;
        to[r] = nullptr;
        if (pc < v.num_chunks && s != 0) {
          from[r] = reinterpret_cast<const Vec*>(s + static_cast<uint64_t>(pe) * W);
          to[r] = reinterpret_cast<Vec*>(d + static_cast<uint64_t>(pe) * W);
        }
        pe += v.step32_vecs;
        pc += v.step32_chunks;
        if (pe >= v.vecs_per_chunk) {
          pe -= v.vecs_per_chunk;
          ++pc;
        }
      }
    } else {
#pragma unroll
      for (int r = 0; r < R; ++r) {
        from[r] = nullptr;
        to[r] = nullptr;
        if (pc < v.num_chunks) {
          if (pc != cached) {
            cached = pc;
            ResolveChunk(v, pc, pe == 0, &pairs, &chunk_src, &chunk_dst);
          }
          if (chunk_src != nullptr) {
            from[r] = reinterpret_cast<const Vec*>(chunk_src + static_cast<uint64_t>(pe) * W);
            to[r] = reinterpret_cast<Vec*>(chunk_dst + static_cast<uint64_t>(pe) * W);
          }
        }
        pe += v.step32_vecs;
        pc += v.step32_chunks;
        if (pe >= v.vecs_per_chunk) {
          pe -= v.vecs_per_chunk;
          ++pc;
        }
      }
    }
    Vec val[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
      if (from[r] != nullptr) val[r] = __ldcs(from[r]);
    }
#pragma unroll
    for (int r = 0; r < R; ++r) {
      if (to[r] != nullptr) __stcs(to[r], val[r]);
    }
    e += v.grid_vecs;
    c += v.grid_chunks;
    if (e >= v.vecs_per_chunk) {
      e -= v.vecs_per_chunk;
      ++c;
    }
    if (c > v.num_chunks) c = v.num_chunks;  // no wrap-around past 2^32 on the last tiles
  }
}

}  // namespace kvtier::transfer::cuda
