// The `auto` transfer backend: per request, the kernel or the dma engine, from a small table
// measured with `kvtier bench --backend kernel|dma` (16,384 tokens in random pages; H200, PCIe
// Gen5 x16, ceiling 55.5 GB/s each way; full numbers in BENCHMARKS.md, GPU section):
//
//   request                                          kernel (4 SMs)   dma                pick
//   per-layer load, any layout, page 1..64           67-92 %          1-77 % (best: lf   kernel
//                                                                     p64, 404 copies)
//   all-layer backup, layer_first <-> layer_first   95 %             70 % p16, 90 % p64 kernel
//   all-layer backup, layer_first <-> page_first_    92-95 %          84 % p16 (32 KiB   dma when
//     direct                                                          pages), 95-97 %    pages of a
//                                                                     p64 (72-128 KiB)   layer >=
//                                                                                        64 KiB
//   all-layer backup, page_first / page_head         92-95 %          25 % (a copy per   kernel
//                                                                     slot) / not run
//   any request with device indices                  -                must synchronise   kernel
//                                                                     to read them
//
// The dma engine is picked exactly where it is measured to be as fast as the kernel, since it
// leaves every SM to the forward pass; its host submission (~1.5 us per page copy) is then the
// price. Everything else goes to the kernel.
//
// Thread safety: as the engines it holds (both are thread-safe); last_stats() as documented in
// gpu_engine.h.
#include <fmt/format.h>

#include <memory>

#include "transfer/backends.h"
#include "transfer/cuda/gpu_engine.h"

namespace kvtier::transfer::cuda {
namespace {

// Measured threshold (see the table above): bytes of one page of one layer on the
// page_first_direct side from which an all-layer copy goes to the copy engines.
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
