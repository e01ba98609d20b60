// python/src/cache_binding.cc — `_kvtier._HierarchicalCache`, the cache manager for
// kvtier.HierarchicalCache (python/kvtier/cache.py adds the Pythonic surface: argument checks,
// token and slot arrays of any kind, torch/numpy results, match handles that release themselves).
//
// Arrays cross this boundary as (address, count) of contiguous host int32 (tokens) / int64
// (slots) memory that the Python layer keeps alive for the call; results come back as bytes of
// int64 so that importing kvtier needs neither numpy nor torch. The configuration comes as a dict
// whose keys are HierarchicalCacheConfig's fields (storage ones prefixed "storage_").
//
// Lifetime: every call holds a CallGuard, counted in flight; close() refuses new calls, waits
// (without the GIL) until the calls in flight have returned, then destroys the C++ cache, so a
// close() racing other threads never frees the cache under them; later calls raise
// FailedPreconditionError. The object keeps the Python device region (its buffers and per-layer
// pointer tables) alive until the C++ cache is gone.
//
// Thread safety: HierarchicalCache is thread-safe; every call that takes the cache's mutex, copies
// or waits runs with the GIL released.
#include <fmt/format.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#if defined(KVTIER_PY_WITH_CUDA)
#include <cuda_runtime.h>
#endif

#include <algorithm>
#include <climits>
#include <condition_variable>
#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "cache_config_table.h"
#include "errors.h"
#include "kvtier/eviction_policy.h"
#include "kvtier/hierarchical_cache.h"
#include "kvtier/shared_host_pool.h"
#include "py_args.h"
#include "tp_binding.h"
#include "transfer_binding.h"

namespace py = pybind11;

namespace kvtier::python {
namespace {

template <typename T>
std::span<const T> SpanOf(uint64_t address, int64_t count, const char* name) {
  if (count < 0) {
    ThrowStatus(Status::InvalidArgument(fmt::format("{} has negative length {}", name, count)));
  }
  if (count > 0 && address == 0) {
    ThrowStatus(Status::InvalidArgument(fmt::format("{} is null but has {} entries", name, count)));
  }
  return {reinterpret_cast<const T*>(static_cast<uintptr_t>(address)), static_cast<size_t>(count)};
}

py::bytes SlotBytes(const std::vector<int64_t>& slots) {
  return py::bytes(reinterpret_cast<const char*>(slots.data()), slots.size() * sizeof(int64_t));
}

CudaStream StreamOf(uint64_t address) {
  return reinterpret_cast<CudaStream>(static_cast<uintptr_t>(address));
}

// Runs `fn` with the GIL released and returns its result.
template <typename Fn>
auto WithoutGil(Fn&& fn) {
  py::gil_scoped_release release;
  return fn();
}

// Releases and frees ordered after an engine's stream. The engine may still read (or write) the
// slots of a match, or slots it frees, in work queued on its stream; handing them back to the
// cache at once would let a later load or allocation reuse them under that work. So a release or
// free given a stream records a CUDA event on it and is parked here; the parked operations whose
// events have completed are carried out at the start of every later call (without blocking), all
// of them when an allocation or load would otherwise run out of device memory (then waiting for
// the events), and at close(). The cache itself never sees the slots back early: a parked match
// stays pinned, parked slots stay the engine's. The first error of a parked operation is raised
// by the next release, free_device_slots, wait_for_backups or close.
// Without CUDA (or a host pool) there is no stream to wait for: the operation runs at once.
class DeferredReleases {
 public:
  ~DeferredReleases() {
#if defined(KVTIER_PY_WITH_CUDA)
    for (Parked& p : parked_) (void)cudaEventDestroy(p.event);
#endif
  }

  // Parks a release of `handle` (or a free of `slots`) behind the work queued so far on `stream`
  // of CUDA device `device`. Returns false when nothing was parked (no CUDA): run it now.
  Result<bool> Park(int device, CudaStream stream, uint64_t handle, std::vector<int64_t> slots) {
#if defined(KVTIER_PY_WITH_CUDA)
    int previous = 0;
    if (cudaGetDevice(&previous) != cudaSuccess) return Status::CudaError("cudaGetDevice failed");
    if (previous != device && cudaSetDevice(device) != cudaSuccess) {
      return Status::CudaError(fmt::format("cudaSetDevice({}) failed", device));
    }
    cudaEvent_t event = nullptr;
    cudaError_t e = cudaEventCreateWithFlags(&event, cudaEventDisableTiming);
    if (e == cudaSuccess) {
      e = cudaEventRecord(event, reinterpret_cast<cudaStream_t>(stream));
      if (e != cudaSuccess) (void)cudaEventDestroy(event);
    }
    if (previous != device) (void)cudaSetDevice(previous);
    if (e != cudaSuccess) {
      return Status::CudaError(fmt::format(
          "recording the release's event on the engine's stream: {}", cudaGetErrorString(e)));
    }
    std::lock_guard<std::mutex> lock(mu_);
    parked_.push_back({event, handle, std::move(slots)});
    return true;
#else
    (void)device, (void)stream, (void)handle, (void)slots;
    return false;
#endif
  }

