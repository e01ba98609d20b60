// Per-head storage objects shared across TP sizes (see tp/head_split_storage.h).
#include "tp/head_split_storage.h"

#include <fmt/format.h>

#include <algorithm>
#include <mutex>
#include <unordered_map>

#include "kvtier/tp_group.h"

namespace kvtier::tp {

namespace {

// A page's outcome from its heads': any failure wins over absence, absence over a time-out, ...
int Severity(PageStatus s) {
  switch (s) {
    case PageStatus::kOk:
      return 0;
    case PageStatus::kSkipped:
      return 1;
    case PageStatus::kTimedOut:
      return 2;
    case PageStatus::kAbsent:
      return 3;
    case PageStatus::kWrongNamespace:
      return 4;
    case PageStatus::kCorrupt:
      return 5;
    case PageStatus::kFailed:
    default:
      return 6;
  }
}

class HeadSplitStorage final : public StorageBackend {
 public:
  HeadSplitStorage(std::shared_ptr<StorageBackend> inner, const StorageNamespace& ns,
                   const HeadSplitOptions& o)
      : StorageBackend(
            fmt::format("heads[{}..{})+{}", o.first_head, o.first_head + ns.head_num, inner->url()),
            ns, o.options),
        inner_(std::move(inner)),
        first_head_(o.first_head),
        read_only_(o.read_only) {}
  ~HeadSplitStorage() override { Close(); }
  Status Begin() { return Start(); }

  // The inner store evicts head objects; a page is gone with any of its heads. Head keys are
  // hashes, so the pages this adapter wrote or read while tracking are remembered by head key
  // (at most kMaxRememberedHeads; past that a page's eviction is learnt from a miss, as for
  // Redis) and an evicted head is reported as its page, once per look.
  void TrackEvictions(bool on) override {
    {
      std::lock_guard<std::mutex> lock(heads_mu_);
      tracking_ = on;
      if (!on) page_of_head_.clear();
    }
    inner_->TrackEvictions(on);
  }
  std::vector<PageKey> TakeEvictions(int64_t* dropped = nullptr) override {
    const std::vector<PageKey> heads = inner_->TakeEvictions(dropped);
    std::vector<PageKey> pages;
    std::lock_guard<std::mutex> lock(heads_mu_);
    for (const PageKey& head : heads) {
      auto it = page_of_head_.find(head);
      if (it == page_of_head_.end()) continue;  // another rank's head, or not remembered
      if (std::find(pages.begin(), pages.end(), it->second) == pages.end()) {
        pages.push_back(it->second);
      }
      page_of_head_.erase(it);
    }
    return pages;
  }
  static constexpr size_t kMaxRememberedHeads = size_t{1} << 18;

 protected:
  ExistsResult DoExists(std::span<const PageKey> keys,
                        std::chrono::steady_clock::time_point) override {
    ExistsResult r = inner_->Exists(HeadKeys(keys)).get();
    r.leading /= ns().head_num;  // whole pages only
    return r;
  }
  void DoGet(std::span<const PageKey> keys, std::span<const PageBuffer> buffers,
             std::span<PageStatus> out, std::chrono::steady_clock::time_point) override {
    Merge(inner_->Get(HeadKeys(keys), HeadBuffers(buffers)).get(), out);
    Remember(keys, out);
  }
  void DoSet(std::span<const PageKey> keys, std::span<const PageBuffer> buffers,
             std::span<PageStatus> out, std::chrono::steady_clock::time_point) override {
    if (read_only_) return;  // every page stays kSkipped
    Merge(inner_->Set(HeadKeys(keys), HeadBuffers(buffers)).get(), out);
    Remember(keys, out);
  }
  // Head h of a page names head h of its parent.
  void DoSetChained(std::span<const PageKey> keys, std::span<const PageBuffer> buffers,
                    std::span<const std::optional<PageKey>> parents, std::span<PageStatus> out,
                    std::chrono::steady_clock::time_point) override {
    if (read_only_) return;
    std::vector<std::optional<PageKey>> head_parents;
    head_parents.reserve(keys.size() * static_cast<size_t>(ns().head_num));
    for (const std::optional<PageKey>& p : parents) {
      for (int64_t h = 0; h < ns().head_num; ++h) {
        head_parents.push_back(p ? std::optional<PageKey>(HeadObjectKey(*p, first_head_ + h))
                                 : std::nullopt);
      }
    }
    Merge(inner_->Set(HeadKeys(keys), HeadBuffers(buffers), std::move(head_parents)).get(), out);
    Remember(keys, out);
  }
  void DoRemove(std::span<const PageKey> keys, std::span<PageStatus> out,
                std::chrono::steady_clock::time_point) override {
    if (read_only_) return;
    Merge(inner_->Remove(HeadKeys(keys)).get(), out);
    std::lock_guard<std::mutex> lock(heads_mu_);
    for (const PageKey& head : HeadKeys(keys)) page_of_head_.erase(head);
  }

