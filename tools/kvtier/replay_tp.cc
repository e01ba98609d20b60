// `kvtier replay --tp N` (see replay_tp.h).
#include "replay_tp.h"

#include <fmt/format.h>
#include <signal.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <thread>

#include "kvtier/device.h"
#include "kvtier/eviction_policy.h"
#include "kvtier/hierarchical_cache.h"
#include "kvtier/host_pool.h"
#include "kvtier/testing/kv_pattern.h"
#include "kvtier/tp_group.h"
#include "replay_engine.h"
#include "replay_model.h"
#include "replay_tp_report.h"
#include "workload.h"

namespace kvtier::tools {
namespace {

using Clock = std::chrono::steady_clock;

// This thread's CPU time: a decision's cost without the time the thread waited or was preempted
// (the machine's other threads: storage I/O, other ranks).
double ThreadCpuSeconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

double MsSince(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

// MHA: each rank fills and checks the pattern under its own salt, so a rank holding another
// rank's bytes (or TP=1's) is caught. MLA: every rank holds the same latent (one salt): a
// follower reads what the leader, the one writer, stored.
uint64_t RankSalt(int rank, bool mla) {
  return KvPatternSalt(mla ? std::string("tp-latent") : fmt::format("tp-rank-{}", rank));
}

// Rank `rank`'s share of `m` in a group of `tp`: MHA splits the KV heads, MLA keeps the latent;
// the prefill's heads and MLP columns are split as tensor parallelism splits them.
Result<ReplayModel> ShardModel(const ReplayModel& m, int tp) {
  if (tp == 1) return m;
  if ((!m.mla && (m.kv_head_num % tp != 0 || m.slot_bytes % tp != 0)) || m.q_heads % tp != 0) {
    return Status::InvalidArgument(fmt::format(
        "--tp {}: model {} has {} KV heads and {} query heads, which do not split over {} ranks",
        tp, m.name, m.kv_head_num, m.q_heads, tp));
  }
  ReplayModel s = m;
  if (!m.mla) {
    s.slot_bytes = m.slot_bytes / tp;
    s.kv_head_num = m.kv_head_num / tp;
  }
  s.q_heads = m.q_heads / tp;
  s.attn_in_cols = m.attn_in_cols / tp;
  s.mlp_cols = m.mlp_cols / tp;
  return s;
}

// What a follower answers to a message that is not a step (StepMessage::report): its load
// counters since the last kResetLoads (TimedEngine), or 0 after resetting them.
// kLoadMedianBps: the median of its loads' bytes per second; kHostNode, kCpuNode: its host pool's
// and its thread's NUMA node + 1 (0: unknown); kCeilingBps: its engine's host -> device ceiling.
enum Report : uint32_t {
  kStep = 0,
  kLoadNs = 1,
  kLoadBytes = 2,
  kLoads = 3,
  kResetLoads = 4,
  kLoadMedianBps = 5,
  kHostNode = 6,
  kCpuNode = 7,
  kCeilingBps = 8,
};

// The step rank 0 publishes per request after its copies: flags, counts, then the tokens
// (hit + new), the matched slots and the new slots.
struct StepMessage {
  uint32_t warm = 0;    // warm-up: write and check, no compute
  uint32_t sample = 0;  // --verify sample
  uint32_t report = 0;  // not a step when set: a Report code, the rank's answer as its result
  int64_t cached_tokens = 0;
  int64_t new_tokens = 0;
  std::vector<int32_t> tokens;
  std::vector<int64_t> hit_slots, new_slots;

  std::vector<std::byte> Encode() const {
    const int64_t head[7] = {warm,
                             sample,
                             report,
                             cached_tokens,
                             new_tokens,
                             static_cast<int64_t>(hit_slots.size()),
                             static_cast<int64_t>(new_slots.size())};
    std::vector<std::byte> out(sizeof(head) + tokens.size() * 4 +
                               (hit_slots.size() + new_slots.size()) * 8);
    std::byte* p = out.data();
    auto put = [&p](const void* src, size_t n) {
      if (n > 0) std::memcpy(p, src, n);
      p += n;
    };
    put(head, sizeof(head));
    put(tokens.data(), tokens.size() * 4);
    put(hit_slots.data(), hit_slots.size() * 8);
    put(new_slots.data(), new_slots.size() * 8);
    return out;
  }
  static Result<StepMessage> Decode(std::span<const std::byte> in) {
    int64_t head[7];
    if (in.size() < sizeof(head)) return Status::Corruption("tp step: short message");
    std::memcpy(head, in.data(), sizeof(head));
    StepMessage m;
    m.warm = static_cast<uint32_t>(head[0]);
    m.sample = static_cast<uint32_t>(head[1]);
    m.report = static_cast<uint32_t>(head[2]);
    m.cached_tokens = head[3];
    m.new_tokens = head[4];
    const int64_t hits = head[5], fresh = head[6];
    if (hits < 0 || fresh < 0 || hits > (int64_t{1} << 32) || fresh > (int64_t{1} << 32) ||
        in.size() != sizeof(head) + static_cast<size_t>(hits + fresh) * 12) {
      return Status::Corruption("tp step: lengths do not match the message");
    }
    const std::byte* p = in.data() + sizeof(head);
    m.tokens.resize(static_cast<size_t>(hits + fresh));
    m.hit_slots.resize(static_cast<size_t>(hits));
    m.new_slots.resize(static_cast<size_t>(fresh));
    // An empty vector's data() may be null, which memcpy must not get even for 0 bytes.
    auto take = [&p](void* dst, size_t bytes) {
      if (bytes > 0) std::memcpy(dst, p, bytes);
      p += bytes;
    };
    take(m.tokens.data(), m.tokens.size() * 4);
    take(m.hit_slots.data(), m.hit_slots.size() * 8);
    take(m.new_slots.data(), m.new_slots.size() * 8);
    return m;
  }
};

// An engine that times every copy (synchronised on a GPU) and measures the host -> device copies
// (into `device`), the loads: rank 0's own (inside the leader's engine: without publishing and
// waiting for the ranks) and each follower's.
//
// A load's time is the device's: CUDA events recorded on the copy's stream right before and
// right after this rank's own copy, read once it finished (so neither host-side waits, the
// cache's decisions, the ring nor the other ranks count; work queued on the stream before the
// copy does not either: the first event completes after it). cpu: the copy is synchronous, its
// wall time. A load on the legacy default stream (a follower's ring applies its copies there)
// runs on `load_stream` instead when it is set (a follower's: its engine's load stream, as rank
// 0's LoadBack uses); it is synchronised here, before the call returns. Bytes: what
// this rank moved (its heads' part of each page for MHA at TP > 1, the whole latent for MLA).
class TimedEngine final : public TransferEngine {
 public:
  // `cuda_device` >= 0: a GPU engine on that device (load times from CUDA events).
  // `cpu`: measure the thread's CPU time of each copy too (two clock reads a copy, which the
  // group's wrapper around rank 0's own copies does without: its cost counts as decisions).
  static Result<std::unique_ptr<TimedEngine>> Create(std::unique_ptr<TransferEngine> inner,
                                                     const KvRegion& device, int cuda_device,
                                                     CudaStream load_stream, bool cpu = true) {
    auto e = std::unique_ptr<TimedEngine>(new TimedEngine(std::move(inner), device, load_stream));
    e->cpu_ = cpu;
    if (cuda_device >= 0) {
      KVTIER_ASSIGN_OR_RETURN(e->start_, CudaEventHandle::Create(cuda_device, /*timing=*/true));
      KVTIER_ASSIGN_OR_RETURN(e->stop_, CudaEventHandle::Create(cuda_device, /*timing=*/true));
      e->events_ = true;
    }
    return e;
  }
  TransferBackend backend() const override { return inner_->backend(); }
  Status Synchronize(CudaStream stream) override { return inner_->Synchronize(stream); }
  double seconds() const { return seconds_; }
  double cpu_seconds() const { return cpu_seconds_; }
  double load_seconds() const { return load_seconds_; }
  int64_t load_bytes() const { return load_bytes_; }
  int64_t loads() const { return loads_; }
  // The median of the loads' bytes per second, each copy's own; 0 without loads.
  double median_load_bytes_per_s() const {
    if (per_load_.empty()) return 0;
    std::vector<double> v = per_load_;
    const size_t mid = v.size() / 2;
    std::nth_element(v.begin(), v.begin() + static_cast<ptrdiff_t>(mid), v.end());
    if (v.size() % 2 == 1) return v[mid];
    const double upper = v[mid];
    return (upper + *std::max_element(v.begin(), v.begin() + static_cast<ptrdiff_t>(mid))) / 2;
  }
  // Starts the load counters afresh (the warm-up's loads are not measured).
  void ResetLoads() {
    load_seconds_ = 0;
    load_bytes_ = 0;
    loads_ = 0;
    per_load_.clear();
  }

 protected:
  Status DoTransfer(const TransferRequest& request, const TransferOptions& given) override {
    const bool to_device = request.dst->has_layer_table()
                               ? request.dst->k_layers.data() == device_.k_layers.data()
                               : request.dst->k == device_.k;
    TransferOptions options = given;
    if (to_device && options.stream == nullptr) options.stream = load_stream_;
    const bool gpu = inner_->backend() != TransferBackend::kCpu;
    const bool events = to_device && gpu && events_;
    const auto t0 = Clock::now();
    const double cpu0 = cpu_ ? ThreadCpuSeconds() : 0;
    Status st = events ? start_.Record(options.stream) : Status::OK();
    if (st.ok()) st = inner_->Transfer(request, options);
    if (st.ok() && events) st = stop_.Record(options.stream);
    if (st.ok() && gpu) st = inner_->Synchronize(options.stream);
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    seconds_ += s;
    if (cpu_) cpu_seconds_ += ThreadCpuSeconds() - cpu0;
    if (to_device && st.ok()) {
      double load_s = s;
      if (events) {
        Result<float> ms = stop_.ElapsedMsSince(start_);
        if (!ms.ok()) return ms.status().WithContext("timing a load with CUDA events");
        load_s = static_cast<double>(*ms) * 1e-3;
      }
      load_seconds_ += load_s;
      load_bytes_ += request.bytes();
      ++loads_;
      if (load_s > 0) per_load_.push_back(static_cast<double>(request.bytes()) / load_s);
    }
    return st;
  }

 private:
  TimedEngine(std::unique_ptr<TransferEngine> inner, const KvRegion& device, CudaStream load_stream)
      : inner_(std::move(inner)), device_(device), load_stream_(load_stream) {}
  std::unique_ptr<TransferEngine> inner_;
  KvRegion device_;
  CudaStream load_stream_;
  bool events_ = false;
  bool cpu_ = true;
  CudaEventHandle start_, stop_;
  // The cache calls its engine from one thread at a time here (backup_threads = 0, a
  // sequential replay); a follower's Serve is one thread.
  double seconds_ = 0, cpu_seconds_ = 0, load_seconds_ = 0;
  int64_t load_bytes_ = 0, loads_ = 0;
  std::vector<double> per_load_;  // bytes per second of each load
};

// The stores' per-call timeout (the leader's wrapper inherits it, and its calls include waiting
// for every rank): long, so that a loaded machine slows the passes down but never turns a storage
// hit into a timed-out miss in one pass and not the other.
constexpr std::chrono::milliseconds kStoreTimeout{60'000};

// Rank `rank`'s host pages (page_head, `head_num` heads) as a storage namespace.
StorageNamespace RankPages(const ReplayModel& rank_model, int64_t page_size, int64_t head_num,
                           int rank, int tp) {
  StorageNamespace ns;
  ns.model_id = rank_model.model_id;
  ns.layout = KvLayout::kPageHead;
  ns.mla = rank_model.mla;
  ns.num_layers = rank_model.num_layers;
  ns.slot_bytes = rank_model.slot_bytes;
  ns.page_size = page_size;
  ns.head_num = head_num;
  ns.tp_rank = rank;
  ns.tp_size = tp;
  return ns;
}

// One rank's prefill of a step; `cache` (rank 0) is waited on per layer. Its total in ms.
Result<double> RunStep(PrefillEngine& engine, const StepMessage& m, int rank, bool mla,
                       HierarchicalCache* cache, MatchHandle handle, PrefillTiming* timing) {
  const std::vector<uint64_t> hashes = KvPatternHashes(m.tokens, RankSalt(rank, mla));
  const std::span<const uint64_t> all(hashes);
  PrefillJob job;
  job.cache = cache;
  job.handle = handle;
  job.hit_slots = m.hit_slots;
  job.hit_hashes = all.first(m.hit_slots.size());
  job.new_slots = m.new_slots;
  job.new_hashes = all.subspan(m.hit_slots.size());
  job.verify_sample = m.sample != 0;
  job.skip_compute = m.warm != 0;
  job.cached_tokens = m.cached_tokens;
  job.new_tokens = m.new_tokens;
  KVTIER_ASSIGN_OR_RETURN(*timing, engine.Prefill(job));
  if (timing->wrong_bytes > 0) {
    return Status::Corruption(fmt::format("tp rank {}: {} wrong bytes; first: {}", rank,
                                          timing->wrong_bytes, timing->first_wrong));
  }
  return timing->total_ms;
}

struct Setup {
  ReplayOptions o;
  int tp = 1;
  bool gpu = false;
  TransferBackend io = TransferBackend::kCpu;
  ReplayModel model{};          // the whole model's KV
  ReplayModel compute_model{};  // the whole model's compute
  Workload workload;            // warm-up requests first
  int64_t device_slots = 0;
  int64_t host_slots = 0;
  int64_t max_context = 1;
  std::string store_dir;  // --storage file: one file store per pass under it (empty: none)
  int64_t store_bytes = 0;
  std::string store_suffix;  // of the pass's store directory (tp<N><suffix>)
  int first_gpu = 0;         // rank r runs on GPU (first_gpu + r) % GPUs (rank 0's TP=1 passes)
  // The CUDA device of rank `rank` (0 on the cpu device).
  int DeviceOf(int rank) const {
    return gpu ? (first_gpu + rank) % std::max(1, CudaDeviceCount()) : 0;
  }
  std::string StoreUrl(int tp) const {
    if (store_dir.empty()) return "";
    return fmt::format("file://{}/tp{}{}?capacity={}", store_dir, tp, store_suffix, store_bytes);
  }
};

Result<std::unique_ptr<PrefillEngine>> MakeEngine(const Setup& s, int tp, int rank) {
  PrefillEngineConfig ec;
  KVTIER_ASSIGN_OR_RETURN(ec.model, ShardModel(s.model, tp));
  KVTIER_ASSIGN_OR_RETURN(ec.compute_model, ShardModel(s.compute_model, tp));
  ec.device_slots = s.device_slots;
  ec.page_size = s.o.page_size;
  ec.compute = (s.o.compute == "gemm" || (s.o.compute == "auto" && s.gpu)) ? ComputeMode::kGemm
                                                                           : ComputeMode::kModel;
  ec.tflops = s.o.tflops;
  ec.chunk_tokens = s.o.chunk_tokens;
  ec.max_context = s.max_context;
  ec.device = s.DeviceOf(rank);
  return s.gpu ? MakeGpuPrefillEngine(ec) : MakeCpuPrefillEngine(ec);
}

// Serves every request at `tp` ranks (rank 0 here; the followers through `leader`).
Status RunPass(const Setup& s, int tp, TpLeader* leader, TpPassResult* out) {
  const int64_t P = s.o.page_size;
  KVTIER_ASSIGN_OR_RETURN(std::unique_ptr<PrefillEngine> engine, MakeEngine(s, tp, 0));
  KVTIER_ASSIGN_OR_RETURN(const ReplayModel rank_model, ShardModel(s.model, tp));
  HierarchicalCacheConfig c;
  c.page_size = s.o.page_size;
  c.host_layout = *ParseLayout(s.o.host_layout);
  c.device_eviction = *ParseEvictionPolicy(s.o.eviction);
  c.host_eviction = c.device_eviction;
  c.transfer_backend = s.io;
  c.transfer.device = s.DeviceOf(0);
  c.load_back_min_tokens = s.o.load_back_threshold;
  c.backup_threads = 0;  // sequential and deterministic: equal hits at every TP size
  c.write_policy = *ParseWritePolicy(s.o.write_policy);
  c.write_through_threshold = s.o.write_through_threshold;
  // Equal pages per rank at every TP size: the capacity in whole pages of this rank's bytes.
  c.host_capacity_bytes = s.host_slots * rank_model.kv_bytes_per_token();
  c.host_ratio = s.host_slots > 0 ? c.host_ratio : 0;
  const KvRegion& device = engine->device_region();
  // The cache's engine: rank 0's own copies, timed (inner); at TP > 1 inside the leader's engine,
  // which times itself (TpLeaderStats::engine_seconds): that less inner is the group's part
  // (publish, wait for the ranks). No timing wrapper around the leader's engine: its request
  // check would count as the group's decision CPU, a cost of measuring that TP=1 does not pay.
  KVTIER_ASSIGN_OR_RETURN(std::unique_ptr<TransferEngine> real,
                          MakeTransferEngine(s.io, c.transfer));
  const int cuda_device = s.gpu ? s.DeviceOf(0) : -1;
  KVTIER_ASSIGN_OR_RETURN(std::unique_ptr<TimedEngine> inner_owned,
                          TimedEngine::Create(std::move(real), device, cuda_device, nullptr));
  TimedEngine* inner = inner_owned.get();
  std::unique_ptr<TransferEngine> given = std::move(inner_owned);
  if (leader != nullptr) given = leader->WrapEngine(std::move(given), device);
  // Wall seconds in the cache's engine so far: the leader's engine's (its own copies included).
  auto engine_seconds = [&] {
    return leader != nullptr ? leader->stats().engine_seconds : inner->seconds();
  };
  const std::string store = s.StoreUrl(tp);
  if (!store.empty()) {
    // The per-head store (shared across TP sizes), one per pass so that each starts empty.
    c.host_layout = KvLayout::kPageHead;
    c.storage.prefetch_policy = *ParsePrefetchPolicy(s.o.prefetch_policy);
    c.storage.prefetch_threshold_tokens = s.o.prefetch_threshold;
    StorageOptions so;
    so.io_threads = s.o.storage_io_threads;
    so.timeout = kStoreTimeout;
    KVTIER_ASSIGN_OR_RETURN(
        std::shared_ptr<StorageBackend> own,
        OpenTpRankStorage(store, RankPages(rank_model, P, device.geometry.head_num, 0, tp), so));
    c.storage.backend =
        leader != nullptr ? leader->WrapStorage(std::move(own), !s.model.mla) : std::move(own);
    if (c.storage.backend == nullptr) {
      return Status::Unavailable("tp: the leader's storage threads could not be started");
    }
  }
  KVTIER_ASSIGN_OR_RETURN(std::unique_ptr<HierarchicalCache> cache,
                          HierarchicalCache::Create(c, device, std::move(given)));
  if (leader != nullptr) {
    // The followers size their host pages from the leader's shape; it must be the cache's.
    if (cache->host_region().geometry.num_slots != s.host_slots) {
      return Status::Internal(fmt::format("tp: the cache made {} host slots, the group expects {}",
                                          cache->host_region().geometry.num_slots, s.host_slots));
    }
    leader->SetHostRegion(cache->host_region());
  }
  out->tp = tp;
  const auto wall0 = Clock::now();
  const int64_t n = static_cast<int64_t>(s.workload.requests.size());
  for (int64_t i = 0; i < n; ++i) {
    const bool warm = i < s.o.warmup;
    if (i == s.o.warmup) {
      // The measured loads start here, on every rank: the same requests' loads at every TP size.
      inner->ResetLoads();
      if (leader != nullptr) {
        StepMessage reset;
        reset.report = kResetLoads;
        KVTIER_ASSIGN_OR_RETURN(const uint64_t seq, leader->PublishMessage(reset.Encode()));
        KVTIER_RETURN_IF_ERROR(leader->WaitApplied(seq));
      }
    }
    const WorkloadRequest& req = s.workload.requests[static_cast<size_t>(i)];
    const std::vector<int32_t> tokens = PromptTokens(req);
    const std::span<const Token> prompt(tokens.data(), tokens.size());
    // Times a cache call: all of it, and the part in the engine the cache was given.
    // CPU: the call's less rank 0's own copies' (as at TP=1), so everything the thread does for
    // the group (validating and encoding a record, publishing it, waking and waiting for the
    // ranks, checking them) counts as the decision's.
    double call_s = 0, engine_s = 0, own_s = 0, call_cpu_s = 0, own_cpu_s = 0;
    auto timed = [&](TpCall kind, auto&& call) {
      const double outer0 = engine_seconds(), inner0 = inner->seconds();
      const double own_cpu0 = inner->cpu_seconds(), cpu0 = ThreadCpuSeconds();
      const auto t = Clock::now();
      auto r = call();
      call_s += std::chrono::duration<double>(Clock::now() - t).count();
      const double cpu_s = ThreadCpuSeconds() - cpu0;
      const double copy_cpu_s = inner->cpu_seconds() - own_cpu0;
      call_cpu_s += cpu_s;
      own_cpu_s += copy_cpu_s;
      engine_s += engine_seconds() - outer0;
      own_s += inner->seconds() - inner0;
      if (!warm) out->call_cpu_ms[static_cast<size_t>(kind)] += (cpu_s - copy_cpu_s) * 1e3;
      return r;
    };
    KVTIER_ASSIGN_OR_RETURN(MatchResult m,
                            timed(TpCall::kMatch, [&] { return cache->Match(prompt); }));
    KVTIER_RETURN_IF_ERROR(engine->BeginRequest());
    const auto t0 = Clock::now();
    int64_t from_storage = 0;
    if (!store.empty()) {
      KVTIER_RETURN_IF_ERROR(
          timed(TpCall::kQueryStorage, [&] { return cache->QueryStorage(m.handle); }).status());
      KVTIER_RETURN_IF_ERROR(
          timed(TpCall::kPrefetch, [&] { return cache->Prefetch(m.handle); }).status());
      const auto w = Clock::now();
      KVTIER_ASSIGN_OR_RETURN(PrefetchResult done, cache->FinishPrefetch(m.handle));
      out->storage_wait_s += std::chrono::duration<double>(Clock::now() - w).count();
      from_storage = done.arrived_tokens;
    }
    Result<LoadBackResult> lb =
        timed(TpCall::kLoadBack, [&] { return cache->LoadBack(m.handle, engine->load_stream()); });
    const double load_ms = MsSince(t0);
    StepMessage step;
    if (lb.ok()) {
      step.hit_slots = std::move(lb->device_slots);
    } else if (lb.status().IsOutOfMemory()) {
      step.hit_slots = m.device_slots;  // no room to load: the host part is recomputed
    } else {
      return lb.status().WithContext(fmt::format("request {}", i));
    }
    const int64_t hit = static_cast<int64_t>(step.hit_slots.size());
    const int64_t whole = req.input_length / P * P;
    if (whole > hit) {
      KVTIER_ASSIGN_OR_RETURN(step.new_slots, timed(TpCall::kAllocate, [&] {
                                return cache->AllocateDeviceSlots(whole - hit,
                                                                  {.allow_fewer = true});
                              }));
    }
    step.warm = warm;
    step.sample = s.o.verify == "sample";
    step.cached_tokens = hit;
    step.new_tokens = req.input_length - hit;
    const size_t covered = static_cast<size_t>(hit) + step.new_slots.size();
    step.tokens.assign(tokens.begin(), tokens.begin() + static_cast<ptrdiff_t>(covered));
    uint64_t seq = 0;
    if (leader != nullptr) {
      KVTIER_ASSIGN_OR_RETURN(seq, leader->PublishMessage(step.Encode()));
    }
    PrefillTiming timing;
    KVTIER_ASSIGN_OR_RETURN(double prefill_ms,
                            RunStep(*engine, step, 0, s.model.mla, cache.get(), m.handle, &timing));
    double slowest = prefill_ms;
    if (leader != nullptr) {
      KVTIER_RETURN_IF_ERROR(leader->WaitApplied(seq).WithContext(fmt::format("request {}", i)));
      for (int r = 1; r < tp; ++r) {
        KVTIER_ASSIGN_OR_RETURN(const uint64_t ns, leader->MessageResult(r, seq));
        slowest = std::max(slowest, static_cast<double>(ns) / 1e6);
      }
    }
    std::vector<int64_t> slots = step.hit_slots;
    slots.insert(slots.end(), step.new_slots.begin(), step.new_slots.end());
    if (!slots.empty()) {
      InsertOptions io;
      io.stream = engine->write_stream();
      KVTIER_RETURN_IF_ERROR(
          timed(TpCall::kInsert,
                [&] { return cache->Insert(prompt.first(slots.size()), slots, "", io); })
              .status()
              .WithContext("Insert"));
    }
    KVTIER_RETURN_IF_ERROR(timed(TpCall::kRelease, [&] { return cache->Release(m.handle); }));
    if (!store.empty()) {
      // Every backup (host and storage, on every rank) lands before the next request, so the
      // storage hits do not depend on how fast the store writes: equal at every TP size.
      KVTIER_RETURN_IF_ERROR(cache->WaitForBackups().WithContext("settling the backups"));
    }
    if (warm) continue;
    ++out->requests;
    out->prompt_tokens += req.input_length;
    const int64_t device_hit = std::min(hit, m.device_tokens);
    const int64_t storage_hit = std::min(hit - device_hit, from_storage);
    out->device_hit += device_hit;
    out->storage_hit += storage_hit;
    out->host_hit += std::max<int64_t>(0, hit - device_hit - storage_hit);
    out->decide_ms.push_back((call_s - engine_s) * 1e3);
    out->decide_cpu_ms.push_back((call_cpu_s - own_cpu_s) * 1e3);
    out->group_ms.push_back((engine_s - own_s) * 1e3);
    out->copy_ms.push_back(own_s * 1e3);
    out->loaded += lb.ok() ? lb->loaded_tokens : 0;
    out->bytes_checked += timing.bytes_checked;
    out->ttft_ms.push_back(load_ms + slowest);
    out->slowest_rank_excess_ms += slowest - prefill_ms;
    if (s.o.progress && (out->requests % 100 == 0)) {
      std::fprintf(stderr, "  tp %d: %lld requests\n", tp, static_cast<long long>(out->requests));
    }
  }
  KVTIER_RETURN_IF_ERROR(cache->WaitForBackups());
  KVTIER_RETURN_IF_ERROR(cache->CheckConsistency());
  out->cache = cache->stats();
  out->wall_s = std::chrono::duration<double>(Clock::now() - wall0).count();
  out->load_bytes = {inner->load_bytes()};
  out->load_seconds = {inner->load_seconds()};
  out->loads = {inner->loads()};
  out->load_gbps_median = {inner->median_load_bytes_per_s() / 1e9};
  out->placement.assign(static_cast<size_t>(tp), TpPlacement{});
  for (int r = 0; r < tp; ++r) {
    TpPlacement& pl = out->placement[static_cast<size_t>(r)];
    if (s.gpu) {
      pl.gpu = s.DeviceOf(r);
      pl.pci_bus_id = GpuPciBusId(pl.gpu);
      pl.gpu_numa_node = PciNumaNode(pl.pci_bus_id);
    }
  }
  out->placement[0].host_numa_node = MemoryNumaNode(cache->host_region().k);
  out->placement[0].cpu_numa_node = CpuNumaNode();
  out->placement[0].ceiling_gbps = engine->ceiling_bytes_per_s() / 1e9;
  if (leader != nullptr) {
    // Each follower's loads of the measured requests (the same slots as rank 0's; its bytes),
    // and where it ran.
    constexpr int kAsks = 7;
    const Report asks[kAsks] = {kLoadNs,   kLoadBytes, kLoads,     kLoadMedianBps,
                                kHostNode, kCpuNode,   kCeilingBps};
    uint64_t answer[kAsks] = {};
    out->load_bytes.resize(static_cast<size_t>(tp));
    out->load_seconds.resize(static_cast<size_t>(tp));
    out->loads.resize(static_cast<size_t>(tp));
    out->load_gbps_median.resize(static_cast<size_t>(tp));
    uint64_t seqs[kAsks];
    for (int k = 0; k < kAsks; ++k) {
      StepMessage ask;
      ask.report = asks[k];
      KVTIER_ASSIGN_OR_RETURN(seqs[k], leader->PublishMessage(ask.Encode()));
      KVTIER_RETURN_IF_ERROR(leader->WaitApplied(seqs[k]));
    }
    for (int r = 1; r < tp; ++r) {
      for (int k = 0; k < kAsks; ++k) {
        KVTIER_ASSIGN_OR_RETURN(answer[k], leader->MessageResult(r, seqs[k]));
      }
      const size_t i = static_cast<size_t>(r);
      out->load_seconds[i] = static_cast<double>(answer[0]) / 1e9;
      out->load_bytes[i] = static_cast<int64_t>(answer[1]);
      out->loads[i] = static_cast<int64_t>(answer[2]);
      out->load_gbps_median[i] = static_cast<double>(answer[3]) / 1e9;
      out->placement[i].host_numa_node = static_cast<int>(answer[4]) - 1;
      out->placement[i].cpu_numa_node = static_cast<int>(answer[5]) - 1;
      out->placement[i].ceiling_gbps = static_cast<double>(answer[6]) / 1e9;
    }
    out->ring = leader->stats();
  }
  return Status::OK();
}

// A follower rank: its own device pool (its heads), host pages of the leader's shape, its engine;
// applies every record until rank 0 closes the ring.
Status RunFollower(const Setup& s, const TpReplayArgs& a) {
  TpGroupConfig gc;
  gc.name = a.group;
  gc.tp_size = a.tp;
  gc.ack_timeout_s = a.ack_timeout_s;
  gc.follower_poll_s = a.follower_poll_s;
  gc.follower_doze_s = a.follower_doze_s;
  gc.leader_poll_s = a.leader_poll_s;
  gc.ack_each_copy = a.ack_each_copy;
  KVTIER_ASSIGN_OR_RETURN(std::unique_ptr<TpFollower> f, TpFollower::Attach(gc, a.rank));
  KVTIER_ASSIGN_OR_RETURN(std::unique_ptr<PrefillEngine> engine, MakeEngine(s, a.tp, a.rank));
  KVTIER_ASSIGN_OR_RETURN(const ReplayModel rank_model, ShardModel(s.model, a.tp));
  const TpShape shape = f->shape();
  KvRegion host_region;
  std::unique_ptr<HostKvPool> host;
  if (shape.host_slots > 0) {
    HostKvPoolConfig hc;
    hc.geometry = engine->device_region().geometry;
    hc.geometry.layout = a.store.empty() ? *ParseLayout(s.o.host_layout) : KvLayout::kPageHead;
    hc.geometry.head_num = rank_model.kv_head_num;
    hc.mla = rank_model.mla;
    hc.capacity_bytes = shape.host_slots * rank_model.kv_bytes_per_token();
    KVTIER_ASSIGN_OR_RETURN(host, HostKvPool::Create(hc));
    host_region = host->region();
  }
  TransferEngineConfig tc;
  tc.device = s.DeviceOf(a.rank);
  KVTIER_ASSIGN_OR_RETURN(std::unique_ptr<TransferEngine> real, MakeTransferEngine(s.io, tc));
  KVTIER_ASSIGN_OR_RETURN(std::unique_ptr<TimedEngine> copier,
                          TimedEngine::Create(std::move(real), engine->device_region(),
                                              s.gpu ? tc.device : -1, engine->load_stream()));
  std::shared_ptr<StorageBackend> store;
  if (!a.store.empty()) {
    StorageOptions so;
    so.io_threads = s.o.storage_io_threads;
    so.timeout = kStoreTimeout;
    KVTIER_ASSIGN_OR_RETURN(
        store,
        OpenTpRankStorage(
            a.store,
            RankPages(rank_model, s.o.page_size, host_region.geometry.head_num, a.rank, a.tp), so));
  }
  auto on_step = [&](std::span<const std::byte> msg) -> Result<uint64_t> {
    KVTIER_ASSIGN_OR_RETURN(StepMessage step, StepMessage::Decode(msg));
    switch (step.report) {
      case kStep:
        break;
      case kLoadNs:
        return static_cast<uint64_t>(copier->load_seconds() * 1e9);
      case kLoadBytes:
        return static_cast<uint64_t>(copier->load_bytes());
      case kLoads:
        return static_cast<uint64_t>(copier->loads());
      case kResetLoads:
        copier->ResetLoads();
        return uint64_t{0};
      case kLoadMedianBps:
        return static_cast<uint64_t>(copier->median_load_bytes_per_s());
      case kHostNode:
        return static_cast<uint64_t>(MemoryNumaNode(host_region.k) + 1);
      case kCpuNode:
        return static_cast<uint64_t>(CpuNumaNode() + 1);
      case kCeilingBps:
        return static_cast<uint64_t>(engine->ceiling_bytes_per_s());
      default:
        return Status::Corruption(fmt::format("tp step: unknown report code {}", step.report));
    }
    KVTIER_RETURN_IF_ERROR(engine->BeginRequest());
    PrefillTiming timing;
    KVTIER_ASSIGN_OR_RETURN(double ms,
                            RunStep(*engine, step, a.rank, s.model.mla, nullptr, {}, &timing));
    return static_cast<uint64_t>(ms * 1e6);  // ns
  };
  for (;;) {
    KVTIER_ASSIGN_OR_RETURN(TpServeResult r, f->Serve(*copier, engine->device_region(), host_region,
                                                      1.0, on_step, store.get()));
    if (r == TpServeResult::kClosed) return Status::OK();
  }
}

// Starts ranks 1 .. tp-1 as copies of this process with the follower flags.
std::vector<pid_t> StartFollowers(const TpReplayArgs& a, const std::string& group,
                                  const std::string& store,
                                  const std::vector<std::string>& self_args) {
  std::vector<pid_t> pids;
  for (int r = 1; r < a.tp; ++r) {
    std::vector<std::string> args = {"/proc/self/exe"};
    args.insert(args.end(), self_args.begin(), self_args.end());
    for (const char* flag : {"--json", "--plot"}) {  // rank 0 writes the outputs
      auto it = std::find(args.begin(), args.end(), flag);
      if (it != args.end() && it + 1 != args.end()) args.erase(it, it + 2);
    }
    args.insert(args.end(), {"--tp-rank", std::to_string(r), "--tp-group", group});
    if (!store.empty()) args.insert(args.end(), {"--tp-store", store});
    std::vector<char*> argv;
    for (std::string& s : args) argv.push_back(s.data());
    argv.push_back(nullptr);
    std::fflush(nullptr);
    const pid_t pid = fork();
    if (pid == 0) {
      execv(argv[0], argv.data());
      std::fprintf(stderr, "kvtier replay --tp: exec of rank %d failed: %s\n", r,
                   std::strerror(errno));
      _exit(127);
    }
    if (pid > 0) pids.push_back(pid);
  }
  return pids;
}

// Waits up to `seconds` for each follower to exit, then kills it. True when all exited with 0.
bool ReapFollowers(const std::vector<pid_t>& pids, double seconds) {
  bool clean = true;
  const auto deadline = Clock::now() + std::chrono::milliseconds(static_cast<int>(seconds * 1e3));
  for (pid_t pid : pids) {
    int status = 0;
    for (;;) {
      const pid_t r = waitpid(pid, &status, WNOHANG);
      if (r == pid) break;
      if (r < 0 || Clock::now() > deadline) {
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
        clean = false;
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    clean = clean && WIFEXITED(status) && WEXITSTATUS(status) == 0;
  }
  return clean;
}

void RemoveStore(const Setup& s) {
  if (s.store_dir.empty()) return;
  std::error_code ec;
  std::filesystem::remove_all(s.store_dir, ec);
}

}  // namespace

void AddTpReplayFlags(CLI::App* replay, TpReplayArgs* a) {
  replay
      ->add_option("--tp", a->tp,
                   "tensor-parallel ranks: one process per rank (GPU, or cpu device), one cache "
                   "decision per group; serves the requests at TP=1 first and compares "
                   "(sequential; --storage file or none: a file store of per-head objects per "
                   "pass, host layout page_head)")
      ->check(CLI::Range(1, 8))
      ->capture_default_str();
  replay->add_flag(
      "--tp-equal-bytes", a->equal_bytes,
      "--tp: also serve the requests at TP=1 on each rank's GPU at that rank's bytes per copy "
      "(MHA: one rank's share of the KV heads; MLA: the whole latent), each rank's load "
      "bandwidth baseline on its own GPU (the cpu device: one such pass for every rank)");
  replay
      ->add_option("--tp-timeout", a->ack_timeout_s,
                   "--tp: seconds rank 0 waits for a rank to apply a decision before failing")
      ->check(CLI::Range(0.1, 3600.0))
      ->capture_default_str();
  replay
      ->add_option("--tp-follower-poll", a->follower_poll_s,
                   "--tp: seconds a follower polls the ring after a record before it sleeps "
                   "(its CPU for the leader's: no wake system call when it is awake; 0: sleep at "
                   "once)")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  replay
      ->add_option("--tp-follower-doze", a->follower_doze_s,
                   "--tp: seconds after its last record a follower, its poll over, looks at the "
                   "ring every 50 us instead of sleeping (no wake call for rank 0; 0: sleep)")
      ->check(CLI::Range(0.0, 60.0))
      ->capture_default_str();
  replay
      ->add_option("--tp-leader-poll", a->leader_poll_s,
                   "--tp: seconds rank 0 polls for the ranks' acknowledgements before it sleeps")
      ->check(CLI::Range(0.0, 0.01))
      ->capture_default_str();
  replay->add_flag("--tp-ack-each-copy", a->ack_each_copy,
                   "--tp: rank 0 waits for every rank after each of its cache's copies (default: "
                   "the step's wait covers them; TpGroupConfig::ack_each_copy)");
  replay->add_option("--tp-rank", a->rank)->group("")->check(CLI::Range(1, 7));
  replay->add_option("--tp-group", a->group)->group("");
  replay->add_option("--tp-store", a->store)->group("");
}

int RunReplayTp(const ReplayOptions& options, const TpReplayArgs& a,
                const std::vector<std::string>& self_args) {
  const char* who = a.rank > 0 ? "kvtier replay (tp rank)" : "kvtier replay --tp";
  auto fail = [&](const Status& st, int code) {
    std::fprintf(stderr, "%s%s: %s\n", who, a.rank > 0 ? fmt::format(" {}", a.rank).c_str() : "",
                 st.ToString().c_str());
    return code;
  };
  Setup s;
  s.o = options;
  s.tp = a.tp;
  if (Status st = s.o.Validate(); !st.ok()) return fail(st, 2);
  if (a.rank > 0 && a.group.empty()) return fail(Status::InvalidArgument("--tp-group missing"), 2);
  if (s.o.host_tokens == -1) s.o.host_tokens = 4 * s.o.device_tokens;
  if (!s.o.shared_host.empty()) {
    return fail(Status::InvalidArgument("--tp: --shared-host is not supported with --tp"), 2);
  }
  auto model = FindReplayModel(s.o.model);
  if (!model.ok()) return fail(model.status(), 2);
  s.model = *model;
  s.compute_model = s.o.compute_model.empty() ? s.model : *FindReplayModel(s.o.compute_model);
  if (Status st = ShardModel(s.model, a.tp).status(); !st.ok()) return fail(st, 2);
  if (Status st = ShardModel(s.compute_model, a.tp).status(); !st.ok()) return fail(st, 2);
  if (Status st = LoadWorkload(s.o, &s.workload); !st.ok()) return fail(st, 2);
  const bool have_gpu = CudaDeviceCount() > 0;
  if (s.o.device == "gpu" && !have_gpu) {
    return fail(Status::Unavailable("--device gpu: no GPU is present (or built without CUDA)"), 1);
  }
  s.gpu = s.o.device == "gpu" || (s.o.device == "auto" && have_gpu);
  if (!s.gpu && s.o.io_backend != "auto" && s.o.io_backend != "cpu") {
    return fail(Status::InvalidArgument("--hicache-io-backend needs a GPU for this run"), 2);
  }
  s.io = TransferBackend::kCpu;
  if (s.gpu) {
    Result<TransferBackend> io =
        ParseTransferBackend(s.o.io_backend == "auto" ? "kernel" : s.o.io_backend);
    if (!io.ok() || *io == TransferBackend::kCpu) {
      return fail(Status::InvalidArgument("--hicache-io-backend: kernel, dma or auto on a GPU"), 2);
    }
    s.io = *io;
  }
  const int64_t P = s.o.page_size;
  s.device_slots = (s.o.device_tokens + P - 1) / P * P;
  s.host_slots = s.o.host_tokens / P * P;
  for (const WorkloadRequest& r : s.workload.requests) {
    s.max_context = std::max(s.max_context, r.input_length);
  }
  if (a.rank > 0) {
    Status st = RunFollower(s, a);
    return st.ok() ? 0 : fail(st, 1);
  }
  if (s.o.storage != "none" && s.o.storage != "file") {
    return fail(Status::InvalidArgument(fmt::format(
                    "--tp: --storage {} is not supported; file (a file store of per-head "
                    "objects per pass) or none",
                    RedactUrl(s.o.storage))),
                2);
  }
  if (s.o.storage == "file") {
    const char* tmp = std::getenv("TMPDIR");
    std::string templ =
        fmt::format("{}/kvtier-replay-tp-XXXXXX", tmp != nullptr && *tmp != '\0' ? tmp : "/tmp");
    if (mkdtemp(templ.data()) == nullptr) {
      return fail(Status::IOError(fmt::format("cannot create a temporary directory {}", templ)), 1);
    }
    s.store_dir = templ;
    // Room for every page the run can store (every request's whole pages, the whole model's
    // bytes; a pass's TP size does not change them): the store never evicts, so storage hits
    // are the same at every TP size. (An evicting store is not: the ranks' writes of one page
    // interleave differently at TP=1 and TP=2, and so does what the store evicts first.) The
    // bound is a limit, not an allocation: the disk holds only the distinct pages.
    int64_t prompt_pages = 0;
    for (const WorkloadRequest& r : s.workload.requests) prompt_pages += r.input_length / P;
    const int64_t all_bytes = prompt_pages * P * s.model.kv_bytes_per_token();
    s.store_bytes =
        s.o.storage_bytes > 0 ? s.o.storage_bytes : std::max<int64_t>(all_bytes, int64_t{64} << 20);
  }

  TpPassResult tp1, tpn, tp1_shard;
  Status st = RunPass(s, 1, nullptr, &tp1);
  if (!st.ok()) {
    RemoveStore(s);
    return fail(st.WithContext("TP=1"), 1);
  }
  const bool shard_pass = a.equal_bytes && !s.model.mla && a.tp > 1;
  // --tp-equal-bytes: rank r's load baseline is a TP=1 pass on rank r's GPU at rank r's bytes
  // per copy (MHA: one rank's share of the KV heads; MLA: the whole latent, which on GPU 0 is
  // the TP=1 pass itself), each with its own store; the cpu device has one baseline for all.
  std::vector<TpPassResult> own_gpu_passes;
  std::vector<const TpPassResult*> own_gpu;
  if (a.equal_bytes && a.tp > 1) {
    const int gpus = s.gpu ? a.tp : 1;
    own_gpu_passes.resize(static_cast<size_t>(gpus));
    for (int r = 0; r < gpus; ++r) {
      if (s.model.mla && r == 0) continue;  // TP=1 itself
      Setup e = s;
      if (!s.model.mla) e.model = *ShardModel(s.model, a.tp);
      e.first_gpu = s.DeviceOf(r);
      e.store_suffix = fmt::format("-gpu{}", r);
      st = RunPass(e, 1, nullptr, &own_gpu_passes[static_cast<size_t>(r)]);
      if (!st.ok()) {
        RemoveStore(s);
        return fail(
            st.WithContext(fmt::format("TP=1 on rank {}'s device at its bytes per copy", r)), 1);
      }
    }
    for (int r = 0; r < a.tp; ++r) {
      const size_t i = static_cast<size_t>(std::min(r, gpus - 1));
      own_gpu.push_back(s.model.mla && i == 0 ? &tp1 : &own_gpu_passes[i]);
    }
    // MHA: the baseline on GPU 0 is also the (GPU 0) equal-bytes pass of the earlier reports.
    if (shard_pass) tp1_shard = own_gpu_passes[0];
  }

  TpGroupConfig gc;
  gc.name = fmt::format("replay-tp.{}", getpid());
  gc.tp_size = a.tp;
  gc.ack_timeout_s = a.ack_timeout_s;
  gc.follower_poll_s = a.follower_poll_s;
  gc.follower_doze_s = a.follower_doze_s;
  gc.leader_poll_s = a.leader_poll_s;
  gc.ack_each_copy = a.ack_each_copy;
  TpReplayArgs fa = a;
  auto leader = TpLeader::Create(
      gc, TpShape{s.device_slots, s.host_slots, s.model.num_layers, P, s.model.mla});
  if (!leader.ok()) {
    RemoveStore(s);
    return fail(leader.status(), 1);
  }
  const std::vector<pid_t> pids = StartFollowers(fa, gc.name, s.StoreUrl(a.tp), self_args);
  st = static_cast<int>(pids.size()) == a.tp - 1
           ? (*leader)->WaitForFollowers()
           : Status::Unavailable("could not start the follower ranks");
  if (st.ok()) st = RunPass(s, a.tp, leader->get(), &tpn);
  leader->reset();  // closes the ring: the followers exit
  const bool followers_clean = ReapFollowers(pids, st.ok() ? 30 : 2);
  RemoveStore(s);
  if (!st.ok()) return fail(st.WithContext(fmt::format("TP={}", a.tp)), 1);
  if (!followers_clean) {
    return fail(Status::Internal("a follower rank did not exit cleanly (see its message above)"),
                1);
  }

  TpRunInfo info;
  info.tp = a.tp;
  info.workload = s.workload.name;
  info.warmup = s.o.warmup;
  info.model = s.model.name;
  info.mla = s.model.mla;
  info.gpu = s.gpu;
  info.io = TransferBackendName(s.io);
  info.storage = !s.store_dir.empty();
  info.command_line = s.o.command_line;
  info.json_path = s.o.json_path;
  Result<bool> equal = ReportTpPasses(info, tp1, tpn, shard_pass ? &tp1_shard : nullptr, own_gpu);
  if (!equal.ok()) return fail(equal.status(), 1);
  return *equal ? 0 : 1;
}

}  // namespace kvtier::tools