  // Carries out the parked operations whose events have completed (all of them, waiting, when
  // `wait`). Returns whether any was carried out. Errors are kept for TakeError.
  bool Reap(HierarchicalCache& cache, bool wait) {
#if defined(KVTIER_PY_WITH_CUDA)
    std::vector<Parked> ready;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (auto it = parked_.begin(); it != parked_.end();) {
        const cudaError_t e = wait ? cudaEventSynchronize(it->event) : cudaEventQuery(it->event);
        if (e == cudaErrorNotReady) {
          ++it;
          continue;
        }
        ready.push_back(std::move(*it));
        it = parked_.erase(it);
      }
    }
    for (Parked& p : ready) {
      (void)cudaEventDestroy(p.event);
      const Status st =
          p.slots.empty() ? cache.Release(MatchHandle{p.handle}) : cache.FreeDeviceSlots(p.slots);
      if (!st.ok()) {
        std::lock_guard<std::mutex> lock(mu_);
        if (error_.ok()) error_ = st.WithContext("a release deferred to the engine's stream");
      }
    }
    return !ready.empty();
#else
    (void)cache, (void)wait;
    return false;
#endif
  }

  bool empty() {
    std::lock_guard<std::mutex> lock(mu_);
    return parked_.empty();
  }

  Status TakeError() {
    std::lock_guard<std::mutex> lock(mu_);
    return std::exchange(error_, Status::OK());
  }

 private:
  struct Parked {
#if defined(KVTIER_PY_WITH_CUDA)
    cudaEvent_t event;
#else
    void* event;
#endif
    uint64_t handle;
    std::vector<int64_t> slots;  // non-empty: a free of these slots instead of a release
  };
  std::mutex mu_;
  std::list<Parked> parked_;  // guarded by mu_
  Status error_;              // guarded by mu_
};

// Owns the cache; see the file comment for the lifetime rules.
class PyCache {
 public:
  // `tp_leader`: the TP group this cache decides for (its engine and store are the leader's
  // wrappers); destroyed after the cache, which closes the group's ring.
  PyCache(std::unique_ptr<HierarchicalCache> cache, py::object region_keepalive,
          std::unique_ptr<TpLeader> tp_leader = nullptr)
      : region_keepalive_(std::move(region_keepalive)),
        tp_leader_(std::move(tp_leader)),
        cache_(std::move(cache)) {}
  // No call can be in flight (each holds a reference to this object). Copies still running are
  // waited for by the cache's destructor; they never need the GIL.
  ~PyCache() = default;
  PyCache(const PyCache&) = delete;
  PyCache& operator=(const PyCache&) = delete;

  // One call in flight. REQUIRES: the GIL is held (construction only).
  class CallGuard {
   public:
    explicit CallGuard(PyCache& owner) : owner_(owner) {
      std::lock_guard<std::mutex> lock(owner_.mu_);
      if (owner_.state_ != State::kOpen) {
        ThrowStatus(Status::FailedPrecondition("the HierarchicalCache is closed"));
      }
      ++owner_.calls_in_flight_;
    }
    ~CallGuard() {
      std::lock_guard<std::mutex> lock(owner_.mu_);
      if (--owner_.calls_in_flight_ == 0) owner_.cv_.notify_all();
    }
    CallGuard(const CallGuard&) = delete;
    CallGuard& operator=(const CallGuard&) = delete;
    HierarchicalCache* operator->() const { return owner_.cache_.get(); }
    HierarchicalCache& operator*() const { return *owner_.cache_; }
    DeferredReleases& deferred() const { return owner_.deferred_; }
    // The TP group's leader; FailedPrecondition when this cache leads none.
    TpLeader& tp_leader() const {
      if (owner_.tp_leader_ == nullptr) {
        ThrowStatus(Status::FailedPrecondition(
            "this HierarchicalCache leads no TP group (create it with tp_group=...)"));
      }
      return *owner_.tp_leader_;
    }

   private:
    PyCache& owner_;
  };

