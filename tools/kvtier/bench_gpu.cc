// tools/kvtier/bench_gpu.cc — the GPU rows of `kvtier bench` (backends kernel, dma, auto).
//
// OWNERSHIP: this file belongs to the CUDA helper from now on. The tools helper created it only
// so the `kvtier` CLI links before the GPU rows exist; replace the body of RunGpuBench freely.
// Everything shared with the CPU rows is in bench.h: BenchOptions, EnumerateCases, DrawSlots,
// HostKvBuffers (random fill, poison, CompareWith), BenchRow, Median; the CLI prints the table
// and the JSON. Per PERFORMANCE.md a GPU row measures the DMA ceiling first (1 GiB
// cudaMemcpyAsync H2D and D2H), times with CUDA events (median after warm-up), times the host
// submit separately, reports SMs used, and checks the device result byte-for-byte against
// transfer::ReferenceTransfer on host copies (whole destination buffer).
//
// Thread safety: called from the one benchmark thread.
#include "bench.h"

namespace kvtier::tools {

Status RunGpuBench(const BenchOptions& options, std::vector<BenchRow>* rows) {
  (void)options;
  (void)rows;
#if !defined(KVTIER_WITH_CUDA)
  return Status::Unavailable("kvtier was built without CUDA (KVTIER_CUDA=OFF or no nvcc)");
#else
  return Status::Unavailable("the GPU rows of kvtier bench are not written yet");
#endif
}

}  // namespace kvtier::tools
