// Internal: computes page payload checksums on threads of its own, so that a writer can send a
// page while its checksum is being computed (the Redis backend's header-last Set,
// redis_backend.cc).
//
// A caller groups its jobs in a Batch and waits for them together. Wait() runs the batch's jobs
// that no pool thread has started yet on the calling thread, so a batch never waits for a queue
// full of other callers' jobs: at worst it costs what computing its checksums in line would.
// (util::ThreadPool's posted tasks cannot be taken back by a waiter, hence a queue of its own.)
//
// Thread safety: a pool is shared by any number of threads; one Batch belongs to one thread.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

#include "kvtier/storage.h"

namespace kvtier::storage {

class ChecksumPool {
 public:
  // REQUIRES: threads >= 1.
  explicit ChecksumPool(int threads);
  // Joins the threads. REQUIRES: no Batch of this pool is alive.
  ~ChecksumPool();
  ChecksumPool(const ChecksumPool&) = delete;
  ChecksumPool& operator=(const ChecksumPool&) = delete;

  class Batch {
   public:
    explicit Batch(ChecksumPool& pool) : pool_(pool) {}
    // Waits for every job added (they read the callers' memory).
    ~Batch() { Wait(); }
    Batch(const Batch&) = delete;
    Batch& operator=(const Batch&) = delete;

    // Queues the checksum of `payload` (this build's kind, DefaultChecksumKind) into `*out`.
    // The payload's memory and `out` must stay valid and unchanged until Wait() returns.
    void Add(const PageBuffer& payload, uint64_t* out);
    // Returns when every job added so far is done.
    void Wait();

   private:
    friend class ChecksumPool;
    ChecksumPool& pool_;
    int pending_ = 0;  // jobs added and not done; guarded by pool_.mu_
    std::condition_variable done_;
  };

 private:
  struct Job {
    Batch* batch;
    PageBuffer payload;
    uint64_t* out;
  };
  static void Run(const Job& job);
  // Marks `job` done. REQUIRES: mu_ held.
  void FinishLocked(const Job& job);
  void Loop();

  std::mutex mu_;
  std::condition_variable wake_;
  std::deque<Job> queue_;
  bool stopping_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace kvtier::storage
