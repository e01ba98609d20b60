// kvtier/engine_stats.h in a build without CUDA: no engine is a CUDA engine. The CUDA
// build defines LastTransferStats in src/transfer/cuda/gpu_engine.cc instead.
#if !defined(KVTIER_WITH_CUDA)

#include "kvtier/engine_stats.h"

namespace kvtier::testing {

const GpuTransferStats* LastTransferStats(const TransferEngine&) { return nullptr; }

}  // namespace kvtier::testing

#endif  // !KVTIER_WITH_CUDA
