// python/bench/sglang_kernel_stubs/pytorch_extension_utils.h — a stand-in, written for kvtier,
// for FlashInfer's csrc/pytorch_extension_utils.h, which SGLang's sgl-kernel build puts on the
// include path and SGLang's sgl-kernel/csrc/kvcacheio/transfer.cu includes. transfer.cu uses
// what that header brings in: PyTorch's operator library header (FlashInfer's includes
// <torch/library.h>), which defines at::Tensor (CUDAContext.h only declares it) and TORCH_CHECK,
// and the CUDA headers: CUDA_VERSION (cuda.h), which transfer.cu's page_first_direct functions
// test to choose cudaMemcpyBatchAsync (CUDA >= 12.8) over one tensor copy per page. FlashInfer's
// own declarations (dtype dispatch macros, shape checks) are not used by transfer.cu and are left
// out, so a transfer.cu that needs them fails to compile instead of running something else.
#pragma once

#include <cuda.h>           // CUDA_VERSION
#include <torch/library.h>  // at::Tensor, TORCH_CHECK
