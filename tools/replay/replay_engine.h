// tools/replay/replay_engine.h — the "engine" side of `kvtier replay`: the device KV pool, the
// prefill of one request (consuming each layer's loaded KV after WaitLayer, computing, writing the
// KV of the new tokens), the check of every matched byte, and the timing of it all.
//
// Two implementations behind one interface:
//   cpu  the device pool is host memory standing in for the GPU (the cache's cpu backend moves
//        it); loads are the measured wall time of LoadBack; compute is the cost model
//        (ReplayModel::LayerFlops at `tflops`); load and compute overlap per layer as an engine
//        that waits layer by layer would (layer l's compute starts when layer l is loaded and
//        layer l-1 is computed).
//   gpu  (built with CUDA) the device pool is a DeviceKvPool; a kernel writes the KV pattern of
//        the new tokens and another checks the matched slots against it, layer by layer after
//        WaitLayer, on a stream of their own; with compute "gemm" the prefill runs real bf16
//        cuBLAS GEMMs of the model's shapes on a compute stream that waits per layer, timed with
//        CUDA events (compute "model": the cost model, as on cpu, with the loads timed by events).
// A prefill of more than `chunk_tokens` new tokens runs in chunks (chunked prefill); only the
// first chunk waits for the loads.
//
// Thread safety: one engine is driven by one thread.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "kvtier/hierarchical_cache.h"
#include "kvtier/status.h"
#include "kvtier/transfer.h"
#include "replay_model.h"

namespace kvtier::tools {

enum class ComputeMode : uint8_t { kModel = 0, kGemm = 1 };

struct PrefillEngineConfig {
  ReplayModel model;          // the KV geometry
  ReplayModel compute_model;  // the prefill's shapes and FLOPs (usually the same model)
  int64_t device_slots = 0;   // a multiple of page_size
  int64_t page_size = 64;
  ComputeMode compute = ComputeMode::kModel;
  double tflops = 400;           // the cost model's rate
  int64_t chunk_tokens = 8192;   // chunked prefill
  int64_t max_context = 131072;  // gemm: the longest prompt (sizes the attention operands)
  int device = 0;                // CUDA device (gpu)
};

// One request's prefill.
struct PrefillJob {
  // The cache and the handle whose loads to wait for per layer; null cache: nothing to wait for.
  HierarchicalCache* cache = nullptr;
  MatchHandle handle;
  // The matched prefix on the device (device hits and what LoadBack copied), with the pattern
  // hashes of those tokens: checked against the pattern (all of them, or a sample).
  std::span<const int64_t> hit_slots;
  std::span<const uint64_t> hit_hashes;
  bool verify_sample = false;
  // Warm-up: write and check the KV, but no compute and no timing.
  bool skip_compute = false;
  // Slots the engine allocated for the new whole pages, and their tokens' hashes: the prefill
  // writes their KV. May be shorter than new_tokens (a partial last page, or no room).
  std::span<const int64_t> new_slots;
  std::span<const uint64_t> new_hashes;
  int64_t cached_tokens = 0;  // context the prefill attends to without computing it
  int64_t new_tokens = 0;     // tokens computed
  double load_wall_ms = 0;    // cpu: wall time of this request's LoadBack
};

struct PrefillTiming {
  double total_ms = 0;    // load and compute, overlapped per layer
  double compute_ms = 0;  // compute alone
  double load_ms = 0;     // the load alone
  int64_t bytes_checked = 0;
  int64_t wrong_bytes = 0;
  std::string first_wrong;  // what the first wrong byte was, when there was one
};

class PrefillEngine {
 public:
  virtual ~PrefillEngine() = default;
  PrefillEngine(const PrefillEngine&) = delete;
  PrefillEngine& operator=(const PrefillEngine&) = delete;

