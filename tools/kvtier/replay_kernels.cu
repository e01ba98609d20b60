// Pattern kernels of `kvtier replay` on a GPU (see replay_kernels.h).
#include <cuda_runtime.h>

#include "replay_kernels.h"

namespace kvtier::tools {
namespace {

constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ull;

__device__ __forceinline__ uint64_t Mix(uint64_t x) {
  x ^= x >> 30;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 27;
  x *= 0x94D049BB133111EBull;
  x ^= x >> 31;
  return x;
}

// Word w (4 bytes) of the pattern of (hash, layer, buffer).
__device__ __forceinline__ uint32_t PatternWord(uint64_t hash, int64_t layer, int buffer,
                                                int64_t w) {
  const uint64_t state = Mix(hash ^ Mix(static_cast<uint64_t>(layer) * 2 + buffer + 1));
  const uint64_t v = Mix(state + static_cast<uint64_t>(w / 2 + 1) * kGolden);
  return (w & 1) == 0 ? static_cast<uint32_t>(v) : static_cast<uint32_t>(v >> 32);
}

// One thread per (slot i, buffer b, word w) of one layer, grid-stride.
template <bool kVerify>
__global__ void PatternKernel(DevicePoolView pool, const int64_t* slots, const uint64_t* hashes,
                              int64_t count, int64_t layer, unsigned long long* wrong_bytes,
                              unsigned long long* first_wrong) {
  const int buffers = pool.v == nullptr ? 1 : 2;
  const int64_t words = pool.slot_bytes / 4;
  const int64_t total = count * buffers * words;
  unsigned long long wrong = 0;
  for (int64_t t = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; t < total;
       t += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t w = t % words;
    const int b = static_cast<int>((t / words) % buffers);
    const int64_t i = t / (words * buffers);
    const int64_t slot = slots[i];
    if (slot < 0 || slot >= pool.num_slots) {  // never reached with the cache's slots
      if (kVerify) wrong += 4;
      continue;
    }
    unsigned char* base = b == 0 ? pool.k : pool.v;
    uint32_t* at = reinterpret_cast<uint32_t*>(
        base + (layer * pool.num_slots + slot) * pool.slot_bytes + w * 4);
    const uint32_t want = PatternWord(hashes[i], layer, b, w);
    if (!kVerify) {
      *at = want;
      continue;
    }
    const uint32_t diff = *at ^ want;
    if (diff != 0) {
      int n = 0;
      for (int k = 0; k < 4; ++k) n += ((diff >> (8 * k)) & 0xFF) != 0;
      wrong += n;
      int first = 0;
      while (((diff >> (8 * first)) & 0xFF) == 0) ++first;
      atomicMin(first_wrong, static_cast<unsigned long long>((i * buffers + b) * pool.slot_bytes +
                                                             w * 4 + first));
    }
  }
  if (kVerify && wrong != 0) atomicAdd(wrong_bytes, wrong);
}

int Launch(bool verify, const DevicePoolView& pool, const int64_t* slots, const uint64_t* hashes,
           int64_t count, int64_t layer, unsigned long long* wrong_bytes,
           unsigned long long* first_wrong, cudaStream_t stream) {
  if (count <= 0) return 0;
  const int buffers = pool.v == nullptr ? 1 : 2;
  const int64_t total = count * buffers * (pool.slot_bytes / 4);
  const int threads = 256;
  const int64_t blocks = (total + threads - 1) / threads;
  const int grid = static_cast<int>(blocks < 4096 ? blocks : 4096);
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
