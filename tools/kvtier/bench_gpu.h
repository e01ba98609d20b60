// tools/kvtier/bench_gpu.h — the GPU rows of `kvtier bench` (how they are measured: bench_gpu.cc's
// opening comment). GpuBench runs them: the ceilings, the calibration of the DMA rate and the run
// over the shapes in bench_gpu.cc; one row (timing, the check against the cpu backend, both
// directions at once) in bench_gpu_rows.cc. Built only with CUDA.
//
// Thread safety: used from the one benchmark thread.
#pragma once

#if defined(KVTIER_WITH_CUDA)

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "bench.h"
#include "bench_gpu_memory.h"
#include "kvtier/device.h"
#include "kvtier/status.h"
#include "kvtier/transfer.h"

namespace kvtier::tools::gpu_bench {

struct Engines {
  std::vector<std::pair<TransferBackend, std::unique_ptr<TransferEngine> > > gpu;
  std::unique_ptr<TransferEngine> cpu;
};

class GpuBench {
 public:
  GpuBench(const BenchOptions& options, std::vector<BenchRow>* rows)
      : options_(options), rows_(rows) {}

  Status Run();

 private:
  Status MeasureCeiling();
  // The rows of case `c` (number *index of `total`), one per GPU backend.
  Status RunCase(const BenchCase& c, ShapeBuffers& buf, size_t* index, size_t total);
  // Into buf.expected, what the cpu backend makes of case `c` (a backup: the whole host pool
  // from the device mirror; a load: the loaded layer, made later unless --reference-first), the
  // tables of a load's layer into `table_k` / `table_v`, which `expected` points into.
  Status PrepareExpected(const BenchCase& c, ShapeBuffers& buf, const std::vector<int64_t>& src,
                         const std::vector<int64_t>& dst, std::vector<void*>* table_k,
                         std::vector<void*>* table_v, KvRegion* expected);
  // Where the GPU's result of case `c` first differs from buf.expected; "" when it does not.
  Result<std::string> FirstMismatch(const BenchCase& c, ShapeBuffers& buf);
  Status RunBoth(const BenchCase& c, ShapeBuffers& buf, TransferBackend backend,
                 TransferEngine& engine);
  // What RunBoth's two streams left against the cpu backend's result; "" when all is equal.
  Result<std::string> CheckBoth(const BenchCase& c, ShapeBuffers& buf, const BenchSlots& load,
                                const BenchSlots& backup);
  Result<BenchRow> TimeRow(const BenchCase& c, TransferBackend backend, TransferEngine& engine,
                           const TransferRequest& request);
  // --warmup-ms: calls `request` (each waited for) until that much wall time has passed.
  Status WarmFor(const BenchCase& c, TransferEngine& engine, const TransferRequest& request);
  // The host submission of one call alone on an idle stream (median of `repeats`) into `row`.
  Status TimeSubmitAlone(const BenchCase& c, TransferEngine& engine, const TransferRequest& request,
                         BenchRow* row);
  // The copy engines' rate right now in one direction (GB/s): kNowBytes, median of 3.
  Result<double> DmaNow(bool h2d);
  // After the last row: per direction, the higher of the start ceiling and the median of the
  // rows' DMA rates measured right after them; rows from `first_row` on are compared with it.
  void RaiseCeilingToRowMedian(size_t first_row);

  const BenchOptions& options_;
  std::vector<BenchRow>* rows_;
  Engines engines_;
  CudaStreamHandle stream_;
  CudaStreamHandle stream2_;
  double ceiling_h2d_ = 0, ceiling_d2h_ = 0;
  static constexpr int64_t kNowBytes = int64_t{64} << 20;
  PinnedHostBuffer now_host_;  // kNowBytes each, random: DmaNow's buffers
  DeviceBuffer now_device_;
};

}  // namespace kvtier::tools::gpu_bench

#endif  // KVTIER_WITH_CUDA
