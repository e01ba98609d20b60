// Internal: constructors of the transfer backends, used by MakeTransferEngine.
#pragma once

#include <memory>

#include "kvtier/transfer.h"

namespace kvtier::transfer {

Result<std::unique_ptr<TransferEngine>> MakeCpuTransferEngine(const TransferEngineConfig& config);

#if defined(KVTIER_WITH_CUDA)
// Defined in src/transfer/cuda/.
Result<std::unique_ptr<TransferEngine>> MakeKernelTransferEngine(
    const TransferEngineConfig& config);
Result<std::unique_ptr<TransferEngine>> MakeDmaTransferEngine(const TransferEngineConfig& config);
Result<std::unique_ptr<TransferEngine>> MakeAutoTransferEngine(const TransferEngineConfig& config);
#endif

}  // namespace kvtier::transfer
