// kvtier/testing/device_tier.h — an engine's device KV pool for tests, tools and benchmarks, filled
// with and checked against the KV pattern (kv_pattern.h): host memory on the cpu backend; on
// kernel / dma a DeviceKvPool, filled and checked through a pinned host staging region of the
// same geometry and a transfer engine of that backend.
//
// Thread safety: Fill and Verify may be called from several threads (on a GPU they share the
// staging region and the engine, so one call at a time uses them); Poison not concurrently with
// them or with copies into the pool.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <vector>

#include "kvtier/device.h"
#include "kvtier/status.h"
#include "kvtier/transfer.h"

namespace kvtier::testing {

class DeviceTier {
 public:
  // The bytes a cpu pool holds before anything is written (and after Poison): K and V apart, so
  // that a copy that mixes them up shows.
  struct InitialBytes {
    std::byte k{0x5A};
    std::byte v{0xA5};
  };

  // A pool of `geometry` (one buffer when `mla`) that starts with `initial` (the defaults: the
  // overload without it). kernel / dma need a GPU (device 0).
  static Result<std::unique_ptr<DeviceTier>> Create(TransferBackend backend,
                                                    const KvGeometry& geometry, bool mla);
  static Result<std::unique_ptr<DeviceTier>> Create(TransferBackend backend,
                                                    const KvGeometry& geometry, bool mla,
                                                    InitialBytes initial);

  const KvRegion& region() const { return region_; }

  // Writes the pattern of hashes[k] into every layer and buffer of slot slots[k].
  Status Fill(std::span<const int64_t> slots, std::span<const uint64_t> hashes);
  // Checks slot slots[k] against the pattern of hashes[k] (Corruption naming the first mismatch).
  Status Verify(std::span<const int64_t> slots, std::span<const uint64_t> hashes);

  // cpu: every byte of the pool back to its initial bytes, so that a load that misses a page
  // cannot pass its check on the bytes of an earlier round. A GPU pool keeps its bytes (the check
  // is weaker there).
  void Poison();

 private:
  DeviceTier() = default;

  TransferBackend backend_ = TransferBackend::kCpu;
  InitialBytes initial_;
  std::vector<std::byte> k_, v_;  // cpu
  KvRegion region_;
  DeviceKvPool pool_;      // kernel / dma
  std::mutex staging_mu_;  // guards staging_mem_ and engine_ (GPU backends)
  PinnedHostBuffer staging_mem_;
  KvRegion staging_;
  std::unique_ptr<TransferEngine> engine_;
};

}  // namespace kvtier::testing
