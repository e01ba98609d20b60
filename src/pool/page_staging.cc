// PageStaging (page_staging.h): zero-copy page buffers for contiguous layouts; gather / scatter
// through a page_first staging region with the cpu transfer backend for layer_first.
//
// Thread safety: `idle_` under `mu_`; everything else is immutable after Create, and the cpu
// engine may be used from several threads at once.
#include "pool/page_staging.h"

#include <fmt/format.h>

#include <algorithm>

namespace kvtier::storage {
namespace {

// Idle staging buffers kept for reuse.
constexpr size_t kMaxIdleStagings = 4;

}  // namespace

Result<std::unique_ptr<PageStaging>> PageStaging::Create(const KvRegion& host) {
  if (host.memory != MemoryKind::kHost) {
    return Status::InvalidArgument("page staging: the pool's region must be in host memory");
  }
  KVTIER_RETURN_IF_ERROR(host.Validate("page staging: host pool"));
  std::unique_ptr<TransferEngine> cpu;
  if (host.geometry.layout == KvLayout::kLayerFirst) {
    TransferEngineConfig config;
    config.cpu_threads = 1;  // a page's gather runs on the thread that asks for it
    config.cpu_parallel_threshold_bytes = int64_t{1} << 40;
    KVTIER_ASSIGN_OR_RETURN(cpu, MakeTransferEngine(TransferBackend::kCpu, config));
  }
  return std::unique_ptr<PageStaging>(new PageStaging(host, std::move(cpu)));
}

PageStaging::PageStaging(const KvRegion& host, std::unique_ptr<TransferEngine> cpu)
    : host_(host),
      zero_copy_(host.geometry.layout != KvLayout::kLayerFirst),
      page_bytes_(host.num_buffers() * host.geometry.num_layers * host.geometry.slot_bytes *
                  host.geometry.page_size),
      cpu_(std::move(cpu)) {}

PageStaging::~PageStaging() = default;

// page_first, page_first_direct and page_head keep page `page_start / P` of each buffer
// contiguous at SlotBase(page_start).
PageBuffer PageStaging::PoolPage(int64_t page_start) const {
  const KvGeometry& g = host_.geometry;
  const size_t bytes = static_cast<size_t>(g.page_size * g.num_layers * g.slot_bytes);
  const int64_t off = g.SlotBase(page_start);
  std::span<std::byte> k(host_.LayerBase(0, 0) + off, bytes);
  if (host_.mla) return PageBuffer::Of(k);
  return PageBuffer::Of(k, std::span<std::byte>(host_.LayerBase(1, 0) + off, bytes));
}

std::vector<PageBuffer> PageStaging::PoolPages(std::span<const int64_t> page_starts) const {
  std::vector<PageBuffer> buffers;
  buffers.reserve(page_starts.size());
  for (int64_t start : page_starts) buffers.push_back(PoolPage(start));
  return buffers;
}

std::shared_ptr<PageStaging::Staging> PageStaging::TakeStaging(int64_t pages) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = std::find_if(idle_.begin(), idle_.end(),
                           [&](const auto& s) { return s->capacity_pages >= pages; });
    if (it != idle_.end()) {
      std::shared_ptr<Staging> s = std::move(*it);
      idle_.erase(it);
      s->region.geometry.num_slots = pages * host_.geometry.page_size;
      s->region.v =
          host_.mla ? nullptr : s->memory.get() + pages * page_bytes_ / host_.num_buffers();
      return s;
    }
  }
  auto s = std::make_shared<Staging>();
  s->memory.reset(new std::byte[static_cast<size_t>(pages * page_bytes_)]);
  s->capacity_pages = pages;
  s->region.geometry = host_.geometry;
  s->region.geometry.layout = KvLayout::kPageFirst;
  s->region.geometry.num_slots = pages * host_.geometry.page_size;
  s->region.mla = host_.mla;
  s->region.memory = MemoryKind::kHost;
  s->region.k = s->memory.get();
  s->region.v = host_.mla ? nullptr : s->memory.get() + pages * page_bytes_ / host_.num_buffers();
  return s;
}

void PageStaging::ReturnStaging(std::shared_ptr<Staging> staging) {
  std::lock_guard<std::mutex> lock(mu_);
  if (idle_.size() < kMaxIdleStagings) {
    idle_.push_back(std::move(staging));
    return;
  }
  // Full: keep the larger buffers (they serve every smaller batch).
  auto smallest = std::min_element(idle_.begin(), idle_.end(), [](const auto& a, const auto& b) {
    return a->capacity_pages < b->capacity_pages;
  });
  if ((*smallest)->capacity_pages < staging->capacity_pages) *smallest = std::move(staging);
}

