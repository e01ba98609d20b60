// scripts/probes/both_ways.cu — who loses when both directions share the link? (BENCHMARKS.md,
// GPU: "Both directions", PERFORMANCE.md target 5.)
// Stand-alone (CUDA runtime only):
//   nvcc -O2 -arch=sm_90 -o both_ways scripts/probes/both_ways.cu && ./both_ways
// Moves 512 MiB host -> device and 512 MiB device -> host (pinned host memory), each direction
// either by the copy engines (one cudaMemcpyAsync) or by SMs (a grid-stride copy kernel over the
// mapped host memory, 1024 threads per block, 16-byte accesses, 4 loads in flight per thread:
// the shape of the kernel backend's copies, on contiguous bytes; or "TMA": bulk copies through
// shared memory, 4 KiB each). First each direction alone,
// then the two at once on two streams, released together by an event behind a short spin
// kernel so that neither starts before the other is queued. For the pairs: each direction's
// own rate (bytes over the time from the release to that direction's end) and the sum (both
// directions' bytes over the time until both ended), as a multiple of the copy engines' H2D
// rate alone. Median of 5 after a warm-up, by CUDA events. Every copy is checked: host -> device
// against the host pattern by a device kernel, device -> host on the host.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "probe_check.h"
#include "probe_tma.h"

constexpr size_t kBytes = size_t{512} << 20;

__host__ __device__ inline uint64_t Pattern(uint64_t i, uint64_t seed) {
  uint64_t x = (i + 1) * 0x9E3779B97F4A7C15ull ^ seed;
  x ^= x >> 31;
  x *= 0xBF58476D1CE4E5B9ull;
  return x ^ (x >> 29);
}

__global__ void Fill(uint64_t* p, size_t words, uint64_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < words; i += size_t(gridDim.x) * blockDim.x) {
    p[i] = Pattern(i, seed);
  }
}

__global__ void CountMismatches(const uint64_t* p, size_t words, uint64_t seed, unsigned long long* bad) {
  unsigned long long mine = 0;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < words; i += size_t(gridDim.x) * blockDim.x) {
    mine += p[i] != Pattern(i, seed);
  }
  if (mine) atomicAdd(bad, mine);
}

__global__ void __launch_bounds__(1024, 1) SmCopy(const uint4* __restrict__ src, uint4* __restrict__ dst, size_t n) {
  const size_t stride = size_t(gridDim.x) * blockDim.x * 4;
  for (size_t base = (blockIdx.x * size_t(blockDim.x) + threadIdx.x / 32 * 32) * 4 + threadIdx.x % 32; base < n;
       base += stride) {
    uint4 v[4];
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      if (base + r * 32 < n) v[r] = __ldcs(src + base + r * 32);
    }
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      if (base + r * 32 < n) __stcs(dst + base + r * 32, v[r]);
    }
  }
}

// Bulk (TMA) copy of contiguous bytes through shared memory (probe_tma.h): kIssuers threads
// per block, each with a ring of kSlots kChunk-byte chunks.
constexpr int kIssuers = 8;
constexpr uint32_t kChunk = 4096;
constexpr uint32_t kSlots = 3 * kBulkStoreLag / 2;  // per issuer
constexpr int kTmaSmem = kIssuers * kSlots * kChunk;

__global__ void TmaCopy(const char* __restrict__ src, char* __restrict__ dst, uint32_t chunks) {
  extern __shared__ __align__(128) unsigned char smem[];
  __shared__ __align__(8) uint64_t bars[kIssuers * kSlots];
  const uint32_t w = threadIdx.x / 32;
  if (threadIdx.x % 32 != 0 || w >= kIssuers) return;
  const uint32_t g = blockIdx.x * kIssuers + w, G = gridDim.x * kIssuers;
  const uint32_t mine = chunks > g ? (chunks - g + G - 1) / G : 0;
  BulkRingCopy([&](uint64_t c) { return src + c * kChunk; }, dst, kChunk, g, G, mine,
               smem + size_t(w) * kSlots * kChunk, bars + w * kSlots, kSlots);
}

