// The bookkeeping shared by the cache's parts (see cache/cache_core.h).
#include "cache/cache_core.h"

#include <fmt/format.h>

#include <algorithm>

#include "kvtier/host_pool.h"
#include "kvtier/shared_host_pool.h"
#include "util/log.h"

namespace kvtier {

namespace {

// Handle ids: the instance's tag in the high 24 bits, a sequence number in the low 40.
constexpr int kHandleSeqBits = 40;
std::atomic<uint64_t> g_next_cache_tag{1};

// The host pool the config asks for beside `device_region` (num_slots derived from the capacity).
HostKvPoolConfig HostPoolConfig(const HierarchicalCacheConfig& config,
                                const KvRegion& device_region, bool gpu) {
  const KvGeometry& g = device_region.geometry;
  HostKvPoolConfig hc;
  hc.geometry = g;
  hc.geometry.layout = config.host_layout;
  hc.geometry.head_num = config.host_head_num > 0 ? config.host_head_num : g.head_num;
  hc.mla = device_region.mla;
  if (config.host_capacity_bytes > 0) {
    hc.capacity_bytes = config.host_capacity_bytes;
  } else {
    hc.device_ratio = config.host_ratio;
    hc.device_pool_bytes = g.buffer_bytes() * device_region.num_buffers();
  }
  hc.huge_pages = config.host_huge_pages;
  hc.register_with_cuda = gpu;
  return hc;
}

}  // namespace

void SortTopDown(std::vector<RadixNode*>* nodes) {
  std::sort(nodes->begin(), nodes->end(), [](const RadixNode* a, const RadixNode* b) {
    return a->prefix_tokens() < b->prefix_tokens();
  });
}

CacheCore::CacheCore(const HierarchicalCacheConfig& cfg, int64_t page_size)
    : config(cfg),
      P(page_size),
      tag(g_next_cache_tag.fetch_add(1) & ((uint64_t{1} << (64 - kHandleSeqBits)) - 1)),
      tree(page_size,
           cfg.device_eviction_policy ? cfg.device_eviction_policy
                                      : MakeEvictionPolicy(cfg.device_eviction),
           cfg.host_eviction_policy ? cfg.host_eviction_policy
                                    : MakeEvictionPolicy(cfg.host_eviction)) {}

Status CacheCore::OpenHostTier(const KvRegion& device_region) {
  const HostKvPoolConfig hc = HostPoolConfig(config, device_region, gpu);
  if (!config.has_host_tier()) {
    host_region.geometry = hc.geometry;
    host_region.geometry.num_slots = 0;
    host_region.mla = device_region.mla;
  } else if (config.shared_host) {
    const double budget = config.host_capacity_bytes > 0
                              ? static_cast<double>(config.host_capacity_bytes)
                              : config.host_ratio * static_cast<double>(hc.device_pool_bytes);
    KVTIER_ASSIGN_OR_RETURN(
        host, OpenSharedHostTier(config.shared_host, device_region, gpu, config.storage.model_id,
                                 static_cast<int64_t>(std::min(budget, 9e18))));
  } else {
    KVTIER_ASSIGN_OR_RETURN(std::unique_ptr<HostKvPool> pool, HostKvPool::Create(hc));
    host = MakeLocalHostTier(std::move(pool));
  }
  if (host) {
    host_region = host->region();
    shared_host_tier = host->shared();
  }
  const int64_t host_tokens = host ? host->num_pages() * P : 0;
  if (config.pin_host_budget_tokens > 0 && config.pin_host_budget_tokens >= host_tokens) {
    return Status::InvalidArgument(
        fmt::format("pin_host_budget_tokens = {} must be below the host pool's {} tokens (pins "
                    "must leave room for backups and prefetches)",
                    config.pin_host_budget_tokens, host_tokens));
  }
  return Status::OK();
}

Status CacheCore::OpenStorageTier(const KvRegion& device_region) {
  if (!config.storage.enabled()) return Status::OK();
  const StorageNamespace want =
      StorageNamespaceOf(HostPoolConfig(config, device_region, gpu).geometry, device_region.mla,
                         {config.storage.model_id, config.storage.kv_dtype, config.storage.tp_rank,
                          config.storage.tp_size});
  if (config.storage.backend) {
    const StorageNamespace& have = config.storage.backend->ns();
    if (have.layout != want.layout || have.mla != want.mla || have.num_layers != want.num_layers ||
        have.slot_bytes != want.slot_bytes || have.page_size != want.page_size ||
        (want.layout == KvLayout::kPageHead && have.head_num != want.head_num)) {
      return Status::InvalidArgument(fmt::format(
          "storage.backend's namespace ({}) does not describe this cache's host pages ({})",
          have.Describe(), want.Describe()));
    }
    storage = config.storage.backend;
  } else {
    KVTIER_RETURN_IF_ERROR(want.Validate().WithContext("storage namespace"));
    KVTIER_ASSIGN_OR_RETURN(std::unique_ptr<StorageBackend> opened,
                            OpenStorage(config.storage.url, want, config.storage.options));
    storage = std::move(opened);
    owns_storage = true;
  }
  KVTIER_ASSIGN_OR_RETURN(staging, storage::PageStaging::Create(host->region()));
  return Status::OK();
}

void ReadBandwidth::Observe(double bytes, double seconds) {
  if (!(bytes > 0) || !(seconds > 0)) return;
  const double sample = bytes / seconds;
  std::lock_guard<std::mutex> lk(mu_);
  constexpr double kWeight = 0.25;  // of the newest prefetch
  bps_ = bps_ == 0 ? sample : (1 - kWeight) * bps_ + kWeight * sample;
}

double ReadBandwidth::bytes_per_second() const {
  std::lock_guard<std::mutex> lk(mu_);
  return bps_;
}

StorageCut CacheCore::CutFor(int64_t tokens) const {
  StorageCut cut;
  const double rate = config.storage.prefill_tokens_per_second;
  const double bps = read_bandwidth.bytes_per_second();
  if (rate <= 0 || bps <= 0 || tokens <= 0) return cut;
  cut.read_bytes_per_second = bps;
  cut.read_seconds = static_cast<double>(tokens / P) * static_cast<double>(PageBytes()) / bps;
  cut.recompute_seconds = static_cast<double>(tokens) / rate;
  if (cut.read_seconds > cut.recompute_seconds) {
    cut.reason = StorageCutReason::kRecomputeCheaper;
    cut.tokens = tokens;
  }
  return cut;
}

CacheStats CacheCore::Stats() const {
  CacheStats c = counters;
  c.page_size = P;
  c.device_total_tokens = ledger->num_slots();
  c.device_used_tokens = ledger->used_pages() * P;
  c.device_cached_tokens = tree.device_tokens();
  c.device_engine_tokens = ledger->pages_of(DevicePageLedger::kEngine) * P;
  if (host) {
    c.host_total_tokens = host->num_pages() * P;
    c.host_used_tokens = host->held_pages() * P;
    c.host_total_bytes = host->capacity_bytes();
  }
  c.storage_known_tokens = tree.stored_tokens();
  c.storage_only_tokens = tree.storage_only_tokens();
  c.nodes = tree.num_nodes();
  c.namespaces = tree.num_namespaces();
  c.live_handles = static_cast<int64_t>(handles.size());
  c.pinned_device_tokens = tree.retained_tokens(RadixTree::Tier::kDevice);
  c.pinned_host_tokens = tree.retained_tokens(RadixTree::Tier::kHost);
  c.pinned_storage_tokens = tree.retained_tokens(RadixTree::Tier::kStorage);
  return c;
}

Result<HandleState*> CacheCore::FindHandle(MatchHandle handle) {
  if ((handle.id >> kHandleSeqBits) != tag) {
    return Status::InvalidArgument(fmt::format(
        "handle {} is not live: it belongs to another HierarchicalCache instance or was never "
        "issued",
        handle.id));
  }
  auto it = handles.find(handle.id);
  if (it == handles.end()) {
    return Status::InvalidArgument(
        fmt::format("handle {} is not live (never issued, or already released)", handle.id));
  }
  return &it->second;
}

MatchHandle CacheCore::NewHandle(HandleState h) {
  MatchHandle out{(tag << kHandleSeqBits) | next_seq++};
  handles.emplace(out.id, std::move(h));
  return out;
}

Status CacheCore::CheckHealth() const {
  if (health.ok()) return Status::OK();
  return Status::FailedPrecondition(
      fmt::format("the cache is unusable after an internal failure: {}", health.ToString()));
}

void CacheCore::Fail(Status st, std::string_view what) {
  if (st.ok() || !health.ok()) return;
  health = st.WithContext(what);
  util::Log(util::LogLevel::kError, "cache: {}", health.ToString());
}

void CacheCore::AppendSlots(std::span<const int64_t> pages, std::vector<int64_t>* out) const {
  const size_t at = out->size();
  const int64_t page_size = P;  // a local, so the stores below cannot alias it
  const size_t n = pages.size();
  out->resize(at + n * static_cast<size_t>(page_size));
  const int64_t* __restrict in = pages.data();
  int64_t* __restrict o = out->data() + at;
  for (size_t k = 0; k < n; ++k) {
    const int64_t page = in[k];
    for (int64_t j = 0; j < page_size; ++j) o[j] = page + j;  // vectorised
    o += page_size;
  }
}

std::vector<int64_t> CacheCore::DeviceSlotsOf(const std::vector<RadixNode*>& path) const {
  std::vector<int64_t> out;
  for (RadixNode* n : path) {
    if (!n->on_device()) break;
    AppendSlots(n->device_pages(), &out);
  }
  return out;
}

std::vector<RadixNode*> CacheCore::Path(RadixNode* last) {
  std::vector<RadixNode*> path;
  for (RadixNode* n = last; n != nullptr && !n->is_root(); n = n->parent()) path.push_back(n);
  std::reverse(path.begin(), path.end());
  return path;
}

void CacheCore::FreeHost(std::span<const int64_t> pages) {
  if (pages.empty()) return;
  Status st = host->Release(pages);
  if (!st.ok()) Fail(Status::Internal(st.ToString()), "releasing host pages");
}

void CacheCore::ReturnBackupPages(std::span<const int64_t> pages,
                                  const std::vector<int64_t>& written) {
  std::vector<int64_t> abandon, release;
  for (int64_t p : pages) {
    (std::find(written.begin(), written.end(), p) != written.end() ? abandon : release)
        .push_back(p);
  }
  if (!abandon.empty()) {
    Status st = host->Abandon(abandon);
    if (!st.ok()) Fail(Status::Internal(st.ToString()), "abandoning host pages");
  }
  FreeHost(release);
}

void CacheCore::Event(CacheWork* work, CacheTier tier, const RadixNode* node, bool kept_in_host,
                      bool kept_in_storage) {
  if (!config.eviction_listener) return;
  work->events.push_back(OwnedEvent{tier, node->name_space(), tree.PrefixTokens(node),
                                    node->num_tokens(), kept_in_host, kept_in_storage});
}

void CacheCore::CountStorageFaults(StorageIo io, const std::vector<PageStatus>& statuses,
                                   const Status& status) {
  for (PageStatus s : statuses) {
    switch (s) {
      case PageStatus::kCorrupt:
      case PageStatus::kWrongNamespace:
        ++counters.storage_corrupt_pages;
        break;
      case PageStatus::kTimedOut:
        ++(io == StorageIo::kRead ? counters.storage_read_timeouts
                                  : counters.storage_write_timeouts);
        break;
      case PageStatus::kFailed:
        ++counters.storage_errors;
        break;
      default:
        break;
    }
  }
  if (!status.ok()) {
    ++counters.storage_errors;
    if (status.code() == StatusCode::kUnavailable) ++counters.storage_queue_drops;
  }
}

}  // namespace kvtier
