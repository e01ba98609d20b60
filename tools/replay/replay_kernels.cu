// Pattern kernels of `kvtier replay` on a GPU (see replay_kernels.h).
#include <cuda_runtime.h>

#include "kvtier/testing/kv_pattern_value.h"
#include "replay_kernels.h"

namespace kvtier::tools {
namespace {

// Wrong bytes of `got` against `want` (4 bytes), and the first wrong byte's index.
__device__ __forceinline__ int WrongBytes(uint32_t got, uint32_t want, int* first) {
  const uint32_t diff = got ^ want;
  int n = 0;
  *first = 4;
  for (int k = 3; k >= 0; --k) {
    if (((diff >> (8 * k)) & 0xFF) != 0) {
      ++n;
      *first = k;
    }
  }
  return n;
}

// One block per (slot i, buffer b) of one layer (grid-stride over them); its threads take the
// slot's words two at a time (one 64-bit pattern value each), so the state and the index
// arithmetic are paid once per slot and buffer, not per word: the kernels run at memory speed,
// and the pattern work they add to a prefill stays far below the GEMMs it sits between.
template <bool kVerify>
__global__ void PatternKernel(DevicePoolView pool, const int64_t* slots, const uint64_t* hashes,
                              int64_t count, int64_t layer, unsigned long long* wrong_bytes,
                              unsigned long long* first_wrong) {
  const int buffers = pool.v == nullptr ? 1 : 2;
  const int64_t words = pool.slot_bytes / 4;
  const int64_t pairs = words / 2;
  const bool aligned = pool.slot_bytes % 8 == 0;
  unsigned long long wrong = 0;
  for (int64_t unit = blockIdx.x; unit < count * buffers; unit += gridDim.x) {
    const int64_t i = unit / buffers;
    const int b = static_cast<int>(unit % buffers);
    const int64_t slot = slots[i];
    if (slot < 0 || slot >= pool.num_slots) {  // never reached with the cache's slots
      if (kVerify && threadIdx.x == 0) wrong += static_cast<unsigned long long>(pool.slot_bytes);
      continue;
    }
    unsigned char* base =
        (b == 0 ? pool.k : pool.v) + (layer * pool.num_slots + slot) * pool.slot_bytes;
    const uint64_t state = KvPatternState(hashes[i], layer, b);
    const unsigned long long unit_byte = static_cast<unsigned long long>(unit) * pool.slot_bytes;
    // Words 2p and 2p + 1, then the odd last word (a slot of an odd number of words).
    for (int64_t p = threadIdx.x; p <= pairs; p += blockDim.x) {
      if (p == pairs && words % 2 == 0) break;
      const uint64_t v = KvPatternValue(state, p);
      const uint32_t lo = static_cast<uint32_t>(v), hi = static_cast<uint32_t>(v >> 32);
      uint32_t* at = reinterpret_cast<uint32_t*>(base) + 2 * p;
      const bool two = p < pairs;
      if (!kVerify) {
        if (two && aligned) {
          *reinterpret_cast<uint2*>(at) = make_uint2(lo, hi);
        } else {
          at[0] = lo;
          if (two) at[1] = hi;
        }
        continue;
      }
      uint32_t got_lo, got_hi = hi;
      if (two && aligned) {
        const uint2 got = *reinterpret_cast<const uint2*>(at);
        got_lo = got.x;
        got_hi = got.y;
      } else {
        got_lo = at[0];
        if (two) got_hi = at[1];
      }
      int first = 4;
      const int n_lo = WrongBytes(got_lo, lo, &first);
      if (n_lo > 0) {
        wrong += n_lo;
        atomicMin(first_wrong, unit_byte + static_cast<unsigned long long>(8 * p + first));
      }
      const int n_hi = WrongBytes(got_hi, hi, &first);
      if (n_hi > 0) {
        wrong += n_hi;
        atomicMin(first_wrong, unit_byte + static_cast<unsigned long long>(8 * p + 4 + first));
      }
    }
  }
  if (kVerify && wrong != 0) atomicAdd(wrong_bytes, wrong);
}

int Launch(bool verify, const DevicePoolView& pool, const int64_t* slots, const uint64_t* hashes,
           int64_t count, int64_t layer, unsigned long long* wrong_bytes,
           unsigned long long* first_wrong, cudaStream_t stream) {
  if (count <= 0) return 0;
  const int buffers = pool.v == nullptr ? 1 : 2;
  const int64_t units = count * buffers;  // one block per (slot, buffer), grid-stride
  const int64_t pairs = pool.slot_bytes / 8 + 1;
  const int threads = pairs >= 256 ? 256 : pairs >= 128 ? 128 : 64;
  const int grid = static_cast<int>(units < 16384 ? units : 16384);
  if (verify) {
    PatternKernel<true>
        <<<grid, threads, 0, stream>>>(pool, slots, hashes, count, layer, wrong_bytes, first_wrong);
  } else {
    PatternKernel<false>
        <<<grid, threads, 0, stream>>>(pool, slots, hashes, count, layer, nullptr, nullptr);
  }
  return static_cast<int>(cudaGetLastError());
}

}  // namespace

int LaunchFillPattern(const DevicePoolView& pool, const int64_t* slots, const uint64_t* hashes,
                      int64_t count, int64_t layer, CUstream_st* stream) {
  return Launch(false, pool, slots, hashes, count, layer, nullptr, nullptr, stream);
}

int LaunchVerifyPattern(const DevicePoolView& pool, const int64_t* slots, const uint64_t* hashes,
                        int64_t count, int64_t layer, unsigned long long* wrong_bytes,
                        unsigned long long* first_wrong, CUstream_st* stream) {
  return Launch(true, pool, slots, hashes, count, layer, wrong_bytes, first_wrong, stream);
}

}  // namespace kvtier::tools
