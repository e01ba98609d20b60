// The `auto` transfer backend: per request, the kernel or the dma engine. The rule:
//   - an all-layer copy between layer_first and page_first_direct, with host indices, whose
//     page of one layer on the page_first_direct side holds at least kDmaMinPageBytes, goes to
//     the dma engine: there the copy engines keep up with the kernel and leave every SM to the
//     forward pass, at the price of host submission per copy;
//   - everything else goes to the kernel: per-layer loads, other layout pairs, smaller pages,
//     and requests with device indices (the dma engine would have to synchronise to read them).
// The measurements behind the rule are the kernel, dma and auto columns of BENCHMARKS.md, GPU.
//
// Thread safety: as the engines it holds (both are thread-safe); last_stats() as documented in
// gpu_engine.h.
#include <fmt/format.h>

#include <memory>

#include "transfer/backends.h"
#include "transfer/cuda/gpu_engine.h"

namespace kvtier::transfer::cuda {
namespace {

// Bytes of one page of one layer on the page_first_direct side from which an all-layer copy goes
// to the copy engines (see the file comment).
constexpr int64_t kDmaMinPageBytes = int64_t{64} << 10;

}  // namespace

// Which engine `auto` gives a request. Exposed for tests and the benchmark.
TransferBackend AutoChoice(const TransferRequest& r, const TransferOptions& options) {
  (void)options;
  const KvGeometry& sg = r.src->geometry;
  const KvGeometry& dg = r.dst->geometry;
  if (r.src_slots.memory == MemoryKind::kDevice || r.dst_slots.memory == MemoryKind::kDevice) {
    return TransferBackend::kKernel;
  }
  if (r.num_layers == 1) return TransferBackend::kKernel;
  const bool src_pfd = sg.layout == KvLayout::kPageFirstDirect;
  const bool dst_pfd = dg.layout == KvLayout::kPageFirstDirect;
  const KvLayout other = src_pfd ? dg.layout : sg.layout;
  if (src_pfd == dst_pfd || other != KvLayout::kLayerFirst) return TransferBackend::kKernel;
  const KvGeometry& pfd = src_pfd ? sg : dg;
  if (pfd.page_size * pfd.slot_bytes < kDmaMinPageBytes) return TransferBackend::kKernel;
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
