// The cache's host tier (cache/host_tier.h): the cache's own host pool, or a shared segment.
// Thread safety: none (the cache's mutex serialises every call).
#include "cache/host_tier.h"

#include <fmt/format.h>

#include <algorithm>
#include <utility>

namespace kvtier {

namespace {

class LocalHostTier final : public HostTier {
 public:
  explicit LocalHostTier(std::unique_ptr<HostKvPool> pool) : pool_(std::move(pool)) {}

  const KvRegion& region() const override { return pool_->region(); }
  int64_t num_pages() const override { return pool_->num_pages(); }
  int64_t held_pages() const override { return pool_->allocator().used_pages(); }
  int64_t capacity_bytes() const override { return pool_->capacity_bytes(); }
  bool Holds(int64_t start) const override { return pool_->allocator().IsAllocated(start); }
  bool shared() const override { return false; }

  Result<std::vector<Page>> Acquire(int64_t count, std::span<const PageKey>,
                                    const std::optional<PageKey>&) override {
    KVTIER_ASSIGN_OR_RETURN(std::vector<int64_t> starts, pool_->AllocatePages(count));
    std::vector<Page> out(starts.size());
    for (size_t i = 0; i < starts.size(); ++i) out[i] = {Got::kWrite, starts[i]};
    return out;
  }
  Status Publish(std::span<const int64_t>) override { return Status::OK(); }
  Status Abandon(std::span<const int64_t> starts) override { return pool_->FreePages(starts); }
  Status Release(std::span<const int64_t> starts) override { return pool_->FreePages(starts); }
  Result<std::vector<int64_t>> FindPrefix(std::span<const PageKey>, int64_t) override {
    return std::vector<int64_t>{};
  }

 private:
  std::unique_ptr<HostKvPool> pool_;
};

class SharedHostTier final : public HostTier {
 public:
  SharedHostTier(std::shared_ptr<SharedHostPool> pool, uint64_t namespace_hash,
                 int64_t budget_pages)
      : pool_(std::move(pool)),
        ns_(namespace_hash),
        P_(pool_->page_size()),
        budget_(std::clamp<int64_t>(budget_pages, 1, pool_->num_pages())),
        state_(static_cast<size_t>(pool_->num_pages()), kNotHeld) {}

  ~SharedHostTier() override {
    // What the cache still holds (its tree's host pages) goes back to the segment: pinned pages
    // stay READY for others; pages being written cannot be here (the cache waits for its copies).
    std::vector<int64_t> pinned;
    for (size_t p = 0; p < state_.size(); ++p) {
      if (state_[p] == kPinned) pinned.push_back(static_cast<int64_t>(p));
    }
    if (!pinned.empty()) (void)pool_->Unpin(pinned);
  }

  const KvRegion& region() const override { return pool_->region(); }
  int64_t num_pages() const override { return budget_; }
  int64_t held_pages() const override { return held_; }
  int64_t capacity_bytes() const override {
    const KvRegion& r = pool_->region();
    return budget_ * P_ * r.geometry.num_layers * r.geometry.slot_bytes * r.num_buffers();
  }
  bool Holds(int64_t start) const override {
    const int64_t p = PageOf(start);
    return p >= 0 && state_[static_cast<size_t>(p)] != kNotHeld;
  }
  bool shared() const override { return true; }

  Result<std::vector<Page>> Acquire(int64_t count, std::span<const PageKey> keys,
                                    const std::optional<PageKey>& first_parent) override {
    if (static_cast<int64_t>(keys.size()) != count) {
      return Status::InvalidArgument(
          fmt::format("shared host tier: {} page keys for {} pages (pages are published by key)",
                      keys.size(), count));
    }
    std::vector<std::optional<PageKey>> parents(keys.size());
    for (size_t i = 0; i < keys.size(); ++i) parents[i] = i == 0 ? first_parent : keys[i - 1];
    KVTIER_ASSIGN_OR_RETURN(std::vector<PageReservation> r,
                            pool_->ReserveOrPin(ns_, keys, parents));
    std::vector<Page> out(r.size());
    for (size_t i = 0; i < r.size(); ++i) {
      switch (r[i].outcome) {
        case ReserveOutcome::kReserved:
          out[i] = {Got::kWrite, r[i].page * P_};
          Take(r[i].page, kWriting);
          break;
        case ReserveOutcome::kAlreadyReady:
          out[i] = {Got::kReady, r[i].page * P_};
          Take(r[i].page, kPinned);
          break;
        case ReserveOutcome::kBeingWritten:
          out[i] = {Got::kBusy, -1};
          break;
        case ReserveOutcome::kNoSpace:
        case ReserveOutcome::kNoParent:  // its parent left the segment: no room for it here
          out[i] = {Got::kNone, -1};
          break;
      }
    }
    return out;
  }

  Status Publish(std::span<const int64_t> starts) override {
    KVTIER_ASSIGN_OR_RETURN(std::vector<int64_t> pages, PagesIn(starts, kWriting, "Publish"));
    KVTIER_RETURN_IF_ERROR(pool_->CommitPinned(pages));
    for (int64_t p : pages) state_[static_cast<size_t>(p)] = kPinned;
    return Status::OK();
  }

  Status Abandon(std::span<const int64_t> starts) override {
    KVTIER_ASSIGN_OR_RETURN(std::vector<int64_t> pages, PagesIn(starts, kWriting, "Abandon"));
    KVTIER_RETURN_IF_ERROR(pool_->Abort(pages));
    for (int64_t p : pages) Drop(p);
    return Status::OK();
  }