std::vector<PageBuffer> PageStaging::StagedPages(const Staging& staging, int64_t n) const {
  std::vector<PageBuffer> buffers;
  buffers.reserve(static_cast<size_t>(n));
  const int64_t half = page_bytes_ / host_.num_buffers();  // one buffer's bytes of a page
  for (int64_t i = 0; i < n; ++i) {
    std::span<std::byte> k(static_cast<std::byte*>(staging.region.k) + i * half,
                           static_cast<size_t>(half));
    if (host_.mla) {
      buffers.push_back(PageBuffer::Of(k));
    } else {
      std::span<std::byte> v(static_cast<std::byte*>(staging.region.v) + i * half,
                             static_cast<size_t>(half));
      buffers.push_back(PageBuffer::Of(k, v));
    }
  }
  return buffers;
}

Status PageStaging::Move(Staging& staging, std::span<const int64_t> page_starts,
                         std::span<const int64_t> staged, bool to_staging) const {
  const int64_t P = host_.geometry.page_size;
  std::vector<int64_t> pool_slots, staging_slots;
  pool_slots.reserve(page_starts.size() * static_cast<size_t>(P));
  staging_slots.reserve(pool_slots.capacity());
  for (size_t i = 0; i < page_starts.size(); ++i) {
    for (int64_t t = 0; t < P; ++t) {
      pool_slots.push_back(page_starts[i] + t);
      staging_slots.push_back(staged[i] * P + t);
    }
  }
  if (pool_slots.empty()) return Status::OK();
  const SlotIndices pool = SlotIndices::Host(pool_slots);
  const SlotIndices stage = SlotIndices::Host(staging_slots);
  return to_staging
             ? cpu_->Transfer(TransferRequest::AllLayers(host_, staging.region, pool, stage))
             : cpu_->Transfer(TransferRequest::AllLayers(staging.region, host_, stage, pool));
}

void PageStaging::GetAsync(StorageBackend& backend, std::vector<PageKey> keys,
                           std::span<const int64_t> page_starts,
                           std::function<void(BatchResult)> done) {
  const int64_t n = static_cast<int64_t>(page_starts.size());
  if (zero_copy_ || n == 0) {
    backend.GetAsync(std::move(keys), PoolPages(page_starts), std::move(done));
    return;
  }
  std::shared_ptr<Staging> staging = TakeStaging(n);
  std::vector<PageBuffer> buffers = StagedPages(*staging, n);
  std::vector<int64_t> starts(page_starts.begin(), page_starts.end());
  backend.GetAsync(
      std::move(keys), std::move(buffers),
      [this, staging, starts = std::move(starts), done = std::move(done)](BatchResult r) mutable {
        // Only the hits go into the pool.
        std::vector<int64_t> hit_starts, hit_staged;
        for (size_t i = 0; i < r.pages.size() && i < starts.size(); ++i) {
          if (r.pages[i] != PageStatus::kOk) continue;
          hit_starts.push_back(starts[i]);
          hit_staged.push_back(static_cast<int64_t>(i));
        }
        if (Status st = Move(*staging, hit_starts, hit_staged, /*to_staging=*/false); !st.ok()) {
          for (auto& p : r.pages) {
            if (p == PageStatus::kOk) p = PageStatus::kFailed;  // never a hit without its bytes
          }
        }
        // The staging memory goes back before `done`, which may destroy the cache (and this).
        ReturnStaging(std::move(staging));
        done(std::move(r));
      });
}

void PageStaging::SetAsync(StorageBackend& backend, std::vector<PageKey> keys,
                           std::span<const int64_t> page_starts,
                           std::function<void(BatchResult)> done) {
  SetAsync(backend, std::move(keys), {}, page_starts, std::move(done));
}

void PageStaging::SetAsync(StorageBackend& backend, std::vector<PageKey> keys,
                           std::vector<std::optional<PageKey>> parents,
                           std::span<const int64_t> page_starts,
                           std::function<void(BatchResult)> done) {
  const int64_t n = static_cast<int64_t>(page_starts.size());
  // Without parents: the plain Set (unknown parents).
  auto set = [&backend, &keys, &parents](std::vector<PageBuffer> buffers,
                                         std::function<void(BatchResult)> cb) {
    if (parents.empty()) {
      backend.SetAsync(std::move(keys), std::move(buffers), std::move(cb));
    } else {
      backend.SetAsync(std::move(keys), std::move(buffers), std::move(parents), std::move(cb));
    }
  };
  if (zero_copy_ || n == 0) {
    set(PoolPages(page_starts), std::move(done));
    return;
  }
  std::shared_ptr<Staging> staging = TakeStaging(n);
  std::vector<int64_t> staged(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) staged[static_cast<size_t>(i)] = i;
  if (Status st = Move(*staging, page_starts, staged, /*to_staging=*/true); !st.ok()) {
    done(BatchResult::Failed(st.WithContext("page staging: gathering a layer_first page"),
                             keys.size()));
    return;
  }
  std::vector<PageBuffer> buffers = StagedPages(*staging, n);
  set(std::move(buffers), [this, staging, done = std::move(done)](BatchResult r) mutable {
    ReturnStaging(std::move(staging));
    done(std::move(r));
  });
}

}  // namespace kvtier::storage
