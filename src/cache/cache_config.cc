// The cache's configuration, its names and small result types (see kvtier/hierarchical_cache.h).
//
// Thread safety: pure functions over plain values.
#include <fmt/format.h>

#include <cmath>

#include "kvtier/hierarchical_cache.h"

namespace kvtier {

namespace {

bool IsPowerOfTwo(int64_t x) { return x > 0 && (x & (x - 1)) == 0; }

}  // namespace

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

Status StorageTierConfig::Validate() const {
  if (!enabled()) return Status::OK();
  if (!backend) KVTIER_RETURN_IF_ERROR(options.Validate().WithContext("storage.options"));
  if (static_cast<int>(prefetch_policy) > 2) {
    return Status::InvalidArgument(fmt::format("storage.prefetch_policy = {} is not a known policy",
                                               static_cast<int>(prefetch_policy)));
  }
  if (prefetch_threshold_tokens < 0) {
    return Status::InvalidArgument(fmt::format(
        "storage.prefetch_threshold_tokens = {} must not be negative", prefetch_threshold_tokens));
  }
  auto seconds_ok = [](double s) { return std::isfinite(s) && s >= 0 && s <= 86400; };
  if (!seconds_ok(prefetch_timeout_base_s) || !seconds_ok(prefetch_timeout_per_1k_tokens_s) ||
      !seconds_ok(prefetch_timeout_max_s)) {
    return Status::InvalidArgument(fmt::format(
        "storage.prefetch_timeout_base_s = {}, _per_1k_tokens_s = {}, _max_s = {}: each must be "
        "in [0, 86400] seconds",
        prefetch_timeout_base_s, prefetch_timeout_per_1k_tokens_s, prefetch_timeout_max_s));
  }
  if (!(max_prefetch_host_fraction > 0 && max_prefetch_host_fraction <= 1)) {
    return Status::InvalidArgument(fmt::format(
        "storage.max_prefetch_host_fraction = {} must be in (0, 1]", max_prefetch_host_fraction));
  }
  constexpr int64_t kMaxPages = int64_t{1} << 40;
  auto pages_ok = [&](int64_t v, int64_t lo) { return v >= lo && v <= kMaxPages; };
  if (!pages_ok(max_prefetch_batch_pages, 1) || !pages_ok(max_backup_batch_pages, 1)) {
    return Status::InvalidArgument(fmt::format(
        "storage.max_prefetch_batch_pages = {} / max_backup_batch_pages = {} must be in [1, 2^40]",
        max_prefetch_batch_pages, max_backup_batch_pages));
  }
  if (!pages_ok(max_storage_only_pages, 0) || !pages_ok(max_backup_queue_pages, 0)) {
    return Status::InvalidArgument(fmt::format(
        "storage.max_storage_only_pages = {} / max_backup_queue_pages = {} must be in [0, 2^40]",
        max_storage_only_pages, max_backup_queue_pages));
  }
  if (tp_size < 1 || tp_rank < 0 || tp_rank >= tp_size) {
    return Status::InvalidArgument(fmt::format(
        "storage.tp_rank = {} / tp_size = {}: need 0 <= tp_rank < tp_size", tp_rank, tp_size));
  }
  return Status::OK();
}

Status HierarchicalCacheConfig::Validate() const {
  if (page_size != 0 && (!IsPowerOfTwo(page_size) || page_size > 256)) {
    return Status::InvalidArgument(fmt::format(
        "page_size = {} must be 0 (the device region's) or a power of two in [1, 256]", page_size));
  }
  if (host_capacity_bytes < 0) {
    return Status::InvalidArgument(
        fmt::format("host_capacity_bytes = {} must not be negative", host_capacity_bytes));
  }
  if (host_capacity_bytes == 0 && host_ratio != 0 &&
      !(std::isfinite(host_ratio) && host_ratio > 0 && host_ratio <= 1e6)) {
    return Status::InvalidArgument(fmt::format(
        "host_ratio = {} must be in (0, 1e6] when host_capacity_bytes is 0 (both 0: no host tier)",
        host_ratio));
  }
  if (static_cast<int>(host_layout) >= kNumLayouts) {
    return Status::InvalidArgument(
        fmt::format("host_layout = {} is not a known layout", static_cast<int>(host_layout)));
  }
  if (host_head_num < 0 || host_head_num > (int64_t{1} << 20)) {
    return Status::InvalidArgument(
        fmt::format("host_head_num = {} must be in [0, 2^20]", host_head_num));
  }
  if (static_cast<int>(write_policy) > 2) {
    return Status::InvalidArgument(
        fmt::format("write_policy = {} is not a known policy", static_cast<int>(write_policy)));
  }
  if (write_through_threshold < 1) {
    return Status::InvalidArgument(
        fmt::format("write_through_threshold = {} must be at least 1", write_through_threshold));
  }
  if (static_cast<int>(device_eviction) > 3 || static_cast<int>(host_eviction) > 3) {
    return Status::InvalidArgument(
        fmt::format("device_eviction = {} / host_eviction = {}: not known eviction policies",
                    static_cast<int>(device_eviction), static_cast<int>(host_eviction)));
  }
  if (static_cast<int>(transfer_backend) > 3) {
    return Status::InvalidArgument(fmt::format("transfer_backend = {} is not a known backend",
                                               static_cast<int>(transfer_backend)));
  }
  KVTIER_RETURN_IF_ERROR(transfer.Validate().WithContext("transfer"));
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
  if (backup_threads < 0 || backup_threads > 64) {
    return Status::InvalidArgument(
        fmt::format("backup_threads = {} must be in [0, 64]", backup_threads));
  }
  if (load_back_min_tokens < 0) {
    return Status::InvalidArgument(
        fmt::format("load_back_min_tokens = {} must not be negative", load_back_min_tokens));
  }
  KVTIER_RETURN_IF_ERROR(storage.Validate());
  if (storage.enabled() && !has_host_tier()) {
    return Status::InvalidArgument(
        "storage (a backend or url) needs a host tier, but host_capacity_bytes = 0 and host_ratio "
        "= 0 configure none: prefetches land in host memory (give the host tier a capacity)");
  }
  return Status::OK();
}

}  // namespace kvtier
