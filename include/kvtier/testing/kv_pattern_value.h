// kvtier/testing/kv_pattern_value.h — the bytes of the KV pattern (kvtier/testing/kv_pattern.h)
// as one function for host and device code: FillKvPattern / VerifyKvPattern on the host and the
// replay's GPU kernels (tools/replay/replay_kernels.cu) both compute them here, so the two cannot
// drift apart.
//
// The slot_bytes bytes of (token hash h, layer l, buffer b) are the little-endian 64-bit values
//   KvPatternValue(KvPatternState(h, l, b), i)   i = 0, 1, ...   (bytes [8i, 8i + 8))
// with the last value cut to the slot's length. The state is split out so that a loop over one
// slot computes it once.
//
// Header-only, <cstdint> only (nvcc includes it). Thread safety: pure functions.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define KVTIER_PATTERN_FN __host__ __device__ __forceinline__
#else
#define KVTIER_PATTERN_FN inline
#endif

namespace kvtier {

// splitmix64's finaliser.
KVTIER_PATTERN_FN uint64_t KvPatternMix(uint64_t x) {
  x ^= x >> 30;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 27;
  x *= 0x94D049BB133111EBull;
  x ^= x >> 31;
  return x;
}

// The state of (token hash, layer, buffer): buffer 0 is K (or the MLA buffer), 1 is V.
KVTIER_PATTERN_FN uint64_t KvPatternState(uint64_t hash, int64_t layer, int buffer) {
  return KvPatternMix(hash ^ KvPatternMix(static_cast<uint64_t>(layer) * 2 + buffer + 1));
}

// The 64-bit value holding bytes [8i, 8i + 8) of the slot whose state is `state`.
KVTIER_PATTERN_FN uint64_t KvPatternValue(uint64_t state, int64_t i) {
  return KvPatternMix(state + static_cast<uint64_t>(i + 1) * 0x9E3779B97F4A7C15ull);
}

}  // namespace kvtier

#undef KVTIER_PATTERN_FN
