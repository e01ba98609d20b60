// StorageBackend's non-virtual half: argument checks, the bounded queue and the I/O threads that
// run the hooks, per-call deadlines, counters, futures and callbacks, Close. (The storage API's
// value types and options: storage_options.cc; OpenStorage's URL dispatch: open_storage.cc.)
//
// The I/O threads are the backend's own rather than util::ThreadPool: the pool runs one blocking
// ParallelFor at a time, while a backend needs independent batches from many callers queued and
// run concurrently, with a bound on the queue and rejection instead of waiting. They are also
// the only I/O threads a backend has: a hook that wants a batch's pages done in parallel calls
// ParallelFor, which shares the pages out to the I/O threads that are idle (the calling thread
// works through them too, so it never waits for a thread to come free; once they are all claimed,
// a read's caller runs pages of other reads while the last of its own finish).
//
// Reads before writes: Exists and Get wait in `reads`, Set and Remove in `writes`, each queue
// bounded on its own. A free I/O thread always takes read work first (pages of a running read's
// ParallelFor, then the oldest read call), so a read never waits behind a backlog of writes.
// Writes have a bounded share of the threads: at most `max_writers` (io_threads, as many as the
// same-run write ceiling's threads) run write work — a write call or pages of a write's
// ParallelFor — at once. Reads keep io_threads threads of their own, and run on at most that many
// at once (the same-run baseline's thread count): the backend runs io_threads + max_writers
// threads (one in all for io_threads = 1), so a
// write page that holds its thread for long (a store that writes slowly: on the GPU replay's
// disk an 8 MiB page took tens of ms) never leaves reads fewer threads than the same-run
// baseline of io_threads pread threads has. While reads are waiting or running, the writers'
// share shrinks to `read_time_writers` (StorageOptions::writers_while_reading; by default a
// quarter of io_threads, at least one): no thread starts
// write work beyond it, and the owner of a running write call steps aside before its next page
// (it runs pages of read jobs, or waits, until the share has room or its call's deadline passes;
// StepAsideLocked), so a backlog of writes on a slow store takes a quarter of the bandwidth from
// reads, not all of them (each writer finishes the page it is on first). Writes that cannot
// keep up fill their queue and later ones are rejected (Unavailable, "write queue full": the
// cache counts the backup as queue_full) instead of delaying reads. The exception keeps each
// key's order: a read that names a key of a write submitted before it (queued or running) is
// held until those writes have completed, so a Get or Exists issued after a Set of the same page
// sees that Set (read-your-writes).
//
// Where a call's time goes is counted (StorageStats): from acceptance (a held read: from its
// release) to an I/O thread taking it (*_queue_seconds), held behind a write of its keys
// (get_held_seconds), inside the hook (get_seconds, set_seconds) and the threads' time on its
// pages (*_page_seconds).
//
// Invariants (Queue, under `mu`): `reads.size() + held.size()` and `writes.size()` are each at
// most `options.max_queued_batches`; `pending_writes` counts, per key, the queued and running
// writes naming it; every held read names a key of `pending_writes`; `writers` counts the threads
// running write work and is at most `max_writers`; `paused_writers` counts the write owners
// stepped aside (not in `writers`); `readers` counts the threads running read work and is at most
// `max_readers` (io_threads); no idle thread takes write work while `writers` + `paused_writers` >=
// WriterShareLocked(); a job is in `read_jobs` / `write_jobs` exactly while it has pages nobody has
// claimed; calls are added only while `running`; once it is cleared (Close) the threads drain all
// queues and exit. Every accepted call has its `done` run exactly once, by the I/O thread that ran
// it; a rejected call has it run at once by its caller.
//
// Thread safety: every public method may be called from any thread; Close is serialised by
// `close_mu`.
#include "kvtier/storage_backend.h"

#include <fmt/format.h>

#include <algorithm>
#include <deque>
#include <exception>
#include <thread>
#include <unordered_map>
#include <utility>

#include "util/log.h"
#include "util/mutex.h"

