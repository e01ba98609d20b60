// python/src/cache_binding.cc — `_kvtier._HierarchicalCache`, the cache manager for
// kvtier.HierarchicalCache (python/kvtier/cache.py adds the Pythonic surface: token and slot
// arrays of any kind, torch/numpy results, match handles as context managers).
//
// Arrays cross this boundary as (address, count) of contiguous host int32 (tokens) / int64
// (slots) memory that the Python layer keeps alive for the call; results come back as bytes of
// int64 so that importing kvtier needs neither numpy nor torch.
//
// Thread safety: HierarchicalCache is thread-safe; every call that may copy or wait releases
// the GIL. The Python object keeps the device region (and its buffers) alive, since the cache
// refers to the region's per-layer pointer tables.
#include <fmt/format.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "errors.h"
#include "kvtier/eviction_policy.h"
#include "kvtier/hierarchical_cache.h"
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
  return {reinterpret_cast<const T*>(static_cast<uintptr_t>(address)),
          static_cast<size_t>(count)};
}

py::bytes SlotBytes(const std::vector<int64_t>& slots) {
  return py::bytes(reinterpret_cast<const char*>(slots.data()), slots.size() * sizeof(int64_t));
}

CudaStream StreamOf(uint64_t address) {
  return reinterpret_cast<CudaStream>(static_cast<uintptr_t>(address));
}

// Owns the cache; the device region it was created over lives in the Python wrapper.
class PyCache {
 public:
  explicit PyCache(std::unique_ptr<HierarchicalCache> cache) : cache_(std::move(cache)) {}
  HierarchicalCache& get() { return *cache_; }

  // Waits for copies in flight without holding the GIL (a backup worker never needs it, but the
  // wait can be long).
  void Close() {
    if (!cache_) return;
    std::unique_ptr<HierarchicalCache> cache = std::move(cache_);
    py::gil_scoped_release release;
    cache.reset();
  }
  bool closed() const { return cache_ == nullptr; }
  HierarchicalCache& checked() {
    if (!cache_) ThrowStatus(Status::FailedPrecondition("the HierarchicalCache is closed"));
    return *cache_;
  }

 private:
  std::unique_ptr<HierarchicalCache> cache_;
};

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
  KVTIER_STAT_(host_total_bytes);
  KVTIER_STAT_(nodes);
  KVTIER_STAT_(live_handles);
  KVTIER_STAT_(match_calls);
  KVTIER_STAT_(match_query_tokens);
  KVTIER_STAT_(device_hit_tokens);
  KVTIER_STAT_(host_hit_tokens);
  KVTIER_STAT_(load_back_calls);
  KVTIER_STAT_(load_back_tokens);
  KVTIER_STAT_(load_back_skipped_tokens);
  KVTIER_STAT_(load_back_seconds);
  KVTIER_STAT_(inserted_tokens);
  KVTIER_STAT_(duplicate_tokens);
  KVTIER_STAT_(backup_tokens);
  KVTIER_STAT_(backup_inflight_tokens);
  KVTIER_STAT_(backup_skipped_tokens);
  KVTIER_STAT_(write_back_tokens);
  KVTIER_STAT_(device_evicted_tokens);
  KVTIER_STAT_(device_evictions);
  KVTIER_STAT_(dropped_tokens);
  KVTIER_STAT_(host_evicted_tokens);
  KVTIER_STAT_(host_evictions);
#undef KVTIER_STAT_
  return d;
}

}  // namespace