__global__ void Spin(long long cycles) {
  const long long t0 = clock64();
  while (clock64() - t0 < cycles) {
  }
}

struct Way {
  int sms;           // 0: copy engines
  bool tma = false;  // SMs with bulk copies instead of 16-byte accesses
  std::string Name() const { return sms == 0 ? "CE" : std::to_string(sms) + (tma ? " TMA" : " SMs"); }
};

struct Buffers {
  char* host_src;  // H2D source (pattern, seed 1)
  char* host_dst;  // D2H destination
  char* dev_dst;   // H2D destination
  char* dev_src;   // D2H source (pattern, seed 2)
};

void Issue(const Way& w, bool h2d, const Buffers& b, cudaStream_t s) {
  const char* src = h2d ? b.host_src : b.dev_src;
  char* dst = h2d ? b.dev_dst : b.host_dst;
  if (w.sms == 0) {
    CHECK(cudaMemcpyAsync(dst, src, kBytes, h2d ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost, s));
  } else if (w.tma) {
    TmaCopy<<<w.sms, 32 * kIssuers, kTmaSmem, s>>>(src, dst, static_cast<uint32_t>(kBytes / kChunk));
    CHECK(cudaGetLastError());
  } else {
    SmCopy<<<w.sms, 1024, 0, s>>>(reinterpret_cast<const uint4*>(src), reinterpret_cast<uint4*>(dst), kBytes / 16);
    CHECK(cudaGetLastError());
  }
}

// Checks the destination of each direction that ran.
bool Verify(const Buffers& b, bool h2d, bool d2h, unsigned long long* d_bad) {
  unsigned long long bad = 0;
  if (d2h) {
    const auto* h = reinterpret_cast<const uint64_t*>(b.host_dst);
    for (size_t i = 0; i < kBytes / 8; ++i) bad += h[i] != Pattern(i, 2);
  }
  if (!h2d) return bad == 0;
  CHECK(cudaMemset(d_bad, 0, sizeof(*d_bad)));
  CountMismatches<<<264, 512>>>(reinterpret_cast<const uint64_t*>(b.dev_dst), kBytes / 8, 1, d_bad);
  CHECK(cudaGetLastError());
  unsigned long long dev_bad = 0;
  CHECK(cudaMemcpy(&dev_bad, d_bad, sizeof(dev_bad), cudaMemcpyDeviceToHost));
  return bad + dev_bad == 0;
}

void Poison(const Buffers& b) {
  CHECK(cudaMemset(b.dev_dst, 0xAB, kBytes));
  std::memset(b.host_dst, 0xCD, kBytes);
}