  Status Release(std::span<const int64_t> starts) override {
    KVTIER_ASSIGN_OR_RETURN(std::vector<int64_t> pages, PagesIn(starts, kPinned, "Release"));
    KVTIER_RETURN_IF_ERROR(pool_->Unpin(pages));
    for (int64_t p : pages) Drop(p);
    return Status::OK();
  }

  Result<std::vector<int64_t>> FindPrefix(std::span<const PageKey> keys,
                                          int64_t max_pages) override {
    const size_t n =
        static_cast<size_t>(std::clamp<int64_t>(max_pages, 0, static_cast<int64_t>(keys.size())));
    if (n == 0) return std::vector<int64_t>{};
    KVTIER_ASSIGN_OR_RETURN(std::vector<int64_t> pinned, pool_->PinPrefix(ns_, keys.first(n)));
    // A page this cache holds already belongs to another of its nodes: the prefix ends there
    // (cannot happen while keys are unique per position, but a page is never held twice).
    size_t keep = 0;
    while (keep < pinned.size() && state_[static_cast<size_t>(pinned[keep])] == kNotHeld) ++keep;
    if (keep < pinned.size()) {
      KVTIER_RETURN_IF_ERROR(pool_->Unpin(std::span<const int64_t>(pinned).subspan(keep)));
      pinned.resize(keep);
    }
    std::vector<int64_t> starts;
    starts.reserve(pinned.size());
    for (int64_t p : pinned) {
      Take(p, kPinned);
      starts.push_back(p * P_);
    }
    return starts;
  }

 private:
  enum : uint8_t { kNotHeld = 0, kWriting = 1, kPinned = 2 };

  int64_t PageOf(int64_t start) const {
    if (start < 0 || start % P_ != 0 || start / P_ >= static_cast<int64_t>(state_.size())) {
      return -1;
    }
    return start / P_;
  }
  void Take(int64_t p, uint8_t how) {
    state_[static_cast<size_t>(p)] = how;
    ++held_;
  }
  void Drop(int64_t p) {
    state_[static_cast<size_t>(p)] = kNotHeld;
    --held_;
  }
  // The segment pages of `starts`, each held as `want`; InvalidArgument naming the first that
  // is not (nothing changes then).
  Result<std::vector<int64_t>> PagesIn(std::span<const int64_t> starts, uint8_t want,
                                       const char* what) const {
    std::vector<int64_t> pages;
    pages.reserve(starts.size());
    for (size_t i = 0; i < starts.size(); ++i) {
      const int64_t p = PageOf(starts[i]);
      if (p < 0 || state_[static_cast<size_t>(p)] != want) {
        return Status::InvalidArgument(
            fmt::format("shared host tier {}: page at slot {} (starts[{}]) is not {} by this cache",
                        what, starts[i], i, want == kWriting ? "being written" : "held"));
      }
      pages.push_back(p);
    }
    return pages;
  }

  std::shared_ptr<SharedHostPool> pool_;
  const uint64_t ns_;
  const int64_t P_;
  const int64_t budget_;
  std::vector<uint8_t> state_;  // per segment page: kNotHeld, kWriting or kPinned
  int64_t held_ = 0;
};

}  // namespace

std::unique_ptr<HostTier> MakeLocalHostTier(std::unique_ptr<HostKvPool> pool) {
  return std::make_unique<LocalHostTier>(std::move(pool));
}

Result<std::unique_ptr<HostTier>> OpenSharedHostTier(std::shared_ptr<SharedHostPool> pool,
                                                     const KvRegion& device, bool gpu,
                                                     const std::string& model_id,
                                                     int64_t budget_bytes) {
  const KvGeometry& seg = pool->geometry();
  const KvGeometry& dev = device.geometry;
  auto mismatch = [&](const char* field, int64_t have, int64_t want) {
    return Status::InvalidArgument(
        fmt::format("shared_host: segment '{}' has {} = {} but the device region has {}",
                    pool->name(), field, have, want));
  };
  if (seg.page_size != dev.page_size) return mismatch("page_size", seg.page_size, dev.page_size);
  if (seg.num_layers != dev.num_layers) {
    return mismatch("num_layers", seg.num_layers, dev.num_layers);
  }
  if (seg.slot_bytes != dev.slot_bytes) {
    return mismatch("slot_bytes", seg.slot_bytes, dev.slot_bytes);
  }
  if (pool->region().mla != device.mla) return mismatch("mla", pool->region().mla, device.mla);
  if (gpu && !pool->cuda_registered()) {
    return Status::InvalidArgument(fmt::format(
        "shared_host: segment '{}' is not registered with CUDA in this process (attach it with "
        "register_with_cuda) but the cache copies on a GPU",
        pool->name()));
  }
  // The segment's pages (checked above to match the device's layers, slots and page size).
  const StorageNamespace ns = StorageNamespaceOf(seg, device.mla, {.model_id = model_id});
  const int64_t page_bytes =
      dev.page_size * dev.num_layers * dev.slot_bytes * pool->region().num_buffers();
  const int64_t budget_pages = std::max<int64_t>(1, budget_bytes / page_bytes);
  return std::unique_ptr<HostTier>(
      std::make_unique<SharedHostTier>(std::move(pool), ns.Hash(), budget_pages));
}

}  // namespace kvtier
