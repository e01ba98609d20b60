// Copies and storage calls after the lock (see cache/copy_executor.h).
#include "cache/copy_executor.h"

#include <algorithm>

#include "kvtier/slot_allocator.h"
#include "util/log.h"

namespace kvtier {

CacheWork::~CacheWork() {
  if (executor != nullptr) executor->Run(*this);
}

Status CopyExecutor::Start() {
  if (core_.gpu) {
    KVTIER_ASSIGN_OR_RETURN(backup_stream_, CudaStreamHandle::Create(core_.device.device));
  } else if (core_.config.backup_threads > 0) {
    KVTIER_ASSIGN_OR_RETURN(pool_, util::ThreadPool::Create(core_.config.backup_threads + 1));
  }
  return Status::OK();
}

void CopyExecutor::Stop() {
  pool_.reset();
  if (core_.gpu && backup_stream_.get() != nullptr) (void)backup_stream_.Synchronize();
}

Status CopyExecutor::RunCopy(const CopyOp& op, CudaStream stream) {
  const bool to_host = op.kind == CopyOp::Kind::kBackup;
  const KvRegion& src = to_host ? core_.device : core_.host_region;
  const KvRegion& dst = to_host ? core_.host_region : core_.device;
  return core_.engine->Transfer(
      TransferRequest::AllLayers(src, dst, SlotIndices::Host(op.src), SlotIndices::Host(op.dst)),
      TransferOptions{stream, op.layer_events.get()});
}

void CopyExecutor::SubmitGpu(CopyOp& op, CudaStream stream,
                             const std::vector<std::shared_ptr<CudaEventHandle>>& fences) {
  Status st;
  for (const auto& f : fences) {
    st = f->WaitOn(stream);
    if (!st.ok()) break;
  }
  const bool timed = op.kind == CopyOp::Kind::kLoad;
  if (st.ok() && timed) {
    Result<CudaEventHandle> begin = CudaEventHandle::Create(core_.device.device, /*timing=*/true);
    if (begin.ok() && begin->Record(stream).ok()) op.begin = std::move(*begin);
  }
  if (st.ok()) st = RunCopy(op, stream);
  Result<CudaEventHandle> ev = CudaEventHandle::Create(core_.device.device, /*timing=*/timed);
  Status rec = ev.ok() ? ev->Record(stream) : ev.status();
  if (rec.ok()) {
    op.event = std::move(*ev);
    core_.tracker.MarkSubmitted(op, std::move(st));
    return;
  }
  Status sync = core_.engine->Synchronize(stream);
  core_.tracker.Complete(op, !st.ok()    ? std::move(st)
                             : !rec.ok() ? std::move(rec)
                                         : std::move(sync));
}

void CopyExecutor::SubmitStorage(const std::shared_ptr<CopyOp>& op) {
  CopyTracker* tr = &core_.tracker;
  StorageBackend* backend = core_.storage.get();
  storage::PageStaging* pages = core_.staging.get();
  if (op->kind == CopyOp::Kind::kPrefetch) {
    const int64_t n = static_cast<int64_t>(op->keys.size());
    for (int64_t b = 0; b * op->batch_pages < n; ++b) {
      const int64_t from = b * op->batch_pages;
      const int64_t to = std::min(n, from + op->batch_pages);
      std::vector<PageKey> keys(op->keys.begin() + from, op->keys.begin() + to);
      const auto starts = std::span(op->pages).subspan(from, to - from);
      ReadBandwidth* bw = &core_.read_bandwidth;
      const double page_bytes = static_cast<double>(core_.PageBytes());
      pages->GetAsync(
          *backend, std::move(keys), starts, [tr, op, b, bw, page_bytes](BatchResult r) {
            // The last batch: the prefetch's read bandwidth, observed before anyone waiting for
            // the prefetch sees it complete (the recompute rule may ask right after).
            tr->CompleteBatch(*op, b, r.status, r.pages, [bw, page_bytes](const CopyOp& done) {
              const auto ok =
                  std::count(done.page_status.begin(), done.page_status.end(), PageStatus::kOk);
              bw->Observe(static_cast<double>(ok) * page_bytes,
                          SecondsSince(done.start, done.finished));
            });
          });
    }
    return;
  }
  if (op->kind == CopyOp::Kind::kRemove) {
    backend->RemoveAsync(op->keys,
                         [tr, op](BatchResult r) { tr->CompleteBatch(*op, 0, r.status, r.pages); });
    return;
  }
  // kStore, per batch: Exists first; write only what storage does not hold.
  const int64_t total = static_cast<int64_t>(op->keys.size());
  for (int64_t b = 0; b * op->batch_pages < total; ++b) {
    const int64_t from = b * op->batch_pages;
    const int64_t n = std::min(total, from + op->batch_pages) - from;
    std::vector<PageKey> batch(op->keys.begin() + from, op->keys.begin() + from + n);
    backend->ExistsAsync(std::move(batch), [tr, op, backend, pages, b, from, n](ExistsResult e) {
      const int64_t present = e.status.ok() ? std::clamp<int64_t>(e.leading, 0, n) : 0;
      tr->AddPresent(*op, present);
      if (present == n) {
        tr->CompleteBatch(*op, b, Status::OK(),
                          std::vector<PageStatus>(static_cast<size_t>(n), PageStatus::kOk));
        return;
      }
      std::vector<PageKey> keys(op->keys.begin() + from + present, op->keys.begin() + from + n);
      // Each page's parent: the page before it (the pages of a store are one chain).
      std::vector<std::optional<PageKey>> parents(keys.size());
      for (int64_t i = from + present; i < from + n; ++i) {
        parents[static_cast<size_t>(i - from - present)] =
            i == 0 ? op->first_parent
                   : std::optional<PageKey>(op->keys[static_cast<size_t>(i - 1)]);
      }
      pages->SetAsync(*backend, std::move(keys), std::move(parents),
                      std::span(op->pages).subspan(from + present, n - present),
                      [tr, op, b, present, n](BatchResult r) {
                        std::vector<PageStatus> all(static_cast<size_t>(n), PageStatus::kOk);
                        for (size_t i = 0;
                             i < r.pages.size() && present + static_cast<int64_t>(i) < n; ++i) {
                          all[static_cast<size_t>(present) + i] = r.pages[i];
                        }
                        if (!r.status.ok()) {
                          for (int64_t i = present; i < n; ++i)
                            all[static_cast<size_t>(i)] = PageStatus::kSkipped;
                        }
                        tr->CompleteBatch(*op, b, r.status, all);
                      });
    });
  }
}

void CopyExecutor::Run(CacheWork& work) {
  for (int round = 0; !work.empty(); ++round) {
    bool inline_done = false;
    std::vector<std::shared_ptr<CudaEventHandle>> fences;
    if (core_.gpu && !work.copies.empty()) {
      CacheLock lk(core_);
      fences = core_.ledger->write_fences();
    }
    for (auto& op : work.copies) {
      if (core_.gpu) {
        SubmitGpu(*op, backup_stream_.get(), fences);
      } else if (pool_) {
        pool_->Post([this, op] { core_.tracker.Complete(*op, RunCopy(*op, nullptr)); });
      } else {
        core_.tracker.Complete(*op, RunCopy(*op, nullptr));
        inline_done = true;
      }
    }
    for (auto& op : work.storage) SubmitStorage(op);
    std::vector<OwnedEvent> events;
    events.swap(work.events);
    work.copies.clear();
    work.storage.clear();
    for (const OwnedEvent& e : events) {
      core_.config.eviction_listener(EvictionEvent{e.tier, e.name_space, e.prefix, e.num_tokens,
                                                   e.kept_in_host, e.kept_in_storage});
    }
    if (inline_done) {
      CacheLock lk(core_);
      reap_(&work);
    }
  }
}

Status CopyExecutor::RunLoad(CopyOp& op, CudaStream stream,
                             const std::vector<std::shared_ptr<CudaEventHandle>>& fences) {
  if (core_.gpu) {
    Result<LayerEvents> events = LayerEvents::Create(
        static_cast<int>(core_.device.geometry.num_layers), core_.device.device);
    if (events.ok()) {
      op.layer_events = std::make_unique<LayerEvents>(std::move(*events));
      SubmitGpu(op, stream, fences);
    } else {
      core_.tracker.Complete(op, events.status());
    }
  } else {
    core_.tracker.Complete(op, RunCopy(op, nullptr));
  }
  Status st;
  std::vector<PageStatus> unused_pages;
  std::vector<uint8_t> unused_batches;
  core_.tracker.Snapshot(op, &unused_pages, &unused_batches, &st);
  return st;
}

std::shared_ptr<CopyOp> CopyExecutor::MakeLoad(const std::vector<RadixNode*>& host_nodes,
                                               const std::vector<int64_t>& alloc, int64_t tokens,
                                               CacheClock::time_point start) {
  auto op = std::make_shared<CopyOp>();
  op->kind = CopyOp::Kind::kLoad;
  op->gpu = core_.gpu;
  op->tokens = tokens;
  op->start = start;
  op->pages = alloc;
  op->free_on_completion = alloc;
  op->unpublished = true;  // LoadHostPart clears it once it holds the mutex again
  op->dst = PageSlots(alloc, core_.P);
  for (RadixNode* n : host_nodes) {
    core_.AppendSlots(n->host_pages(), &op->src);
    core_.MarkBusy(*op, n);
  }
  core_.tracker.Add(op);
  return op;
}

int64_t CopyExecutor::PublishLoad(CopyOp& op, const std::vector<int64_t>& alloc) {
  op.unpublished = false;  // reapable from now on
  std::vector<RadixNode*> nodes = op.nodes;
  SortTopDown(&nodes);
  size_t off = 0;
  std::vector<int64_t> published;
  for (RadixNode* n : nodes) {
    const size_t np = n->host_pages().size();
    std::vector<int64_t> slice(alloc.begin() + static_cast<ptrdiff_t>(off),
                               alloc.begin() + static_cast<ptrdiff_t>(off + np));
    off += np;
    const bool parent_ok = n->parent()->is_root() || n->parent()->on_device();
    if (!n->on_device() && parent_ok) {
      published.insert(published.end(), slice.begin(), slice.end());
      core_.tree.SetDevicePages(n, std::move(slice));
    }
  }
  core_.ledger->Transfer(published, DevicePageLedger::kTree);
  std::erase_if(op.free_on_completion, [&](int64_t p) {
    return std::find(published.begin(), published.end(), p) != published.end();
  });
  return static_cast<int64_t>(published.size());
}

void CopyExecutor::ReapLoad(CopyOp& op) {
  if (op.gpu && op.status.ok()) {
    // The copy's time on the device to completion (its events), else (no timing event) the time
    // until its completion was seen.
    double seconds = SecondsSince(op.start, op.finished);
    if (op.begin.get() != nullptr) {
      if (Result<float> ms = op.event.ElapsedMsSince(op.begin); ms.ok()) seconds = *ms / 1e3;
    }
    core_.counters.load_back_seconds += seconds;
    core_.counters.load_back_duration.Observe(seconds);
  }
  core_.ClearBusy(op);
  core_.FreeDevice(op.free_on_completion);
  op.free_on_completion.clear();
  if (!op.status.ok()) {
    util::Log(util::LogLevel::kWarning, "cache: {}",
              op.status.WithContext("load-back copy").ToString());
  }
}

}  // namespace kvtier