namespace kvtier {

using Clock = std::chrono::steady_clock;

namespace {
StorageOptions Resolved(StorageOptions options) {
  if (options.io_threads == 0) options.io_threads = DefaultIoThreads();
  return options;
}
}  // namespace

// ---- the queue -------------------------------------------------------------------------------

namespace {

enum class CallKind : uint8_t { kExists, kGet, kSet, kRemove };

const char* CallName(CallKind kind) {
  switch (kind) {
    case CallKind::kExists:
      return "Exists";
    case CallKind::kGet:
      return "Get";
    case CallKind::kSet:
      return "Set";
    case CallKind::kRemove:
      return "Remove";
  }
  return "?";
}

bool IsRead(CallKind kind) { return kind == CallKind::kExists || kind == CallKind::kGet; }

struct Call {
  CallKind kind;
  std::vector<PageKey> keys;
  std::vector<PageBuffer> buffers;              // Get and Set
  std::vector<std::optional<PageKey>> parents;  // Set: empty, or one per key
  std::function<void(ExistsResult)> exists_done;
  std::function<void(BatchResult)> batch_done;
  // When it joined `reads` or `writes` (a held read: when it was released); a held read's time
  // in `held` (Stats' get_queue_seconds, get_held_seconds).
  Clock::time_point queued_at{};
  double held_seconds = 0;
  bool was_held = false;
};

// Runs a caller's callback; an exception from it (the core does not throw, but callers' code,
// e.g. a Python callback, might) is logged instead of ending the I/O thread.
template <typename Fn, typename Arg>
void RunDone(const Fn& done, Arg&& arg) {
  if (!done) return;
  try {
    done(std::forward<Arg>(arg));
  } catch (const std::exception& e) {
    util::Log(util::LogLevel::kError, "storage: a completion callback threw: {}", e.what());
  } catch (...) {
    util::Log(util::LogLevel::kError, "storage: a completion callback threw");
  }
}

}  // namespace

// The bounded queue, the I/O threads and the counters. A nested class, so it may call the
// backend's protected hooks without the public header naming any of this.
struct StorageBackend::Queue {
  // One ParallelFor: pages claimed one at a time by its owner and by idle I/O threads. Its
  // counters are guarded by the queue's `mu` (touched only in the Queue's methods that require
  // it: a Job cannot name that mutex for the analysis).
  struct Job {
    const std::function<void(int64_t)>* fn;
    int64_t n;
    bool write;
    int64_t next = 0;         // guarded by mu: the first page nobody has claimed
    int64_t finished = 0;     // guarded by mu
    double page_seconds = 0;  // guarded by mu: the threads' time inside its pages
  };

  util::Mutex mu;
  util::CondVar cv;                                   // idle I/O threads wait here for work
  util::CondVar job_cv;                               // a job's owner waits here for its pages
  int waiting_read_owners KVTIER_GUARDED_BY(mu) = 0;  // read owners waiting in job_cv
  std::deque<Job*> read_jobs KVTIER_GUARDED_BY(mu);
  std::deque<Job*> write_jobs KVTIER_GUARDED_BY(mu);
  int writers KVTIER_GUARDED_BY(mu) = 0;
  int paused_writers KVTIER_GUARDED_BY(mu) = 0;  // write owners stepped aside for reads
  int readers KVTIER_GUARDED_BY(mu) = 0;
  util::CondVar pause_cv;  // paused write owners wait here
  // Set by Start before it starts the threads, constant after.
  int max_readers = 1;        // io_threads
  int max_writers = 1;        // io_threads
  int read_time_writers = 1;  // the writers' share while reads are about
  int num_threads = 1;
  std::deque<Call> reads KVTIER_GUARDED_BY(mu);   // Exists and Get, served first
  std::deque<Call> writes KVTIER_GUARDED_BY(mu);  // Set and Remove
  std::deque<Call> held KVTIER_GUARDED_BY(mu);    // reads waiting for earlier writes of their keys
  std::unordered_map<PageKey, int, PageKeyHash> pending_writes KVTIER_GUARDED_BY(mu);
  bool running KVTIER_GUARDED_BY(mu) = false;  // Start ran and Close has not
  util::Mutex close_mu;                        // serialises Start and Close
  std::vector<std::thread> threads KVTIER_GUARDED_BY(close_mu);
  bool started KVTIER_GUARDED_BY(close_mu) = false;

  mutable util::Mutex stats_mu;
  StorageStats stats KVTIER_GUARDED_BY(stats_mu);  // queued_batches and gauges filled on read

