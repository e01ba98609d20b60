// The backup planner (see cache/backup_planner.h).
#include "cache/backup_planner.h"

#include <fmt/format.h>

#include <algorithm>
#include <optional>

#include "cache/tier_evictor.h"
#include "util/log.h"

namespace kvtier {

int64_t StoreBatchPages(int64_t page_bytes, std::chrono::milliseconds timeout,
                        int64_t max_backup_batch_pages, int64_t backend_max_batch_pages) {
  const double in_time = kSlowestStoreBytesPerSecond *
                         std::chrono::duration<double>(timeout).count() /
                         static_cast<double>(std::max<int64_t>(page_bytes, 1));
  const int64_t by_time = in_time >= 1e15 ? int64_t{1} << 50 : static_cast<int64_t>(in_time);
  return std::max<int64_t>(1, std::min({max_backup_batch_pages, backend_max_batch_pages, by_time}));
}

int64_t BackupPlanner::UnbackedPath(RadixNode* node, std::vector<RadixNode*>* path) const {
  for (RadixNode* n = node; !n->is_root() && !n->on_host(); n = n->parent()) {
    if (n->busy() > 0 || !n->on_device()) return 0;
    path->push_back(n);
  }
  std::reverse(path->begin(), path->end());
  int64_t tokens = 0;
  for (RadixNode* n : *path) tokens += n->num_tokens();
  return tokens;
}

void BackupPlanner::EndPathAt(std::vector<RadixNode*>* path, int64_t keep) {
  int64_t acc = 0;
  for (size_t i = 0; i < path->size(); ++i) {
    const int64_t np = (*path)[i]->num_tokens() / core_.P;
    if (acc + np <= keep) {
      acc += np;
      continue;
    }
    if (keep > acc) {
      (*path)[i] = core_.tree.SplitAfter((*path)[i], keep - acc)->parent();
      path->resize(i + 1);
    } else {
      path->resize(i);
    }
    return;
  }
}

std::shared_ptr<CopyOp> BackupPlanner::MakeBackup(const std::vector<RadixNode*>& path,
                                                  const std::vector<HostTier::Page>& got,
                                                  const std::vector<int64_t>& host_pages,
                                                  const std::vector<int64_t>& written,
                                                  bool write_back) {
  auto op = std::make_shared<CopyOp>();
  op->kind = CopyOp::Kind::kBackup;
  op->gpu = core_.gpu;
  op->tokens = static_cast<int64_t>(written.size()) * core_.P;
  op->bytes = static_cast<int64_t>(written.size()) * core_.PageBytes();
  op->start = CacheClock::now();
  op->pages = written;
  op->write_back = write_back;
  const bool copy_all = written.size() == host_pages.size();
  if (copy_all) core_.AppendSlots(host_pages, &op->dst);
  size_t off = 0;
  for (RadixNode* n : path) {
    const size_t np = n->device_pages().size();
    if (copy_all) {
      core_.AppendSlots(n->device_pages(), &op->src);
    } else {
      for (size_t i = 0; i < np; ++i) {
        if (got[off + i].got != HostTier::Got::kWrite) continue;
        core_.AppendSlots(n->device_pages().subspan(i, 1), &op->src);
        core_.AppendSlots(std::span<const int64_t>(host_pages).subspan(off + i, 1), &op->dst);
      }
    }
    core_.tree.SetHostPages(
        n, std::vector<int64_t>(host_pages.begin() + static_cast<ptrdiff_t>(off),
                                host_pages.begin() + static_cast<ptrdiff_t>(off + np)));
    off += np;
  }
  return op;
}

bool BackupPlanner::Backup(RadixNode* node, CacheWork* work, bool write_back) {
  if (!core_.host) return false;  // no host tier: nothing to back up to
  std::vector<RadixNode*> path;
  const int64_t tokens = UnbackedPath(node, &path);
  if (tokens == 0) return false;
  const int64_t pages = tokens / core_.P;
  if (!evictor_.EnsureHostPages(pages, work)) {
    core_.counters.backup_skipped_tokens += tokens;
    return false;
  }
  std::vector<PageKey> keys;
  std::optional<PageKey> first_parent;  // the segment evicts a chain's tail first (host_tier.h)
  if (core_.host->shared()) {
    for (RadixNode* n : path) {
      if (static_cast<int64_t>(n->keys().size()) * core_.P != n->num_tokens()) return false;
      keys.insert(keys.end(), n->keys().begin(), n->keys().end());
    }
    if (const RadixNode* up = path.front()->parent(); !up->is_root() && !up->keys().empty()) {
      first_parent = up->keys().back();
    }
  }
  Result<std::vector<HostTier::Page>> got = core_.host->Acquire(pages, keys, first_parent);
  if (!got.ok()) {
    util::Log(util::LogLevel::kWarning, "cache: backup skipped: {}", got.status().ToString());
    core_.counters.backup_skipped_tokens += tokens;
    return false;
  }
  // The leading pages the tier gave; the others go back.
  int64_t keep = 0;
  while (keep < pages && ((*got)[static_cast<size_t>(keep)].got == HostTier::Got::kWrite ||
                          (*got)[static_cast<size_t>(keep)].got == HostTier::Got::kReady)) {
    ++keep;
  }
  std::vector<int64_t> host_pages, written, unused, unused_written;
  for (int64_t i = 0; i < pages; ++i) {
    const HostTier::Page& pg = (*got)[static_cast<size_t>(i)];
    if (pg.got != HostTier::Got::kWrite && pg.got != HostTier::Got::kReady) continue;
    (i < keep ? host_pages : unused).push_back(pg.start);
    if (pg.got == HostTier::Got::kWrite) {
      (i < keep ? written : unused_written).push_back(pg.start);
    }
  }
  core_.ReturnBackupPages(unused, unused_written);
  core_.counters.backup_skipped_tokens += (pages - keep) * core_.P;
  if (keep == 0) return false;
  if (keep < pages) EndPathAt(&path, keep);  // the path ends where the kept pages end
  auto op = MakeBackup(path, *got, host_pages, written, write_back);
  core_.counters.backup_present_tokens += keep * core_.P - op->tokens;
  if (written.empty()) return true;  // every page was published already: nothing to copy
  for (RadixNode* n : path) core_.MarkBusy(*op, n);
  core_.counters.backup_inflight_tokens += op->tokens;
  core_.tracker.Add(op);
  work->copies.push_back(std::move(op));
  return true;
}

void BackupPlanner::MaybeBackup(const std::vector<RadixNode*>& path, CacheWork* work) {
  if (!core_.host || !policy_->backs_up_on_use()) return;
  for (auto it = path.rbegin(); it != path.rend(); ++it) {
    RadixNode* n = *it;
    if (n->on_device() && !n->on_host() && policy_->BackUpOnUse(*n)) {
      Backup(n, work, /*write_back=*/false);
      return;
    }
  }
}

bool BackupPlanner::Store(RadixNode* node, CacheWork* work, bool* deferred,
                          int64_t* refused_pages) {
  if (!core_.storage) return false;
  std::vector<RadixNode*> path;
  for (RadixNode* n = node; !n->is_root(); n = n->parent()) {
    if (!n->on_host()) return false;  // host copies form a prefix: cannot happen
    if (n->stored()) break;
    // Behind an ancestor's store in flight: that store, when it completes, stores what is below
    // it (StoreBelow). Busy (being read or copied): its completion starts the store.
    if (n->storing() || n->busy() > 0) {
      if (deferred != nullptr) *deferred = true;
      return false;
    }
    if (n->keys().empty()) return false;
    path.push_back(n);
  }
  if (path.empty()) return false;
  std::reverse(path.begin(), path.end());
  int64_t pages = 0;
  for (RadixNode* n : path) pages += n->num_tokens() / core_.P;
  const int64_t page_bytes = core_.PageBytes();
  const int64_t queue_pages = core_.config.storage.max_backup_queue_pages;
  if (queue_pages <= 0) {  // no store queue: nothing is ever written (not a choice of admission)
    core_.counters.storage_backup_dropped_tokens += pages * core_.P;
    ++core_.counters.storage_queue_drops;
    return false;
  }
  // Admission, page by page from the head: the first page refused ends the store. Room: the
  // queue takes the store now (what does not fit follows as it lands: StoreBelow, asking again),
  // or the backlog holds it whole.
  const bool room =
      (backlog_.empty() && StoreQueueRoom() > 0) || backlog_.free_bytes() >= pages * page_bytes;
  int64_t admitted = 0, head_estimate = 0;
  bool refused = false;
  for (RadixNode* n : path) {
    const size_t np = static_cast<size_t>(n->num_tokens() / core_.P);
    for (size_t i = 0; i < np && !refused; ++i) {
      const int64_t estimate = admission_->Estimate(*n, i);
      if (admitted == 0) head_estimate = estimate;
      if (admission_->Admits(estimate, room)) {
        ++admitted;
      } else {
        refused = true;
      }
    }
    if (refused) break;
  }
  if (refused_pages != nullptr) {
    *refused_pages = pages - admitted;
  } else {
    core_.counters.storage_backup_refused_tokens += (pages - admitted) * core_.P;
  }
  if (admitted == 0) return false;
  if (core_.config.storage.admitted_listener) ReportAdmitted(path, admitted);
  const int64_t queue_room = StoreQueueRoom();
  const bool to_queue = backlog_.empty() && queue_room > 0;
  int64_t keep = admitted;
  if (to_queue) {
    keep = std::min(keep, queue_room);  // the rest when these are stored (StoreBelow)
  } else {
    keep = std::min({keep, queue_pages, backlog_.capacity_bytes() / page_bytes});
    std::vector<std::shared_ptr<CopyOp>> victims;
    if (keep <= 0 || !backlog_.MakeRoom(keep * page_bytes, head_estimate, &victims)) {
      // The queue is full and the backlog (if any) keeps stores likelier to be reused.
      if (backlog_.capacity_bytes() >= page_bytes) {
        core_.counters.storage_backup_backlog_tokens += admitted * core_.P;
      } else {
        core_.counters.storage_backup_dropped_tokens += admitted * core_.P;
        ++core_.counters.storage_queue_drops;
      }
      return false;
    }
    for (const std::shared_ptr<CopyOp>& v : victims) {  // reaped (ReapStore) by the next call
      v->backlogged = false;
      v->backlog_dropped = true;
      core_.tracker.Complete(*v, Status::OK());
    }
  }
  if (keep < pages) {
    EndPathAt(&path, keep);
    pages = keep;
  }
  std::shared_ptr<CopyOp> op = MakeStore(path, pages);
  op->reuse_estimate = head_estimate;
  op->tail_pages = admitted - pages;
  if (to_queue) {
    store_queue_pages_ += pages;
    SubmitStore(std::move(op), work);  // held back while a removal of one of its keys runs
  } else {
    op->backlogged = true;
    backlog_.Add(op, head_estimate, pages * page_bytes, pages, op->tokens);
  }
  return true;
}

void BackupPlanner::ReportAdmitted(const std::vector<RadixNode*>& path, int64_t pages) const {
  std::vector<PageKey> keys;
  for (RadixNode* n : path) {
    for (const PageKey& k : n->keys()) {
      if (static_cast<int64_t>(keys.size()) == pages) break;
      keys.push_back(k);
    }
  }
  core_.config.storage.admitted_listener(keys);
}

std::shared_ptr<CopyOp> BackupPlanner::MakeStore(const std::vector<RadixNode*>& path,
                                                 int64_t pages) {
  auto op = std::make_shared<CopyOp>();
  op->kind = CopyOp::Kind::kStore;
  op->tokens = pages * core_.P;
  op->start = CacheClock::now();
  op->batch_pages = StoreBatchPages(core_.PageBytes(), core_.storage->options().timeout,
                                    core_.config.storage.max_backup_batch_pages,
                                    core_.storage->options().max_batch_pages);
  if (const RadixNode* up = path.front()->parent(); !up->is_root() && !up->keys().empty()) {
    op->first_parent = up->keys().back();
  }
  for (RadixNode* n : path) {
    for (size_t i = 0; i < n->host_pages().size(); ++i) {
      op->pages.push_back(n->host_pages()[i]);
      op->keys.push_back(n->keys()[i]);
    }
    core_.tree.SetStoring(n, true);  // its host pages stay put (the device copy may still go)
    op->nodes.push_back(n);
  }
  op->page_status.assign(static_cast<size_t>(pages), PageStatus::kSkipped);
  op->batch_done.assign(static_cast<size_t>(op->num_batches()), 0);
  op->batches_left = op->num_batches();
  core_.counters.storage_backup_inflight_tokens += op->tokens;
  core_.tracker.Add(op);
  return op;
}

void BackupPlanner::SizeBacklog() {
  int64_t bytes = core_.config.storage.admission.backlog_bytes;
  if (core_.config.storage.max_backup_queue_pages <= 0 || !core_.host) bytes = 0;
  if (core_.host) {
    bytes =
        std::min(bytes, core_.host->num_pages() * core_.PageBytes() / kMaxBacklogHostShareDivisor);
  }
  backlog_.set_capacity_bytes(bytes);
}

void BackupPlanner::SubmitFromBacklog(CacheWork* work) {
  while (!backlog_.empty()) {
    std::shared_ptr<CopyOp> op = backlog_.Next(StoreQueueRoom());
    if (!op) return;
    op->backlogged = false;
    op->start = CacheClock::now();  // its time with the store starts now
    store_queue_pages_ += static_cast<int64_t>(op->keys.size());
    SubmitStore(std::move(op), work);
  }
}

void BackupPlanner::MaybeStore(const std::vector<RadixNode*>& path, CacheWork* work) {
  if (!core_.storage || !policy_->store_on_backup()) return;
  RadixNode* deepest = nullptr;  // host copies form a prefix of the path
  for (RadixNode* n : path) {
    if (!n->on_host()) break;
    deepest = n;
  }
  if (deepest == nullptr || deepest->stored() || deepest->storing() || deepest->busy() > 0) return;
  Store(deepest, work);
}

void BackupPlanner::ReapBackup(CopyOp& op, CacheWork* work) {
  core_.counters.backup_inflight_tokens -= op.tokens;
  if (op.status.ok()) {
    Status published = core_.host->Publish(op.pages);
    if (!published.ok()) core_.Fail(Status::Internal(published.ToString()), "publishing a backup");
    core_.counters.backup_tokens += op.tokens;
    core_.counters.backup_bytes += op.bytes;
    core_.counters.backup_seconds += SecondsSince(op.start, op.finished);
    if (op.write_back) core_.counters.write_back_tokens += op.tokens;
    std::vector<RadixNode*> nodes = op.nodes;
    core_.ClearBusy(op);
    if (core_.storage && policy_->store_on_backup() && !nodes.empty()) {
      RadixNode* deepest =
          *std::max_element(nodes.begin(), nodes.end(), [](const RadixNode* a, const RadixNode* b) {
            return a->prefix_tokens() < b->prefix_tokens();
          });
      Store(deepest, work);
    }
    return;
  }
  // Failed: take back the host pages it was given (deepest first); it never counted.
  core_.counters.backup_failed_tokens += op.tokens;
  if (core_.backup_failure.ok()) core_.backup_failure = op.status.WithContext("backup copy");
  util::Log(util::LogLevel::kWarning, "cache: {}", op.status.WithContext("backup copy").ToString());
  std::vector<RadixNode*> nodes = op.nodes;
  core_.ClearBusy(op);
  std::sort(nodes.begin(), nodes.end(), [](const RadixNode* a, const RadixNode* b) {
    return a->prefix_tokens() > b->prefix_tokens();
  });
  for (RadixNode* n : nodes) {
    if (!n->on_host()) continue;
    if (n->host_children() > 0) {
      core_.Fail(
          Status::Internal(fmt::format("node {}: its failed backup has host children", n->id())),
          "rolling back a failed backup");
      return;
    }
    core_.ReturnBackupPages(core_.tree.TakeHostPages(n), op.pages);
    evictor_.DropIfNowhere(n);
  }
}

void BackupPlanner::ReapStore(CopyOp& op, CacheWork* work) {
  const int64_t pages = static_cast<int64_t>(op.keys.size());
  core_.counters.storage_backup_inflight_tokens -= op.tokens;
  if (op.backlog_dropped) {  // given up in the backlog for likelier stores: never queued
    core_.counters.storage_backup_backlog_tokens += op.tokens + op.tail_pages * core_.P;
    for (RadixNode* n : op.nodes) core_.tree.SetStoring(n, false);
    op.nodes.clear();
    return;
  }
  store_queue_pages_ -= pages;
  SubmitFromBacklog(work);  // this store's room in the queue
  int64_t ok = 0;           // leading pages in storage: the stored part of the path
  while (ok < pages && op.page_status[static_cast<size_t>(ok)] == PageStatus::kOk) ++ok;
  const int64_t in_storage =
      std::count(op.page_status.begin(), op.page_status.end(), PageStatus::kOk);
  const int64_t present = std::min(op.present_pages, in_storage);
  const int64_t written = in_storage - present;
  // Every page that did not make it under its reason: no room in the store, a batch the
  // backend's full write queue rejected, else a failure (an error, a time-out).
  const int64_t no_space =
      std::count(op.page_status.begin(), op.page_status.end(), PageStatus::kNoSpace);
  const int64_t rejected = std::min(op.rejected_pages, pages - in_storage - no_space);
  core_.counters.storage_backup_capacity_tokens += no_space * core_.P;
  core_.counters.storage_backup_dropped_tokens += rejected * core_.P;
  core_.counters.storage_backup_present_tokens += present * core_.P;
  core_.counters.storage_backup_tokens += written * core_.P;
  core_.counters.storage_backup_bytes += written * core_.PageBytes();
  const double seconds = SecondsSince(op.start, op.finished);
  core_.counters.storage_backup_seconds += seconds;
  if (written > 0 && seconds > 0) {
    core_.counters.storage_backup_bandwidth.Observe(
        static_cast<double>(written * core_.PageBytes()) / seconds / 1e9);
  }
  const int64_t timed_out =
      std::count(op.page_status.begin(), op.page_status.end(), PageStatus::kTimedOut);
  core_.counters.storage_backup_timed_out_tokens += timed_out * core_.P;
  core_.counters.storage_backup_failed_tokens +=
      std::max<int64_t>(0, pages - in_storage - no_space - rejected - timed_out) * core_.P;
  core_.CountStorageFaults(StorageIo::kWrite, op.page_status, op.status);
  // The admitted pages that waited behind this store follow only when it lands whole; otherwise
  // they are not written for the reason its first missing page was not (which ends the path).
  if (ok < pages && op.tail_pages > 0) {
    const PageStatus first_missing = op.page_status[static_cast<size_t>(ok)];
    int64_t* reason = &core_.counters.storage_backup_failed_tokens;
    if (first_missing == PageStatus::kNoSpace) {
      reason = &core_.counters.storage_backup_capacity_tokens;
    } else if (first_missing == PageStatus::kTimedOut) {
      reason = &core_.counters.storage_backup_timed_out_tokens;
    } else if (first_missing == PageStatus::kSkipped && rejected > 0) {
      reason = &core_.counters.storage_backup_dropped_tokens;  // the backend's queue was full
    }
    *reason += op.tail_pages * core_.P;
  }
  // Pages written past the first one that did not make it: no lookup reaches them (it stops at
  // that page), so they would sit in the store stranded until evicted. They go now; the next
  // store of this path writes them again after the missing page (held back until the removal
  // completed: BackupPlanner::SubmitStore).
  std::vector<PageKey> stranded;
  for (int64_t i = ok + 1; i < pages; ++i) {
    if (op.page_status[static_cast<size_t>(i)] == PageStatus::kOk) {
      stranded.push_back(op.keys[static_cast<size_t>(i)]);
    }
  }
  core_.counters.storage_stranded_removed_pages += static_cast<int64_t>(stranded.size());
  RemoveFromStorage(stranded, work);
  // Mark stored the nodes (or the leading part of the node) whose pages all made it.
  std::vector<RadixNode*> nodes = std::move(op.nodes);
  std::sort(nodes.begin(), nodes.end(), [](const RadixNode* a, const RadixNode* b) {
    return a->prefix_tokens() < b->prefix_tokens();
  });
  int64_t left = ok;
  for (RadixNode* n : nodes) {
    core_.tree.SetStoring(n, false);
  }
  RadixNode* deepest_stored = nullptr;
  for (RadixNode* n : nodes) {
    const int64_t np = n->num_tokens() / core_.P;
    if (left <= 0) break;
    if (left >= np) {
      core_.tree.SetStored(n, true);
      deepest_stored = n;
      left -= np;
    } else {
      RadixNode* lower = core_.tree.SplitAfter(n, left);
      core_.tree.SetStored(lower->parent(), true);
      left = 0;
    }
  }
  // Every page made it: what waited behind this store (the rest of a long path, a later chunk of
  // the same prompt) goes now.
  if (ok == pages && deepest_stored != nullptr && policy_->store_on_backup()) {
    StoreBelow(deepest_stored, work);
  }
}

void BackupPlanner::StoreBelow(RadixNode* node, CacheWork* work) {
  std::vector<RadixNode*> stack;
  node->ForEachChild([&](RadixNode* c) {
    if (c->on_host()) stack.push_back(c);
  });
  while (!stack.empty()) {
    RadixNode* n = stack.back();
    stack.pop_back();
    bool deeper = false;
    n->ForEachChild([&](RadixNode* c) {
      if (c->on_host()) {
        stack.push_back(c);
        deeper = true;
      }
    });
    // The deepest host node of each branch: Store takes the unstored path above it. Branches that
    // share an unstored ancestor wait for its store, and come back here when it completes.
    if (!deeper && !n->stored() && !n->storing()) Store(n, work);
  }
}

void BackupPlanner::RemoveFromStorage(std::span<const PageKey> keys, CacheWork* work) {
  const size_t batch = static_cast<size_t>(core_.storage->options().max_batch_pages);
  for (size_t from = 0; from < keys.size(); from += batch) {
    const size_t n = std::min(keys.size() - from, batch);
    auto remove = std::make_shared<CopyOp>();
    remove->kind = CopyOp::Kind::kRemove;
    remove->start = CacheClock::now();
    remove->keys.assign(keys.begin() + static_cast<ptrdiff_t>(from),
                        keys.begin() + static_cast<ptrdiff_t>(from + n));
    remove->batch_pages = static_cast<int64_t>(n);
    remove->page_status.assign(n, PageStatus::kSkipped);
    remove->batch_done.assign(1, 0);
    remove->batches_left = 1;
    for (const PageKey& key : remove->keys) ++removing_[key];
    core_.tracker.Add(remove);
    work->storage.push_back(std::move(remove));
  }
}

bool BackupPlanner::RemovalPending(std::span<const PageKey> keys) const {
  if (removing_.empty()) return false;
  for (const PageKey& key : keys) {
    if (removing_.count(key) != 0) return true;
  }
  return false;
}

void BackupPlanner::SubmitStore(std::shared_ptr<CopyOp> op, CacheWork* work) {
  if (RemovalPending(op->keys)) {
    op->held = true;
    ++core_.counters.storage_stores_held;
    return;
  }
  work->storage.push_back(std::move(op));
}

void BackupPlanner::ReapRemove(const CopyOp& op, CacheWork* work) {
  for (const PageKey& key : op.keys) {
    auto it = removing_.find(key);
    if (it == removing_.end()) {
      core_.Fail(Status::Internal("a removal's key is not recorded as being removed"),
                 "reaping a removal");
      return;
    }
    if (--it->second == 0) removing_.erase(it);
  }
  ++removals_reaped_;
  for (const auto& held : core_.tracker.ops()) {
    if (held->held && !RemovalPending(held->keys)) {
      held->held = false;
      work->storage.push_back(held);
    }
  }
}

}  // namespace kvtier
