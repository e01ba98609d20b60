// The cpu prefill engine of `kvtier replay` and the cost model (see replay_engine.h).
#include "replay_engine.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <vector>

#include "kvtier/testing/kv_pattern.h"

namespace kvtier::tools {

Status DecodeNeedsGemm() {
  return Status::InvalidArgument(
      "--decode-ms-per-token measure times a decode step's GEMMs on a GPU (--compute gemm); with "
      "the cost model give the step's milliseconds a token");
}

double ModelLayerMs(const ReplayModel& model, int64_t new_tokens, int64_t cached_tokens,
                    double tflops) {
  return model.LayerFlops(new_tokens, cached_tokens) / (tflops * 1e12) * 1e3;
}

std::pair<double, double> ModelPrefillMs(const ReplayModel& model, int64_t new_tokens,
                                         int64_t cached_tokens, int64_t chunk_tokens, double tflops,
                                         double load_ms) {
  const int64_t L = model.num_layers;
  const int64_t first = std::min(new_tokens, chunk_tokens);
  const double first_layer_ms = ModelLayerMs(model, first, cached_tokens, tflops);
  double compute = 0;
  double t = 0;
  for (int64_t l = 0; l < L; ++l) {
    const double loaded = load_ms * static_cast<double>(l + 1) / static_cast<double>(L);
    t = std::max(t, loaded) + first_layer_ms;
    compute += first_layer_ms;
  }
  for (int64_t done = first; done < new_tokens; done += chunk_tokens) {
    const int64_t n = std::min(chunk_tokens, new_tokens - done);
    const double ms = ModelLayerMs(model, n, cached_tokens + done, tflops) * static_cast<double>(L);
    t += ms;
    compute += ms;
  }
  return {std::max(t, load_ms), compute};
}

int64_t AlignKeys(int64_t tokens) {
  return (tokens + kAttentionKeyAlign - 1) / kAttentionKeyAlign * kAttentionKeyAlign;
}

std::vector<AttentionBlock> PlanAttention(int64_t n, int64_t cached, int64_t heads,
                                          int64_t score_elements, int64_t context) {
  std::vector<AttentionBlock> out;
  const int64_t keys_max = std::min(AlignKeys(cached + n), context);
  const int64_t per_row = std::max<int64_t>(heads * std::max<int64_t>(keys_max, 1), 1);
  int64_t rows = std::max<int64_t>(score_elements / per_row, 1);
  if (rows >= kAttentionKeyAlign) rows = rows / kAttentionKeyAlign * kAttentionKeyAlign;
  for (int64_t r0 = 0; r0 < n;) {
    const int64_t r = std::min(rows, n - r0);
    out.push_back({r0, r, std::min(AlignKeys(cached + r0 + r), context)});
    r0 += r;
  }
  return out;
}

namespace {

// Exact count of the bytes of `slot` that differ from the pattern of `hash`, using a one-slot
// scratch region with the same geometry per slot.
int64_t CountWrongBytes(const KvRegion& region, int64_t slot, uint64_t hash,
                        std::vector<std::byte>* scratch, std::string* first) {
  const KvGeometry& g = region.geometry;
  KvRegion expected;
  expected.geometry = g;
  expected.geometry.num_slots = g.page_size;
  expected.mla = region.mla;
  expected.memory = MemoryKind::kHost;
  const size_t buffer_bytes = static_cast<size_t>(expected.geometry.buffer_bytes());
  scratch->assign(buffer_bytes * static_cast<size_t>(region.num_buffers()), std::byte{0});
  expected.k = scratch->data();
  expected.v = region.mla ? nullptr : scratch->data() + buffer_bytes;
  const int64_t zero = 0;
  if (!FillKvPattern(expected, std::span<const int64_t>(&zero, 1),
                     std::span<const uint64_t>(&hash, 1))
           .ok()) {
    return g.slot_bytes * g.num_layers * region.num_buffers();
  }
  int64_t wrong = 0;
  for (int b = 0; b < region.num_buffers(); ++b) {
    for (int64_t l = 0; l < g.num_layers; ++l) {
      const std::byte* have = region.LayerBase(b, l) + region.LayerOffset(l, slot, 0);
      const std::byte* want = expected.LayerBase(b, l) + expected.LayerOffset(l, 0, 0);
      for (int64_t i = 0; i < g.slot_bytes; ++i) {
        if (have[i] == want[i]) continue;
        if (wrong == 0 && first->empty()) {
          *first = fmt::format(
              "slot {}, layer {}, {} buffer, byte {}: found 0x{:02x}, pattern "
              "0x{:02x}",
              slot, l, region.mla ? "MLA" : (b == 0 ? "K" : "V"), i, static_cast<unsigned>(have[i]),
              static_cast<unsigned>(want[i]));
        }
        ++wrong;
      }
    }
  }
  return wrong;
}

}  // namespace

Status VerifyHostSlots(const KvRegion& region, std::span<const int64_t> slots,
                       std::span<const uint64_t> hashes, int64_t page_size, bool sample,
                       PrefillTiming* timing) {
  if (slots.size() != hashes.size()) {
    return Status::InvalidArgument(
        fmt::format("VerifyHostSlots: {} slots, {} hashes", slots.size(), hashes.size()));
  }
  const int64_t slot_total =
      region.geometry.slot_bytes * region.geometry.num_layers * region.num_buffers();
  const int64_t n = static_cast<int64_t>(slots.size());
  const int64_t pages = (n + page_size - 1) / page_size;
  std::vector<std::byte> scratch;
  for (int64_t p = 0; p < pages; ++p) {
    if (!PageChecked(p, pages, sample)) continue;
    const int64_t begin = p * page_size;
    const int64_t count = std::min(page_size, n - begin);
    const auto s = slots.subspan(static_cast<size_t>(begin), static_cast<size_t>(count));
    const auto h = hashes.subspan(static_cast<size_t>(begin), static_cast<size_t>(count));
    timing->bytes_checked += count * slot_total;
    Status st = VerifyKvPattern(region, s, h);
    if (st.ok()) continue;
    if (st.code() != StatusCode::kCorruption) return st;
    for (int64_t k = 0; k < count; ++k) {
      timing->wrong_bytes +=
          CountWrongBytes(region, s[static_cast<size_t>(k)], h[static_cast<size_t>(k)], &scratch,
                          &timing->first_wrong);
    }
  }
  return Status::OK();
}

namespace {

// The device pool in host memory, as the cache's cpu backend expects it.
class CpuPrefillEngine final : public PrefillEngine {
 public:
  explicit CpuPrefillEngine(const PrefillEngineConfig& config) : config_(config) {}

