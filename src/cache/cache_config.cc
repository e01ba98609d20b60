// The cache's configuration (its schema and Validate), its names and small result types (see
// kvtier/hierarchical_cache.h).
//
// Thread safety: pure functions over plain values.
#include <fmt/format.h>

#include <chrono>
#include <limits>
#include <string>

#include "kvtier/hierarchical_cache.h"

namespace kvtier {

const char* WritePolicyName(WritePolicy policy) {
  switch (policy) {
    case WritePolicy::kWriteThrough:
      return "write_through";
    case WritePolicy::kWriteThroughSelective:
      return "write_through_selective";
    case WritePolicy::kWriteBack:
      return "write_back";
  }
  return "unknown_write_policy";
}

Result<WritePolicy> ParseWritePolicy(std::string_view name) {
  for (auto p :
       {WritePolicy::kWriteThrough, WritePolicy::kWriteThroughSelective, WritePolicy::kWriteBack}) {
    if (name == WritePolicyName(p)) return p;
  }
  return Status::InvalidArgument(fmt::format(
      "write policy '{}' is not one of write_through, write_through_selective, write_back", name));
}

const char* PrefetchPolicyName(PrefetchPolicy policy) {
  switch (policy) {
    case PrefetchPolicy::kBestEffort:
      return "best_effort";
    case PrefetchPolicy::kWaitComplete:
      return "wait_complete";
    case PrefetchPolicy::kTimeout:
      return "timeout";
  }
  return "unknown_prefetch_policy";
}

Result<PrefetchPolicy> ParsePrefetchPolicy(std::string_view name) {
  for (auto p :
       {PrefetchPolicy::kBestEffort, PrefetchPolicy::kWaitComplete, PrefetchPolicy::kTimeout}) {
    if (name == PrefetchPolicyName(p)) return p;
  }
  return Status::InvalidArgument(
      fmt::format("prefetch policy '{}' is not one of best_effort, wait_complete, timeout", name));
}

const char* StorageAdmissionName(StorageAdmission admission) {
  switch (admission) {
    case StorageAdmission::kAll:
      return "all";
    case StorageAdmission::kHits:
      return "hits";
    case StorageAdmission::kFrequency:
      return "frequency";
  }
  return "unknown_storage_admission";
}

Result<StorageAdmission> ParseStorageAdmission(std::string_view name) {
  for (auto a : {StorageAdmission::kAll, StorageAdmission::kHits, StorageAdmission::kFrequency}) {
    if (name == StorageAdmissionName(a)) return a;
  }
  return Status::InvalidArgument(
      fmt::format("storage admission '{}' is not one of all, hits, frequency", name));
}

const ConfigSchema<StorageAdmissionConfig>& StorageAdmissionConfigSchema() {
  static const ConfigSchema<StorageAdmissionConfig> schema = [] {
    using A = StorageAdmissionConfig;
    ConfigSchema<A> s;
    s.push_back(ChoiceField<A>("policy", Member(&A::policy), kNumStorageAdmissions,
                               StorageAdmissionName,
                               "which host pages are written to storage: all, hits (node hit "
                               "count >= threshold), frequency (sketch count >= threshold, or "
                               "any while the backlog has room)"));
    s.push_back(IntField<A>("threshold", Member(&A::threshold), 1, 15,
                            "hits / frequency: the count a page needs to be written"));
    s.push_back(IntField<A>("sketch_counters", Member(&A::sketch_counters), 16, int64_t{1} << 26,
                            "frequency: counters per row of the access sketch (rounded up to a "
                            "power of two; halved every 10 x this many accesses)"));
    s.push_back(IntField<A>("backlog_bytes", Member(&A::backlog_bytes), 0, int64_t{1} << 50,
                            "bytes of writes to storage waiting for the store's queue; when "
                            "full, the least likely to be reused are dropped (0: none wait)"));
    return s;
  }();
  return schema;
}

const char* CacheTierName(CacheTier tier) {
  switch (tier) {
    case CacheTier::kDevice:
      return "device";
    case CacheTier::kHost:
      return "host";
    case CacheTier::kStorage:
      return "storage";
  }
  return "unknown_tier";
}

const char* PrefetchStateName(PrefetchState state) {
  switch (state) {
    case PrefetchState::kNone:
      return "none";
    case PrefetchState::kRunning:
      return "running";
    case PrefetchState::kComplete:
      return "complete";
    case PrefetchState::kPartial:
      return "partial";
    case PrefetchState::kTimedOut:
      return "timed_out";
  }
  return "unknown_prefetch_state";
}

const char* StorageCutReasonName(StorageCutReason reason) {
  switch (reason) {
    case StorageCutReason::kNone:
      return "none";
    case StorageCutReason::kRecomputeCheaper:
      return "recompute_cheaper";
  }
  return "unknown_storage_cut_reason";
}

// ---- the schema ------------------------------------------------------------------------------

namespace {

constexpr const char* kWithStorage = "with a storage tier";

bool StorageOn(const HierarchicalCacheConfig& c) { return c.storage.enabled(); }

ConfigSchema<HierarchicalCacheConfig> BuildSchema() {
  using C = HierarchicalCacheConfig;
  using S = StorageTierConfig;
  constexpr int64_t kPages = int64_t{1} << 40;
  ConfigSchema<C> s;
  s.push_back(IntField<C>("page_size", Member(&C::page_size), 0, kMaxKvPageSize,
                          "page size of every tier; 0 = the device region's (ValidatePageSize)"));
  s.push_back(IntField<C>("host_capacity_bytes", Member(&C::host_capacity_bytes), 0,
                          "host tier bytes; 0 = host_ratio x the device pool"));
  s.push_back(FloatField<C>("host_ratio", Member(&C::host_ratio), 0, 1e6, false,
                            "host tier as a multiple of the device pool (both 0: no host tier)"));
  s.back().checked_when = [](const C& c) { return c.host_capacity_bytes == 0; };
  s.back().when = "when host_capacity_bytes is 0";
  s.push_back(ChoiceField<C>("host_layout", Member(&C::host_layout), kNumLayouts, LayoutName,
                             "layout of the host pool"));
  s.push_back(IntField<C>("host_head_num", Member(&C::host_head_num), 0, int64_t{1} << 20,
                          "page_head: heads per slot; 0 = the device region's"));
  s.push_back(BoolField<C>("host_huge_pages", Member(&C::host_huge_pages),
                           "back the host pool with huge pages"));
  s.push_back(ChoiceField<C>("write_policy", Member(&C::write_policy), kNumWritePolicies,
                             WritePolicyName,
                             "when device pages are backed up to host and storage"));
  s.push_back(IntField<C>("write_through_threshold", Member(&C::write_through_threshold), 1,
                          "write_through_selective: hits before a backup"));
  s.push_back(ChoiceField<C>("device_eviction", Member(&C::device_eviction), kNumEvictionPolicies,
                             EvictionPolicyName, "eviction order of the device tier"));
  s.push_back(ChoiceField<C>("host_eviction", Member(&C::host_eviction), kNumEvictionPolicies,
                             EvictionPolicyName, "eviction order of the host tier"));
  s.push_back(ChoiceField<C>("transfer_backend", Member(&C::transfer_backend), kNumTransferBackends,
                             TransferBackendName, "copy backend between device and host"));
  AppendPart(s, TransferEngineConfigSchema(), &C::transfer);
  s.push_back(IntField<C>("backup_threads", Member(&C::backup_threads), 0, 64,
                          "cpu backend: backup threads; 0 = in the calling thread"));
  s.push_back(IntField<C>("load_back_min_tokens", Member(&C::load_back_min_tokens), 0,
                          "host hits shorter than this are recomputed, not loaded"));
  s.push_back(IntField<C>("pin_device_budget_tokens", Member(&C::pin_device_budget_tokens), 0,
                          "most tokens pins may cover in the device tier (0: no device pins; "
                          "below the device pool)"));
  s.push_back(IntField<C>("pin_host_budget_tokens", Member(&C::pin_host_budget_tokens), 0,
                          "most tokens pins may cover in the host tier (0: no host pins; below "
                          "the host pool)"));
  s.push_back(IntField<C>("pin_storage_budget_tokens", Member(&C::pin_storage_budget_tokens), 0,
                          "most tokens pins may cover in the storage tier (0: no storage pins)"));
  // The storage tier: its bounds are checked only when it is on.
  const size_t first_storage = s.size();
  s.push_back(StringField<C>("storage", Member(&C::storage, &S::url),
                             "storage tier URL (file://, redis://, redis+cluster://, memory://); "
                             "empty = no storage tier"));
  s.push_back(StringField<C>("storage_model_id", Member(&C::storage, &S::model_id),
                             "the deployment's model in the store's namespace"));
  s.push_back(StringField<C>("storage_kv_dtype", Member(&C::storage, &S::kv_dtype),
                             "the KV dtype in the store's namespace"));
  s.push_back(IntField<C>("storage_tp_rank", Member(&C::storage, &S::tp_rank), 0,
                          (int64_t{1} << 20) - 1,
                          "tensor-parallel rank in the store's namespace (< storage_tp_size)"));
  s.push_back(IntField<C>("storage_tp_size", Member(&C::storage, &S::tp_size), 1, int64_t{1} << 20,
                          "tensor-parallel size in the store's namespace"));
  // storage_io_threads, storage_writers_while_reading, storage_max_queued_batches,
  // storage_timeout_ms, storage_max_batch_pages, storage_min_free_bytes.
  AppendPart(s, StorageOptionsSchema(), Member(&C::storage, &S::options), "storage_");
  s.push_back(ChoiceField<C>("prefetch_policy", Member(&C::storage, &S::prefetch_policy),
                             kNumPrefetchPolicies, PrefetchPolicyName,
                             "how a prefetch ends by default"));
  s.push_back(IntField<C>("prefetch_threshold_tokens",
                          Member(&C::storage, &S::prefetch_threshold_tokens), 0,
                          "prefetches of fewer tokens do nothing"));
  s.push_back(FloatField<C>("prefetch_timeout_base_s",
                            Member(&C::storage, &S::prefetch_timeout_base_s), 0, 86400, false,
                            "timeout policy: base deadline, seconds"));
  s.push_back(FloatField<C>("prefetch_timeout_per_1k_tokens_s",
                            Member(&C::storage, &S::prefetch_timeout_per_1k_tokens_s), 0, 86400,
                            false, "timeout policy: deadline per 1,024 tokens, seconds"));
  s.push_back(FloatField<C>("prefetch_timeout_max_s",
                            Member(&C::storage, &S::prefetch_timeout_max_s), 0, 86400, false,
                            "timeout policy: deadline cap, seconds"));
  s.push_back(FloatField<C>("max_prefetch_host_fraction",
                            Member(&C::storage, &S::max_prefetch_host_fraction), 0, 1, true,
                            "share of the host pool filling at once"));
  s.push_back(IntField<C>("max_prefetch_batch_pages",
                          Member(&C::storage, &S::max_prefetch_batch_pages), 1, kPages,
                          "pages per storage Get batch"));
  s.push_back(BoolField<C>("stream_load_back", Member(&C::storage, &S::stream_load_back),
                           "LoadBack copies a waited-for prefetch's pages to the device as they "
                           "arrive (off: after the whole read)"));
  s.push_back(FloatField<C>("prefill_tokens_per_second",
                            Member(&C::storage, &S::prefill_tokens_per_second), 0, 1e12, false,
                            "engine prefill rate; storage hits slower to read are recomputed "
                            "(0 = off)"));
  s.push_back(IntField<C>("max_storage_only_pages", Member(&C::storage, &S::max_storage_only_pages),
                          0, kPages, "storage-only pages the tree remembers"));
  s.push_back(IntField<C>("max_backup_queue_pages", Member(&C::storage, &S::max_backup_queue_pages),
                          0, kPages, "backups to storage queued or running, in pages"));
  s.push_back(IntField<C>("max_backup_batch_pages", Member(&C::storage, &S::max_backup_batch_pages),
                          1, kPages, "pages per storage Set batch"));
  // admission_policy, admission_threshold, admission_sketch_counters, admission_backlog_bytes.
  AppendPart(s, StorageAdmissionConfigSchema(), Member(&C::storage, &S::admission), "admission_");
  CheckedWhen<C>(s, first_storage, StorageOn, kWithStorage);
  return s;
}

std::string NameOf(const FieldNamer& name_of, std::string_view field) {
  return name_of ? name_of(field) : std::string(field);
}

}  // namespace

const ConfigSchema<HierarchicalCacheConfig>& HierarchicalCacheConfigSchema() {
  static const ConfigSchema<HierarchicalCacheConfig> schema = BuildSchema();
  return schema;
}

// The storage fields of the schema, on a config that holds this storage tier.
Status StorageTierConfig::Validate() const {
  if (!enabled()) return Status::OK();
  HierarchicalCacheConfig c;
  c.storage = *this;
  for (const auto& f : HierarchicalCacheConfigSchema()) {
    if (f.when == kWithStorage) KVTIER_RETURN_IF_ERROR(f.Check(c, f.name));
  }
  if (tp_rank >= tp_size) {
    return Status::InvalidArgument(
        fmt::format("storage_tp_rank = {} must be below storage_tp_size = {}", tp_rank, tp_size));
  }
  return Status::OK();
}

// The bounds come from the schema; the rules between fields are written here.
Status HierarchicalCacheConfig::Validate(const FieldNamer& name_of) const {
  KVTIER_RETURN_IF_ERROR(CheckFields(HierarchicalCacheConfigSchema(), *this, name_of));
  if (page_size != 0) {
    KVTIER_RETURN_IF_ERROR(ValidatePageSize(page_size, NameOf(name_of, "page_size")));
  }
  if (storage.enabled() && storage.tp_rank >= storage.tp_size) {
    return Status::InvalidArgument(
        fmt::format("{} = {} must be below {} = {}", NameOf(name_of, "storage_tp_rank"),
                    storage.tp_rank, NameOf(name_of, "storage_tp_size"), storage.tp_size));
  }
  if (shared_host != nullptr && storage.enabled()) {
    return Status::InvalidArgument(
        "shared_host and storage are both set: a cache on a shared host tier has no storage tier "
        "below it (drop storage.backend / storage.url, or shared_host)");
  }
  if (shared_host != nullptr && !has_host_tier()) {
    return Status::InvalidArgument(
        "shared_host is set, but host_capacity_bytes = 0 and host_ratio = 0 configure no host "
        "tier: the shared segment is the host tier (give it a budget of pinned pages)");
  }
  if (storage.enabled() && !has_host_tier()) {
    return Status::InvalidArgument(fmt::format(
        "storage (a backend or url) needs a host tier, but {} = 0 and {} = 0 configure none: "
        "prefetches land in host memory (give the host tier a capacity)",
        NameOf(name_of, "host_capacity_bytes"), NameOf(name_of, "host_ratio")));
  }
  return Status::OK();
}

}  // namespace kvtier
