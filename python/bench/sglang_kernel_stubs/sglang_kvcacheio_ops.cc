// python/bench/sglang_kernel_stubs/sglang_kvcacheio_ops.cc — kvtier's binding of SGLang's own
// KV transfer kernels, for python/bench/sglang_kernels.py (issue 37 item 4).
//
// SGLang's sgl-kernel/csrc/kvcacheio/transfer.cu (not part of kvtier: taken unmodified from the
// SGLang source folder at bench time) defines the functions declared below; this file registers
// them as torch.ops.sgl_kernel.<name> with the schemas SGLang's sgl-kernel registers, so SGLang's
// own Python wrappers (sgl-kernel/python/sgl_kernel/kvcacheio.py, also taken unmodified) call them
// exactly as in an SGLang install. Signatures: SGLang's include/sgl_kernel_ops.h; schemas:
// SGLang's csrc/common_extension.cc (the "From csrc/kvcacheio" block), both at the commit
// docs/sglang.md names. torch.utils.cpp_extension.load compiles this file and transfer.cu into
// one library (is_python_module=False: the registrations run when torch.ops loads it).
//
// torch.ops.kvtier_sglang_build.info() tells which path SGLang's page_first_direct functions take
// in this process, by the same tests transfer.cu makes (CUDA_VERSION as the stand-in header gives
// it to both files, the driver and runtime versions, the cudaMemcpyBatchAsync symbol), so the
// bench can say whether SGLang's rows ran its batched copies or its per-page fallback.
//
// Thread safety: registration runs once, when the library is loaded.

#include <ATen/core/Tensor.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <torch/library.h>

#include <cstdint>
#include <vector>

#include "pytorch_extension_utils.h"

// ---- SGLang's functions (defined in transfer.cu) ----------------------------------------------

void transfer_kv_per_layer(const at::Tensor src_k, at::Tensor dst_k, const at::Tensor src_v,
                           at::Tensor dst_v, const at::Tensor src_indices,
                           const at::Tensor dst_indices, int64_t item_size, int64_t block_quota,
                           int64_t num_warps_per_block);
void transfer_kv_per_layer_pf_lf(const at::Tensor src_k, at::Tensor dst_k, const at::Tensor src_v,
                                 at::Tensor dst_v, const at::Tensor src_indices,
                                 const at::Tensor dst_indices, int64_t layer_id, int64_t item_size,
                                 int64_t src_layout_dim, int64_t block_quota,
                                 int64_t num_warps_per_block);
void transfer_kv_per_layer_ph_lf(const at::Tensor src_k, at::Tensor dst_k, const at::Tensor src_v,
                                 at::Tensor dst_v, const at::Tensor src_indices,
                                 const at::Tensor dst_indices, int64_t layer_id, int64_t item_size,
                                 int64_t src_layout_dim, int64_t page_size, int64_t head_num,
                                 int64_t block_quota, int64_t num_warps_per_block);
void transfer_kv_all_layer(const at::Tensor src_k_layers, const at::Tensor dst_k_layers,
                           const at::Tensor src_v_layers, const at::Tensor dst_v_layers,
                           const at::Tensor src_indices, const at::Tensor dst_indices,
                           int64_t item_size, int64_t num_layers, int64_t block_quota,
                           int64_t num_warps_per_block);
void transfer_kv_all_layer_lf_pf(const at::Tensor src_k_layers, at::Tensor dst_k,
                                 const at::Tensor src_v_layers, at::Tensor dst_v,
                                 const at::Tensor src_indices, const at::Tensor dst_indices,
                                 int64_t item_size, int64_t dst_layout_dim, int64_t num_layers,
                                 int64_t block_quota, int64_t num_warps_per_block);
void transfer_kv_all_layer_lf_ph(const at::Tensor src_k_layers, at::Tensor dst_k,
                                 const at::Tensor src_v_layers, at::Tensor dst_v,
                                 const at::Tensor src_indices, const at::Tensor dst_indices,
                                 int64_t item_size, int64_t dst_layout_dim, int64_t num_layers,
                                 int64_t page_size, int64_t head_num, int64_t block_quota,
                                 int64_t num_warps_per_block);
void transfer_kv_per_layer_mla(const at::Tensor src, at::Tensor dst, const at::Tensor src_indices,
                               const at::Tensor dst_indices, int64_t item_size, int64_t block_quota,
                               int64_t num_warps_per_block);