  Status Init() {
    KvGeometry g;
    g.layout = KvLayout::kLayerFirst;
    g.num_layers = config_.model.num_layers;
    g.num_slots = config_.device_slots;
    g.slot_bytes = config_.model.slot_bytes;
    g.page_size = config_.page_size;
    g.head_num = config_.model.kv_head_num;
    const int64_t bytes = g.buffer_bytes() * config_.model.num_buffers();
    try {
      memory_.assign(static_cast<size_t>(bytes), std::byte{0});
    } catch (const std::bad_alloc&) {
      return Status::OutOfMemory(fmt::format(
          "the device pool ({} slots of {} bytes) needs {:.2f} GiB of host memory on the cpu "
          "backend; lower --device-tokens",
          config_.device_slots, config_.model.kv_bytes_per_token(),
          static_cast<double>(bytes) / (1 << 30)));
    }
    region_.geometry = g;
    region_.mla = config_.model.mla;
    region_.memory = MemoryKind::kHost;
    region_.k = memory_.data();
    region_.v = config_.model.mla ? nullptr : memory_.data() + g.buffer_bytes();
    KVTIER_RETURN_IF_ERROR(region_.Validate("device pool"));
    MeasureCeiling();
    return Status::OK();
  }

  const KvRegion& device_region() const override { return region_; }
  TransferBackend backend() const override { return TransferBackend::kCpu; }
  CudaStream load_stream() const override { return nullptr; }
  CudaStream write_stream() const override { return nullptr; }
  Status BeginRequest() override { return Status::OK(); }

  Result<PrefillTiming> Prefill(const PrefillJob& job) override {
    PrefillTiming t;
    KVTIER_RETURN_IF_ERROR(VerifyHostSlots(region_, job.hit_slots, job.hit_hashes,
                                           config_.page_size, job.verify_sample, &t));
    if (!job.new_slots.empty()) {
      KVTIER_RETURN_IF_ERROR(FillKvPattern(region_, job.new_slots, job.new_hashes));
    }
    const auto [total, compute] =
        ModelPrefillMs(config_.compute_model, job.new_tokens, job.cached_tokens,
                       config_.chunk_tokens, config_.tflops, job.load_wall_ms);
    t.total_ms = total;
    t.compute_ms = compute;
    t.load_ms = job.load_wall_ms;
    return t;
  }

  double ceiling_bytes_per_s() const override { return ceiling_; }
  Result<double> DecodeStepMs(int64_t /*batch*/) override { return DecodeNeedsGemm(); }
  std::string Describe() const override {
    return fmt::format(
        "cpu: device pool in host memory ({:.2f} GiB); loads measured (wall "
        "clock), compute modelled at {:g} TFLOP/s; one-copy ceiling {:.1f} GB/s",
        static_cast<double>(memory_.size()) / (1 << 30), config_.tflops, ceiling_ / 1e9);
  }

 private:
  // One large memcpy (the cpu backend's ceiling, as `kvtier bench` measures it): the median of
  // three copies of 64 MiB.
  void MeasureCeiling() {
    const size_t bytes = size_t{64} << 20;
    std::vector<std::byte> a(bytes, std::byte{1}), b(bytes, std::byte{2});
    std::vector<double> s;
    for (int i = 0; i < 3; ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      std::memcpy(b.data(), a.data(), bytes);
      s.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    std::sort(s.begin(), s.end());
    ceiling_ = static_cast<double>(bytes) / std::max(s[1], 1e-9);
  }

  PrefillEngineConfig config_;
  std::vector<std::byte> memory_;
  KvRegion region_;
  double ceiling_ = 1e10;
};

}  // namespace

Result<std::unique_ptr<PrefillEngine>> MakeCpuPrefillEngine(const PrefillEngineConfig& config) {
  auto engine = std::make_unique<CpuPrefillEngine>(config);
  KVTIER_RETURN_IF_ERROR(engine->Init());
  return std::unique_ptr<PrefillEngine>(std::move(engine));
}

#if !defined(KVTIER_WITH_CUDA)
Result<std::unique_ptr<PrefillEngine>> MakeGpuPrefillEngine(const PrefillEngineConfig&) {
  return Status::Unavailable("kvtier was built without CUDA (KVTIER_CUDA=OFF): no GPU engine");
}
#endif

}  // namespace kvtier::tools
