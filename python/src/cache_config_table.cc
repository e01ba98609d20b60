// python/src/cache_config_table.cc — the table of cache_config_table.h.
#include "cache_config_table.h"

#include <fmt/format.h>
#include <pybind11/stl.h>

#include <chrono>
#include <cstdint>
#include <limits>
#include <string>
#include <utility>

#include "errors.h"
#include "kvtier/eviction_policy.h"
#include "kvtier/layout.h"
#include "kvtier/transfer.h"

namespace py = pybind11;

namespace kvtier::python {
namespace {

using Config = HierarchicalCacheConfig;
using Kind = ConfigField::Kind;

constexpr double kInt64Max = 9223372036854775807.0;
constexpr double kPages = static_cast<double>(int64_t{1} << 40);

[[noreturn]] void WrongType(const std::string& name, py::handle value, const char* want) {
  ThrowStatus(Status::InvalidArgument(
      fmt::format("{} = {} must be {}", name, py::repr(value).cast<std::string>(), want)));
}

// An integer field of C++ type T, read and written through `get` / `put`.
template <typename T, typename Get, typename Put>
ConfigField IntVia(std::string name, Get get, Put put, double min, double max, std::string help) {
  ConfigField f{std::move(name), Kind::kInt, min, max, false, {}, std::move(help), {}, {}};
  f.get = [get](const Config& c) { return py::int_(static_cast<int64_t>(get(c))); };
  f.set = [put, n = f.name](Config& c, py::handle v) {
    if (PyBool_Check(v.ptr()) || !PyIndex_Check(v.ptr())) WrongType(n, v, "an integer");
    int overflow = 0;
    py::object index = py::reinterpret_steal<py::object>(PyNumber_Index(v.ptr()));
    const long long x = PyLong_AsLongLongAndOverflow(index.ptr(), &overflow);
    if (overflow != 0 || x < static_cast<long long>(std::numeric_limits<T>::min()) ||
        x > static_cast<long long>(std::numeric_limits<T>::max())) {
      ThrowStatus(Status::InvalidArgument(
          fmt::format("{} = {} does not fit the field", n, py::repr(v).cast<std::string>())));
    }
    put(c, static_cast<T>(x));
  };
  return f;
}

// An integer field reached through `ref` (a member of Config or of one of its parts).
template <typename T, typename Ref>
ConfigField Int(std::string name, Ref ref, double min, double max, std::string help) {
  return IntVia<T>(
      std::move(name), [ref](const Config& c) { return ref(const_cast<Config&>(c)); },
      [ref](Config& c, T v) { ref(c) = v; }, min, max, std::move(help));
}

template <typename Ref>
ConfigField Float(std::string name, Ref ref, double min, double max, bool min_exclusive,
                  std::string help) {
  ConfigField f{std::move(name), Kind::kFloat, min, max, min_exclusive, {},
                std::move(help), {},           {}};
  f.get = [ref](const Config& c) { return py::float_(ref(const_cast<Config&>(c))); };
  f.set = [ref, n = f.name](Config& c, py::handle v) {
    if (PyBool_Check(v.ptr()) || !(PyFloat_Check(v.ptr()) || PyIndex_Check(v.ptr()))) {
      WrongType(n, v, "a number");
    }
    ref(c) = PyFloat_AsDouble(v.ptr());
  };
  return f;
}

template <typename Ref>
ConfigField Bool(std::string name, Ref ref, std::string help) {
  ConfigField f{std::move(name), Kind::kBool, 0, 1, false, {}, std::move(help), {}, {}};
  f.get = [ref](const Config& c) { return py::bool_(ref(const_cast<Config&>(c))); };
  f.set = [ref, n = f.name](Config& c, py::handle v) {
    if (!PyBool_Check(v.ptr())) WrongType(n, v, "True or False");
    ref(c) = v.ptr() == Py_True;
  };
  return f;
}

// A string field; None reads as "" (off).
template <typename Ref>
ConfigField String(std::string name, Ref ref, std::string help) {
  ConfigField f{std::move(name), Kind::kString, 0, 0, false, {}, std::move(help), {}, {}};
  f.get = [ref](const Config& c) { return py::str(ref(const_cast<Config&>(c))); };
  f.set = [ref, n = f.name](Config& c, py::handle v) {
    if (v.is_none()) {
      ref(c).clear();
      return;
    }
    if (!PyUnicode_Check(v.ptr())) WrongType(n, v, "a string");
    ref(c) = v.cast<std::string>();
  };
  return f;
}

// An enum field spelled by name (Name / Parse functions of the C++ API).
template <typename E, typename Ref, typename NameFn, typename ParseFn>
ConfigField Choice(std::string name, Ref ref, std::vector<E> values, NameFn name_of, ParseFn parse,
                   std::string help) {
  ConfigField f{std::move(name), Kind::kChoice, 0, 0, false, {}, std::move(help), {}, {}};
  for (E e : values) f.choices.emplace_back(name_of(e));
  f.get = [ref, name_of](const Config& c) { return py::str(name_of(ref(const_cast<Config&>(c)))); };
  f.set = [ref, parse, n = f.name, choices = f.choices](Config& c, py::handle v) {
    if (!PyUnicode_Check(v.ptr())) WrongType(n, v, "a string");
    Result<E> r = parse(v.cast<std::string>());
    if (!r.ok()) {
      ThrowStatus(Status::InvalidArgument(
          fmt::format("{} = {}: {}", n, py::repr(v).cast<std::string>(), r.status().message())));
    }
    ref(c) = *r;
  };
  return f;
}

#define KVTIER_REF_(expr) \
  [](Config & c) -> auto& { return c.expr; }

std::vector<ConfigField> BuildFields() {
  const std::vector<EvictionPolicyKind> evictions = {
      EvictionPolicyKind::kLru, EvictionPolicyKind::kLfu, EvictionPolicyKind::kFifo,
      EvictionPolicyKind::kPriority};
  std::vector<ConfigField> f;
  f.push_back(Int<int64_t>("page_size", KVTIER_REF_(page_size), 0, 256,
                           "page size of every tier; 0 = the device region's (a power of two)"));
  f.push_back(Int<int64_t>("host_capacity_bytes", KVTIER_REF_(host_capacity_bytes), 0, kInt64Max,
                           "host tier bytes; 0 = host_ratio x the device pool"));
  f.push_back(Float("host_ratio", KVTIER_REF_(host_ratio), 0, 1e6, false,
                    "host tier as a multiple of the device pool (both 0: no host tier)"));
  f.push_back(Choice<KvLayout>("host_layout", KVTIER_REF_(host_layout),
                               {KvLayout::kPageFirst, KvLayout::kPageFirstDirect,
                                KvLayout::kPageHead, KvLayout::kLayerFirst},
                               LayoutName, ParseLayout, "layout of the host pool"));
  f.push_back(Int<int64_t>("host_head_num", KVTIER_REF_(host_head_num), 0, 1 << 20,
                           "page_head: heads per slot; 0 = the device region's"));
  f.push_back(
      Bool("host_huge_pages", KVTIER_REF_(host_huge_pages), "back the host pool with huge pages"));
  f.push_back(Choice<WritePolicy>(
      "write_policy", KVTIER_REF_(write_policy),
      {WritePolicy::kWriteThrough, WritePolicy::kWriteThroughSelective, WritePolicy::kWriteBack},
      WritePolicyName, ParseWritePolicy, "when device pages are backed up to host and storage"));
  f.push_back(Int<int64_t>("write_through_threshold", KVTIER_REF_(write_through_threshold), 1,
                           kInt64Max, "write_through_selective: hits before a backup"));
  f.push_back(Choice<EvictionPolicyKind>("device_eviction", KVTIER_REF_(device_eviction), evictions,
                                         EvictionPolicyName, ParseEvictionPolicy,
                                         "eviction order of the device tier"));
  f.push_back(Choice<EvictionPolicyKind>("host_eviction", KVTIER_REF_(host_eviction), evictions,
                                         EvictionPolicyName, ParseEvictionPolicy,
                                         "eviction order of the host tier"));
  f.push_back(Choice<TransferBackend>(
      "transfer_backend", KVTIER_REF_(transfer_backend),
      {TransferBackend::kCpu, TransferBackend::kKernel, TransferBackend::kDma,
       TransferBackend::kAuto},
      TransferBackendName, ParseTransferBackend,
      "copy backend (Python's default: cpu for a host region, kernel for a device region)"));
  f.push_back(Int<int>("cpu_threads", KVTIER_REF_(transfer.cpu_threads), 0, 1024,
                       "cpu backend copy threads; 0 = one per core"));
  f.push_back(Int<int64_t>("cpu_parallel_threshold_bytes",
                           KVTIER_REF_(transfer.cpu_parallel_threshold_bytes), 0, kInt64Max,
                           "cpu backend: smaller copies run on the calling thread"));
  f.push_back(Int<int>("max_sms", KVTIER_REF_(transfer.max_sms), 1, 2147483647,
                       "kernel backend: SMs of one copy"));
  f.push_back(Int<int>("max_sms_to_host", KVTIER_REF_(transfer.max_sms_to_host), 0, 2147483647,
                       "kernel backend: SMs of a backup (device -> host); 0 = max_sms"));
  f.push_back(Int<int>("max_sms_beside_backup", KVTIER_REF_(transfer.max_sms_beside_backup), 0,
                       2147483647, "kernel backend: SMs of a load beside a backup; 0 = off"));
  f.push_back(Bool("dma_batch", KVTIER_REF_(transfer.dma_batch),
                   "dma backend: batched submission where the driver offers it"));
  f.push_back(Bool("dma_join_kv", KVTIER_REF_(transfer.dma_join_kv),
                   "dma backend: K and V of a page in one strided operation"));
  f.push_back(Int<int>("dma_lanes", KVTIER_REF_(transfer.dma_lanes), 1, 16,
                       "dma backend: streams a large plan is split over"));
  f.push_back(Int<int>("dma_ops_per_lane", KVTIER_REF_(transfer.dma_ops_per_lane), 16, 1 << 20,
                       "dma backend: operations per lane before another lane is used"));
  f.push_back(Bool("dma_submit_threads", KVTIER_REF_(transfer.dma_submit_threads),
                   "dma backend: a submitting thread per lane"));
  f.push_back(Int<int>("dma_min_strided_rows", KVTIER_REF_(transfer.dma_min_strided_rows), 2,
                       1 << 20, "dma backend: fewest equal runs sent as one strided copy"));
  f.push_back(Int<int>("backup_threads", KVTIER_REF_(backup_threads), 0, 64,
                       "cpu backend: backup threads; 0 = in the calling thread"));
  f.push_back(Int<int64_t>("load_back_min_tokens", KVTIER_REF_(load_back_min_tokens), 0, kInt64Max,
                           "host hits shorter than this are recomputed, not loaded"));
  f.push_back(String("storage", KVTIER_REF_(storage.url),
                     "storage tier URL (file://, redis://, redis+cluster://, memory://); None = "
                     "no storage tier"));
  f.push_back(String("storage_model_id", KVTIER_REF_(storage.model_id),
                     "the deployment's model in the store's namespace"));
  f.push_back(String("storage_kv_dtype", KVTIER_REF_(storage.kv_dtype),
                     "the KV dtype in the store's namespace"));
  f.push_back(Int<int64_t>("storage_tp_rank", KVTIER_REF_(storage.tp_rank), 0, kInt64Max,
                           "tensor-parallel rank in the store's namespace"));
  f.push_back(Int<int64_t>("storage_tp_size", KVTIER_REF_(storage.tp_size), 1, kInt64Max,
                           "tensor-parallel size in the store's namespace"));
  f.push_back(Int<int>("storage_io_threads", KVTIER_REF_(storage.options.io_threads), 0, 64,
                       "the storage backend's I/O threads; 0 = the machine's default, "
                       "min(cores, 16) and at least 4"));
  f.push_back(Int<int>("storage_max_queued_batches",
                       KVTIER_REF_(storage.options.max_queued_batches), 1, 2147483647,
                       "storage calls waiting (reads and writes apart); more are rejected"));
  // A std::chrono::milliseconds in C++: read and written as its count.
  f.push_back(IntVia<int64_t>(
      "storage_timeout_ms", [](const Config& c) { return c.storage.options.timeout.count(); },
      [](Config& c, int64_t v) { c.storage.options.timeout = std::chrono::milliseconds(v); }, 1,
      kInt64Max, "per storage call, from when an I/O thread takes it"));
  f.push_back(Int<int64_t>("storage_max_batch_pages", KVTIER_REF_(storage.options.max_batch_pages),
                           1, 1 << 20, "pages of one backend call; more is refused"));
  f.push_back(Choice<PrefetchPolicy>(
      "prefetch_policy", KVTIER_REF_(storage.prefetch_policy),
      {PrefetchPolicy::kBestEffort, PrefetchPolicy::kWaitComplete, PrefetchPolicy::kTimeout},
      PrefetchPolicyName, ParsePrefetchPolicy, "how a prefetch ends by default"));
  f.push_back(Int<int64_t>("prefetch_threshold_tokens",
                           KVTIER_REF_(storage.prefetch_threshold_tokens), 0, kInt64Max,
                           "prefetches of fewer tokens do nothing"));
  f.push_back(Float("prefetch_timeout_base_s", KVTIER_REF_(storage.prefetch_timeout_base_s), 0,
                    86400, false, "timeout policy: base deadline"));
  f.push_back(Float("prefetch_timeout_per_1k_tokens_s",
                    KVTIER_REF_(storage.prefetch_timeout_per_1k_tokens_s), 0, 86400, false,
                    "timeout policy: deadline per 1,024 tokens"));
  f.push_back(Float("prefetch_timeout_max_s", KVTIER_REF_(storage.prefetch_timeout_max_s), 0, 86400,
                    false, "timeout policy: deadline cap"));
  f.push_back(Float("max_prefetch_host_fraction", KVTIER_REF_(storage.max_prefetch_host_fraction),
                    0, 1, true, "share of the host pool filling at once, in (0, 1]"));
  f.push_back(Int<int64_t>("max_prefetch_batch_pages",
                           KVTIER_REF_(storage.max_prefetch_batch_pages), 1, kPages,
                           "pages per storage Get batch"));
  f.push_back(Int<int64_t>("max_storage_only_pages", KVTIER_REF_(storage.max_storage_only_pages), 0,
                           kPages, "storage-only pages the tree remembers"));
  f.push_back(Int<int64_t>("max_backup_queue_pages", KVTIER_REF_(storage.max_backup_queue_pages), 0,
                           kPages, "backups to storage queued or running, in pages"));
  f.push_back(Int<int64_t>("max_backup_batch_pages", KVTIER_REF_(storage.max_backup_batch_pages), 1,
                           kPages, "pages per storage Set batch"));
  return f;
}

#undef KVTIER_REF_

const char* KindName(Kind k) {
  switch (k) {
    case Kind::kInt:
      return "int";
    case Kind::kFloat:
      return "float";
    case Kind::kBool:
      return "bool";
    case Kind::kString:
      return "str";
    case Kind::kChoice:
      return "choice";
  }
  return "?";
}

}  // namespace

const std::vector<ConfigField>& CacheConfigFields() {
  static const std::vector<ConfigField> fields = BuildFields();
  return fields;
}

py::list CacheConfigTable() {
  const Config defaults;
  py::list out;
  for (const ConfigField& f : CacheConfigFields()) {
    py::dict d;
    d["name"] = f.name;
    d["kind"] = KindName(f.kind);
    d["default"] = f.get(defaults);
    const bool numeric = f.kind == Kind::kInt || f.kind == Kind::kFloat;
    if (f.kind == Kind::kInt) {
      d["min"] = py::int_(static_cast<int64_t>(f.min));
      d["max"] = f.max >= kInt64Max ? py::int_(std::numeric_limits<int64_t>::max())
                                    : py::int_(static_cast<int64_t>(f.max));
    } else {
      d["min"] = numeric ? py::object(py::float_(f.min)) : py::none();
      d["max"] = numeric ? py::object(py::float_(f.max)) : py::none();
    }
    d["min_exclusive"] = f.min_exclusive;
    d["choices"] = f.choices;
    d["help"] = f.help;
    out.append(d);
  }
  return out;
}

HierarchicalCacheConfig CacheConfigFromDict(const py::dict& values) {
  Config c;
  const auto& fields = CacheConfigFields();
  for (auto item : values) {
    const std::string key = py::str(item.first).cast<std::string>();
    const ConfigField* field = nullptr;
    for (const ConfigField& f : fields) {
      if (f.name == key) field = &f;
    }
    if (field == nullptr) {
      ThrowStatus(
          Status::InvalidArgument(fmt::format("'{}' is not a HierarchicalCache setting (see "
                                              "kvtier.HierarchicalCache.config_fields())",
                                              key)));
    }
    field->set(c, item.second);
  }
  return c;
}

}  // namespace kvtier::python