void transfer_kv_per_layer_mla_pf_lf(const at::Tensor src, at::Tensor dst,
                                     const at::Tensor src_indices, const at::Tensor dst_indices,
                                     int64_t layer_id, int64_t item_size, int64_t src_layout_dim,
                                     int64_t block_quota, int64_t num_warps_per_block);
void transfer_kv_all_layer_mla(const at::Tensor src_layers, const at::Tensor dst_layers,
                               const at::Tensor src_indices, const at::Tensor dst_indices,
                               int64_t item_size, int64_t num_layers, int64_t block_quota,
                               int64_t num_warps_per_block);
void transfer_kv_all_layer_mla_lf_pf(const at::Tensor src_layers, at::Tensor dst,
                                     const at::Tensor src_indices, const at::Tensor dst_indices,
                                     int64_t item_size, int64_t dst_layout_dim, int64_t num_layers,
                                     int64_t block_quota, int64_t num_warps_per_block);
void transfer_kv_direct(const std::vector<at::Tensor>& src_layers,
                        std::vector<at::Tensor> dst_layers, const at::Tensor src_indices,
                        const at::Tensor dst_indices, int64_t page_size);
void transfer_kv_per_layer_direct_pf_lf(const std::vector<at::Tensor>& src_ptrs,
                                        std::vector<at::Tensor> dst_ptrs,
                                        const at::Tensor& src_indices,
                                        const at::Tensor& dst_indices, int64_t layer_id,
                                        int64_t page_size);
void transfer_kv_all_layer_direct_lf_pf(const std::vector<at::Tensor>& src_ptrs,
                                        std::vector<at::Tensor> dst_ptrs,
                                        const at::Tensor& src_indices,
                                        const at::Tensor& dst_indices, int64_t page_size);

// ---- torch.ops.sgl_kernel.*: SGLang's schemas ------------------------------------------------