  // The device KV pool (layer_first, page_size pages).
  virtual const KvRegion& device_region() const = 0;
  virtual TransferBackend backend() const = 0;
  // The stream LoadBack enqueues on, and the one the prefill writes the KV on (Insert's stream);
  // nullptr on cpu.
  virtual CudaStream load_stream() const = 0;
  virtual CudaStream write_stream() const = 0;
  // Marks the start of a request's device work; call right before LoadBack.
  virtual Status BeginRequest() = 0;
  virtual Result<PrefillTiming> Prefill(const PrefillJob& job) = 0;
  // Host -> device bytes per second of one large copy, measured when the engine was made (cpu:
  // one large memcpy): the ideal's load rate.
  virtual double ceiling_bytes_per_s() const = 0;
  // One line: where the pool lives, how compute is done.
  virtual std::string Describe() const = 0;
  // The time of one decode step of `batch` tokens (--decode-ms-per-token measure): the model's
  // weight GEMMs of every layer at `batch` rows, timed (gpu, compute gemm: CUDA events, median of
  // five after a warm-up). It leaves out attention over the context, so it is a lower bound of a
  // real step. InvalidArgument where compute is the cost model (decode is bound by memory, which
  // the model does not price).
  virtual Result<double> DecodeStepMs(int64_t batch) = 0;

 protected:
  PrefillEngine() = default;
};

Result<std::unique_ptr<PrefillEngine>> MakeCpuPrefillEngine(const PrefillEngineConfig& config);
// Unavailable when kvtier was built without CUDA or no GPU is present.
Result<std::unique_ptr<PrefillEngine>> MakeGpuPrefillEngine(const PrefillEngineConfig& config);

// DecodeStepMs's answer where compute is the cost model.
Status DecodeNeedsGemm();

// Model time of one layer's share of a prefill, in ms, at `tflops`.
double ModelLayerMs(const ReplayModel& model, int64_t new_tokens, int64_t cached_tokens,
                    double tflops);
// Load and compute overlapped per layer: layer l's compute starts once layer l is loaded
// (load_ms spread evenly over the layers) and layer l-1 is computed; chunks after the first
// follow without waiting. Returns {total, compute} in ms.
std::pair<double, double> ModelPrefillMs(const ReplayModel& model, int64_t new_tokens,
                                         int64_t cached_tokens, int64_t chunk_tokens, double tflops,
                                         double load_ms);

// The attention of the GEMM stand-in (gpu, compute gemm), causal by row blocks: rows
// [row, row + rows) of a chunk of `n` new tokens after `cached` ones attend to `keys` keys, as two
// batched GEMMs per block (scores [keys, rows] = K^T Q, then out = V scores), the scores buffer
// holding at most `score_elements` over `heads` heads. `keys` is the causal bound rounded up to a
// multiple of kAttentionKeyAlign (at most `context`, itself such a multiple), and `rows` a
// multiple of it where the buffer holds that many (but the last block): the scores' leading
// dimension and batch stride stay
// multiples of 8 bf16 elements (16 bytes), which cuBLAS's tensor-core kernels need. Unrounded,
// a cached prefix of 512 tokens made blocks of 1,927 rows over 2,439 keys: misaligned operands,
// slower kernels, and a prompt with 3 % cached computing in 850 ms against 538 ms with none
// (docs/perf-notes/replay.md); real attention kernels tile keys by 64 or 128 all the same.
inline constexpr int64_t kAttentionKeyAlign = 64;
struct AttentionBlock {
  int64_t row = 0, rows = 0, keys = 0;
};
std::vector<AttentionBlock> PlanAttention(int64_t n, int64_t cached, int64_t heads,
                                          int64_t score_elements, int64_t context);
// `tokens` rounded up to a multiple of kAttentionKeyAlign.
int64_t AlignKeys(int64_t tokens);

// Whether a prefill checks matched page `page` of `pages`: every page, or with `sample`
// (--verify sample) one page in eight and the last page. The CPU and GPU engines both ask it.
inline bool PageChecked(int64_t page, int64_t pages, bool sample) {
  return !sample || page % 8 == 0 || page == pages - 1;
}

// Checks (host memory) that `slots` of `region` hold the pattern of `hashes`: every token, or
// with `sample` one page in eight (and the last page). Adds to bytes_checked / wrong_bytes
// (exact counts of wrong bytes), keeps the first mismatch's description.
Status VerifyHostSlots(const KvRegion& region, std::span<const int64_t> slots,
                       std::span<const uint64_t> hashes, int64_t page_size, bool sample,
                       PrefillTiming* timing);

}  // namespace kvtier::tools