  void Count(CallKind kind) KVTIER_EXCLUDES(stats_mu);
  Status Check(const StorageBackend& b, CallKind kind, const std::vector<PageKey>& keys,
               const std::vector<PageBuffer>* buffers) const;
  // Moves `call` into the queue, or leaves it with the caller and says why not.
  Status Enqueue(const StorageBackend& b, Call& call) KVTIER_EXCLUDES(mu, stats_mu);
  void Submit(StorageBackend& b, CallKind kind, std::vector<PageKey> keys,
              std::vector<PageBuffer> buffers, std::function<void(BatchResult)> done,
              std::vector<std::optional<PageKey>> parents = {});
  // Under `mu`: whether an I/O thread may take work now.
  bool HasWorkLocked() const KVTIER_REQUIRES(mu) {
    return (ReadRoomLocked() && (!read_jobs.empty() || !reads.empty())) ||
           (WriteRoomLocked() && (!write_jobs.empty() || !writes.empty()));
  }
  // Under `mu`: whether an idle thread may start read work: reads run on at most io_threads
  // threads at once (the threads beyond them are the writers'), so a read batch gets what
  // io_threads plain pread threads get, never more threads than that.
  bool ReadRoomLocked() const KVTIER_REQUIRES(mu) { return readers < max_readers; }
  // Under `mu`: whether an idle thread may start write work: below the writers' share, counting
  // the paused write owners (they resume first).
  bool WriteRoomLocked() const KVTIER_REQUIRES(mu) {
    return writers + paused_writers < WriterShareLocked();
  }
  // Under `mu`: the writers' share may have grown or read pages appeared; paused owners look.
  void WakePausedLocked() KVTIER_REQUIRES(mu) {
    if (paused_writers > 0) pause_cv.NotifyAll();
  }
  // Under `mu`, by the owner of a write job before it claims its next page: while writes hold
  // more threads than their share (reads are waiting or running), this owner steps aside — it
  // runs pages of read jobs, or waits — until the share has room for it again or `deadline`
  // (its call's) passes. Without this, a write call's owner kept its thread for the whole
  // batch, so reads arriving behind a backlog of long write batches got only the threads the
  // writers' full share left them (a quarter).
  void StepAsideLocked(Clock::time_point deadline) KVTIER_REQUIRES(mu);
  // Under `mu`: how many threads may run write work now — fewer while reads wait or run.
  int WriterShareLocked() const KVTIER_REQUIRES(mu) {
    return readers > 0 || !reads.empty() || !read_jobs.empty() ? read_time_writers : max_writers;
  }
  // Under `mu`: a thread's read work is done; when no read is left, the writers' full share
  // is back and idle threads are told (they sleep while the smaller share is taken).
  bool ReadDoneLocked() KVTIER_REQUIRES(mu) {
    --readers;
    const bool share_back = readers == 0 && reads.empty() && read_jobs.empty();
    if (share_back) WakePausedLocked();
    return share_back && (!writes.empty() || !write_jobs.empty());
  }
  // Under `mu`: claims the next page of `job` (false when all are claimed), dropping the job
  // from its list once its last page is claimed.
  bool ClaimLocked(Job& job, int64_t* page) KVTIER_REQUIRES(mu) {
    if (job.next >= job.n) return false;
    *page = job.next++;
    if (job.next == job.n) {
      std::deque<Job*>& list = job.write ? write_jobs : read_jobs;
      list.erase(std::find(list.begin(), list.end(), &job));
    }
    return true;
  }
  // Runs page `page` of `job` (claimed), then counts it finished. Called without `mu`.
  void RunPage(Job& job, int64_t page) KVTIER_EXCLUDES(mu) {
    const auto start = Clock::now();
    (*job.fn)(page);
    const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    bool last = false;
    {
      util::MutexLock lock(mu);
      job.page_seconds += seconds;
      last = ++job.finished == job.n;
    }
    if (last) job_cv.NotifyAll();
  }
  void ParallelFor(int64_t n, const std::function<void(int64_t)>& fn, bool write)
      KVTIER_EXCLUDES(mu);
  bool WritePending(const PageKey& key) KVTIER_EXCLUDES(mu);
  // Under `mu`: whether `call` names a key that a queued or running write names.
  bool WaitsForAWriteLocked(const Call& call) const KVTIER_REQUIRES(mu) {
    if (pending_writes.empty()) return false;
    for (const PageKey& key : call.keys) {
      if (pending_writes.count(key) != 0) return true;
    }
    return false;
  }
  // Under `mu`: a write of `keys` has completed; held reads no longer waiting go to `reads`.
  void WriteDoneLocked(const std::vector<PageKey>& keys) KVTIER_REQUIRES(mu) {
    for (const PageKey& key : keys) {
      auto it = pending_writes.find(key);
      if (it != pending_writes.end() && --it->second == 0) pending_writes.erase(it);
    }
    const auto now = Clock::now();
    for (auto it = held.begin(); it != held.end();) {
      if (WaitsForAWriteLocked(*it)) {
        ++it;
        continue;
      }
      it->held_seconds = std::chrono::duration<double>(now - it->queued_at).count();
      it->queued_at = now;
      reads.push_back(std::move(*it));
      it = held.erase(it);
    }
  }
  void Loop(StorageBackend& b) KVTIER_EXCLUDES(mu);
  void Run(StorageBackend& b, Call& call) KVTIER_EXCLUDES(mu, stats_mu);
};

StorageBackend::StorageBackend(std::string url, StorageNamespace ns, StorageOptions options)
    : url_(std::move(url)),
      ns_(std::move(ns)),
      options_(Resolved(std::move(options))),
      queue_(std::make_unique<Queue>()) {}

StorageBackend::~StorageBackend() { Close(); }

Status StorageBackend::Start() {
  KVTIER_RETURN_IF_ERROR(options_.Validate());
  KVTIER_RETURN_IF_ERROR(ns_.Validate());
  util::MutexLock close_lock(queue_->close_mu);
  if (queue_->started) return Status::FailedPrecondition("storage backend started twice");
  queue_->started = true;
  {
    util::MutexLock lock(queue_->mu);
    queue_->running = true;
  }
  // Writes alone run on as many threads as reads (the write ceiling's N threads); they had three
  // quarters of them, from when reads and writes shared io_threads threads, which capped a
  // Set at 75 % of the ceiling wherever the disk was not the limit.
  queue_->max_writers = options_.io_threads;
  queue_->read_time_writers = options_.writers_while_reading > 0
                                  ? std::min(options_.writers_while_reading, options_.io_threads)
                                  : std::max(1, options_.io_threads / 4);
  queue_->max_readers = options_.io_threads;
  // io_threads for reads, and beyond them a thread for each writer of the writers' share (one
  // thread in all for io_threads = 1, which keeps calls in order): write pages on a store that
  // writes slowly hold their threads for long, and reads must not have to wait for them.
  queue_->num_threads = options_.io_threads == 1 ? 1 : options_.io_threads + queue_->max_writers;
  for (int i = 0; i < queue_->num_threads; ++i) {
    queue_->threads.emplace_back([this] { queue_->Loop(*this); });
  }
  return Status::OK();
}

void StorageBackend::Close() {
  util::MutexLock close_lock(queue_->close_mu);
  {
    util::MutexLock lock(queue_->mu);
    queue_->running = false;
    queue_->pause_cv.NotifyAll();
  }
  queue_->cv.NotifyAll();
  for (auto& t : queue_->threads) t.join();
  queue_->threads.clear();
  DoClose();
}

namespace {
// The queue whose I/O thread this is, and whether the call it runs writes (ParallelFor's
// caller); null on other threads.
thread_local const void* tls_queue = nullptr;
thread_local bool tls_write = false;
// The time inside the pages of the call this I/O thread runs (its ParallelFor calls, all threads
// summed), and whether the hook called ParallelFor at all.
thread_local double tls_page_seconds = 0;
thread_local bool tls_paged = false;
// The deadline of the call this I/O thread runs.
thread_local Clock::time_point tls_deadline{};
}  // namespace

void StorageBackend::Queue::StepAsideLocked(Clock::time_point deadline) {
  while (running && writers > WriterShareLocked() && Clock::now() < deadline) {
    --writers;
    ++paused_writers;
    if (!read_jobs.empty() && ReadRoomLocked()) {
      Job& read = *read_jobs.front();
      int64_t page = 0;
      ClaimLocked(read, &page);  // a listed job has a page left
      ++readers;
      mu.Unlock();
      RunPage(read, page);  // `read` may be gone once its last page is counted
      mu.Lock();
      if (ReadDoneLocked()) cv.NotifyAll();
    } else {
      // Until closing, a read job it may help with, or room in the writers' share.
      while (running && (read_jobs.empty() || !ReadRoomLocked()) &&
             writers >= WriterShareLocked() &&
             pause_cv.WaitUntil(mu, deadline) == std::cv_status::no_timeout) {
      }
    }
    --paused_writers;
    ++writers;
  }
}

void StorageBackend::Queue::Loop(StorageBackend& b) {
  tls_queue = this;
  for (;;) {
    Call call;
    mu.Lock();
    while (!HasWorkLocked() && (running || !writes.empty() || !held.empty())) cv.Wait(mu);
    if (!HasWorkLocked()) {  // closing and drained
      mu.Unlock();
      return;
    }
    // Read work first: a page of a running read, then a read call; write work only while
    // writes hold fewer than their share of the threads.
    const bool read_room = ReadRoomLocked();
    Job* job = read_room && !read_jobs.empty()            ? read_jobs.front()
               : read_room && !reads.empty()              ? nullptr
               : WriteRoomLocked() && !write_jobs.empty() ? write_jobs.front()
                                                          : nullptr;
    if (job != nullptr) {
      int64_t page = 0;
      ClaimLocked(*job, &page);  // a listed job has a page left
      const bool write = job->write;
      if (write) {
        ++writers;
      } else {
        ++readers;
      }
      mu.Unlock();
      RunPage(*job, page);  // `job` may be gone once its last page is counted
      mu.Lock();
      bool wake = false;
      if (write) {
        --writers;
        WakePausedLocked();
        wake = !writes.empty() || !write_jobs.empty();
      } else {
        wake = ReadDoneLocked();
      }
      mu.Unlock();
      if (wake) (write ? cv.NotifyOne() : cv.NotifyAll());
      continue;
    }
    const bool read = read_room && !reads.empty();
    std::deque<Call>& from = read ? reads : writes;
    call = std::move(from.front());
    from.pop_front();
    if (read) {
      ++readers;
    } else {
      ++writers;
    }
    mu.Unlock();
    tls_write = !IsRead(call.kind);
    Run(b, call);
    if (IsRead(call.kind)) {
      bool wake = false;
      {
        util::MutexLock lock(mu);
        wake = ReadDoneLocked();
      }
      if (wake) cv.NotifyAll();
    } else {
      bool wake = false;
      {
        util::MutexLock lock(mu);
        --writers;
        WakePausedLocked();
        const size_t ready_reads = reads.size();
        WriteDoneLocked(call.keys);
        // Wake the idle threads only when there is something new for them: reads this write
        // held, a write that waited for this writer's share, or (closing) the drain they wait
        // for. Waking them after every write made each one contend for `mu` and go back to
        // sleep, a storm of hand-offs per batch.
        wake = reads.size() > ready_reads || !running || !writes.empty() || !write_jobs.empty();
      }
      if (wake) cv.NotifyAll();
    }
  }
}

bool StorageBackend::Queue::WritePending(const PageKey& key) {
  util::MutexLock lock(mu);
  return pending_writes.count(key) != 0;
}

void StorageBackend::Queue::ParallelFor(int64_t n, const std::function<void(int64_t)>& fn,
                                        bool write) {
  Job job{&fn, n, write};
  mu.Lock();
  (write ? write_jobs : read_jobs).push_back(&job);
  const bool wake_owners = !write && waiting_read_owners > 0;
  if (!write) WakePausedLocked();  // paused write owners help with its pages
  // Helpers for the pages beyond the one this thread starts with: for a read, no more than the
  // reader slots left free (a woken thread that finds none goes back to sleep, and with many
  // reads in flight those wake-ups took cores from the readers: 8 calls of 64 pages of 512 KiB
  // in flight read at 60 % of the baseline, 2 at 66-73 %); threads already reading take its
  // pages as they finish theirs.
  const int64_t helpers = write ? std::min<int64_t>(n, num_threads) - 1
                                : std::min<int64_t>(n - 1, std::max(0, max_readers - readers));
  mu.Unlock();
  if (wake_owners) job_cv.NotifyAll();  // read owners waiting for their last pages help too
  for (int64_t i = 0; i < helpers; ++i) cv.NotifyOne();
  int64_t page = 0;
  for (;;) {
    mu.Lock();
    if (write && job.next < job.n) StepAsideLocked(tls_deadline);
    const bool claimed = ClaimLocked(job, &page);
    mu.Unlock();
    if (!claimed) break;
    RunPage(job, page);
  }
  // Every page is claimed; other threads run the last ones. A read's owner does not idle
  // meanwhile: it runs pages of other read jobs, one at a time (its own call's completion waits
  // at most one such page longer). Without this each read call left its thread idle at its tail,
  // and a prefetch's batches ran on fewer threads than the baseline's io_threads.
  mu.Lock();
  while (job.finished != job.n) {
    if (!write && !read_jobs.empty()) {
      Job& other = *read_jobs.front();
      int64_t other_page = 0;
      ClaimLocked(other, &other_page);  // a listed job has a page left
      mu.Unlock();
      RunPage(other, other_page);  // `other` may be gone once its last page is counted
      mu.Lock();
      continue;
    }
    ++waiting_read_owners;
    job_cv.Wait(mu);
    --waiting_read_owners;
  }
  tls_page_seconds += job.page_seconds;
  mu.Unlock();
  tls_paged = true;
}

bool StorageBackend::WritePending(const PageKey& key) const { return queue_->WritePending(key); }

void StorageBackend::ParallelFor(int64_t n, const std::function<void(int64_t)>& fn) {
  if (n <= 0) return;
  if (n == 1 || tls_queue != queue_.get() || options_.io_threads == 1) {
    const auto start = Clock::now();
    for (int64_t i = 0; i < n; ++i) fn(i);
    if (tls_queue == queue_.get()) {
      tls_page_seconds += std::chrono::duration<double>(Clock::now() - start).count();
      tls_paged = true;
    }
    return;
  }
  queue_->ParallelFor(n, fn, tls_write);
}

void StorageBackend::Queue::Run(StorageBackend& b, Call& call) {
  const auto start = Clock::now();
  const auto deadline = start + b.options_.timeout;
  const double queue_seconds = std::chrono::duration<double>(start - call.queued_at).count();
  tls_deadline = deadline;
  tls_page_seconds = 0;
  tls_paged = false;
  if (call.kind == CallKind::kExists) {
    ExistsResult result = b.DoExists(call.keys, deadline);
    if (!result.status.ok()) result.leading = 0;
    result.leading = std::clamp<int64_t>(result.leading, 0, static_cast<int64_t>(call.keys.size()));
    RunDone(call.exists_done, std::move(result));
    return;
  }
  BatchResult result;
  result.pages.assign(call.keys.size(), PageStatus::kSkipped);
  switch (call.kind) {
    case CallKind::kGet:
      b.DoGet(call.keys, call.buffers, result.pages, deadline);
      break;
    case CallKind::kSet:
      if (call.parents.empty()) {
        b.DoSet(call.keys, call.buffers, result.pages, deadline);
      } else {
        b.DoSetChained(call.keys, call.buffers, call.parents, result.pages, deadline);
      }
      break;
    case CallKind::kRemove:
      b.DoRemove(call.keys, result.pages, deadline);
      break;
    case CallKind::kExists:
      break;
  }
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  const double page_seconds = tls_paged ? tls_page_seconds : seconds;
  {
    util::MutexLock lock(stats_mu);
    StorageStats& s = stats;
    for (size_t i = 0; i < result.pages.size(); ++i) {
      const PageStatus p = result.pages[i];
      const int64_t bytes = call.buffers.empty() ? 0 : call.buffers[i].bytes();
      if (call.kind == CallKind::kGet) {
        s.get_hit_pages += p == PageStatus::kOk;
        s.get_absent_pages += p == PageStatus::kAbsent;
        s.get_corrupt_pages += p == PageStatus::kCorrupt;
        s.get_wrong_namespace_pages += p == PageStatus::kWrongNamespace;
        s.get_timed_out_pages += p == PageStatus::kTimedOut;
        s.get_failed_pages += p == PageStatus::kFailed;
        if (p == PageStatus::kOk) s.bytes_read += bytes;
      } else if (call.kind == CallKind::kSet) {
        s.set_ok_pages += p == PageStatus::kOk;
        s.set_timed_out_pages += p == PageStatus::kTimedOut;
        s.set_no_space_pages += p == PageStatus::kNoSpace;
        s.set_failed_pages += p != PageStatus::kOk && p != PageStatus::kTimedOut &&
                              p != PageStatus::kSkipped && p != PageStatus::kNoSpace;
        if (p == PageStatus::kOk) s.bytes_written += bytes;
      } else {
        s.removed_pages += p == PageStatus::kOk;
      }
    }
    if (call.kind == CallKind::kGet) {
      s.get_seconds += seconds;
      s.get_queue_seconds += queue_seconds;
      s.get_page_seconds += page_seconds;
      s.get_held_seconds += call.held_seconds;
      s.get_held_calls += call.was_held;
    }
    if (call.kind == CallKind::kSet) {
      s.set_seconds += seconds;
      s.set_queue_seconds += queue_seconds;
      s.set_page_seconds += page_seconds;
    }
  }
  result.status = Status::OK();
  RunDone(call.batch_done, std::move(result));
}

// ---- submission --------------------------------------------------------------------------------

Status StorageBackend::Queue::Check(const StorageBackend& b, CallKind kind,
                                    const std::vector<PageKey>& keys,
                                    const std::vector<PageBuffer>* buffers) const {
  const char* name = CallName(kind);
  if (static_cast<int64_t>(keys.size()) > b.options_.max_batch_pages) {
    return Status::InvalidArgument(fmt::format("storage {}: {} keys exceed max_batch_pages {}",
                                               name, keys.size(), b.options_.max_batch_pages));
  }
  if (buffers == nullptr) return Status::OK();
  if (buffers->size() != keys.size()) {
    return Status::InvalidArgument(
        fmt::format("storage {}: {} keys but {} page buffers", name, keys.size(), buffers->size()));
  }
  const int64_t page_bytes = b.ns_.page_bytes();
  for (size_t i = 0; i < buffers->size(); ++i) {
    const PageBuffer& buf = (*buffers)[i];
    if (buf.num_segments < 1 || buf.num_segments > PageBuffer::kMaxSegments) {
      return Status::InvalidArgument(fmt::format(
          "storage {}: page buffer {} has {} segments (1 or 2)", name, i, buf.num_segments));
    }
    for (int s = 0; s < buf.num_segments; ++s) {
      const auto& seg = buf.segments[static_cast<size_t>(s)];
      if (seg.data() == nullptr && !seg.empty()) {
        return Status::InvalidArgument(
            fmt::format("storage {}: page buffer {} segment {} is null", name, i, s));
      }
    }
    if (buf.bytes() != page_bytes) {
      return Status::InvalidArgument(
          fmt::format("storage {}: page buffer {} holds {} bytes, a page of {} is {} bytes", name,
                      i, buf.bytes(), b.ns_.Name(), page_bytes));
    }
  }
  return Status::OK();
}

Status StorageBackend::Queue::Enqueue(const StorageBackend& b, Call& call) {
  Status why;
  bool wake = false;
  {
    util::MutexLock lock(mu);
    const bool read = IsRead(call.kind);
    const size_t waiting = read ? reads.size() + held.size() : writes.size();
    if (running && static_cast<int64_t>(waiting) < b.options_.max_queued_batches) {
      call.queued_at = Clock::now();
      if (!read) {
        for (const PageKey& key : call.keys) ++pending_writes[key];
        writes.push_back(std::move(call));
        wake = true;
      } else if (WaitsForAWriteLocked(call)) {
        call.was_held = true;
        held.push_back(std::move(call));  // nothing to wake a thread for
      } else {
        reads.push_back(std::move(call));
        wake = true;
      }
    } else {
      why = running ? Status::Unavailable(
                          fmt::format("storage {}: {} queue full ({} batches waiting)", b.url_,
                                      read ? "read" : "write", b.options_.max_queued_batches))
                    : Status::Unavailable(fmt::format("storage {} is closed", b.url_));
    }
  }
  if (why.ok()) {
    // Woken after unlocking, so the thread does not wake only to block on `mu` again.
    if (wake) cv.NotifyOne();
    return Status::OK();
  }
  util::MutexLock lock(stats_mu);
  ++stats.rejected_calls;
  return why;
}

void StorageBackend::Queue::Count(CallKind kind) {
  util::MutexLock lock(stats_mu);
  switch (kind) {
    case CallKind::kExists:
      ++stats.exists_calls;
      break;
    case CallKind::kGet:
      ++stats.get_calls;
      break;
    case CallKind::kSet:
      ++stats.set_calls;
      break;
    case CallKind::kRemove:
      ++stats.remove_calls;
      break;
  }
}

void StorageBackend::Queue::Submit(StorageBackend& b, CallKind kind, std::vector<PageKey> keys,
                                   std::vector<PageBuffer> buffers,
                                   std::function<void(BatchResult)> done,
                                   std::vector<std::optional<PageKey>> parents) {
  Count(kind);
  const size_t num_pages = keys.size();
  Status st = b.CheckCaller(CallName(kind));
  if (st.ok()) st = Check(b, kind, keys, kind == CallKind::kRemove ? nullptr : &buffers);
  if (st.ok() && !parents.empty() && parents.size() != keys.size()) {
    st = Status::InvalidArgument(
        fmt::format("Set: {} parents for {} keys (one per key)", parents.size(), keys.size()));
  }
  if (st.ok()) {
    Call call{kind, std::move(keys), std::move(buffers), std::move(parents), {}, std::move(done)};
    st = Enqueue(b, call);
    if (st.ok()) return;
    done = std::move(call.batch_done);
  }
  RunDone(done, BatchResult::Failed(std::move(st), num_pages));
}

void StorageBackend::ExistsAsync(std::vector<PageKey> keys,
                                 std::function<void(ExistsResult)> done) {
  queue_->Count(CallKind::kExists);
  Status st = CheckCaller(CallName(CallKind::kExists));
  if (st.ok()) st = queue_->Check(*this, CallKind::kExists, keys, nullptr);
  if (st.ok()) {
    Call call{CallKind::kExists, std::move(keys), {}, {}, std::move(done), {}};
    st = queue_->Enqueue(*this, call);
    if (st.ok()) return;
    done = std::move(call.exists_done);
  }
  RunDone(done, ExistsResult{std::move(st), 0});
}

void StorageBackend::GetAsync(std::vector<PageKey> keys, std::vector<PageBuffer> buffers,
                              std::function<void(BatchResult)> done) {
  queue_->Submit(*this, CallKind::kGet, std::move(keys), std::move(buffers), std::move(done));
}

void StorageBackend::SetAsync(std::vector<PageKey> keys, std::vector<PageBuffer> buffers,
                              std::function<void(BatchResult)> done) {
  queue_->Submit(*this, CallKind::kSet, std::move(keys), std::move(buffers), std::move(done));
}

void StorageBackend::SetAsync(std::vector<PageKey> keys, std::vector<PageBuffer> buffers,
                              std::vector<std::optional<PageKey>> parents,
                              std::function<void(BatchResult)> done) {
  if (parents.empty() && !keys.empty()) {  // a Set with parents names one per key
    RunDone(done, BatchResult::Failed(Status::InvalidArgument(fmt::format(
                                          "Set: 0 parents for {} keys (one per key)", keys.size())),
                                      keys.size()));
    return;
  }
  queue_->Submit(*this, CallKind::kSet, std::move(keys), std::move(buffers), std::move(done),
                 std::move(parents));
}

void StorageBackend::RemoveAsync(std::vector<PageKey> keys, std::function<void(BatchResult)> done) {
  queue_->Submit(*this, CallKind::kRemove, std::move(keys), {}, std::move(done));
}

namespace {

// The future form of an asynchronous call: `start(done)`, whose `done` fulfils the future.
template <typename R, typename Start>
std::future<R> AsFuture(Start start) {
  auto promise = std::make_shared<std::promise<R>>();
  auto future = promise->get_future();
  start([promise](R r) { promise->set_value(std::move(r)); });
  return future;
}

}  // namespace

std::future<ExistsResult> StorageBackend::Exists(std::vector<PageKey> keys) {
  return AsFuture<ExistsResult>([&](auto done) { ExistsAsync(std::move(keys), std::move(done)); });
}

std::future<BatchResult> StorageBackend::Get(std::vector<PageKey> keys,
                                             std::vector<PageBuffer> buffers) {
  return AsFuture<BatchResult>(
      [&](auto done) { GetAsync(std::move(keys), std::move(buffers), std::move(done)); });
}

std::future<BatchResult> StorageBackend::Set(std::vector<PageKey> keys,
                                             std::vector<PageBuffer> buffers) {
  return AsFuture<BatchResult>(
      [&](auto done) { SetAsync(std::move(keys), std::move(buffers), std::move(done)); });
}

std::future<BatchResult> StorageBackend::Set(std::vector<PageKey> keys,
                                             std::vector<PageBuffer> buffers,
                                             std::vector<std::optional<PageKey>> parents) {
  auto promise = std::make_shared<std::promise<BatchResult>>();
  auto future = promise->get_future();
  SetAsync(std::move(keys), std::move(buffers), std::move(parents),
           [promise](BatchResult r) { promise->set_value(std::move(r)); });
  return future;
}

std::future<BatchResult> StorageBackend::Remove(std::vector<PageKey> keys) {
  return AsFuture<BatchResult>([&](auto done) { RemoveAsync(std::move(keys), std::move(done)); });
}

Result<uint64_t> StorageBackend::PinPages(std::span<const PageKey> keys,
                                          std::chrono::nanoseconds ttl) {
  if (ttl <= std::chrono::nanoseconds::zero()) {
    return Status::InvalidArgument(
        fmt::format("PinPages: ttl = {} ns must be positive", ttl.count()));
  }
  return DoPinPages(keys, ttl);
}

Status StorageBackend::UnpinPages(uint64_t pin) { return DoUnpinPages(pin); }

Result<uint64_t> StorageBackend::DoPinPages(std::span<const PageKey> /*keys*/,
                                            std::chrono::nanoseconds /*ttl*/) {
  return Status::FailedPrecondition(
      fmt::format("storage backend {} cannot pin pages: its own eviction decides", url_));
}

Status StorageBackend::DoUnpinPages(uint64_t pin) {
  return Status::InvalidArgument(fmt::format("UnpinPages: no pin {} in {}", pin, url_));
}

Result<std::vector<PageKey>> StorageBackend::StoredKeys() { return DoStoredKeys(); }

Result<std::vector<PageKey>> StorageBackend::DoStoredKeys() {
  return Status::FailedPrecondition(
      fmt::format("storage backend {} cannot list a namespace's pages", url_));
}

StorageStats StorageBackend::Stats() const {
  StorageStats s;
  {
    util::MutexLock lock(queue_->stats_mu);
    s = queue_->stats;
  }
  {
    util::MutexLock lock(queue_->mu);
    s.queued_batches =
        static_cast<int64_t>(queue_->reads.size() + queue_->held.size() + queue_->writes.size());
  }
  FillStats(s);
  return s;
}

}  // namespace kvtier
