// The GPU prefill engine of `kvtier replay` (see replay_engine.h): a DeviceKvPool, the pattern
// kernels (replay_kernels.cu) for the new tokens' KV and the check of the matched slots, and the
// prefill's GEMMs through cuBLAS (bf16 in and out, fp32 accumulation), timed with CUDA events.
//
// Streams: LoadBack enqueues on `load_`; the prefill runs on `compute_`, which waits for layer l of
// the match (WaitLayer) before layer l of the first chunk; the check of the matched slots runs on
// `check_`, which also waits per layer, so it reads exactly what the compute would read without
// adding to the compute stream's time. Timing events: `start_` on the load stream before LoadBack
// (both other streams wait for it), `loaded_` after LoadBack, per-layer begin/end on the compute
// stream for the first chunk, `end_` after the last GEMM.
//
// Thread safety: one thread drives an engine.
#if defined(KVTIER_WITH_CUDA)

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <span>
#include <vector>

#include "kvtier/device.h"
#include "replay_engine.h"
#include "replay_kernels.h"

namespace kvtier::tools {
namespace {

Status Cuda(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return Status::OK();
  return Status::CudaError(fmt::format("{}: {}", what, cudaGetErrorString(e)));
}
Status Cublas(cublasStatus_t s, const char* what) {
  if (s == CUBLAS_STATUS_SUCCESS) return Status::OK();
  return Status::CudaError(fmt::format("{}: cuBLAS status {}", what, static_cast<int>(s)));
}

// The matched slots of `job` whose KV the prefill checks, and their hashes: every page's, or
// with verify_sample the pages PageChecked picks.
void SelectCheckedSlots(const PrefillJob& job, int64_t page_size, std::vector<int64_t>* slots,
                        std::vector<uint64_t>* hashes) {
  const int64_t P = page_size;
  const int64_t hits = static_cast<int64_t>(job.hit_slots.size());
  const int64_t pages = (hits + P - 1) / P;
  for (int64_t p = 0; p < pages; ++p) {
    if (!PageChecked(p, pages, job.verify_sample)) continue;
    for (int64_t i = p * P; i < std::min(hits, (p + 1) * P); ++i) {
      slots->push_back(job.hit_slots[static_cast<size_t>(i)]);
      hashes->push_back(job.hit_hashes[static_cast<size_t>(i)]);
    }
  }
}

// Device memory for the GEMMs' operands, filled with a small finite bf16 value (no NaNs or
// denormals slowing anything down).
Result<DeviceBuffer> Operand(int64_t elements, int device) {
  KVTIER_ASSIGN_OR_RETURN(DeviceBuffer b,
                          DeviceBuffer::Allocate(std::max<int64_t>(elements, 1) * 2, device));
  KVTIER_RETURN_IF_ERROR(
      Cuda(cudaMemset(b.data(), 0x3C, static_cast<size_t>(b.bytes())), "cudaMemset"));
  return b;
}

class GpuPrefillEngine final : public PrefillEngine {
 public:
  explicit GpuPrefillEngine(const PrefillEngineConfig& config) : c_(config) {}

  ~GpuPrefillEngine() override {
    if (cublas_ != nullptr) cublasDestroy(cublas_);
  }