// TORCH_LIBRARY, not a fragment: a second sgl_kernel library in the process (a real sgl_kernel
// imported too) is an error at load, never a silent mix of the two.
TORCH_LIBRARY(sgl_kernel, m) {
  m.def(
      "transfer_kv_per_layer(Tensor src_k, Tensor dst_k, Tensor src_v, Tensor dst_v, Tensor "
      "src_indices, Tensor dst_indices, int item_size, int block_quota, int num_warps_per_block) "
      "-> ()");
  m.impl("transfer_kv_per_layer", c10::kCUDA, &transfer_kv_per_layer);
  m.def(
      "transfer_kv_per_layer_pf_lf(Tensor src_k, Tensor dst_k, Tensor src_v, Tensor dst_v, Tensor "
      "src_indices, Tensor dst_indices, int layer_id, int item_size, int src_layout_dim, int "
      "block_quota, int num_warps_per_block) -> ()");
  m.impl("transfer_kv_per_layer_pf_lf", c10::kCUDA, &transfer_kv_per_layer_pf_lf);
  m.def(
      "transfer_kv_per_layer_ph_lf(Tensor src_k, Tensor dst_k, Tensor src_v, Tensor dst_v, Tensor "
      "src_indices, Tensor dst_indices, int layer_id, int item_size, int src_layout_dim, int "
      "page_size, int head_num, int block_quota, int num_warps_per_block) -> ()");
  m.impl("transfer_kv_per_layer_ph_lf", c10::kCUDA, &transfer_kv_per_layer_ph_lf);
  m.def(
      "transfer_kv_all_layer(Tensor src_k_layers, Tensor dst_k_layers, Tensor src_v_layers, "
      "Tensor dst_v_layers, Tensor src_indices, Tensor dst_indices, int item_size, int "
      "num_layers, int block_quota, int num_warps_per_block) -> ()");
  m.impl("transfer_kv_all_layer", c10::kCUDA, &transfer_kv_all_layer);
  m.def(
      "transfer_kv_all_layer_lf_pf(Tensor src_k_layers, Tensor dst_k, Tensor src_v_layers, Tensor "
      "dst_v, Tensor src_indices, Tensor dst_indices, int item_size, int dst_layout_dim, int "
      "num_layers, int block_quota, int num_warps_per_block) -> ()");
  m.impl("transfer_kv_all_layer_lf_pf", c10::kCUDA, &transfer_kv_all_layer_lf_pf);
  m.def(
      "transfer_kv_all_layer_lf_ph(Tensor src_k_layers, Tensor dst_k, Tensor src_v_layers, Tensor "
      "dst_v, Tensor src_indices, Tensor dst_indices, int item_size, int dst_layout_dim, int "
      "num_layers, int page_size, int head_num, int block_quota, int num_warps_per_block) -> ()");
  m.impl("transfer_kv_all_layer_lf_ph", c10::kCUDA, &transfer_kv_all_layer_lf_ph);
  m.def(
      "transfer_kv_per_layer_mla(Tensor src, Tensor dst, Tensor src_indices, Tensor dst_indices, "
      "int item_size, int block_quota, int num_warps_per_block) -> ()");
  m.impl("transfer_kv_per_layer_mla", c10::kCUDA, &transfer_kv_per_layer_mla);
  m.def(
      "transfer_kv_per_layer_mla_pf_lf(Tensor src, Tensor dst, Tensor src_indices, Tensor "
      "dst_indices, int layer_id, int item_size, int src_layout_dim, int block_quota, int "
      "num_warps_per_block) -> ()");
  m.impl("transfer_kv_per_layer_mla_pf_lf", c10::kCUDA, &transfer_kv_per_layer_mla_pf_lf);
  m.def(
      "transfer_kv_all_layer_mla(Tensor src_layers, Tensor dst_layers, Tensor src_indices, Tensor "
      "dst_indices, int item_size, int num_layers, int block_quota, int num_warps_per_block) -> "
      "()");
  m.impl("transfer_kv_all_layer_mla", c10::kCUDA, &transfer_kv_all_layer_mla);
  m.def(
      "transfer_kv_all_layer_mla_lf_pf(Tensor src_layers, Tensor dst, Tensor src_indices, Tensor "
      "dst_indices, int item_size, int dst_layout_dim, int num_layers, int block_quota, int "
      "num_warps_per_block) -> ()");
  m.impl("transfer_kv_all_layer_mla_lf_pf", c10::kCUDA, &transfer_kv_all_layer_mla_lf_pf);
  m.def(
      "transfer_kv_direct(Tensor[] src_layers, Tensor[] dst_layers, Tensor src_indices, Tensor "
      "dst_indices, int page_size) -> ()");
  m.impl("transfer_kv_direct", c10::kCUDA, &transfer_kv_direct);
  m.def(
      "transfer_kv_per_layer_direct_pf_lf(Tensor[] src_ptrs, Tensor[] dst_ptrs, Tensor "
      "src_indices, Tensor dst_indices, int layer_id, int page_size) -> ()");
  m.impl("transfer_kv_per_layer_direct_pf_lf", c10::kCUDA, &transfer_kv_per_layer_direct_pf_lf);
  m.def(
      "transfer_kv_all_layer_direct_lf_pf(Tensor[] src_ptrs, Tensor[] dst_ptrs, Tensor "
      "src_indices, Tensor dst_indices, int page_size) -> ()");
  m.impl("transfer_kv_all_layer_direct_lf_pf", c10::kCUDA, &transfer_kv_all_layer_direct_lf_pf);
}

// ---- torch.ops.kvtier_sglang_build.info() ----------------------------------------------------

namespace {

// [CUDA_VERSION as transfer.cu sees it (0: undefined), cudaDriverGetVersion (-1: failed),
//  cudaRuntimeGetVersion (-1: failed), 1 when dlsym finds cudaMemcpyBatchAsync else 0].
std::vector<int64_t> BuildInfo() {
#ifdef CUDA_VERSION
  const int64_t compiled = CUDA_VERSION;
#else
  const int64_t compiled = 0;
#endif
  int driver = 0;
  int runtime = 0;
  const int64_t driver_version = cudaDriverGetVersion(&driver) == cudaSuccess ? driver : -1;
  const int64_t runtime_version = cudaRuntimeGetVersion(&runtime) == cudaSuccess ? runtime : -1;
  const int64_t batch_symbol = dlsym(RTLD_DEFAULT, "cudaMemcpyBatchAsync") != nullptr ? 1 : 0;
  return {compiled, driver_version, runtime_version, batch_symbol};
}

}  // namespace

TORCH_LIBRARY(kvtier_sglang_build, m) { m.def("info", &BuildInfo); }