float Median(std::vector<float> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

int main() {
  Buffers b{};
  CHECK(cudaHostAlloc(reinterpret_cast<void**>(&b.host_src), kBytes, cudaHostAllocDefault));
  CHECK(cudaHostAlloc(reinterpret_cast<void**>(&b.host_dst), kBytes, cudaHostAllocDefault));
  CHECK(cudaMalloc(&b.dev_dst, kBytes));
  CHECK(cudaMalloc(&b.dev_src, kBytes));
  unsigned long long* d_bad = nullptr;
  CHECK(cudaMalloc(&d_bad, sizeof(*d_bad)));
  for (size_t i = 0; i < kBytes / 8; ++i) reinterpret_cast<uint64_t*>(b.host_src)[i] = Pattern(i, 1);
  Fill<<<264, 512>>>(reinterpret_cast<uint64_t*>(b.dev_src), kBytes / 8, 2);
  CHECK(cudaGetLastError());
  CHECK(cudaDeviceSynchronize());

  cudaStream_t sh, sd;
  CHECK(cudaStreamCreateWithFlags(&sh, cudaStreamNonBlocking));
  CHECK(cudaStreamCreateWithFlags(&sd, cudaStreamNonBlocking));
  cudaEvent_t go, end_h, end_d;
  CHECK(cudaEventCreate(&go));
  CHECK(cudaEventCreate(&end_h));
  CHECK(cudaEventCreate(&end_d));
  int clock_khz = 0;
  CHECK(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, 0));
  const long long spin = static_cast<long long>(clock_khz) * 2;  // ~2 ms

  // One sample: the release event on sh behind a spin, then the chosen directions. Returns the
  // ms from the release to each direction's end (0 for a direction not run).
  auto sample = [&](const Way* h2d, const Way* d2h, float* ms_h, float* ms_d) {
    Spin<<<1, 1, 0, sh>>>(spin);
    CHECK(cudaGetLastError());
    CHECK(cudaEventRecord(go, sh));
    CHECK(cudaStreamWaitEvent(sd, go, 0));
    if (h2d) Issue(*h2d, true, b, sh);
    if (d2h) Issue(*d2h, false, b, sd);
    CHECK(cudaEventRecord(end_h, sh));
    CHECK(cudaEventRecord(end_d, sd));
    CHECK(cudaEventSynchronize(end_h));
    CHECK(cudaEventSynchronize(end_d));
    *ms_h = *ms_d = 0;
    if (h2d) CHECK(cudaEventElapsedTime(ms_h, go, end_h));
    if (d2h) CHECK(cudaEventElapsedTime(ms_d, go, end_d));
  };
  auto gbps = [](float ms) { return ms > 0 ? kBytes / (ms * 1e-3) / 1e9 : 0.0; };

  CHECK(cudaFuncSetAttribute(TmaCopy, cudaFuncAttributeMaxDynamicSharedMemorySize, kTmaSmem));
  const Way ce{0}, sm4{4}, sm3{3}, sm8{8}, sm2{2}, sm12{12}, sm16{16}, tma4{4, true}, tma3{3, true};
  struct Case {
    const Way* h2d;
    const Way* d2h;
  };
  const Case cases[] = {
      {&ce, nullptr},  {nullptr, &ce},  {&sm4, nullptr}, {nullptr, &sm3}, {&tma4, nullptr},
      {nullptr, &tma3}, {&ce, &ce},     {&sm4, &sm3},    {&sm4, &ce},     {&ce, &sm3},
      {&ce, &tma3},    {&sm4, &tma3},   {&tma4, &sm3},   {&tma4, &tma3},  {&tma4, &ce},
      {&sm4, &sm2},    {&sm8, &sm3},    {&sm8, &sm2},    {&sm16, &sm3},   {&sm16, &sm2},
      {&sm8, &tma3},   {&sm8, &ce},     {&sm12, &ce},    {&sm16, &ce},
  };
  double ceiling = 0;
  std::printf("%-8s %-8s %10s %10s %10s %8s %s\n", "H2D by", "D2H by", "H2D GB/s", "D2H GB/s", "sum GB/s",
              "x H2D CE", "check");
  for (const Case& c : cases) {
    Poison(b);
    std::vector<float> mh, md, both;
    for (int t = 0; t < 6; ++t) {
      float h = 0, d = 0;
      sample(c.h2d, c.d2h, &h, &d);
      if (t == 0) continue;  // warm-up
      mh.push_back(h);
      md.push_back(d);
      both.push_back(std::max(h, d));
    }
    const bool ok = Verify(b, c.h2d != nullptr, c.d2h != nullptr, d_bad);
    const double h = gbps(Median(mh)), d = gbps(Median(md));
    const double bytes = (c.h2d ? kBytes : 0) + (c.d2h ? kBytes : 0);
    const double sum = bytes / (Median(both) * 1e-3) / 1e9;
    if (c.h2d == &ce && !c.d2h) ceiling = h;
    std::printf("%-8s %-8s %10.2f %10.2f %10.2f %8.2f %s\n", c.h2d ? c.h2d->Name().c_str() : "-",
                c.d2h ? c.d2h->Name().c_str() : "-", h, d, sum, sum / ceiling,
                ok ? "ok" : "MISMATCH");
  }
  return 0;
}