  // Refuses new calls, waits for the calls in flight, then destroys the cache (which waits for
  // its copies). A second close() waits for the first to finish. REQUIRES: the GIL is held.
  void Close() {
    bool closer = false;
    {
      py::gil_scoped_release release;
      std::unique_lock<std::mutex> lock(mu_);
      if (state_ == State::kOpen) {
        state_ = State::kClosing;
        closer = true;
        cv_.wait(lock, [&] { return calls_in_flight_ == 0; });
      } else {
        cv_.wait(lock, [&] { return state_ == State::kClosed; });
      }
    }
    if (!closer) return;
    Status deferred_error;
    {
      py::gil_scoped_release release;
      deferred_.Reap(*cache_, /*wait=*/true);
      deferred_error = deferred_.TakeError();
      cache_.reset();
      tp_leader_.reset();  // closes the ring: the followers' serve() returns "closed"
      std::lock_guard<std::mutex> lock(mu_);
      state_ = State::kClosed;
    }
    cv_.notify_all();
    region_keepalive_ = py::none();  // the buffers may go now
    ThrowIfError(deferred_error);
  }

  bool closed() {
    std::lock_guard<std::mutex> lock(mu_);
    return state_ != State::kOpen;
  }

 private:
  enum class State { kOpen, kClosing, kClosed };
  // Declared before cache_ so that the cache is destroyed first.
  py::object region_keepalive_;
  std::unique_ptr<TpLeader> tp_leader_;  // the cache's engine and store use it
  std::unique_ptr<HierarchicalCache> cache_;
  std::mutex mu_;
  std::condition_variable cv_;
  State state_ = State::kOpen;   // guarded by mu_
  int64_t calls_in_flight_ = 0;  // guarded by mu_
  DeferredReleases deferred_;
};

// Runs `fn` (a call returning a Result or Status) without the GIL after reaping completed
// deferred releases; when it runs out of device memory while releases are parked, waits for
// them and tries once more.
template <typename Fn>
auto ReapAndRun(const PyCache::CallGuard& cache, Fn&& fn) {
  py::gil_scoped_release release;
  cache.deferred().Reap(*cache, /*wait=*/false);
  auto r = fn();
  auto code = [](const auto& x) {
    if constexpr (std::is_same_v<std::decay_t<decltype(x)>, Status>) {
      return x.code();
    } else {
      return x.status().code();
    }
  };
  if (code(r) == StatusCode::kOutOfMemory && !cache.deferred().empty() &&
      cache.deferred().Reap(*cache, /*wait=*/true)) {
    r = fn();
  }
  return r;
}

// ---- configuration -----------------------------------------------------------------------

HierarchicalCacheConfig ConfigFromDict(const py::dict& d, const std::string& shared,
                                       const PyRegion& device_region) {
  HierarchicalCacheConfig c = CacheConfigFromDict(d);
  if (device_region.region.memory == MemoryKind::kDevice) {
    c.transfer.device = device_region.region.device;
  }
  // The shared host tier: a segment made by `kvtier shm create`, attached (and registered with
  // CUDA when the device pool is on a GPU) for this cache.
  if (!shared.empty()) {
    SharedHostPoolAttachOptions attach;
    attach.register_with_cuda = device_region.region.memory == MemoryKind::kDevice;
    c.shared_host = Unwrap(SharedHostPool::Attach(shared, attach));
  }
  return c;
}

// ---- results -----------------------------------------------------------------------------

py::dict PrefetchDict(const PrefetchResult& p) {
  py::dict d;
  d["state"] = PrefetchStateName(p.state);
  d["policy"] = PrefetchPolicyName(p.policy);
  d["requested_tokens"] = p.requested_tokens;
  d["arrived_tokens"] = p.arrived_tokens;
  d["host_tokens"] = p.host_tokens;
  return d;
}

// {"bounds", "counts" (not cumulative, one more than bounds), "count", sum_key}.
template <typename Bounds>
py::dict HistogramDict(const Histogram<Bounds>& h, const char* sum_key) {
  py::dict d;
  d["bounds"] = std::vector<double>(h.kBounds.begin(), h.kBounds.end());
  d["counts"] = std::vector<int64_t>(h.counts.begin(), h.counts.end());
  d["count"] = h.count;
  d[sum_key] = h.sum;
  return d;
}

py::dict StatsDict(const CacheStats& s) {
  py::dict d;
#define KVTIER_STAT_(field) d[#field] = s.field
  KVTIER_STAT_(page_size);
  KVTIER_STAT_(device_total_tokens);
  KVTIER_STAT_(device_used_tokens);
  KVTIER_STAT_(device_cached_tokens);
  KVTIER_STAT_(device_engine_tokens);
  KVTIER_STAT_(host_total_tokens);
  KVTIER_STAT_(host_used_tokens);
  KVTIER_STAT_(host_filling_tokens);
  KVTIER_STAT_(host_total_bytes);
  KVTIER_STAT_(storage_known_tokens);
  KVTIER_STAT_(storage_only_tokens);
  KVTIER_STAT_(nodes);
  KVTIER_STAT_(namespaces);
  KVTIER_STAT_(live_handles);
  KVTIER_STAT_(backup_inflight_tokens);
  KVTIER_STAT_(storage_backup_inflight_tokens);
  KVTIER_STAT_(storage_backlog_tokens);
  KVTIER_STAT_(storage_backlog_bytes);
  KVTIER_STAT_(prefetch_inflight_tokens);
  KVTIER_STAT_(match_calls);
  KVTIER_STAT_(match_query_tokens);
  KVTIER_STAT_(device_hit_tokens);
  KVTIER_STAT_(host_hit_tokens);
  KVTIER_STAT_(storage_hit_tokens);
  KVTIER_STAT_(query_storage_calls);
  KVTIER_STAT_(query_storage_tokens);
  KVTIER_STAT_(prefetch_calls);
  KVTIER_STAT_(prefetch_requested_tokens);
  KVTIER_STAT_(prefetched_tokens);
  KVTIER_STAT_(prefetch_below_threshold_tokens);
  KVTIER_STAT_(prefetch_no_room_tokens);
  KVTIER_STAT_(prefetch_complete);
  KVTIER_STAT_(prefetch_partial);
  KVTIER_STAT_(prefetch_timed_out);
  KVTIER_STAT_(prefetch_cancelled);
  KVTIER_STAT_(prefetch_bytes);
  KVTIER_STAT_(prefetch_seconds);
  KVTIER_STAT_(load_back_calls);
  KVTIER_STAT_(load_back_tokens);
  KVTIER_STAT_(load_back_skipped_tokens);
  KVTIER_STAT_(load_back_seconds);
  KVTIER_STAT_(inserted_tokens);
  KVTIER_STAT_(duplicate_tokens);
  KVTIER_STAT_(backup_tokens);
  KVTIER_STAT_(backup_failed_tokens);
  KVTIER_STAT_(backup_skipped_tokens);
  KVTIER_STAT_(backup_present_tokens);
  KVTIER_STAT_(shared_host_hit_tokens);
  KVTIER_STAT_(backup_bytes);
  KVTIER_STAT_(backup_seconds);
  KVTIER_STAT_(write_back_tokens);
  KVTIER_STAT_(storage_backup_tokens);
  KVTIER_STAT_(storage_backup_failed_tokens);
  KVTIER_STAT_(storage_backup_present_tokens);
  KVTIER_STAT_(storage_backup_dropped_tokens);
  KVTIER_STAT_(storage_backup_backlog_tokens);
  KVTIER_STAT_(storage_backup_refused_tokens);
  KVTIER_STAT_(storage_backup_timed_out_tokens);
  KVTIER_STAT_(storage_backup_capacity_tokens);
  KVTIER_STAT_(storage_backup_policy_tokens);
  KVTIER_STAT_(storage_stranded_removed_pages);
  KVTIER_STAT_(storage_stores_held);
  KVTIER_STAT_(storage_backup_bytes);
  KVTIER_STAT_(storage_backup_seconds);
  KVTIER_STAT_(device_evicted_tokens);
  KVTIER_STAT_(device_evictions);
  KVTIER_STAT_(dropped_tokens);
  KVTIER_STAT_(host_evicted_tokens);
  KVTIER_STAT_(host_evictions);
  KVTIER_STAT_(storage_forgotten_tokens);
  KVTIER_STAT_(storage_evicted_by_store_tokens);
  KVTIER_STAT_(eviction_seconds);
  KVTIER_STAT_(storage_errors);
  KVTIER_STAT_(storage_corrupt_pages);
  KVTIER_STAT_(storage_read_timeouts);
  KVTIER_STAT_(storage_write_timeouts);
  KVTIER_STAT_(storage_queue_drops);
  KVTIER_STAT_(pinned_device_tokens);
  KVTIER_STAT_(pinned_host_tokens);
  KVTIER_STAT_(pinned_storage_tokens);
  KVTIER_STAT_(live_pins);
  KVTIER_STAT_(pins);
  KVTIER_STAT_(pins_refused);
  KVTIER_STAT_(pins_expired);
#undef KVTIER_STAT_
  d["load_back_duration"] = HistogramDict(s.load_back_duration, "sum_seconds");
  d["eviction_duration"] = HistogramDict(s.eviction_duration, "sum_seconds");
  d["prefetch_bandwidth"] = HistogramDict(s.prefetch_bandwidth, "sum");
  d["storage_backup_bandwidth"] = HistogramDict(s.storage_backup_bandwidth, "sum");
  return d;
}

// Construction: the device region's buffers checked writable, the config from its dict, and a
// TP group's leader cache (tp_binding.h) when `tp` is given.
void DefConstruction(py::class_<PyCache>& cls) {
  cls.def(py::init([](py::object region_keepalive, const PyRegion& device_region,
                      const py::dict& config_dict, const std::string& shared_host,
                      const std::optional<py::dict>& tp) {
            // load_back writes into the region: read-only memory (bytes, a read-only mmap) is
            // refused here (issue 36: it was accepted, and the first load-back crashed).
            for (size_t i = 0; i < device_region.buffers.size(); ++i) {
              if (IsReadOnly(device_region.buffers[i])) {
                ThrowInvalid(
                    fmt::format("device_region buffer {} is read-only; the cache writes "
                                "into it (load_back): give it writable memory",
                                device_region.labels[i]));
              }
            }
            const HierarchicalCacheConfig config =
                ConfigFromDict(config_dict, shared_host, device_region);
            const KvRegion region = device_region.Get();
            if (tp.has_value()) {  // the leader of a TP group (tp_binding.h)
              const TpGroupConfig group = TpGroupConfigFromDict(*tp);
              TpLeaderCache made =
                  Unwrap(WithoutGil([&] { return CreateTpLeaderCache(config, region, group); }));
              return std::make_unique<PyCache>(std::move(made.cache), std::move(region_keepalive),
                                               std::move(made.leader));
            }
            Result<std::unique_ptr<HierarchicalCache>> cache =
                WithoutGil([&] { return HierarchicalCache::Create(config, region); });
            return std::make_unique<PyCache>(Unwrap(std::move(cache)), std::move(region_keepalive));
          }),
          py::arg("region_keepalive"), py::arg("device_region"), py::arg("config"),
          py::arg("shared_host"), py::arg("tp") = py::none());
}

// A request's calls: match, the storage tier's query and prefetch, load-back, release.
void DefRequestCalls(py::class_<PyCache>& cls) {
  using CallGuard = PyCache::CallGuard;
  cls.def("match",
          [](PyCache& c, uint64_t tokens, int64_t count, const std::string& ns) {
            auto span = SpanOf<Token>(tokens, count, "tokens");
            CallGuard cache(c);
            MatchResult r = Unwrap(ReapAndRun(cache, [&] { return cache->Match(span, ns); }));
            return py::make_tuple(r.handle.id, r.device_tokens, SlotBytes(r.device_slots),
                                  r.host_tokens, SlotBytes(r.host_slots), r.storage_tokens);
          })
      .def("query_storage",
           [](PyCache& c, uint64_t handle) {
             CallGuard cache(c);
             StorageQueryResult r =
                 Unwrap(WithoutGil([&] { return cache->QueryStorage(MatchHandle{handle}); }));
             return py::make_tuple(r.storage_tokens, r.queried_tokens);
           })
      .def("prefetch",
           [](PyCache& c, uint64_t handle, const std::string& policy) {
             CallGuard cache(c);
             Result<PrefetchResult> r = [&]() -> Result<PrefetchResult> {
               if (policy.empty()) {
                 return WithoutGil([&] { return cache->Prefetch(MatchHandle{handle}); });
               }
               KVTIER_ASSIGN_OR_RETURN(PrefetchPolicy p, ParsePrefetchPolicy(policy));
               return WithoutGil([&] { return cache->Prefetch(MatchHandle{handle}, p); });
             }();
             return PrefetchDict(Unwrap(std::move(r)));
           })
      .def("poll_prefetch",
           [](PyCache& c, uint64_t handle) {
             CallGuard cache(c);
             return PrefetchDict(
                 Unwrap(WithoutGil([&] { return cache->PollPrefetch(MatchHandle{handle}); })));
           })
      .def("finish_prefetch",
           [](PyCache& c, uint64_t handle) {
             CallGuard cache(c);
             return PrefetchDict(
                 Unwrap(WithoutGil([&] { return cache->FinishPrefetch(MatchHandle{handle}); })));
           })
      .def("load_back",
           [](PyCache& c, uint64_t handle, uint64_t stream) {
             CallGuard cache(c);
             LoadBackResult l = Unwrap(ReapAndRun(
                 cache, [&] { return cache->LoadBack(MatchHandle{handle}, StreamOf(stream)); }));
             return py::make_tuple(l.loaded_tokens, l.skipped_tokens, SlotBytes(l.device_slots),
                                   PrefetchDict(l.prefetch));
           })
      .def("wait_layer",
           [](PyCache& c, uint64_t handle, int64_t layer, uint64_t stream) {
             CallGuard cache(c);
             ThrowIfError(WithoutGil(
                 [&] { return cache->WaitLayer(MatchHandle{handle}, layer, StreamOf(stream)); }));
           })
      .def(
          "release",
          [](PyCache& c, uint64_t handle, std::optional<uint64_t> stream, int device) {
            CallGuard cache(c);
            ThrowIfError(cache.deferred().TakeError());
            if (stream.has_value() &&
                Unwrap(cache.deferred().Park(device, StreamOf(*stream), handle, {}))) {
              return;
            }
            ThrowIfError(WithoutGil([&] { return cache->Release(MatchHandle{handle}); }));
          },
          py::arg("handle"), py::arg("stream") = py::none(), py::arg("device") = 0);
}

// Pins, the engine's device slots and inserting a computed prefix.
void DefPinAndSlotCalls(py::class_<PyCache>& cls) {
  using CallGuard = PyCache::CallGuard;
  cls.def("pin",
          [](PyCache& c, uint64_t tokens, int64_t count, const std::vector<std::string>& tiers,
             double ttl_seconds, const std::string& ns) {
            auto span = SpanOf<Token>(tokens, count, "tokens");
            std::vector<CacheTier> named;
            for (const std::string& t : tiers) {
              if (t == "device") {
                named.push_back(CacheTier::kDevice);
              } else if (t == "host") {
                named.push_back(CacheTier::kHost);
              } else if (t == "storage") {
                named.push_back(CacheTier::kStorage);
              } else {
                ThrowIfError(Status::InvalidArgument(
                    fmt::format("tiers: '{}' is not one of device, host, storage", t)));
              }
            }
            CallGuard cache(c);
            PinResult r =
                Unwrap(ReapAndRun(cache, [&] { return cache->Pin(span, named, ttl_seconds, ns); }));
            return py::make_tuple(r.pin.id, r.pinned_tokens, r.store_pinned);
          })
      .def("unpin",
           [](PyCache& c, uint64_t pin) {
             CallGuard cache(c);
             ThrowIfError(WithoutGil([&] { return cache->Unpin(PinHandle{pin}); }));
           })
      .def("allocate_device_slots",
           [](PyCache& c, int64_t num_tokens, bool allow_fewer) {
             CallGuard cache(c);
             AllocateOptions options;
             options.allow_fewer = allow_fewer;
             return SlotBytes(Unwrap(ReapAndRun(
                 cache, [&] { return cache->AllocateDeviceSlots(num_tokens, options); })));
           })
      .def(
          "free_device_slots",
          [](PyCache& c, uint64_t slots, int64_t count, std::optional<uint64_t> stream,
             int device) {
            auto span = SpanOf<int64_t>(slots, count, "slots");
            CallGuard cache(c);
            ThrowIfError(cache.deferred().TakeError());
            const int64_t page = cache->page_size();
            if (stream.has_value() && !span.empty() && span.size() % page == 0 &&
                Unwrap(cache.deferred().Park(device, StreamOf(*stream), 0,
                                             std::vector<int64_t>(span.begin(), span.end())))) {
              return;  // (a list that is not whole pages is refused now, below)
            }
            ThrowIfError(WithoutGil([&] { return cache->FreeDeviceSlots(span); }));
          },
          py::arg("slots"), py::arg("count"), py::arg("stream") = py::none(), py::arg("device") = 0)
      .def("insert",
           [](PyCache& c, uint64_t tokens, int64_t num_tokens, uint64_t slots, int64_t num_slots,
              const std::string& ns, int32_t priority, uint64_t stream) {
             auto t = SpanOf<Token>(tokens, num_tokens, "tokens");
             auto s = SpanOf<int64_t>(slots, num_slots, "device_slots");
             CallGuard cache(c);
             InsertOptions options;
             options.priority = priority;
             options.stream = StreamOf(stream);
             InsertResult i =
                 Unwrap(ReapAndRun(cache, [&] { return cache->Insert(t, s, ns, options); }));
             py::dict d;
             d["cached_tokens"] = i.cached_tokens;
             d["revived_tokens"] = i.revived_tokens;
             d["new_tokens"] = i.new_tokens;
             d["duplicate_tokens"] = i.duplicate_tokens;
             return d;
           });
}

// Tier operations: eviction and waiting for the backups.
void DefTierCalls(py::class_<PyCache>& cls) {
  using CallGuard = PyCache::CallGuard;
  cls.def("evict_device",
          [](PyCache& c, int64_t n) {
            CallGuard cache(c);
            return Unwrap(ReapAndRun(cache, [&] { return cache->EvictDevice(n); }));
          })
      .def("evict_host",
           [](PyCache& c, int64_t n) {
             CallGuard cache(c);
             return Unwrap(WithoutGil([&] { return cache->EvictHost(n); }));
           })
      .def("wait_for_backups", [](PyCache& c) {
        CallGuard cache(c);
        ThrowIfError(WithoutGil([&] {
          cache.deferred().Reap(*cache, /*wait=*/false);
          return cache->WaitForBackups();
        }));
        ThrowIfError(cache.deferred().TakeError());
      });
}

// What the cache reports: stats, metrics, its consistency, its shape and host tier; close.
void DefInspection(py::class_<PyCache>& cls) {
  using CallGuard = PyCache::CallGuard;
  cls.def("stats",
          [](PyCache& c) {
            CallGuard cache(c);
            return StatsDict(WithoutGil([&] {
              cache.deferred().Reap(*cache, /*wait=*/false);
              return cache->stats();
            }));
          })
      .def("metrics",
           [](PyCache& c) {
             CallGuard cache(c);
             return WithoutGil([&] { return cache->Metrics(); });
           })
      .def("check_consistency",
           [](PyCache& c) {
             CallGuard cache(c);
             ThrowIfError(WithoutGil([&] { return cache->CheckConsistency(); }));
           })
      .def("page_size", [](PyCache& c) { return CallGuard(c)->page_size(); })
      .def("backend", [](PyCache& c) { return TransferBackendName(CallGuard(c)->backend()); })
      .def("has_storage", [](PyCache& c) { return CallGuard(c)->storage() != nullptr; })
      .def("host_geometry",
           [](PyCache& c) {
             CallGuard cache(c);
             const KvRegion& r = cache->host_region();
             py::dict d;
             d["layout"] = LayoutName(r.geometry.layout);
             d["num_layers"] = r.geometry.num_layers;
             d["num_slots"] = r.geometry.num_slots;
             d["slot_bytes"] = r.geometry.slot_bytes;
             d["page_size"] = r.geometry.page_size;
             d["head_num"] = r.geometry.head_num;
             d["mla"] = r.mla;
             return d;
           })
      .def("close", &PyCache::Close)
      .def_property_readonly("closed", &PyCache::closed);
}

// A TP group's leader (tp_binding.h): its engine messages, waits and statistics.
void DefTpLeaderCalls(py::class_<PyCache>& cls) {
  using CallGuard = PyCache::CallGuard;
  cls.def("tp_publish",
          [](PyCache& c, const py::bytes& message) {
            CallGuard cache(c);
            const std::string data = message;
            TpLeader& leader = cache.tp_leader();
            return Unwrap(WithoutGil([&] {
              return leader.PublishMessage(std::span<const std::byte>(
                  reinterpret_cast<const std::byte*>(data.data()), data.size()));
            }));
          })
      .def("tp_wait_applied",
           [](PyCache& c, uint64_t seq) {
             CallGuard cache(c);
             TpLeader& leader = cache.tp_leader();
             ThrowIfError(WithoutGil([&] { return leader.WaitApplied(seq); }));
           })
      .def("tp_fence",
           [](PyCache& c) {
             CallGuard cache(c);
             TpLeader& leader = cache.tp_leader();
             ThrowIfError(WithoutGil([&] { return leader.Fence(); }));
           })
      .def("tp_result",
           [](PyCache& c, int rank, uint64_t seq) {
             CallGuard cache(c);
             return Unwrap(cache.tp_leader().MessageResult(rank, seq));
           })
      .def("tp_stats", [](PyCache& c) {
        CallGuard cache(c);
        const TpLeaderStats s = cache.tp_leader().stats();
        py::dict d;
        d["size"] = cache.tp_leader().config().tp_size;
        d["records"] = s.records;
        d["record_bytes"] = s.record_bytes;
        d["slots"] = s.slots;
        d["waits"] = s.waits;
        d["wakes"] = s.wakes;
        d["ack_wait_seconds"] = s.ack_wait_seconds;
        d["health"] = cache.tp_leader().health().ToString();
        return d;
      });
}

// kvtier.int32_tokens: a Python sequence of ints as int32 bytes.
void RegisterInt32Tokens(py::module_& m) {
  m.def(
      "int32_tokens",
      [](py::handle obj, const std::string& name) {
        // A list or tuple of Python ints as contiguous int32 bytes: one pass with the C API
        // (array.array('i', list) takes several times as long for an 8,192-token prompt).
        py::object seq = py::reinterpret_steal<py::object>(PySequence_Fast(obj.ptr(), "tokens"));
        if (!seq) throw py::error_already_set();
        const Py_ssize_t n = PySequence_Fast_GET_SIZE(seq.ptr());
        PyObject** items = PySequence_Fast_ITEMS(seq.ptr());
        py::bytes out(nullptr, static_cast<size_t>(n) * sizeof(int32_t));
        auto* data = reinterpret_cast<int32_t*>(PyBytes_AS_STRING(out.ptr()));
        for (Py_ssize_t i = 0; i < n; ++i) {
          PyObject* item = items[i];
          if (!PyLong_Check(item) || PyBool_Check(item)) {
            ThrowStatus(Status::InvalidArgument(
                fmt::format("{} must be a sequence of int32 values ({}[{}] is a {})", name, name, i,
                            Py_TYPE(item)->tp_name)));
          }
          int overflow = 0;
          const long long v = PyLong_AsLongLongAndOverflow(item, &overflow);
          if (overflow != 0 || v < INT32_MIN || v > INT32_MAX) {
            ThrowStatus(Status::InvalidArgument(fmt::format(
                "{} must be a sequence of int32 values ({}[{}] is outside the int32 range)", name,
                name, i)));
          }
          data[i] = static_cast<int32_t>(v);
        }
        return out;
      },
      py::arg("tokens"), py::arg("name"),
      "A list or tuple of ints as int32 bytes (ValueError naming `name` otherwise).");
}

// The shared host segment's lifetime (as `kvtier shm create` / `destroy`).
void RegisterSharedHostSegments(py::module_& m) {
  m.def(
      "shm_create",
      [](const std::string& name, const std::string& layout, int64_t num_layers, int64_t slot_bytes,
         int64_t page_size, int64_t head_num, int64_t pages, bool mla, int max_processes) {
        SharedHostPoolConfig config;
        config.name = name;
        config.geometry.layout = Unwrap(ParseLayout(layout));
        config.geometry.num_layers = num_layers;
        config.geometry.slot_bytes = slot_bytes;
        config.geometry.page_size = page_size;
        config.geometry.head_num = head_num;
        config.mla = mla;
        config.max_processes = max_processes;
        config.register_with_cuda = false;  // the caches that attach it register their mapping
        ThrowIfError(ValidatePageSize(page_size, "page_size"));
        if (pages <= 0 || pages > (int64_t{1} << 40) / std::max<int64_t>(page_size, 1)) {
          ThrowStatus(Status::InvalidArgument(
              fmt::format("pages = {} must be positive (and below 2^40 slots)", pages)));
        }
        config.geometry.num_slots = pages * page_size;
        ThrowIfError(config.Validate());
        std::unique_ptr<SharedHostPool> pool =
            Unwrap(WithoutGil([&] { return SharedHostPool::Create(config); }));
        SharedHostPoolInfo info = Unwrap(pool->Inspect());
        py::dict d;
        d["name"] = info.name;
        d["path"] = info.path;
        d["num_pages"] = info.num_pages;
        d["page_bytes"] = info.page_bytes;
        d["segment_bytes"] = info.segment_bytes;
        return d;
      },
      py::arg("name"), py::arg("layout"), py::arg("num_layers"), py::arg("slot_bytes"),
      py::arg("page_size"), py::arg("head_num"), py::arg("pages"), py::arg("mla"),
      py::arg("max_processes"),
      "Creates a shared host segment (as `kvtier shm create`); FailedPrecondition if it exists.");
  m.def(
      "shm_destroy",
      [](const std::string& name) {
        ThrowIfError(WithoutGil([&] { return SharedHostPool::Destroy(name); }));
      },
      py::arg("name"), "Removes a shared host segment's name (as `kvtier shm destroy`).");
}

// Ordering one CUDA stream after others (a no-op without CUDA).
void RegisterStreamWait(py::module_& m) {
  m.def(
      "stream_wait_streams",
      [](int device, uint64_t waiter, const std::vector<uint64_t>& others) {
#if defined(KVTIER_PY_WITH_CUDA)
        int previous = 0;
        ThrowIfError(cudaGetDevice(&previous) == cudaSuccess
                         ? Status::OK()
                         : Status::CudaError("cudaGetDevice failed"));
        if (previous != device) (void)cudaSetDevice(device);
        Status st;
        for (uint64_t other : others) {
          if (other == waiter) continue;
          cudaEvent_t event = nullptr;
          cudaError_t e = cudaEventCreateWithFlags(&event, cudaEventDisableTiming);
          if (e == cudaSuccess) e = cudaEventRecord(event, reinterpret_cast<cudaStream_t>(other));
          if (e == cudaSuccess) {
            e = cudaStreamWaitEvent(reinterpret_cast<cudaStream_t>(waiter), event, 0);
          }
          if (event != nullptr) (void)cudaEventDestroy(event);  // freed once the wait is done
          if (e != cudaSuccess) {
            st = Status::CudaError(
                fmt::format("ordering after stream {:#x}: {}", other, cudaGetErrorString(e)));
            break;
          }
        }
        if (previous != device) (void)cudaSetDevice(previous);
        ThrowIfError(st);
#else
        (void)device, (void)waiter, (void)others;
#endif
      },
      py::arg("device"), py::arg("waiter"), py::arg("others"),
      "Makes `waiter` wait (on the device) for the work queued so far on each of `others`.");
}

}  // namespace

void RegisterCache(py::module_& m) {
  py::class_<PyCache> cls(m, "_HierarchicalCache",
                          "The C++ cache manager; use kvtier.HierarchicalCache.");
  DefConstruction(cls);
  DefRequestCalls(cls);
  DefPinAndSlotCalls(cls);
  DefTierCalls(cls);
  DefInspection(cls);
  DefTpLeaderCalls(cls);
  RegisterInt32Tokens(m);
  RegisterSharedHostSegments(m);
  m.def("cache_config_fields", &CacheConfigTable,
        "The HierarchicalCache settings: [{name, kind, default, min, max, min_exclusive, choices, "
        "help}], defaults read from the C++ HierarchicalCacheConfig.");
  RegisterStreamWait(m);
}

}  // namespace kvtier::python