  Status Init() {
    const ReplayModel& m = c_.model;
    const int d = c_.device;
    KVTIER_RETURN_IF_ERROR(Cuda(cudaSetDevice(d), "cudaSetDevice"));
    KvGeometry g;
    g.layout = KvLayout::kLayerFirst;
    g.num_layers = m.num_layers;
    g.num_slots = c_.device_slots;
    g.slot_bytes = m.slot_bytes;
    g.page_size = c_.page_size;
    g.head_num = m.kv_head_num;
    KVTIER_ASSIGN_OR_RETURN(pool_, DeviceKvPool::Create(g, m.mla, d));
    region_ = pool_.region();
    view_.k = static_cast<unsigned char*>(pool_.k());
    view_.v = static_cast<unsigned char*>(pool_.v());
    view_.num_slots = g.num_slots;
    view_.slot_bytes = g.slot_bytes;
    KVTIER_ASSIGN_OR_RETURN(load_, CudaStreamHandle::Create(d));
    KVTIER_ASSIGN_OR_RETURN(compute_, CudaStreamHandle::Create(d));
    KVTIER_ASSIGN_OR_RETURN(check_, CudaStreamHandle::Create(d));
    for (CudaEventHandle* e : {&start_, &loaded_, &end_}) {
      KVTIER_ASSIGN_OR_RETURN(*e, CudaEventHandle::Create(d, /*timing=*/true));
    }
    for (int64_t l = 0; l < m.num_layers; ++l) {
      KVTIER_ASSIGN_OR_RETURN(CudaEventHandle b, CudaEventHandle::Create(d, true));
      KVTIER_ASSIGN_OR_RETURN(CudaEventHandle e, CudaEventHandle::Create(d, true));
      layer_begin_.push_back(std::move(b));
      layer_end_.push_back(std::move(e));
    }
    KVTIER_ASSIGN_OR_RETURN(staged_, CudaEventHandle::Create(d));
    KVTIER_ASSIGN_OR_RETURN(counters_, DeviceBuffer::Allocate(16, d));
    KVTIER_ASSIGN_OR_RETURN(host_counters_, PinnedHostBuffer::Allocate(16));
    if (c_.compute == ComputeMode::kGemm) KVTIER_RETURN_IF_ERROR(InitGemm());
    return MeasureCeiling();
  }

  const KvRegion& device_region() const override { return region_; }
  TransferBackend backend() const override { return TransferBackend::kKernel; }
  CudaStream load_stream() const override { return load_.get(); }
  CudaStream write_stream() const override { return compute_.get(); }

  Status BeginRequest() override { return start_.Record(load_.get()); }

