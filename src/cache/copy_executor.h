// Internal: the part of a HierarchicalCache that runs what its calls collected (see
// cache/cache_core.h) after the cache's mutex is released — device <-> host copies on the cpu pool,
// inline or on a CUDA stream, host <-> storage calls on the storage backend's threads, and the
// eviction listener's events — and that completes load-backs.
//
// Thread safety: Run, RunCopy, SubmitGpu, SubmitStorage and RunLoad run WITHOUT the cache's mutex
// (Run takes it briefly for the engine's write fences and to reap inline copies); ReapLoad runs
// under it. Start and Stop run while no other call can (Create, the destructor).
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "cache/cache_core.h"
#include "kvtier/device.h"
#include "util/thread_pool.h"

namespace kvtier {

class CopyExecutor {
 public:
  // `reap` applies completed operations; Run calls it under the mutex after inline copies.
  CopyExecutor(CacheCore& core, std::function<void(CacheWork*)> reap)
      : core_(core), reap_(std::move(reap)) {}
  CopyExecutor(const CopyExecutor&) = delete;
  CopyExecutor& operator=(const CopyExecutor&) = delete;

  // The backup stream (GPU) or the cpu copy pool (backup_threads > 0).
  Status Start();
  // Waits for what still runs on the pool and the backup stream.
  void Stop() KVTIER_EXCLUDES(kCacheLock);

  // Runs what a call collected. Inline copies (backup_threads = 0) complete here, and their
  // follow-ups (stores after backups) run in the same call.
  void Run(CacheWork& work) KVTIER_EXCLUDES(kCacheLock);

  // One device <-> host copy of `op` (kBackup: device -> host; kLoad: host -> device) on `stream`
  // (null: on this thread).
  Status RunCopy(const CopyOp& op, CudaStream stream) KVTIER_EXCLUDES(kCacheLock);
  // GPU: enqueues `op` on `stream` after the engine's pending writes (`fences`); the op completes
  // through its event. A failure after part of the copy may have been enqueued still records the
  // event (or synchronises the stream), so the op completes only when nothing writes any more.
  void SubmitGpu(CopyOp& op, CudaStream stream,
                 const std::vector<std::shared_ptr<CudaEventHandle>>& fences)
      KVTIER_EXCLUDES(kCacheLock);
  // Prefetches: one GetAsync per batch. Stores: per batch, Exists first, then writes only what
  // storage does not hold. Removals: one RemoveAsync.
  void SubmitStorage(const std::shared_ptr<CopyOp>& op) KVTIER_EXCLUDES(kCacheLock);
  // A load-back's copy on the caller's `stream` (GPU, with per-layer events) or on this thread;
  // returns the copy's status as far as it is known (a GPU copy may still fail later).
  Status RunLoad(CopyOp& op, CudaStream stream,
                 const std::vector<std::shared_ptr<CudaEventHandle>>& fences)
      KVTIER_EXCLUDES(kCacheLock);

  // The load-back copy of `host_nodes` (the host part of a match) into `alloc` (kCopy device
  // pages), registered: the nodes busy (their host pages stay put while they are read), the device
  // pages the op's until published. REQUIRES the mutex.
  std::shared_ptr<CopyOp> MakeLoad(const std::vector<RadixNode*>& host_nodes,
                                   const std::vector<int64_t>& alloc, int64_t tokens,
                                   CacheClock::time_point start) KVTIER_REQUIRES(kCacheLock);
  // Publishes a copied load-back: each of its nodes that is still off the device (under a parent
  // on the device) takes its pages; pages of nodes that came onto the device meanwhile stay with
  // the op and are freed when it completes. Nodes split meanwhile are all in op.nodes (the split
  // hook), whose host pages in order are the sources. Returns the pages published. REQUIRES the
  // mutex. The op is reapable from then on (MakeLoad registers it unreapable: CopyOp::unpublished;
  // a load that failed is made reapable by its caller).
  int64_t PublishLoad(CopyOp& op, const std::vector<int64_t>& alloc) KVTIER_REQUIRES(kCacheLock);
  // A load-back completed. A GPU one counts its copy's device time (load_back_seconds). A failed
  // one published nothing (LoadBack returned the error); its pages come back now that nothing
  // writes them any more, and the cache stays usable (a sticky device error fails the next GPU
  // call on its own).
  void ReapLoad(CopyOp& op) KVTIER_REQUIRES(kCacheLock);

 private:
  CacheCore& core_;
  std::function<void(CacheWork*)> reap_;
  CudaStreamHandle backup_stream_;          // GPU only
  std::unique_ptr<util::ThreadPool> pool_;  // cpu backups (backup_threads > 0)
};

}  // namespace kvtier