 private:
  // While tracking: the heads of the pages whose status is kOk, for TakeEvictions.
  void Remember(std::span<const PageKey> keys, std::span<const PageStatus> out) {
    std::lock_guard<std::mutex> lock(heads_mu_);
    if (!tracking_) return;
    for (size_t i = 0; i < keys.size(); ++i) {
      if (out[i] != PageStatus::kOk) continue;
      for (int64_t h = 0; h < ns().head_num; ++h) {
        if (page_of_head_.size() >= kMaxRememberedHeads) return;
        page_of_head_.insert_or_assign(HeadObjectKey(keys[i], first_head_ + h), keys[i]);
      }
    }
  }
  std::vector<PageKey> HeadKeys(std::span<const PageKey> keys) const {
    std::vector<PageKey> out;
    out.reserve(keys.size() * static_cast<size_t>(ns().head_num));
    for (const PageKey& k : keys) {
      for (int64_t h = 0; h < ns().head_num; ++h) out.push_back(HeadObjectKey(k, first_head_ + h));
    }
    return out;
  }
  // Head j of a page_head page: bytes [j * hb, (j + 1) * hb) of each buffer's page range.
  std::vector<PageBuffer> HeadBuffers(std::span<const PageBuffer> pages) const {
    const int64_t heads = ns().head_num;
    std::vector<PageBuffer> out;
    out.reserve(pages.size() * static_cast<size_t>(heads));
    for (const PageBuffer& p : pages) {
      for (int64_t h = 0; h < heads; ++h) {
        PageBuffer b;
        b.num_segments = p.num_segments;
        for (int s = 0; s < p.num_segments; ++s) {
          const size_t hb = p.segments[s].size() / static_cast<size_t>(heads);
          b.segments[s] = p.segments[s].subspan(static_cast<size_t>(h) * hb, hb);
        }
        out.push_back(b);
      }
    }
    return out;
  }
  void Merge(const BatchResult& r, std::span<PageStatus> out) const {
    const size_t heads = static_cast<size_t>(ns().head_num);
    for (size_t i = 0; i < out.size(); ++i) {
      PageStatus page = r.status.ok() ? PageStatus::kOk : PageStatus::kFailed;
      for (size_t h = 0; h < heads && r.status.ok(); ++h) {
        const size_t j = i * heads + h;
        const PageStatus s = j < r.pages.size() ? r.pages[j] : PageStatus::kFailed;
        if (Severity(s) > Severity(page)) page = s;
      }
      out[i] = page;
    }
  }

  std::shared_ptr<StorageBackend> inner_;
  int64_t first_head_;
  bool read_only_;
  std::mutex heads_mu_;
  bool tracking_ = false;                                           // guarded by heads_mu_
  std::unordered_map<PageKey, PageKey, PageKeyHash> page_of_head_;  // guarded by heads_mu_
};

}  // namespace

StorageNamespace HeadObjectNamespace(const StorageNamespace& rank_pages) {
  StorageNamespace ns = rank_pages;
  ns.layout = KvLayout::kPageHead;
  ns.slot_bytes = rank_pages.slot_bytes / std::max<int64_t>(1, rank_pages.head_num);
  ns.head_num = 1;
  ns.tp_rank = 0;
  ns.tp_size = 1;
  return ns;
}

PageKey HeadObjectKey(const PageKey& page, int64_t head) {
  // The SHA-256 chain of the page keys, one step further with the head as the "token": distinct
  // per (page, head), and in the per-head namespace only.
  const int32_t token = static_cast<int32_t>(head);
  Result<std::vector<PageKey>> k = ComputePageKeys(std::span<const int32_t>(&token, 1), 1, page);
  return k.ok() && !k->empty() ? (*k)[0] : page;
}

Result<std::unique_ptr<StorageBackend>> OpenHeadSplitStorage(std::shared_ptr<StorageBackend> inner,
                                                             const StorageNamespace& rank_pages,
                                                             const HeadSplitOptions& options) {
  if (inner == nullptr) return Status::InvalidArgument("head-split storage: no inner backend");
  KVTIER_RETURN_IF_ERROR(rank_pages.Validate());
  KVTIER_RETURN_IF_ERROR(options.options.Validate());
  if (rank_pages.layout != KvLayout::kPageHead) {
    return Status::InvalidArgument(
        fmt::format("head-split storage: the rank's pages must be page_head (heads apart), not {}",
                    LayoutName(rank_pages.layout)));
  }
  if (options.first_head < 0 || options.first_head > (int64_t{1} << 20)) {
    return Status::InvalidArgument(
        fmt::format("head-split storage: first_head = {}", options.first_head));
  }
  const StorageNamespace want = HeadObjectNamespace(rank_pages);
  if (inner->ns().Hash() != want.Hash()) {
    return Status::InvalidArgument(fmt::format(
        "head-split storage: the inner backend's namespace ({}) is not the per-head namespace "
        "({})",
        inner->ns().Describe(), want.Describe()));
  }
  auto b = std::make_unique<HeadSplitStorage>(std::move(inner), rank_pages, options);
  KVTIER_RETURN_IF_ERROR(b->Begin());
  return std::unique_ptr<StorageBackend>(std::move(b));
}

}  // namespace kvtier::tp

namespace kvtier {

Result<std::shared_ptr<StorageBackend>> OpenTpRankStorage(const std::string& url,
                                                          const StorageNamespace& rank_pages,
                                                          const StorageOptions& options) {
  KVTIER_RETURN_IF_ERROR(rank_pages.Validate().WithContext("tp rank storage"));
  KVTIER_ASSIGN_OR_RETURN(std::unique_ptr<StorageBackend> inner,
                          OpenStorage(url, tp::HeadObjectNamespace(rank_pages), options));
  tp::HeadSplitOptions o;
  o.first_head = rank_pages.mla ? 0 : rank_pages.tp_rank * rank_pages.head_num;
  o.read_only = rank_pages.mla && rank_pages.tp_rank > 0;  // MLA: the leader is the one writer
  o.options = options;
  KVTIER_ASSIGN_OR_RETURN(std::unique_ptr<StorageBackend> view,
                          tp::OpenHeadSplitStorage(std::move(inner), rank_pages, o));
  return std::shared_ptr<StorageBackend>(std::move(view));
}

}  // namespace kvtier