  Result<PrefillTiming> Prefill(const PrefillJob& job) override {
    const ReplayModel& m = c_.model;
    const int64_t L = m.num_layers;
    PrefillTiming t;
    const bool timed = job.cache != nullptr || job.new_tokens > 0;
    if (job.cache == nullptr) KVTIER_RETURN_IF_ERROR(start_.Record(load_.get()));
    KVTIER_RETURN_IF_ERROR(loaded_.Record(load_.get()));
    KVTIER_RETURN_IF_ERROR(start_.WaitOn(compute_.get()));
    KVTIER_RETURN_IF_ERROR(start_.WaitOn(check_.get()));

    // The matched slots to check (all, or one page in eight and the last page) and the new slots.
    std::vector<int64_t> check_slots;
    std::vector<uint64_t> check_hashes;
    SelectCheckedSlots(job, c_.page_size, &check_slots, &check_hashes);
    const int64_t checks = static_cast<int64_t>(check_slots.size());
    const int64_t news = static_cast<int64_t>(job.new_slots.size());
    KVTIER_RETURN_IF_ERROR(Stage(check_slots, check_hashes, job.new_slots, job.new_hashes));
    int64_t* d_check_slots = static_cast<int64_t*>(indices_.data());
    int64_t* d_new_slots = d_check_slots + checks;
    uint64_t* d_check_hashes = reinterpret_cast<uint64_t*>(d_new_slots + news);
    uint64_t* d_new_hashes = d_check_hashes + checks;
    auto* counters = static_cast<unsigned long long*>(counters_.data());
    if (checks > 0) {
      KVTIER_RETURN_IF_ERROR(Cuda(cudaMemsetAsync(counters, 0, 8, check_.get()), "memset"));
      KVTIER_RETURN_IF_ERROR(Cuda(cudaMemsetAsync(counters + 1, 0xFF, 8, check_.get()), "memset"));
    }

    const int64_t first = std::min(job.new_tokens, c_.chunk_tokens);
    for (int64_t done = 0, chunk = 0; chunk == 0 || done < job.new_tokens; ++chunk) {
      const int64_t n = chunk == 0 ? first : std::min(c_.chunk_tokens, job.new_tokens - done);
      for (int64_t l = 0; l < L; ++l) {
        if (chunk == 0) {
          if (job.cache != nullptr) {
            KVTIER_RETURN_IF_ERROR(job.cache->WaitLayer(job.handle, l, compute_.get()));
            KVTIER_RETURN_IF_ERROR(job.cache->WaitLayer(job.handle, l, check_.get()));
          }
          if (checks > 0) {
            KVTIER_RETURN_IF_ERROR(Cuda(static_cast<cudaError_t>(LaunchVerifyPattern(
                                            view_, d_check_slots, d_check_hashes, checks, l,
                                            counters, counters + 1, check_.get())),
                                        "verify kernel"));
          }
          KVTIER_RETURN_IF_ERROR(layer_begin_[static_cast<size_t>(l)].Record(compute_.get()));
        }
        if (c_.compute == ComputeMode::kGemm && n > 0 && !job.skip_compute) {
          // The compute model's layers that belong to KV layer l (the same layer when the KV
          // and the compute come from one model).
          const int64_t Lc = c_.compute_model.num_layers;
          for (int64_t lc = l * Lc / L; lc < (l + 1) * Lc / L; ++lc) {
            KVTIER_RETURN_IF_ERROR(LayerGemms(n, job.cached_tokens + done));
          }
        }
        // The KV of this chunk's new tokens that have slots, layer l.
        const int64_t w0 = std::min(done, news), w1 = std::min(done + n, news);
        if (w1 > w0) {
          KVTIER_RETURN_IF_ERROR(
              Cuda(static_cast<cudaError_t>(LaunchFillPattern(
                       view_, d_new_slots + w0, d_new_hashes + w0, w1 - w0, l, compute_.get())),
                   "fill kernel"));
        }
        if (chunk == 0)
          KVTIER_RETURN_IF_ERROR(layer_end_[static_cast<size_t>(l)].Record(compute_.get()));
      }
      done += n;
      if (n == 0) break;
    }
    KVTIER_RETURN_IF_ERROR(end_.Record(compute_.get()));
    if (checks > 0) {
      KVTIER_RETURN_IF_ERROR(Cuda(cudaMemcpyAsync(host_counters_.data(), counters, 16,
                                                  cudaMemcpyDeviceToHost, check_.get()),
                                  "counters"));
    }
    KVTIER_RETURN_IF_ERROR(end_.Synchronize());
    KVTIER_RETURN_IF_ERROR(check_.Synchronize());
    KVTIER_RETURN_IF_ERROR(load_.Synchronize());

    const int64_t slot_total = m.slot_bytes * L * m.num_buffers();
    t.bytes_checked = checks * slot_total;
    if (checks > 0) {
      const auto* hc = static_cast<const unsigned long long*>(host_counters_.data());
      t.wrong_bytes = static_cast<int64_t>(hc[0]);
      if (t.wrong_bytes > 0) {
        const int64_t at = static_cast<int64_t>(hc[1]);  // (i * buffers + b) * S + byte
        const int64_t unit = at / m.slot_bytes;
        const int64_t i = unit / m.num_buffers();
        t.first_wrong = fmt::format("slot {} (token {} of the match), {} buffer, byte {}",
                                    check_slots[static_cast<size_t>(i)], i,
                                    m.mla ? "MLA" : (unit % 2 == 0 ? "K" : "V"), at % m.slot_bytes);
      }
    }
    if (timed) KVTIER_RETURN_IF_ERROR(TimePrefill(job, &t));
    return t;
  }

  double ceiling_bytes_per_s() const override { return ceiling_; }
  Result<double> DecodeStepMs(int64_t batch) override {
    if (c_.compute != ComputeMode::kGemm) return DecodeNeedsGemm();
    const int64_t n = std::clamp<int64_t>(batch, 1, c_.chunk_tokens);
    std::vector<float> ms;
    for (int i = 0; i < 6; ++i) {
      KVTIER_RETURN_IF_ERROR(start_.Record(compute_.get()));
      for (int64_t l = 0; l < c_.compute_model.num_layers; ++l) {
        KVTIER_RETURN_IF_ERROR(LayerGemms(n, 0));
      }
      KVTIER_RETURN_IF_ERROR(end_.Record(compute_.get()));
      KVTIER_RETURN_IF_ERROR(end_.Synchronize());
      KVTIER_ASSIGN_OR_RETURN(float t, end_.ElapsedMsSince(start_));
      if (i > 0) ms.push_back(t);  // the first is the warm-up
    }
    std::sort(ms.begin(), ms.end());
    return static_cast<double>(ms[ms.size() / 2]);
  }

