// Rank 0's side of a pass of `kvtier replay --tp N` (replay_tp_pass.h): the cache, its decisions
// published to the followers, rank 0's share of every prefill, and what the pass measured.
#include "replay_tp_pass.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "kvtier/eviction_policy.h"
#include "kvtier/hierarchical_cache.h"
#include "kvtier/layout.h"
#include "kvtier/storage.h"
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

}  // namespace

Status RunTpPass(const TpSetup& s, int tp, TpLeader* leader, TpPassResult* out) {
  const int64_t P = s.o.cache.page_size;
  KVTIER_ASSIGN_OR_RETURN(std::unique_ptr<PrefillEngine> engine, MakeTpRankEngine(s, tp, 0));
  KVTIER_ASSIGN_OR_RETURN(const ReplayModel rank_model, TpRankModel(s.model, tp));
  // Every cache setting of the command line (ReplayOptions::cache), then what the pass decides.
  HierarchicalCacheConfig c = s.o.cache;
  c.transfer_backend = s.io;
  c.transfer.device = s.DeviceOf(0);
  c.backup_threads = 0;  // sequential and deterministic: equal hits at every TP size
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
  KVTIER_ASSIGN_OR_RETURN(std::unique_ptr<TpTimedEngine> inner_owned,
                          TpTimedEngine::Create(std::move(real), device, cuda_device, nullptr));
  TpTimedEngine* inner = inner_owned.get();
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
    StorageOptions so = c.storage.options;
    so.timeout = kTpStoreTimeout;
    KVTIER_ASSIGN_OR_RETURN(
        std::shared_ptr<StorageBackend> own,
        OpenTpRankStorage(store, TpRankPages(rank_model, P, device.geometry.head_num, 0, tp), so));
    c.storage.backend =
        leader != nullptr ? leader->WrapStorage(std::move(own), !s.model.mla) : std::move(own);
    if (c.storage.backend == nullptr) {
      return Status::Unavailable("tp: the leader's storage threads could not be started");
    }
  }
  out->cache_settings = TpCacheSettingsOf(c);
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
        TpStepMessage reset;
        reset.report = TpStepMessage::kResetLoads;
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
    TpStepMessage step;
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
    KVTIER_ASSIGN_OR_RETURN(double prefill_ms, RunTpStep(*engine, step, 0, s.model.mla, cache.get(),
                                                         m.handle, &timing));
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
    const TpStepMessage::Report asks[kAsks] = {
        TpStepMessage::kLoadNs,        TpStepMessage::kLoadBytes, TpStepMessage::kLoads,
        TpStepMessage::kLoadMedianBps, TpStepMessage::kHostNode,  TpStepMessage::kCpuNode,
        TpStepMessage::kCeilingBps};
    uint64_t answer[kAsks] = {};
    out->load_bytes.resize(static_cast<size_t>(tp));
    out->load_seconds.resize(static_cast<size_t>(tp));
    out->loads.resize(static_cast<size_t>(tp));
    out->load_gbps_median.resize(static_cast<size_t>(tp));
    uint64_t seqs[kAsks];
    for (int k = 0; k < kAsks; ++k) {
      TpStepMessage ask;
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

}  // namespace kvtier::tools