void RegisterCache(py::module_& m) {
  py::class_<PyCache>(m, "_HierarchicalCache",
                      "The C++ cache manager; use kvtier.HierarchicalCache.")
      .def(py::init([](const PyRegion& device_region, int64_t page_size,
                       int64_t host_capacity_bytes, double host_ratio,
                       const std::string& host_layout, int64_t host_head_num,
                       bool host_huge_pages, const std::string& write_policy,
                       int64_t write_through_threshold, const std::string& device_eviction,
                       const std::string& host_eviction, const std::string& transfer_backend,
                       int max_sms, int max_sms_to_host, int max_sms_beside_backup,
                       int cpu_threads, int backup_threads,
                       int64_t load_back_min_tokens) {
             HierarchicalCacheConfig config;
             config.page_size = page_size;
             config.host_capacity_bytes = host_capacity_bytes;
             config.host_ratio = host_ratio;
             config.host_layout = Unwrap(ParseLayout(host_layout));
             config.host_head_num = host_head_num;
             config.host_huge_pages = host_huge_pages;
             config.write_policy = Unwrap(ParseWritePolicy(write_policy));
             config.write_through_threshold = write_through_threshold;
             config.device_eviction = Unwrap(ParseEvictionPolicy(device_eviction));
             config.host_eviction = Unwrap(ParseEvictionPolicy(host_eviction));
             config.transfer_backend = Unwrap(ParseTransferBackend(transfer_backend));
             config.transfer.max_sms = max_sms;
             config.transfer.max_sms_to_host = max_sms_to_host;
             config.transfer.max_sms_beside_backup = max_sms_beside_backup;
             config.transfer.cpu_threads = cpu_threads;
             if (device_region.region.memory == MemoryKind::kDevice) {
               config.transfer.device = device_region.region.device;
             }
             config.backup_threads = backup_threads;
             config.load_back_min_tokens = load_back_min_tokens;
             const KvRegion region = device_region.Get();
             Result<std::unique_ptr<HierarchicalCache>> cache = [&] {
               py::gil_scoped_release release;
               return HierarchicalCache::Create(config, region);
             }();
             return std::make_unique<PyCache>(Unwrap(std::move(cache)));
           }),
           py::arg("device_region"), py::kw_only(), py::arg("page_size"),
           py::arg("host_capacity_bytes"), py::arg("host_ratio"), py::arg("host_layout"),
           py::arg("host_head_num"), py::arg("host_huge_pages"), py::arg("write_policy"),
           py::arg("write_through_threshold"), py::arg("device_eviction"),
           py::arg("host_eviction"), py::arg("transfer_backend"), py::arg("max_sms"),
           py::arg("max_sms_to_host"), py::arg("max_sms_beside_backup"), py::arg("cpu_threads"),
           py::arg("backup_threads"), py::arg("load_back_min_tokens"))
      .def("match",
           [](PyCache& c, uint64_t tokens, int64_t count, const std::string& ns) {
             auto span = SpanOf<Token>(tokens, count, "tokens");
             HierarchicalCache& cache = c.checked();
             Result<MatchResult> r = [&] {
               py::gil_scoped_release release;
               return cache.Match(span, ns);
             }();
             MatchResult m = Unwrap(std::move(r));
             return py::make_tuple(m.handle.id, m.device_tokens, SlotBytes(m.device_slots),
                                   m.host_tokens, SlotBytes(m.host_slots));
           })
      .def("load_back",
           [](PyCache& c, uint64_t handle, uint64_t stream) {
             HierarchicalCache& cache = c.checked();
             Result<LoadBackResult> r = [&] {
               py::gil_scoped_release release;
               return cache.LoadBack(MatchHandle{handle}, StreamOf(stream));
             }();
             LoadBackResult l = Unwrap(std::move(r));
             return py::make_tuple(l.loaded_tokens, l.skipped_tokens, SlotBytes(l.device_slots));
           })
      .def("wait_layer",
           [](PyCache& c, uint64_t handle, int64_t layer, uint64_t stream) {
             ThrowIfError(c.checked().WaitLayer(MatchHandle{handle}, layer, StreamOf(stream)));
           })
      .def("release",
           [](PyCache& c, uint64_t handle) { ThrowIfError(c.checked().Release(MatchHandle{handle})); })
      .def("allocate_device_slots",
           [](PyCache& c, int64_t num_tokens) {
             HierarchicalCache& cache = c.checked();
             Result<std::vector<int64_t>> r = [&] {
               py::gil_scoped_release release;
               return cache.AllocateDeviceSlots(num_tokens);
             }();
             return SlotBytes(Unwrap(std::move(r)));
           })
      .def("free_device_slots",
           [](PyCache& c, uint64_t slots, int64_t count) {
             ThrowIfError(c.checked().FreeDeviceSlots(SpanOf<int64_t>(slots, count, "slots")));
           })
      .def("insert",
           [](PyCache& c, uint64_t tokens, int64_t num_tokens, uint64_t slots, int64_t num_slots,
              const std::string& ns, int32_t priority, uint64_t stream) {
             auto t = SpanOf<Token>(tokens, num_tokens, "tokens");
             auto s = SpanOf<int64_t>(slots, num_slots, "device_slots");
             HierarchicalCache& cache = c.checked();
             InsertOptions options;
             options.priority = priority;
             options.stream = reinterpret_cast<CudaStream>(stream);
             Result<InsertResult> r = [&] {
               py::gil_scoped_release release;
               return cache.Insert(t, s, ns, options);
             }();
             InsertResult i = Unwrap(std::move(r));
             py::dict d;
             d["cached_tokens"] = i.cached_tokens;
             d["revived_tokens"] = i.revived_tokens;
             d["new_tokens"] = i.new_tokens;
             d["duplicate_tokens"] = i.duplicate_tokens;
             return d;
           })
      .def("evict_device",
           [](PyCache& c, int64_t n) {
             HierarchicalCache& cache = c.checked();
             Result<int64_t> r = [&] {
               py::gil_scoped_release release;
               return cache.EvictDevice(n);
             }();
             return Unwrap(std::move(r));
           })
      .def("evict_host",
           [](PyCache& c, int64_t n) {
             HierarchicalCache& cache = c.checked();
             Result<int64_t> r = [&] {
               py::gil_scoped_release release;
               return cache.EvictHost(n);
             }();
             return Unwrap(std::move(r));
           })
      .def("wait_for_backups",
           [](PyCache& c) {
             HierarchicalCache& cache = c.checked();
             Status s;
             {
               py::gil_scoped_release release;
               s = cache.WaitForBackups();
             }
             ThrowIfError(s);
           })
      .def("stats", [](PyCache& c) { return StatsDict(c.checked().stats()); })
      .def("check_consistency", [](PyCache& c) { ThrowIfError(c.checked().CheckConsistency()); })
      .def("page_size", [](PyCache& c) { return c.checked().page_size(); })
      .def("backend", [](PyCache& c) { return TransferBackendName(c.checked().backend()); })
      .def("host_geometry",
           [](PyCache& c) {
             const KvRegion& r = c.checked().host_region();
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

}  // namespace kvtier::python