  std::string Describe() const override {
    cudaDeviceProp prop{};
    cudaGetDeviceProperties(&prop, c_.device);
    return fmt::format(
        "gpu {}: device pool {:.2f} GiB; loads timed with CUDA events; compute {}; "
        "host -> device ceiling {:.1f} GB/s (one 256 MiB copy)",
        prop.name, static_cast<double>(pool_.bytes()) / (1 << 30),
        c_.compute == ComputeMode::kGemm ? "bf16 cuBLAS GEMMs of the model's prefill"
                                         : fmt::format("modelled at {:g} TFLOP/s", c_.tflops),
        ceiling_ / 1e9);
  }

 private:
  // The prefill's times from its events: the load (to `loaded_`), the compute (GEMMs: the layers'
  // events; otherwise modelled from the load) and the total.
  Status TimePrefill(const PrefillJob& job, PrefillTiming* t) {
    const int64_t L = c_.model.num_layers;
    KVTIER_ASSIGN_OR_RETURN(float total, end_.ElapsedMsSince(start_));
    KVTIER_ASSIGN_OR_RETURN(float load, loaded_.ElapsedMsSince(start_));
    t->load_ms = job.cache != nullptr ? load : 0;
    if (c_.compute == ComputeMode::kGemm) {
      double compute = 0;
      for (int64_t l = 0; l < L; ++l) {
        KVTIER_ASSIGN_OR_RETURN(float ms, layer_end_[static_cast<size_t>(l)].ElapsedMsSince(
                                              layer_begin_[static_cast<size_t>(l)]));
        compute += ms;
      }
      KVTIER_ASSIGN_OR_RETURN(float rest,
                              end_.ElapsedMsSince(layer_end_[static_cast<size_t>(L - 1)]));
      t->compute_ms = compute + rest;
      t->total_ms = total;
    } else {
      const auto [modelled, compute] =
          ModelPrefillMs(c_.compute_model, job.new_tokens, job.cached_tokens, c_.chunk_tokens,
                         c_.tflops, t->load_ms);
      t->total_ms = modelled;
      t->compute_ms = compute;
    }
    return Status::OK();
  }

  Status InitGemm() {
    const ReplayModel& m = c_.compute_model;
    const int d = c_.device;
    KVTIER_RETURN_IF_ERROR(Cublas(cublasCreate(&cublas_), "cublasCreate"));
    KVTIER_RETURN_IF_ERROR(Cublas(cublasSetStream(cublas_, compute_.get()), "cublasSetStream"));
    const int64_t n = c_.chunk_tokens;
    KVTIER_ASSIGN_OR_RETURN(w_in_, Operand(m.hidden * m.attn_in_cols, d));
    KVTIER_ASSIGN_OR_RETURN(w_out_, Operand(m.q_heads * m.v_dim * m.hidden, d));
    KVTIER_ASSIGN_OR_RETURN(w_up_, Operand(m.hidden * 2 * m.mlp_cols, d));
    KVTIER_ASSIGN_OR_RETURN(w_down_, Operand(m.mlp_cols * m.hidden, d));
    KVTIER_ASSIGN_OR_RETURN(x_,
                            Operand(n * std::max({m.hidden, m.q_heads * m.v_dim, m.mlp_cols}), d));
    KVTIER_ASSIGN_OR_RETURN(y_,
                            Operand(n * std::max({m.attn_in_cols, m.hidden, 2 * m.mlp_cols}), d));
    KVTIER_ASSIGN_OR_RETURN(q_, Operand(m.q_heads * n * m.qk_dim, d));
    KVTIER_ASSIGN_OR_RETURN(o_, Operand(m.q_heads * n * m.v_dim, d));
    // Keys and values of the whole context (padded to whole key tiles), per query head (what
    // attention reads).
    context_ = AlignKeys(std::max<int64_t>(c_.max_context, 1));
    KVTIER_ASSIGN_OR_RETURN(kc_, Operand(m.q_heads * context_ * m.qk_dim, d));
    KVTIER_ASSIGN_OR_RETURN(vc_, Operand(m.q_heads * context_ * m.v_dim, d));
    KVTIER_ASSIGN_OR_RETURN(scores_, Operand(kScoreElements, d));
    // Warm-up: cuBLAS picks and loads its kernels at the first call of each shape; one layer of
    // a full chunk, and one after a cached prefix, keep that out of the first requests' time.
    KVTIER_RETURN_IF_ERROR(LayerGemms(std::min(n, context_), 0));
    if (context_ > n) KVTIER_RETURN_IF_ERROR(LayerGemms(std::min(n, context_ - n), n));
    return compute_.Synchronize();
  }

