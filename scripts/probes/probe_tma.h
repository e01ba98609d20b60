// scripts/probes/probe_tma.h — the bulk-copy (TMA) ring the stand-alone probes share
// (tma_loads.cu, both_ways.cu). sm_90 and later.
//
// One issuing thread keeps `slots` bulk loads (global -> shared, completed on an mbarrier) in
// flight and bulk-stores (shared -> global) every chunk that lands. A slot is refilled once all
// but the last kBulkStoreLag store groups have read their slots, so stores and loads overlap
// (waiting for every store before each refill serialised the first version of tma_loads.cu at
// ~0.35 us per chunk per block).
#pragma once

#include <cstdint>

constexpr uint32_t kBulkStoreLag = 4;

__device__ __forceinline__ uint32_t Smem(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Copies this issuer's chunks g, g + G, g + 2G, ... (`mine` of them, `chunk` bytes each) from
// src_at(c) to dst + c * chunk through `ring` (slots x chunk bytes of shared memory) with one
// mbarrier per slot in `bar`. REQUIRES: slots > kBulkStoreLag; chunk a multiple of 16.
template <class SrcAt>
__device__ void BulkRingCopy(SrcAt src_at, char* __restrict__ dst, uint32_t chunk, uint32_t g,
                             uint32_t G, uint32_t mine, unsigned char* ring, uint64_t* bar,
                             uint32_t slots) {
  for (uint32_t s = 0; s < slots; ++s) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(Smem(&bar[s])));
  }
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  auto load = [&](uint32_t j) {  // j-th chunk of this issuer into slot j % slots
    const uint32_t s = j % slots;
    const uint64_t c = g + uint64_t(j) * G;
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(Smem(&bar[s])),
                 "r"(chunk)
                 : "memory");
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
            Smem(ring + size_t(s) * chunk)),
        "l"(src_at(c)), "r"(chunk), "r"(Smem(&bar[s]))
        : "memory");
  };
  for (uint32_t j = 0; j < min(mine, slots); ++j) load(j);
  for (uint32_t j = 0; j < mine; ++j) {
    const uint32_t s = j % slots;
    const uint32_t parity = (j / slots) & 1u;
    uint32_t done = 0;
    while (!done) {
      asm volatile(
          "{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
          : "=r"(done)
          : "r"(Smem(&bar[s])), "r"(parity)
          : "memory");
    }
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    const uint64_t c = g + uint64_t(j) * G;
    asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" ::"l"(dst + c * chunk),
                 "r"(Smem(ring + size_t(s) * chunk)), "r"(chunk)
                 : "memory");
    asm volatile("cp.async.bulk.commit_group;" ::: "memory");
    if (j >= kBulkStoreLag && j - kBulkStoreLag + slots < mine) {
      // all but the last kBulkStoreLag stores have read their slots: chunk j - lag's is free
      asm volatile("cp.async.bulk.wait_group.read %0;" ::"n"(kBulkStoreLag) : "memory");
      load(j - kBulkStoreLag + slots);
    }
  }
  asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
}
