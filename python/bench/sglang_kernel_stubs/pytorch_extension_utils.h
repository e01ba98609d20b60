// python/bench/sglang_kernel_stubs/pytorch_extension_utils.h — a stand-in, written for kvtier,
// for FlashInfer's csrc/pytorch_extension_utils.h, which SGLang's sgl-kernel build puts on the
// include path and SGLang's sgl-kernel/csrc/kvcacheio/transfer.cu includes. Of that header
// transfer.cu uses only TORCH_CHECK (c10) and what FlashInfer's header brings in with the CUDA
// headers: CUDA_VERSION (cuda.h), which transfer.cu's page_first_direct functions test to choose
// cudaMemcpyBatchAsync (CUDA >= 12.8) over one tensor copy per page. Nothing else is declared
// here, so a transfer.cu that needs more fails to compile instead of running something else.
#pragma once

#include <c10/util/Exception.h>  // TORCH_CHECK
#include <cuda.h>                // CUDA_VERSION