  // C[m, n] = A[m, k] x B[k, n] in column-major terms (only the shapes matter).
  Status Gemm(int64_t rows, int64_t cols, int64_t inner, const void* a, const void* b, void* out) {
    const float one = 1, zero = 0;
    return Cublas(
        cublasGemmEx(cublas_, CUBLAS_OP_N, CUBLAS_OP_N, static_cast<int>(rows),
                     static_cast<int>(cols), static_cast<int>(inner), &one, a, CUDA_R_16BF,
                     static_cast<int>(rows), b, CUDA_R_16BF, static_cast<int>(inner), &zero, out,
                     CUDA_R_16BF, static_cast<int>(rows), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
        "cublasGemmEx");
  }

  // One layer of the prefill of `n` tokens after `cached` (ReplayModel's GEMMs).
  Status LayerGemms(int64_t n, int64_t cached) {
    const ReplayModel& m = c_.compute_model;
    const float one = 1, zero = 0;
    KVTIER_RETURN_IF_ERROR(Gemm(m.attn_in_cols, n, m.hidden, w_in_.data(), x_.data(), y_.data()));
    // Attention, causal by row blocks of aligned shapes (PlanAttention).
    const int64_t H = m.q_heads;
    for (const AttentionBlock& b : PlanAttention(n, cached, H, kScoreElements, context_)) {
      const int64_t R = b.rows, keys = b.keys;
      auto* q = static_cast<__nv_bfloat16*>(q_.data()) + b.row * m.qk_dim;
      auto* o = static_cast<__nv_bfloat16*>(o_.data()) + b.row * m.v_dim;
      // scores[keys, R] = K^T[keys, qk] x Q[qk, R], per head.
      KVTIER_RETURN_IF_ERROR(Cublas(
          cublasGemmStridedBatchedEx(cublas_, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(keys),
                                     static_cast<int>(R), static_cast<int>(m.qk_dim), &one,
                                     kc_.data(), CUDA_R_16BF, static_cast<int>(m.qk_dim),
                                     context_ * m.qk_dim, q, CUDA_R_16BF,
                                     static_cast<int>(m.qk_dim), c_.chunk_tokens * m.qk_dim, &zero,
                                     scores_.data(), CUDA_R_16BF, static_cast<int>(keys), keys * R,
                                     static_cast<int>(H), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
          "attention scores"));
      // out[v, R] = V[v, keys] x scores[keys, R], per head.
      KVTIER_RETURN_IF_ERROR(Cublas(
          cublasGemmStridedBatchedEx(
              cublas_, CUBLAS_OP_N, CUBLAS_OP_N, static_cast<int>(m.v_dim), static_cast<int>(R),
              static_cast<int>(keys), &one, vc_.data(), CUDA_R_16BF, static_cast<int>(m.v_dim),
              context_ * m.v_dim, scores_.data(), CUDA_R_16BF, static_cast<int>(keys), keys * R,
              &zero, o, CUDA_R_16BF, static_cast<int>(m.v_dim), c_.chunk_tokens * m.v_dim,
              static_cast<int>(H), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
          "attention values"));
    }
    KVTIER_RETURN_IF_ERROR(
        Gemm(m.hidden, n, m.q_heads * m.v_dim, w_out_.data(), o_.data(), y_.data()));
    KVTIER_RETURN_IF_ERROR(Gemm(2 * m.mlp_cols, n, m.hidden, w_up_.data(), x_.data(), y_.data()));
    return Gemm(m.hidden, n, m.mlp_cols, w_down_.data(), x_.data(), y_.data());
  }

  // Copies the index lists to the device (through pinned staging), on the compute stream, before
  // anything that reads them.
  Status Stage(const std::vector<int64_t>& check_slots, const std::vector<uint64_t>& check_hashes,
               std::span<const int64_t> new_slots, std::span<const uint64_t> new_hashes) {
    const size_t n = check_slots.size() + new_slots.size();
    const size_t bytes = 16 * n;
    if (bytes == 0) return Status::OK();
    if (static_cast<int64_t>(bytes) > indices_.bytes()) {
      KVTIER_ASSIGN_OR_RETURN(indices_,
                              DeviceBuffer::Allocate(static_cast<int64_t>(bytes) * 2, c_.device));
      KVTIER_ASSIGN_OR_RETURN(staging_,
                              PinnedHostBuffer::Allocate(static_cast<int64_t>(bytes) * 2));
    }
    auto* s = static_cast<unsigned char*>(staging_.data());
    auto put = [&](const void* src, size_t len) {
      std::memcpy(s, src, len);
      s += len;
    };
    put(check_slots.data(), 8 * check_slots.size());
    put(new_slots.data(), 8 * new_slots.size());
    put(check_hashes.data(), 8 * check_hashes.size());
    put(new_hashes.data(), 8 * new_hashes.size());
    KVTIER_RETURN_IF_ERROR(Cuda(cudaMemcpyAsync(indices_.data(), staging_.data(), bytes,
                                                cudaMemcpyHostToDevice, compute_.get()),
                                "index upload"));
    // The check stream reads them too.
    KVTIER_RETURN_IF_ERROR(staged_.Record(compute_.get()));
    return staged_.WaitOn(check_.get());
  }

  // One 256 MiB pinned host -> device copy, median of five after a warm-up.
  Status MeasureCeiling() {
    const int64_t bytes = int64_t{256} << 20;
    KVTIER_ASSIGN_OR_RETURN(PinnedHostBuffer src, PinnedHostBuffer::Allocate(bytes));
    KVTIER_ASSIGN_OR_RETURN(DeviceBuffer dst, DeviceBuffer::Allocate(bytes, c_.device));
    std::memset(src.data(), 0x5A, static_cast<size_t>(bytes));
    std::vector<float> ms;
    for (int i = 0; i < 6; ++i) {
      KVTIER_RETURN_IF_ERROR(start_.Record(load_.get()));
      KVTIER_RETURN_IF_ERROR(
          Cuda(cudaMemcpyAsync(dst.data(), src.data(), bytes, cudaMemcpyHostToDevice, load_.get()),
               "ceiling copy"));
      KVTIER_RETURN_IF_ERROR(end_.Record(load_.get()));
      KVTIER_RETURN_IF_ERROR(end_.Synchronize());
      KVTIER_ASSIGN_OR_RETURN(float t, end_.ElapsedMsSince(start_));
      if (i > 0) ms.push_back(t);
    }
    std::sort(ms.begin(), ms.end());
    ceiling_ = static_cast<double>(bytes) / (ms[ms.size() / 2] / 1e3);
    return Status::OK();
  }

  static constexpr int64_t kScoreElements = int64_t{1} << 29;  // 1 GiB of bf16 scores

  PrefillEngineConfig c_;
  DeviceKvPool pool_;
  KvRegion region_;
  DevicePoolView view_;
  CudaStreamHandle load_, compute_, check_;
  CudaEventHandle start_, loaded_, end_;
  CudaEventHandle staged_;  // the index upload, for the check stream
  std::vector<CudaEventHandle> layer_begin_, layer_end_;
  DeviceBuffer counters_;
  PinnedHostBuffer host_counters_;
  DeviceBuffer indices_;
  PinnedHostBuffer staging_;
  cublasHandle_t cublas_ = nullptr;
  DeviceBuffer w_in_, w_out_, w_up_, w_down_, x_, y_, q_, o_, kc_, vc_, scores_;
  int64_t context_ = 0;  // keys per head in kc_ / vc_: max_context rounded up to a key tile
  double ceiling_ = 5e10;
};

}  // namespace

Result<std::unique_ptr<PrefillEngine>> MakeGpuPrefillEngine(const PrefillEngineConfig& config) {
  if (CudaDeviceCount() == 0) return Status::Unavailable("no GPU is present");
  auto engine = std::make_unique<GpuPrefillEngine>(config);
  KVTIER_RETURN_IF_ERROR(engine->Init());
  return std::unique_ptr<PrefillEngine>(std::move(engine));
}

}  // namespace kvtier::tools

#endif  // KVTIER_WITH_CUDA
