// The `auto` transfer backend: per request, the kernel or the dma engine, from a small table
// measured on an H100 (PCIe Gen5 x16) with `kvtier bench --backend all` (BENCHMARKS.md, GPU
// section). The reasoning behind the table:
//
//   - The copy engines need one operation per contiguous piece, and both their bandwidth and the
//     host's submission time depend on the piece size: pieces of a page of one layer at page 64
//     (128 KiB for Llama-3-8B) run at the ceiling with ~1 us of host time each, while 2-32 KiB
//     pieces fall well short of it and cost far more host time than one kernel launch.
//   - The kernel reaches the ceiling for every layout with <= max_sms SMs, but it does occupy them.
//   So the dma engine is picked (keeping every SM for the forward pass) exactly where it is
//   measured to be as fast as the kernel: pieces of at least kDmaMinPieceBytes that are
//   contiguous within a layer on both sides (layer_first / page_first_direct pairs, one head
//   chunk per slot), host indices (device indices would make dma synchronise to read them), and
//   at most kDmaMaxOps operations per call. Everything else goes to the kernel.
//
// Thread safety: as the engines it holds (both are thread-safe).
#include <fmt/format.h>

#include <algorithm>
#include <memory>

#include "transfer/backends.h"
#include "transfer/cuda/gpu_engine.h"

namespace kvtier::transfer::cuda {
namespace {

// Measured thresholds (see the file comment and BENCHMARKS.md).
constexpr int64_t kDmaMinPieceBytes = int64_t{128} << 10;
constexpr int64_t kDmaMaxOps = 4096;

bool RunContiguous(KvLayout l) {
  return l == KvLayout::kLayerFirst || l == KvLayout::kPageFirstDirect;
}

}  // namespace

// Which engine `auto` gives a request. Exposed for tests and the benchmark.
TransferBackend AutoChoice(const TransferRequest& r, const TransferOptions& options) {
  (void)options;
  const KvGeometry& sg = r.src->geometry;
  const KvGeometry& dg = r.dst->geometry;
  if (r.src_slots.memory == MemoryKind::kDevice || r.dst_slots.memory == MemoryKind::kDevice) {
    return TransferBackend::kKernel;
  }
  if (!RunContiguous(sg.layout) || !RunContiguous(dg.layout)) return TransferBackend::kKernel;
  // Pages move as runs: a piece is one page of one layer (the smaller page size of the sides).
  const int64_t page = std::min(sg.page_size, dg.page_size);
  const int64_t piece = page * sg.slot_bytes;
  if (piece < kDmaMinPieceBytes) return TransferBackend::kKernel;
  // 2D copies gather a page across layers when the request spans several layers.
  const int64_t pages = (r.num_slots() + page - 1) / page;
  const int64_t ops = pages * r.src->num_buffers();
  if (ops > kDmaMaxOps) return TransferBackend::kKernel;
  return TransferBackend::kDma;
}

class AutoTransferEngine final : public GpuTransferEngine {
 public:
  AutoTransferEngine(std::unique_ptr<GpuTransferEngine> kernel,
                     std::unique_ptr<GpuTransferEngine> dma)
      : kernel_(std::move(kernel)), dma_(std::move(dma)) {}

  TransferBackend backend() const override { return TransferBackend::kAuto; }

  // Waits for both engines' work on `stream`; returns the kernel engine's deferred errors.
  Status Synchronize(CudaStream stream) override {
    Status dma = dma_->Synchronize(stream);
    Status kernel = kernel_->Synchronize(stream);
    if (!kernel.ok()) return kernel;
    return dma;
  }

 protected:
  Status DoTransfer(const TransferRequest& r, const TransferOptions& options) override {
    GpuTransferEngine* engine =
        AutoChoice(r, options) == TransferBackend::kDma ? dma_.get() : kernel_.get();
    Status s = engine->TransferValidated(r, options);
    stats_ = engine->last_stats();
    return s;
  }

 private:
  std::unique_ptr<GpuTransferEngine> kernel_;
  std::unique_ptr<GpuTransferEngine> dma_;
};

}  // namespace kvtier::transfer::cuda

namespace kvtier::transfer {

Result<std::unique_ptr<TransferEngine>> MakeAutoTransferEngine(const TransferEngineConfig& config) {
  KVTIER_ASSIGN_OR_RETURN(auto kernel, cuda::CreateKernelEngine(config));
  KVTIER_ASSIGN_OR_RETURN(auto dma, cuda::CreateDmaEngine(config));
  return std::unique_ptr<TransferEngine>(
      new cuda::AutoTransferEngine(std::move(kernel), std::move(dma)));
}

}  // namespace kvtier::transfer
