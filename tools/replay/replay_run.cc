// One run of `kvtier replay` (replay_run.h): the driver that serves the workload through one cache
// the way an engine's scheduler does, checks every loaded byte and records each request.
#include "replay_run.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <deque>
#include <span>
#include <utility>

#include "kvtier/hierarchical_cache.h"
#include "kvtier/shared_host_pool.h"
#include "kvtier/storage.h"
#include "kvtier/storage_schemes.h"
#include "kvtier/testing/kv_pattern.h"
#include "replay_options.h"
#include "replay_oracle.h"
#include "replay_pin.h"
#include "replay_run_storage.h"

namespace kvtier::tools {

namespace {

using Clock = std::chrono::steady_clock;
double MsSince(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

// A request between its Match and its Release.
struct InFlight {
  int64_t index = 0;
  std::vector<Token> tokens;     // prompt (and output, with --insert-output)
  std::vector<uint64_t> hashes;  // KV pattern hashes of `tokens`
  int64_t prompt_tokens = 0;
  bool matched = false;
  MatchResult match;
  int64_t storage_tokens = 0;  // after QueryStorage
  PrefetchState prefetch = PrefetchState::kNone;
  Clock::time_point prefetch_start;  // when Prefetch was called (state kRunning)
};

// The progress line: requests done, hit rate so far, ETA, on stderr: rewritten in place twice a
// second on a terminal, a plain line every 10 s otherwise (logs), and a last line per run.
class Progress {
 public:
  Progress(bool on, std::string name, int64_t total)
      : on_(on),
        tty_(isatty(STDERR_FILENO) != 0),
        name_(std::move(name)),
        total_(total),
        t0_(Clock::now()),
        last_(t0_) {}
  void Update(int64_t done, double hit_rate) {
    if (!on_) return;
    const auto now = Clock::now();
    const auto every = tty_ ? std::chrono::milliseconds(500) : std::chrono::milliseconds(10000);
    if (done < total_ && now - last_ < every) return;
    last_ = now;
    const double s = std::chrono::duration<double>(now - t0_).count();
    const double eta =
        done > 0 ? s / static_cast<double>(done) * static_cast<double>(total_ - done) : 0;
    std::fprintf(stderr, "%s  [%s] %lld/%lld requests, hit rate %.1f %%, %.0f s, ETA %.0f s%s",
                 tty_ ? "\r" : "", name_.c_str(), static_cast<long long>(done),
                 static_cast<long long>(total_), 100 * hit_rate, s, eta,
                 tty_ && done < total_ ? "   " : "\n");
    std::fflush(stderr);
  }

 private:
  bool on_;
  bool tty_;
  std::string name_;
  int64_t total_;
  Clock::time_point t0_, last_;
};

class RunDriver {
 public:
  RunDriver(ReplaySetup& setup, RunKind kind, int64_t host_tokens, std::string name)
      : s_(setup),
        o_(setup.options),
        kind_(kind),
        host_tokens_(host_tokens),
        P_(o_.cache.page_size),
        timeline_(setup.workload, setup.options, setup.decode_ms_per_token) {
    summary_.name = std::move(name);
    summary_.device_tokens = o_.device_tokens;
    summary_.host_tokens = kind == RunKind::kHierarchy ? host_tokens : 0;
    summary_.storage = "none";
  }

  Result<RunSummary> Run() {
    const auto wall0 = Clock::now();
    if (kind_ != RunKind::kNoCache) KVTIER_RETURN_IF_ERROR(CreateCache());
    const int64_t n = static_cast<int64_t>(s_.workload.requests.size());
    summary_.records.resize(static_cast<size_t>(n));
    Progress progress(o_.progress, summary_.name, n);
    // --warmup: requests served one by one before the measured ones, to fill the tiers; their KV
    // is written and checked, nothing is timed or recorded.
    if (cache_ != nullptr) {
      warming_ = true;
      for (int64_t i = 0; i < static_cast<int64_t>(s_.warmup.requests.size()); ++i) {
        KVTIER_ASSIGN_OR_RETURN(InFlight f, Arrive(i));
        KVTIER_RETURN_IF_ERROR(Serve(f).WithContext(fmt::format("warm-up request {}", i)));
        KVTIER_RETURN_IF_ERROR(RenewPin());
      }
      warming_ = false;
    }
    std::deque<InFlight> pending;
    int64_t next = 0;
    int64_t hit = 0, input = 0;
    for (int64_t served = 0; served < n; ++served) {
      if (pending.empty()) {
        KVTIER_ASSIGN_OR_RETURN(InFlight f, Arrive(next++));
        pending.push_back(std::move(f));
      }
      const double serve_at = timeline_.StartOf(served);
      while (next < n && static_cast<int64_t>(pending.size()) < o_.max_inflight &&
             timeline_.Known(next, served) && timeline_.Arrival(next) <= serve_at) {
        KVTIER_ASSIGN_OR_RETURN(InFlight f, Arrive(next++));
        pending.push_back(std::move(f));
      }
      InFlight f = std::move(pending.front());
      pending.pop_front();
      KVTIER_RETURN_IF_ERROR(Serve(f).WithContext(fmt::format("request {}", f.index)));
      KVTIER_RETURN_IF_ERROR(RenewPin());
      if (o_.settle_backups && cache_ != nullptr) {
        KVTIER_RETURN_IF_ERROR(cache_->WaitForBackups().WithContext(
            fmt::format("--settle-backups after request {}", f.index)));
      }
      const RequestRecord& r = summary_.records[static_cast<size_t>(f.index)];
      hit += r.hit_tokens();
      input += r.input_tokens;
      progress.Update(served + 1, input > 0 ? static_cast<double>(hit) / input : 0);
    }
    if (cache_ != nullptr) {
      KVTIER_RETURN_IF_ERROR(cache_->WaitForBackups().WithContext("waiting for backups"));
      summary_.cache = cache_->stats();
      if (kind_ == RunKind::kHierarchy && s_.kv_events != nullptr) {
        // The blocks the events describe, then every batch sent (the seq they end at).
        KVTIER_ASSIGN_OR_RETURN(summary_.kv_blocks, cache_->CachedBlocks());
        if (!s_.kv_events->Flush(std::chrono::seconds(30))) {
          return Status::Unavailable("--kv-events: batches still queued after 30 s");
        }
        summary_.has_kv_events = true;
        summary_.kv_events = s_.kv_events->stats();
        summary_.kv_events_endpoint = s_.kv_events->endpoint();
        summary_.kv_events_replay_endpoint = s_.kv_events->replay_endpoint();
      }
      if (o_.metrics) summary_.metrics = cache_->Metrics();
      if (pin_ != nullptr) {
        summary_.has_pin = true;
        summary_.pin_tiers = o_.pin_system_prompt;
        summary_.pin_ttl_s = o_.pin_ttl_s;
        summary_.pin_prompt_tokens = pin_->prompt_tokens();
        summary_.pin_covered_tokens = pin_->covered_tokens();
        summary_.pin_store_pinned = pin_->store_pinned();
        KVTIER_RETURN_IF_ERROR(pin_->End(*cache_).WithContext("--pin-system-prompt"));
      }
      if (StorageBackend* b = cache_->storage(); b != nullptr) {
        summary_.has_storage = true;
        summary_.storage_stats = b->Stats();
        if (s_.fault_at_s >= 0 || s_.fault_delay_ms > 0) {
          summary_.stored_chains.why_unchecked = "--fault: the store answers as the fault makes it";
        } else {
          summary_.stored_chains = CheckStoredChains(*b, RequestChains(s_));
        }
        RunOracle();
      }
      KVTIER_RETURN_IF_ERROR(cache_->CheckConsistency().WithContext("cache consistency"));
      cache_.reset();
    }
    summary_.wall_s = std::chrono::duration<double>(Clock::now() - wall0).count();
    return std::move(summary_);
  }

 private:
  // The storage oracle of this run (replay_oracle.h) into the summary and its records: a store of
  // the same capacity (the store's, in its own bytes per page; unknown: unbounded).
  void RunOracle() {
    const StorageStats& st = summary_.storage_stats;
    const int64_t page_bytes = P_ * s_.model.kv_bytes_per_token();
    // The store's bytes per page: what it holds now, else the page and what its scheme adds to
    // a page (a file store's header block).
    const StorageScheme* scheme = FindStorageScheme(StorageUrlScheme(summary_.storage));
    const int64_t per_page =
        st.stored_pages > 0 ? st.stored_bytes / st.stored_pages
                            : page_bytes + (scheme != nullptr ? scheme->page_overhead_bytes : 0);
    const int64_t capacity = st.capacity_bytes >= 0 ? st.capacity_bytes
                             : storage_             ? storage_->capacity_bytes()
                                                    : -1;
    const int64_t capacity_pages = capacity >= 0 ? capacity / std::max<int64_t>(per_page, 1) : -1;
    std::vector<int64_t> prompt_pages;
    for (const WorkloadRequest& req : s_.workload.requests) {
      prompt_pages.push_back(req.input_length / P_);
    }
    const std::vector<std::vector<PageKey>> warmup = RequestChainsOf(s_, s_.warmup);
    const std::vector<std::vector<PageKey>> chains = RequestChainsOf(s_, s_.workload);
    const AdmittedAt admitted = admissions_.Take();
    const StorageOracleResult o = RunStorageOracle(warmup, chains, prompt_pages, summary_.records,
                                                   P_, capacity_pages, &admitted);
    summary_.admit_all_storage_tokens =
        RunStorageOracle(warmup, chains, prompt_pages, summary_.records, P_, capacity_pages,
                         nullptr)
            .storage_tokens;
    summary_.has_oracle = true;
    summary_.oracle_capacity_pages = o.capacity_pages;
    summary_.oracle_storage_tokens = o.storage_tokens;
    summary_.lost_storage_tokens = o.lost_tokens;
    summary_.lost_storage_requests = o.lost_requests;
    for (size_t i = 0; i < summary_.records.size(); ++i) {
      summary_.records[i].oracle_storage_hit = o.oracle_storage_hit[i];
      summary_.records[i].lost_storage_hit = o.lost_hit[i];
    }
  }

  Status CreateCache() {
    HierarchicalCacheConfig c = o_.cache;
    c.transfer_backend = s_.io_backend;
    c.transfer.device = 0;
    // One replay thread drives the cache; sequential runs keep backups in that thread, so a
    // replay is deterministic.
    c.backup_threads = o_.sequential ? 0 : 1;
    const int64_t token_bytes = s_.model.kv_bytes_per_token();
    const bool host_tier = kind_ == RunKind::kHierarchy && host_tokens_ > 0;
    if (host_tier) {
      c.host_capacity_bytes = host_tokens_ * token_bytes;
      if (!o_.shared_host.empty()) {
        SharedHostPoolAttachOptions attach;
        attach.register_with_cuda = s_.gpu;
        Result<std::unique_ptr<SharedHostPool>> pool =
            SharedHostPool::Attach(o_.shared_host, attach);
        if (!pool.ok()) return pool.status().WithContext("--shared-host");
        c.shared_host = std::move(*pool);
        c.storage.model_id = s_.model.model_id;  // part of the page keys' namespace
        summary_.shared_host = o_.shared_host;
      }
    } else {
      // No host tier (--host-tokens 0, and the device-only run): device evictions forget.
      c.host_capacity_bytes = 0;
      c.host_ratio = 0;
    }
    if (kind_ == RunKind::kHierarchy && o_.storage != "none" && host_tier) {
      storage_ = std::make_unique<RunStorage>();
      KVTIER_RETURN_IF_ERROR(storage_->Open(s_, c.host_capacity_bytes).WithContext("--storage"));
      c.storage.backend = storage_->backend();
      c.storage.admitted_listener = [this](std::span<const PageKey> keys) {
        admissions_.Admitted(keys);
      };
      if (storage_->capacity_bytes() >= 0) {
        // The tree remembers no more storage-only pages than the store can hold beside the host
        // tier's (the store evicts by itself and does not tell the tree): a page the tree still
        // believes stored after the store dropped it costs a prefetch that waits and then
        // misses. Pages the tree forgot are found again by QueryStorage's Exists.
        const int64_t page_bytes = P_ * token_bytes;
        c.storage.max_storage_only_pages = std::max<int64_t>(
            0, storage_->capacity_bytes() / page_bytes - c.host_capacity_bytes / page_bytes);
      }
      summary_.storage = RedactUrl(storage_->url());
      summary_.storage_load_path = StreamsStorageHits() ? "streamed" : "after_read";
    }
    if (kind_ == RunKind::kHierarchy && s_.kv_events != nullptr) {
      c.kv_event_sink = s_.kv_events;
      if (c.storage.backend != nullptr) {
        summary_.kv_events_storage_medium = StorageMediumOf(c.storage.backend->url());
      }
    }
    if (kind_ == RunKind::kHierarchy && !o_.pin_system_prompt.empty()) {
      pin_ = std::make_unique<SystemPromptPin>(s_.pin_prompt, *ParsePinTiers(o_.pin_system_prompt),
                                               o_.pin_ttl_s);  // checked
      pin_->SetBudgets(&c);
    }
    KVTIER_ASSIGN_OR_RETURN(cache_, HierarchicalCache::Create(c, s_.engine->device_region()));
    summary_.has_cache = true;
    return Status::OK();
  }

  Result<InFlight> Arrive(int64_t i) {
    const WorkloadRequest& req =
        (warming_ ? s_.warmup : s_.workload).requests[static_cast<size_t>(i)];
    InFlight f;
    f.index = i;
    f.tokens = PromptTokens(req);
    f.prompt_tokens = req.input_length;
    if (o_.insert_output && req.output_length > 0) {
      const std::vector<int32_t> out = OutputTokens(i, req.output_length);
      f.tokens.insert(f.tokens.end(), out.begin(), out.end());
    }
    if (cache_ == nullptr) return f;
    // --fault storage-down@S: the store fails from the first request arriving at or after S.
    if (!warming_ && storage_ != nullptr && s_.fault_at_s >= 0 && summary_.fault_index < 0 &&
        timeline_.Arrival(i) >= s_.fault_at_s * 1e3) {
      summary_.fault_action = storage_->TakeDown();
      summary_.fault_index = i;
      summary_.fault_at_s = timeline_.Arrival(i) / 1e3;
    }
    f.hashes = KvPatternHashes(f.tokens, KvPatternSalt(""));
    const std::span<const Token> prompt(f.tokens.data(), static_cast<size_t>(f.prompt_tokens));
    KVTIER_ASSIGN_OR_RETURN(f.match, cache_->Match(prompt));
    f.matched = true;
    f.storage_tokens = f.match.storage_tokens;
    if (storage_ != nullptr) {
      KVTIER_ASSIGN_OR_RETURN(StorageQueryResult q, cache_->QueryStorage(f.match.handle));
      f.storage_tokens = q.storage_tokens;
      f.prefetch_start = Clock::now();
      KVTIER_ASSIGN_OR_RETURN(PrefetchResult p, cache_->Prefetch(f.match.handle));
      f.prefetch = p.state;
    }
    return f;
  }

  // The request's matched prefix onto the device: its prefetch ended (a streamed storage hit:
  // by LoadBack, copying pages as they arrive), its host and storage hits loaded, the prefetch
  // wait and the hits per tier recorded in `r`, the LoadBack's wall time in `job`. Returns the
  // hit's device slots (no room to load: the device part only, the rest is recomputed).
  Result<std::vector<int64_t>> LoadMatched(InFlight& f, RequestRecord& r, PrefillJob& job) {
    std::vector<int64_t> hit_slots;
    const MatchHandle h = f.match.handle;
    const bool running = f.prefetch == PrefetchState::kRunning;
    // How long before its service the request's read began (its lead over the service): the
    // ideal lets its read overlap as much (replay_ideal.h).
    if (running) r.prefetch_lead_ms = MsSince(f.prefetch_start);
    // A streamed storage hit (stream_load_back with a wait_complete or timeout prefetch
    // running): LoadBack ends the prefetch by its policy, copying its pages as they arrive.
    // Otherwise the prefetch is ended first (FinishPrefetch: best_effort takes what arrived),
    // and the prefetch wait is how long that blocks, before the device work begins.
    const bool stream = running && StreamsStorageHits();
    int64_t prefetched = 0;  // tokens this request's prefetch brought from storage
    if (running && !stream) {
      const auto t0 = Clock::now();
      KVTIER_ASSIGN_OR_RETURN(PrefetchResult p, cache_->FinishPrefetch(h));
      r.prefetch_wait_ms = MsSince(t0);
      f.prefetch = p.state;
      prefetched = p.arrived_tokens;
    }
    KVTIER_RETURN_IF_ERROR(s_.engine->BeginRequest());
    const double copy_s0 = stream && !s_.gpu ? cache_->stats().load_back_seconds : 0;
    const auto t0 = Clock::now();
    Result<LoadBackResult> lb = cache_->LoadBack(h, s_.engine->load_stream());
    job.load_wall_ms = MsSince(t0);
    if (stream) {
      // The LoadBack waited on the read for its wall time less its copies (cpu: synchronous,
      // their wall time is load_back_seconds; GPU: the copies are enqueued while it waits).
      // That wait is inside the device time measured from BeginRequest (GPU: the start event
      // precedes the LoadBack; cpu: the load's wall time), so it is reported as the prefetch
      // wait (overlapping the load) and not added to the TTFT again.
      const double copies_ms = s_.gpu ? 0 : (cache_->stats().load_back_seconds - copy_s0) * 1e3;
      r.streamed = true;
      r.prefetch_wait_ms = std::max(0.0, job.load_wall_ms - copies_ms);
      ++summary_.streamed_loads;
      // OutOfMemory leaves the prefetch running (Release cancels it): counted as partial.
      f.prefetch = lb.ok() ? lb->prefetch.state : PrefetchState::kPartial;
      if (lb.ok()) prefetched = lb->prefetch.arrived_tokens;
    }
    CountPrefetch(f.prefetch);
    if (lb.ok()) {
      hit_slots = std::move(lb->device_slots);
      r.loaded_bytes = lb->loaded_tokens * s_.model.kv_bytes_per_token();
    } else if (lb.status().IsOutOfMemory()) {
      ++summary_.load_failures;  // no room to load: the host part is recomputed
      hit_slots = f.match.device_slots;
    } else {
      return lb.status().WithContext("LoadBack");
    }
    const int64_t hit = static_cast<int64_t>(hit_slots.size());
    r.device_hit = std::min(hit, f.match.device_tokens);
    // Storage hits are the tokens this request's prefetch read; what the prefix gained past
    // its Match otherwise (another request in flight inserted or loaded it meanwhile) was
    // taken from memory, counted as host hits (the ideal charges no read for them).
    r.storage_hit = std::clamp<int64_t>(hit - r.device_hit - f.match.host_tokens, 0, prefetched);
    r.host_hit = hit - r.device_hit - r.storage_hit;
    return hit_slots;
  }

  Status Serve(InFlight& f) {
    RequestRecord warm_record;
    RequestRecord& r = warming_ ? warm_record : summary_.records[static_cast<size_t>(f.index)];
    admissions_.Serving(warming_ ? f.index - static_cast<int64_t>(s_.warmup.requests.size())
                                 : f.index);
    r.arrival_ms = warming_ ? 0 : timeline_.Arrival(f.index);
    r.start_ms = warming_ ? 0 : timeline_.StartOf(f.index);
    r.queue_ms = r.start_ms - r.arrival_ms;
    r.input_tokens = f.prompt_tokens;
    r.output_tokens =
        (warming_ ? s_.warmup : s_.workload).requests[static_cast<size_t>(f.index)].output_length;
    PrefillJob job;
    std::vector<int64_t> hit_slots;
    std::vector<int64_t> new_slots;
    int64_t hit = 0;
    if (cache_ != nullptr) {
      const MatchHandle h = f.match.handle;
      KVTIER_ASSIGN_OR_RETURN(hit_slots, LoadMatched(f, r, job));
      hit = static_cast<int64_t>(hit_slots.size());
      // Slots for the new whole pages of the prompt (as many as the device can make room for).
      const int64_t whole = f.prompt_tokens / P_ * P_;
      if (whole > hit) {
        KVTIER_ASSIGN_OR_RETURN(new_slots,
                                cache_->AllocateDeviceSlots(whole - hit, {.allow_fewer = true}));
      }
      job.cache = cache_.get();
      job.handle = h;
      job.hit_slots = hit_slots;
      job.hit_hashes = std::span<const uint64_t>(f.hashes.data(), static_cast<size_t>(hit));
      job.verify_sample = o_.verify == "sample";
      job.skip_compute = warming_;
      job.new_slots = new_slots;
      job.new_hashes = std::span<const uint64_t>(f.hashes.data() + hit, new_slots.size());
    }
    job.cached_tokens = hit;
    job.new_tokens = f.prompt_tokens - hit;
    KVTIER_ASSIGN_OR_RETURN(PrefillTiming t, s_.engine->Prefill(job));
    summary_.bytes_checked += t.bytes_checked;
    summary_.wrong_bytes += t.wrong_bytes;
    if (summary_.first_wrong.empty() && !t.first_wrong.empty()) {
      summary_.first_wrong = fmt::format("request {}: {}", f.index, t.first_wrong);
    }
    r.load_ms = t.load_ms;
    r.compute_ms = t.compute_ms;
    r.device_ms = t.total_ms;
    if (!warming_) {
      // A streamed load's wait is inside total_ms already (see above).
      const double end =
          timeline_.Serve(f.index, (r.streamed ? 0 : r.prefetch_wait_ms) + t.total_ms);
      r.ttft_ms = end - r.arrival_ms;
    }
    if (cache_ != nullptr) KVTIER_RETURN_IF_ERROR(InsertAndRelease(f, hit_slots, new_slots));
    return Status::OK();
  }

  // Insert the prompt's computed pages (and, with --insert-output, the output's), then Release.
  Status InsertAndRelease(InFlight& f, std::vector<int64_t>& slots,
                          const std::vector<int64_t>& new_slots) {
    slots.insert(slots.end(), new_slots.begin(), new_slots.end());
    const int64_t prompt_whole = f.prompt_tokens / P_ * P_;
    const int64_t all_whole = static_cast<int64_t>(f.tokens.size()) / P_ * P_;
    if (o_.insert_output && static_cast<int64_t>(slots.size()) == prompt_whole &&
        all_whole > prompt_whole) {
      // Decode would have written the output's KV; write it now (untimed) and cache it too.
      KVTIER_ASSIGN_OR_RETURN(
          std::vector<int64_t> out,
          cache_->AllocateDeviceSlots(all_whole - prompt_whole, {.allow_fewer = true}));
      if (!out.empty()) {
        PrefillJob write;
        write.new_slots = out;
        write.new_hashes = std::span<const uint64_t>(f.hashes.data() + prompt_whole, out.size());
        write.cached_tokens = prompt_whole;
        KVTIER_RETURN_IF_ERROR(s_.engine->Prefill(write).status());
        slots.insert(slots.end(), out.begin(), out.end());
      }
    }
    if (!slots.empty()) {
      const std::span<const Token> tokens(f.tokens.data(), slots.size());
      InsertOptions io;
      io.stream = s_.engine->write_stream();
      KVTIER_RETURN_IF_ERROR(cache_->Insert(tokens, slots, "", io).status().WithContext("Insert"));
    }
    return cache_->Release(f.match.handle).WithContext("Release");
  }

  // Whether LoadBack ends a running prefetch (streaming its pages) rather than FinishPrefetch.
  bool StreamsStorageHits() const {
    return o_.cache.storage.stream_load_back &&
           o_.cache.storage.prefetch_policy != PrefetchPolicy::kBestEffort;
  }

  void CountPrefetch(PrefetchState st) {
    switch (st) {
      case PrefetchState::kNone:
        ++summary_.prefetch_none;
        break;
      case PrefetchState::kComplete:
        ++summary_.prefetch_complete;
        break;
      case PrefetchState::kTimedOut:
        ++summary_.prefetch_timed_out;
        break;
      default:
        ++summary_.prefetch_partial;
        break;
    }
  }

  ReplaySetup& s_;
  const ReplayOptions& o_;
  RunKind kind_;
  int64_t host_tokens_;
  int64_t P_;
  Timeline timeline_;
  RunSummary summary_;
  std::unique_ptr<RunStorage> storage_;
  AdmissionLog admissions_;  // before cache_: its listener may run until the cache is gone
  std::unique_ptr<HierarchicalCache> cache_;
  std::unique_ptr<SystemPromptPin> pin_;  // --pin-system-prompt, hierarchy run
  bool warming_ = false;                  // serving --warmup requests

  Status RenewPin() {
    return pin_ == nullptr ? Status::OK() : pin_->Renew(*cache_).WithContext("--pin-system-prompt");
  }
};

}  // namespace

Result<RunSummary> RunOne(ReplaySetup& setup, RunKind kind, int64_t host_tokens, std::string name) {
  RunDriver driver(setup, kind, host_tokens, std::move(name));
  return driver.Run();
}

}  // namespace kvtier::tools
