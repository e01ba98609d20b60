// tools/replay/replay_kernels.h — the device side of `kvtier replay` on a GPU: kernels that write
// the KV pattern of kvtier/testing/kv_pattern.h into slots of a layer_first device pool, and that
// check slots against it, counting wrong bytes. Built only with CUDA (replay_kernels.cu).
//
// The pattern is the one FillKvPattern writes on the host, computed on the device by the same
// functions (kvtier/testing/kv_pattern_value.h): the 4-byte word w of (token hash h, layer l,
// buffer b) is half of KvPatternValue(KvPatternState(h, l, b), w / 2) (the low half for even w);
// a block takes one slot's buffer, a thread one 64-bit value (two words) at a time.
//
// Thread safety: launchers enqueue on the given stream; no host state.
#pragma once

#include <cstdint>

struct CUstream_st;

namespace kvtier::tools {

// One layer_first buffer set of the device pool, as the kernels see it.
struct DevicePoolView {
  unsigned char* k = nullptr;  // K (or the MLA buffer): [L, N, S]
  unsigned char* v = nullptr;  // V: [L, N, S]; null for MLA
  int64_t num_slots = 0;       // N
  int64_t slot_bytes = 0;      // S, a multiple of 4
};

// Writes the pattern of hashes[i] into layer `layer` (both buffers) of slots[i], i < count.
// `slots` and `hashes` are device arrays. Returns the CUDA error of the launch (0 = success).
int LaunchFillPattern(const DevicePoolView& pool, const int64_t* slots, const uint64_t* hashes,
                      int64_t count, int64_t layer, CUstream_st* stream);

// Compares layer `layer` of slots[i] with the pattern of hashes[i]; adds the number of wrong
// bytes to *wrong_bytes and lowers *first_wrong to the smallest i * S * 2 + byte found wrong
// (device counters, set by the caller).
int LaunchVerifyPattern(const DevicePoolView& pool, const int64_t* slots, const uint64_t* hashes,
                        int64_t count, int64_t layer, unsigned long long* wrong_bytes,
                        unsigned long long* first_wrong, CUstream_st* stream);

}  // namespace kvtier::tools
