// Rank 0's side of a pass of `kvtier replay --tp N` (replay_tp_pass.h): the cache, its decisions
// published to the followers, rank 0's share of every prefill, and what the pass measured.
#include "replay_tp_pass.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "kvtier/eviction_policy.h"
#include "kvtier/hierarchical_cache.h"
#include "kvtier/layout.h"
#include "kvtier/storage.h"
#include "kvtier/tp_leader_cache.h"
#include "replay_tp_rank.h"
#include "replay_tp_report.h"
#include "replay_tp_step.h"
#include "replay_tp_timed_engine.h"

namespace kvtier::tools {
namespace {

using Clock = std::chrono::steady_clock;

double MsSince(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

// The time of a request's cache calls (TimedCall): all of each call, the part in the engine the
// cache was given and rank 0's own copies in it, in wall and thread CPU seconds.
struct CallTimes {
  double call_s = 0, engine_s = 0, own_s = 0, call_cpu_s = 0, own_cpu_s = 0;
};

// Rank 0's side of one pass: the leader cache over rank 0's timed engine (Open), each request
// (Serve), and what the pass measured, the followers' part asked for over the ring (Finish).
class LeaderPass {
 public:
  LeaderPass(const TpSetup& s, int tp, TpLeader* leader, TpPassResult* out)
      : s_(s), tp_(tp), P_(s.o.cache.page_size), leader_(leader), out_(out) {}

  Status Open() {
    KVTIER_ASSIGN_OR_RETURN(engine_, MakeTpRankEngine(s_, tp_, 0));
    KVTIER_ASSIGN_OR_RETURN(rank_model_, TpRankModel(s_.model, tp_));
    // Every cache setting of the command line (ReplayOptions::cache), then what the pass decides.
    HierarchicalCacheConfig c = s_.o.cache;
    c.transfer_backend = s_.io;
    c.transfer.device = s_.DeviceOf(0);
    c.backup_threads = 0;  // sequential and deterministic: equal hits at every TP size
    // Equal pages per rank at every TP size: the capacity in whole pages of this rank's bytes.
    c.host_capacity_bytes = s_.host_slots * rank_model_.kv_bytes_per_token();
    c.host_ratio = s_.host_slots > 0 ? c.host_ratio : 0;
    const KvRegion& device = engine_->device_region();
    // The cache's engine: rank 0's own copies, timed (inner); at TP > 1 inside the leader's
    // engine, which times itself (TpLeaderStats::engine_seconds): that less inner is the group's
    // part (publish, wait for the ranks). No timing wrapper around the leader's engine: its
    // request check would count as the group's decision CPU, a cost of measuring that TP=1 does
    // not pay.
    KVTIER_ASSIGN_OR_RETURN(std::unique_ptr<TransferEngine> real,
                            MakeTransferEngine(s_.io, c.transfer));
    const int cuda_device = s_.gpu ? s_.DeviceOf(0) : -1;
    KVTIER_ASSIGN_OR_RETURN(std::unique_ptr<TpTimedEngine> inner_owned,
                            TpTimedEngine::Create(std::move(real), device, cuda_device, nullptr));
    inner_ = inner_owned.get();
    std::shared_ptr<StorageBackend> rank_store;
    store_ = s_.StoreUrl(tp_);
    if (!store_.empty()) {
      // The per-head store (shared across TP sizes), one per pass so that each starts empty.
      c.host_layout = KvLayout::kPageHead;
      StorageOptions so = c.storage.options;
      so.timeout = kTpStoreTimeout;
      KVTIER_ASSIGN_OR_RETURN(
          rank_store,
          OpenTpRankStorage(store_, TpRankPages(rank_model_, P_, device.geometry.head_num, 0, tp_),
                            so));
    }
    out_->cache_settings = TpCacheSettingsOf(c);
    // The followers size their host pages from the leader's shape (s_.host_slots); the cache
    // checks that it made as many.
    KVTIER_ASSIGN_OR_RETURN(cache_,
                            MakeTpLeaderCache(std::move(c), device, leader_, std::move(inner_owned),
                                              std::move(rank_store)));
    out_->tp = tp_;
    return Status::OK();
  }

  // The measured loads start here, on every rank: the same requests' loads at every TP size.
  Status ResetLoads() {
    inner_->ResetLoads();
    if (leader_ == nullptr) return Status::OK();
    TpStepMessage reset;
    reset.report = TpStepMessage::kResetLoads;
    KVTIER_ASSIGN_OR_RETURN(const uint64_t seq, leader_->PublishMessage(reset.Encode()));
    return leader_->WaitApplied(seq);
  }

  // Request `i`: the cache's calls (timed), the step published to the followers, rank 0's share
  // of the prefill, the slowest rank's time; recorded unless `warm`.
  Status Serve(int64_t i, bool warm) {
    const WorkloadRequest& req = s_.workload.requests[static_cast<size_t>(i)];
    const std::vector<int32_t> tokens = PromptTokens(req);
    const std::span<const Token> prompt(tokens.data(), tokens.size());
    CallTimes t;
    auto timed = [&](TpCall kind, auto&& call) { return TimedCall(kind, warm, &t, call); };
    KVTIER_ASSIGN_OR_RETURN(MatchResult m,
                            timed(TpCall::kMatch, [&] { return cache_->Match(prompt); }));
    KVTIER_RETURN_IF_ERROR(engine_->BeginRequest());
    const auto t0 = Clock::now();
    int64_t from_storage = 0;
    if (!store_.empty()) {
      KVTIER_RETURN_IF_ERROR(
          timed(TpCall::kQueryStorage, [&] { return cache_->QueryStorage(m.handle); }).status());
      KVTIER_RETURN_IF_ERROR(
          timed(TpCall::kPrefetch, [&] { return cache_->Prefetch(m.handle); }).status());
      const auto w = Clock::now();
      KVTIER_ASSIGN_OR_RETURN(PrefetchResult done, cache_->FinishPrefetch(m.handle));
      out_->storage_wait_s += std::chrono::duration<double>(Clock::now() - w).count();
      from_storage = done.arrived_tokens;
    }
    Result<LoadBackResult> lb = timed(
        TpCall::kLoadBack, [&] { return cache_->LoadBack(m.handle, engine_->load_stream()); });
    const double load_ms = MsSince(t0);
    TpStepMessage step;
    if (lb.ok()) {
      step.hit_slots = std::move(lb->device_slots);
    } else if (lb.status().IsOutOfMemory()) {
      step.hit_slots = m.device_slots;  // no room to load: the host part is recomputed
    } else {
      return lb.status().WithContext(fmt::format("request {}", i));
    }
    const int64_t hit = static_cast<int64_t>(step.hit_slots.size());
    const int64_t whole = req.input_length / P_ * P_;
    if (whole > hit) {
      KVTIER_ASSIGN_OR_RETURN(step.new_slots, timed(TpCall::kAllocate, [&] {
                                return cache_->AllocateDeviceSlots(whole - hit,
                                                                   {.allow_fewer = true});
                              }));
    }
    step.warm = warm;
    step.sample = s_.o.verify == "sample";
    step.cached_tokens = hit;
    step.new_tokens = req.input_length - hit;
    const size_t covered = static_cast<size_t>(hit) + step.new_slots.size();
    step.tokens.assign(tokens.begin(), tokens.begin() + static_cast<ptrdiff_t>(covered));
    PrefillTiming timing;
    KVTIER_ASSIGN_OR_RETURN(const StepMs slowest, RunStep(i, step, m.handle, &timing));
    std::vector<int64_t> slots = step.hit_slots;
    slots.insert(slots.end(), step.new_slots.begin(), step.new_slots.end());
    if (!slots.empty()) {
      InsertOptions io;
      io.stream = engine_->write_stream();
      KVTIER_RETURN_IF_ERROR(
          timed(TpCall::kInsert,
                [&] { return cache_->Insert(prompt.first(slots.size()), slots, "", io); })
              .status()
              .WithContext("Insert"));
    }
    KVTIER_RETURN_IF_ERROR(timed(TpCall::kRelease, [&] { return cache_->Release(m.handle); }));
    if (!store_.empty()) {
      // Every backup (host and storage, on every rank) lands before the next request, so the
      // storage hits do not depend on how fast the store writes: equal at every TP size.
      KVTIER_RETURN_IF_ERROR(cache_->WaitForBackups().WithContext("settling the backups"));
    }
    if (warm) return Status::OK();
    ++out_->requests;
    out_->prompt_tokens += req.input_length;
    const int64_t device_hit = std::min(hit, m.device_tokens);
    const int64_t storage_hit = std::min(hit - device_hit, from_storage);
    out_->device_hit += device_hit;
    out_->storage_hit += storage_hit;
    out_->host_hit += std::max<int64_t>(0, hit - device_hit - storage_hit);
    out_->decide_ms.push_back((t.call_s - t.engine_s) * 1e3);
    out_->decide_cpu_ms.push_back((t.call_cpu_s - t.own_cpu_s) * 1e3);
    out_->group_ms.push_back((t.engine_s - t.own_s) * 1e3);
    out_->copy_ms.push_back(t.own_s * 1e3);
    out_->loaded += lb.ok() ? lb->loaded_tokens : 0;
    out_->bytes_checked += timing.bytes_checked;
    out_->ttft_ms.push_back(load_ms + slowest.max_ms);
    out_->slowest_rank_excess_ms += slowest.max_ms - slowest.own_ms;
    if (s_.o.progress && (out_->requests % 100 == 0)) {
      std::fprintf(stderr, "  tp %d: %lld requests\n", tp_, static_cast<long long>(out_->requests));
    }
    return Status::OK();
  }

  // After the last request: the backups settled, the cache checked, its stats, rank 0's loads
  // and placement, and the followers' (asked for over the ring).
  // `wall0`: when the first request began.
  Status Finish(Clock::time_point wall0) {
    KVTIER_RETURN_IF_ERROR(cache_->WaitForBackups());
    KVTIER_RETURN_IF_ERROR(cache_->CheckConsistency());
    out_->cache = cache_->stats();
    out_->wall_s = std::chrono::duration<double>(Clock::now() - wall0).count();
    out_->load_bytes = {inner_->load_bytes()};
    out_->load_seconds = {inner_->load_seconds()};
    out_->loads = {inner_->loads()};
    out_->load_gbps_median = {inner_->median_load_bytes_per_s() / 1e9};
    out_->placement.assign(static_cast<size_t>(tp_), TpPlacement{});
    for (int r = 0; r < tp_; ++r) {
      TpPlacement& pl = out_->placement[static_cast<size_t>(r)];
      if (s_.gpu) {
        pl.gpu = s_.DeviceOf(r);
        pl.pci_bus_id = GpuPciBusId(pl.gpu);
        pl.gpu_numa_node = PciNumaNode(pl.pci_bus_id);
      }
    }
    out_->placement[0].host_numa_node = MemoryNumaNode(cache_->host_region().k);
    out_->placement[0].cpu_numa_node = CpuNumaNode();
    out_->placement[0].ceiling_gbps = engine_->ceiling_bytes_per_s() / 1e9;
    if (leader_ == nullptr) return Status::OK();
    KVTIER_RETURN_IF_ERROR(GatherFollowers());
    out_->ring = leader_->stats();
    return Status::OK();
  }

 private:
  // A prefill's time: rank 0's own share, and the slowest rank's (rank 0's at TP=1).
  struct StepMs {
    double own_ms = 0, max_ms = 0;
  };

  // Times a cache call into `t`: all of it, and the part in the engine the cache was given.
  // CPU: the call's less rank 0's own copies' (as at TP=1), so everything the thread does for
  // the group (validating and encoding a record, publishing it, waking and waiting for the
  // ranks, checking them) counts as the decision's.
  template <typename Call>
  std::invoke_result_t<Call&> TimedCall(TpCall kind, bool warm, CallTimes* t, Call&& call) {
    const double outer0 = EngineSeconds(), inner0 = inner_->seconds();
    const double own_cpu0 = inner_->cpu_seconds(), cpu0 = ThreadCpuSeconds();
    const auto start = Clock::now();
    auto r = call();
    t->call_s += std::chrono::duration<double>(Clock::now() - start).count();
    const double cpu_s = ThreadCpuSeconds() - cpu0;
    const double copy_cpu_s = inner_->cpu_seconds() - own_cpu0;
    t->call_cpu_s += cpu_s;
    t->own_cpu_s += copy_cpu_s;
    t->engine_s += EngineSeconds() - outer0;
    t->own_s += inner_->seconds() - inner0;
    if (!warm) out_->call_cpu_ms[static_cast<size_t>(kind)] += (cpu_s - copy_cpu_s) * 1e3;
    return r;
  }

  // Wall seconds in the cache's engine so far: the leader's engine's (its own copies included).
  double EngineSeconds() const {
    return leader_ != nullptr ? leader_->stats().engine_seconds : inner_->seconds();
  }

  // Request `i`'s step: published to the followers, rank 0's share run, every rank's applied.
  Result<StepMs> RunStep(int64_t i, const TpStepMessage& step, MatchHandle handle,
                         PrefillTiming* timing) {
    uint64_t seq = 0;
    if (leader_ != nullptr) {
      KVTIER_ASSIGN_OR_RETURN(seq, leader_->PublishMessage(step.Encode()));
    }
    StepMs ms;
    KVTIER_ASSIGN_OR_RETURN(
        ms.own_ms, RunTpStep(*engine_, step, 0, s_.model.mla, cache_.get(), handle, timing));
    ms.max_ms = ms.own_ms;
    if (leader_ != nullptr) {
      KVTIER_RETURN_IF_ERROR(leader_->WaitApplied(seq).WithContext(fmt::format("request {}", i)));
      for (int r = 1; r < tp_; ++r) {
        KVTIER_ASSIGN_OR_RETURN(const uint64_t ns, leader_->MessageResult(r, seq));
        ms.max_ms = std::max(ms.max_ms, static_cast<double>(ns) / 1e6);
      }
    }
    return ms;
  }

  // Each follower's loads of the measured requests (the same slots as rank 0's; its bytes), and
  // where it ran.
  Status GatherFollowers() {
    constexpr int kAsks = 7;
    const TpStepMessage::Report asks[kAsks] = {
        TpStepMessage::kLoadNs,        TpStepMessage::kLoadBytes, TpStepMessage::kLoads,
        TpStepMessage::kLoadMedianBps, TpStepMessage::kHostNode,  TpStepMessage::kCpuNode,
        TpStepMessage::kCeilingBps};
    uint64_t answer[kAsks] = {};
    out_->load_bytes.resize(static_cast<size_t>(tp_));
    out_->load_seconds.resize(static_cast<size_t>(tp_));
    out_->loads.resize(static_cast<size_t>(tp_));
    out_->load_gbps_median.resize(static_cast<size_t>(tp_));
    uint64_t seqs[kAsks];
    for (int k = 0; k < kAsks; ++k) {
      TpStepMessage ask;
      ask.report = asks[k];
      KVTIER_ASSIGN_OR_RETURN(seqs[k], leader_->PublishMessage(ask.Encode()));
      KVTIER_RETURN_IF_ERROR(leader_->WaitApplied(seqs[k]));
    }
    for (int r = 1; r < tp_; ++r) {
      for (int k = 0; k < kAsks; ++k) {
        KVTIER_ASSIGN_OR_RETURN(answer[k], leader_->MessageResult(r, seqs[k]));
      }
      const size_t i = static_cast<size_t>(r);
      out_->load_seconds[i] = static_cast<double>(answer[0]) / 1e9;
      out_->load_bytes[i] = static_cast<int64_t>(answer[1]);
      out_->loads[i] = static_cast<int64_t>(answer[2]);
      out_->load_gbps_median[i] = static_cast<double>(answer[3]) / 1e9;
      out_->placement[i].host_numa_node = static_cast<int>(answer[4]) - 1;
      out_->placement[i].cpu_numa_node = static_cast<int>(answer[5]) - 1;
      out_->placement[i].ceiling_gbps = static_cast<double>(answer[6]) / 1e9;
    }
    return Status::OK();
  }

  const TpSetup& s_;
  const int tp_;
  const int64_t P_;
  TpLeader* const leader_;  // null at TP=1
  TpPassResult* const out_;
  std::unique_ptr<PrefillEngine> engine_;
  ReplayModel rank_model_{};
  TpTimedEngine* inner_ = nullptr;  // owned by the cache's engine
  std::string store_;               // the pass's per-head store; "" without one
  std::unique_ptr<HierarchicalCache> cache_;
};

}  // namespace

Status RunTpPass(const TpSetup& s, int tp, TpLeader* leader, TpPassResult* out) {
  LeaderPass pass(s, tp, leader, out);
  KVTIER_RETURN_IF_ERROR(pass.Open());
  const auto wall0 = Clock::now();
  const int64_t n = static_cast<int64_t>(s.workload.requests.size());
  for (int64_t i = 0; i < n; ++i) {
    if (i == s.o.warmup) KVTIER_RETURN_IF_ERROR(pass.ResetLoads());
    KVTIER_RETURN_IF_ERROR(pass.Serve(i, i < s.o.warmup));
  }
  return pass.Finish(wall0);
}

}  // namespace kvtier::tools
