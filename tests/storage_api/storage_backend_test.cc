// StorageBackend's own machinery, through a backend whose hooks wait at a gate the test opens:
// argument checks (InvalidArgument at once, in the caller's thread), the bounded queue (a full
// queue rejects with Unavailable without blocking; reads and writes are queued apart and reads
// go first), completion on the I/O threads, deadlines,
// Close (drains, then rejects), counters, and a callback that throws. The concurrency test runs
// many callers against the real memory backend and checks every byte.
#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <cstring>
#include <future>
#include <mutex>
#include <random>
#include <set>
#include <stdexcept>
#include <thread>

#include "kvtier/storage.h"
#include "kvtier/testing/storage_fault.h"

namespace kvtier {
namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

StorageNamespace SmallNamespace() {
  StorageNamespace ns;
  ns.model_id = "test-model";
  ns.num_layers = 2;
  ns.slot_bytes = 32;
  ns.page_size = 4;
  return ns;  // page_bytes = 2 * 2 * 4 * 32 = 512
}

PageKey KeyOf(int i) {
  std::vector<int32_t> tokens = {i, i + 1, i + 2, i + 3};
  return ComputePromptPageKeys(tokens, 4)->front();
}

// What the fake backends below share, so that each states only what differs: Open, hooks that
// store nothing (Exists finds no page, Set and Remove do nothing) for a fake to override where
// its test drives them, and the mutex, condition variable and gate that its hooks and its test
// share, with helpers that read or wait under that mutex.
// REQUIRES: a fake's destructor calls Close(): its hooks use its members, which are destroyed
// before this class's destructor (and StorageBackend's Close) runs.
class FakeBackend : public StorageBackend {
 public:
  Status Open() { return Start(); }
  // Lets every hook that waits at the gate go on (and any that gets there later).
  void OpenGate() {
    std::lock_guard<std::mutex> lock(mu_);
    gate_open_ = true;
    cv_.notify_all();
  }

 protected:
  FakeBackend(std::string url, const StorageNamespace& ns, const StorageOptions& options)
      : StorageBackend(std::move(url), ns, options) {}

  ExistsResult DoExists(std::span<const PageKey>, Clock::time_point) override { return {}; }
  void DoSet(std::span<const PageKey>, std::span<const PageBuffer>, std::span<PageStatus>,
             Clock::time_point) override {}
  void DoRemove(std::span<const PageKey>, std::span<PageStatus>, Clock::time_point) override {}

  // `member` (guarded by mu_) read under the lock.
  template <class T>
  T Locked(const T& member) {
    std::lock_guard<std::mutex> lock(mu_);
    return member;
  }
  // Waits up to `limit` until `done()` (called under the lock) holds; false if it never did.
  template <class Done>
  bool WaitFor(Done done, std::chrono::seconds limit = 30s) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, limit, done);
  }

  std::mutex mu_;
  std::condition_variable cv_;
  bool gate_open_ = false;  // guarded by mu_
};

// Hooks that record what they were given and block until the gate opens. Absent/present is
// decided by the key's first byte so results are checkable.
class GatedBackend final : public FakeBackend {
 public:
  GatedBackend(const StorageNamespace& ns, const StorageOptions& options)
      : FakeBackend("gated://", ns, options) {}
  ~GatedBackend() override { Close(); }

  // Waits until `n` hooks have been entered.
  void WaitEntered(int n) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return entered_ >= n; });
  }
  Clock::time_point last_deadline() { return Locked(last_deadline_); }
  std::thread::id last_thread() { return Locked(last_thread_); }
  // The hooks entered so far, in order: 'E'xists, 'G'et, 'S'et, 'R'emove.
  std::string order() { return Locked(order_); }

 protected:
  ExistsResult DoExists(std::span<const PageKey> keys, Clock::time_point deadline) override {
    Enter(deadline, 'E');
    ExistsResult r;
    while (r.leading < static_cast<int64_t>(keys.size()) &&
           keys[static_cast<size_t>(r.leading)].bytes[0] % 2 == 0) {
      ++r.leading;
    }
    return r;
  }
  void DoGet(std::span<const PageKey> keys, std::span<const PageBuffer> buffers,
             std::span<PageStatus> out, Clock::time_point deadline) override {
    Enter(deadline, 'G');
    for (size_t i = 0; i < keys.size(); ++i) {
      if (keys[i].bytes[0] % 2 == 0) {
        std::memset(buffers[i].segments[0].data(), keys[i].bytes[1], buffers[i].bytes());
        out[i] = PageStatus::kOk;
      } else {
        out[i] = PageStatus::kAbsent;
      }
    }
  }
  void DoSet(std::span<const PageKey> keys, std::span<const PageBuffer>, std::span<PageStatus> out,
             Clock::time_point deadline) override {
    Enter(deadline, 'S');
    for (size_t i = 0; i < keys.size(); ++i) out[i] = PageStatus::kOk;
  }
  void DoRemove(std::span<const PageKey> keys, std::span<PageStatus> out,
                Clock::time_point deadline) override {
    Enter(deadline, 'R');
    for (size_t i = 0; i < keys.size(); ++i) out[i] = PageStatus::kOk;
  }

 private:
  void Enter(Clock::time_point deadline, char hook) {
    std::unique_lock<std::mutex> lock(mu_);
    ++entered_;
    order_ += hook;
    last_deadline_ = deadline;
    last_thread_ = std::this_thread::get_id();
    cv_.notify_all();
    cv_.wait(lock, [&] { return gate_open_; });
  }

  int entered_ = 0;
  Clock::time_point last_deadline_;
  std::thread::id last_thread_;
  std::string order_;
};

std::unique_ptr<GatedBackend> MakeGated(int threads, int queue, std::chrono::milliseconds timeout) {
  StorageOptions o;
  o.io_threads = threads;
  o.max_queued_batches = queue;
  o.timeout = timeout;
  o.max_batch_pages = 8;
  auto b = std::make_unique<GatedBackend>(SmallNamespace(), o);
  EXPECT_TRUE(b->Open().ok());
  return b;
}

TEST(StorageBackendTest, BadArgumentsAreRejectedAtOnceInTheCallersThread) {
  auto b = MakeGated(1, 4, 1000ms);
  std::vector<std::byte> page(512), small(100);
  const auto caller = std::this_thread::get_id();
  struct Case {
    std::vector<PageKey> keys;
    std::vector<PageBuffer> buffers;
    const char* needle;
  };
  std::vector<Case> cases;
  cases.push_back({{KeyOf(1), KeyOf(2)}, {PageBuffer::Of(page)}, "2 keys but 1 page buffers"});
  cases.push_back({{KeyOf(1)}, {PageBuffer::Of(small)}, "holds 100 bytes"});
  cases.push_back({{KeyOf(1)}, {PageBuffer{}}, "0 segments"});
  cases.push_back({std::vector<PageKey>(9, KeyOf(1)),
                   std::vector<PageBuffer>(9, PageBuffer::Of(page)), "max_batch_pages"});
  for (auto& c : cases) {
    for (bool set : {false, true}) {
      bool called = false;
      auto done = [&](BatchResult r) {
        called = true;
        EXPECT_EQ(std::this_thread::get_id(), caller);
        EXPECT_TRUE(r.status.IsInvalidArgument());
        EXPECT_NE(r.status.message().find(c.needle), std::string::npos) << r.status.ToString();
        EXPECT_EQ(r.pages.size(), c.keys.size());
        EXPECT_EQ(r.count(PageStatus::kSkipped), static_cast<int64_t>(c.keys.size()));
      };
      if (set) {
        b->SetAsync(c.keys, c.buffers, done);
      } else {
        b->GetAsync(c.keys, c.buffers, done);
      }
      EXPECT_TRUE(called);
    }
  }
  auto exists = b->Exists(std::vector<PageKey>(9, KeyOf(1))).get();
  EXPECT_TRUE(exists.status.IsInvalidArgument());
  EXPECT_EQ(exists.leading, 0);
  // A zero-length segment beside a full one is fine (bytes() is what counts).
  std::vector<std::byte> empty;
  b->OpenGate();
  auto r = b->Get({KeyOf(2)}, {PageBuffer::Of(std::span<std::byte>(empty), page)}).get();
  EXPECT_TRUE(r.status.ok()) << r.status.ToString();
  EXPECT_EQ(b->Stats().rejected_calls, 0);  // bad arguments are not queue rejections
}

TEST(StorageBackendTest, FullQueueRejectsWithUnavailableWithoutBlocking) {
  auto b = MakeGated(/*threads=*/1, /*queue=*/2, 5000ms);
  std::vector<std::byte> page(512);
  std::atomic<int> completed{0};
  auto count = [&](BatchResult r) {
    EXPECT_TRUE(r.status.ok());
    completed.fetch_add(1);
  };
  b->SetAsync({KeyOf(0)}, {PageBuffer::Of(page)}, count);  // taken by the I/O thread
  b->WaitEntered(1);
  b->SetAsync({KeyOf(2)}, {PageBuffer::Of(page)}, count);  // queued
  b->SetAsync({KeyOf(4)}, {PageBuffer::Of(page)}, count);  // queued: the write queue is full
  EXPECT_EQ(b->Stats().queued_batches, 2);
  // Without blocking: the future is ready when the call returns (the gate holds the only I/O
  // thread, so nothing else could have completed it); no wall-clock bound needed.
  auto rejected = b->Set({KeyOf(6)}, {PageBuffer::Of(page)});
  ASSERT_EQ(rejected.wait_for(0s), std::future_status::ready);  // completed in the call
  const BatchResult r = rejected.get();
  EXPECT_TRUE(r.status.IsUnavailable());
  EXPECT_NE(r.status.message().find("write queue full"), std::string::npos);
  EXPECT_EQ(r.pages, std::vector<PageStatus>{PageStatus::kSkipped});
  EXPECT_TRUE(b->Remove({KeyOf(6)}).get().status.IsUnavailable());  // a write too
  // Reads have a queue of their own: a full write queue does not turn them away.
  auto exists = b->Exists({KeyOf(0)});
  auto get = b->Get({KeyOf(0)}, {PageBuffer::Of(page)});
  EXPECT_EQ(b->Stats().queued_batches, 4);
  auto rejected_get = b->Get({KeyOf(0)}, {PageBuffer::Of(page)});
  ASSERT_EQ(rejected_get.wait_for(0s), std::future_status::ready);
  const BatchResult rg = rejected_get.get();
  EXPECT_TRUE(rg.status.IsUnavailable());
  EXPECT_NE(rg.status.message().find("read queue full"), std::string::npos) << rg.status.ToString();
  EXPECT_EQ(b->Stats().rejected_calls, 3);
  b->OpenGate();
  EXPECT_TRUE(exists.get().status.ok());
  EXPECT_TRUE(get.get().status.ok());
  b->Close();
  EXPECT_EQ(completed.load(), 3);
}

TEST(StorageBackendTest, QueuedReadsRunBeforeQueuedWrites) {
  auto b = MakeGated(/*threads=*/1, /*queue=*/8, 5000ms);
  std::vector<std::byte> page(512);
  auto set = b->Set({KeyOf(0)}, {PageBuffer::Of(page)});  // taken by the only I/O thread
  b->WaitEntered(1);
  std::vector<std::future<BatchResult>> writes;
  for (int i = 1; i <= 3; ++i) writes.push_back(b->Set({KeyOf(i)}, {PageBuffer::Of(page)}));
  writes.push_back(b->Remove({KeyOf(1)}));
  auto get = b->Get({KeyOf(8)}, {PageBuffer::Of(page)});  // keys no write names
  auto exists = b->Exists({KeyOf(9)});
  b->OpenGate();
  EXPECT_TRUE(get.get().status.ok());
  EXPECT_TRUE(exists.get().status.ok());
  for (auto& f : writes) EXPECT_TRUE(f.get().status.ok());
  // The running Set, then both reads in arrival order, then the writes in theirs.
  EXPECT_EQ(b->order(), "SGESSSR");
}

// Reads go first except behind a write of one of their own keys submitted before them: then they
// wait for that write (read-your-writes), while reads of other keys still go first.
TEST(StorageBackendTest, AReadWaitsForEarlierWritesOfItsKeysOnly) {
  auto b = MakeGated(/*threads=*/1, /*queue=*/8, 5000ms);
  std::vector<std::byte> page(512);
  std::mutex mu;
  std::vector<std::string> done;
  auto record = [&](std::string name) {
    return [&, name](BatchResult r) {
      EXPECT_TRUE(r.status.ok()) << name;
      std::lock_guard<std::mutex> lock(mu);
      done.push_back(name);
    };
  };
  const PageKey a = KeyOf(0), bkey = KeyOf(2), c = KeyOf(4);
  b->SetAsync({a}, {PageBuffer::Of(page)}, record("set a"));  // running
  b->WaitEntered(1);
  b->SetAsync({bkey}, {PageBuffer::Of(page)}, record("set b"));                          // queued
  b->GetAsync({c, a}, {PageBuffer::Of(page), PageBuffer::Of(page)}, record("get c,a"));  // held
  b->GetAsync({bkey}, {PageBuffer::Of(page)}, record("get b"));                          // held
  b->GetAsync({c}, {PageBuffer::Of(page)}, record("get c"));  // no pending write: first
  EXPECT_EQ(b->Stats().queued_batches, 4);
  b->OpenGate();
  b->Close();
  EXPECT_EQ(done, (std::vector<std::string>{"set a", "get c", "get c,a", "set b", "get b"}));
}

TEST(StorageBackendTest, CompletesOnAnIoThreadWithTheDeadline) {
  auto b = MakeGated(2, 8, 750ms);
  b->OpenGate();
  std::vector<std::byte> page(512, std::byte{0});
  PageKey even = KeyOf(0), odd = KeyOf(0);
  even.bytes[0] = 2;
  even.bytes[1] = 0x5A;
  odd.bytes[0] = 3;
  const auto before = Clock::now();
  BatchResult r = b->Get({even, odd}, {PageBuffer::Of(page), PageBuffer::Of(page)}).get();
  EXPECT_TRUE(r.status.ok());
  EXPECT_EQ(r.pages, (std::vector<PageStatus>{PageStatus::kOk, PageStatus::kAbsent}));
  EXPECT_EQ(r.leading_ok(), 1);
  EXPECT_NE(b->last_thread(), std::this_thread::get_id());
  EXPECT_GE(b->last_deadline(), before + 750ms);
  EXPECT_LE(b->last_deadline(), Clock::now() + 750ms);
  auto e = b->Exists({even, even, odd, even}).get();
  EXPECT_TRUE(e.status.ok());
  EXPECT_EQ(e.leading, 2);
  const StorageStats s = b->Stats();
  EXPECT_EQ(s.get_calls, 1);
  EXPECT_EQ(s.exists_calls, 1);
  EXPECT_EQ(s.get_hit_pages, 1);
  EXPECT_EQ(s.get_absent_pages, 1);
  EXPECT_EQ(s.bytes_read, 512);
  EXPECT_EQ(s.stored_pages, -1);  // this backend reports no gauges
}

TEST(StorageBackendTest, CloseDrainsTheQueueThenRejects) {
  auto b = MakeGated(1, 16, 5000ms);
  std::vector<std::byte> page(512);
  std::vector<std::future<BatchResult>> futures;
  for (int i = 0; i < 5; ++i) futures.push_back(b->Set({KeyOf(i)}, {PageBuffer::Of(page)}));
  b->WaitEntered(1);
  std::thread closer([&] { b->Close(); });
  // Close waits for the queued calls; open the gate so they can run.
  std::this_thread::sleep_for(20ms);
  b->OpenGate();
  closer.join();
  for (auto& f : futures) {
    ASSERT_EQ(f.wait_for(0s), std::future_status::ready);
    EXPECT_TRUE(f.get().status.ok());
  }
  auto late = b->Remove({KeyOf(1)}).get();
  EXPECT_TRUE(late.status.IsUnavailable());
  EXPECT_NE(late.status.message().find("closed"), std::string::npos);
  b->Close();  // idempotent
}

TEST(StorageBackendTest, AThrowingCallbackDoesNotStopTheIoThread) {
  auto b = MakeGated(1, 4, 1000ms);
  b->OpenGate();
  std::vector<std::byte> page(512);
  b->SetAsync({KeyOf(1)}, {PageBuffer::Of(page)},
              [](BatchResult) { throw std::runtime_error("callback failure"); });
  EXPECT_TRUE(b->Set({KeyOf(2)}, {PageBuffer::Of(page)}).get().status.ok());
}

// Many threads Set, Exists, Get and Remove their own pages on the memory backend at once; every
// byte read back is checked.
TEST(StorageBackendTest, ConcurrentCallersGetTheirOwnBytes) {
  StorageOptions o;
  o.io_threads = 3;
  o.max_queued_batches = 1024;
  auto backend = OpenStorage("memory://?capacity=64MiB", SmallNamespace(), o);
  ASSERT_TRUE(backend.ok()) << backend.status().ToString();
  StorageBackend& b = **backend;
  constexpr int kThreads = 6, kRounds = 40, kPages = 4;
  std::atomic<int> errors{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 rng(static_cast<uint32_t>(t));
      for (int round = 0; round < kRounds; ++round) {
        std::vector<PageKey> keys;
        std::vector<std::vector<std::byte>> pages(kPages, std::vector<std::byte>(512));
        std::vector<PageBuffer> buffers;
        for (int p = 0; p < kPages; ++p) {
          keys.push_back(KeyOf(t * 100000 + round * 10 + p));
          for (auto& byte : pages[static_cast<size_t>(p)]) byte = static_cast<std::byte>(rng());
          buffers.push_back(PageBuffer::Of(pages[static_cast<size_t>(p)]));
        }
        if (b.Set(keys, buffers).get().leading_ok() != kPages) ++errors;
        if (b.Exists(keys).get().leading != kPages) ++errors;
        std::vector<std::vector<std::byte>> out(kPages, std::vector<std::byte>(512));
        std::vector<PageBuffer> out_buffers;
        for (auto& o2 : out) out_buffers.push_back(PageBuffer::Of(o2));
        if (b.Get(keys, out_buffers).get().leading_ok() != kPages) ++errors;
        if (out != pages) ++errors;
        if (round % 2 == 0 && b.Remove(keys).get().leading_ok() != kPages) ++errors;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(errors.load(), 0);
  const StorageStats s = b.Stats();
  EXPECT_EQ(s.set_ok_pages, kThreads * kRounds * kPages);
  EXPECT_EQ(s.get_hit_pages, kThreads * kRounds * kPages);
  EXPECT_EQ(s.stored_pages, kThreads * (kRounds / 2) * kPages);
}

// A backend whose hooks run their pages through ParallelFor; each page waits at a gate and
// records how many pages run at once.
class ParallelBackend final : public FakeBackend {
 public:
  ParallelBackend(const StorageNamespace& ns, const StorageOptions& options)
      : FakeBackend("parallel://", ns, options) {}
  ~ParallelBackend() override { Close(); }

  // Waits (bounded) until `n` pages are running at once; false if that never happened.
  bool WaitRunning(int n) {
    return WaitFor([&] { return running_ >= n; });
  }
  int max_running() { return Locked(max_running_); }
  std::set<std::thread::id> threads() { return Locked(threads_); }

 protected:
  void DoGet(std::span<const PageKey> keys, std::span<const PageBuffer>, std::span<PageStatus> out,
             Clock::time_point) override {
    // Reads are not gated: they must get through while writes hold their share.
    ParallelFor(static_cast<int64_t>(keys.size()), [&](int64_t i) {
      Note();
      out[static_cast<size_t>(i)] = PageStatus::kOk;
    });
  }
  void DoSet(std::span<const PageKey> keys, std::span<const PageBuffer>, std::span<PageStatus> out,
             Clock::time_point) override {
    ParallelFor(static_cast<int64_t>(keys.size()), [&](int64_t i) {
      std::unique_lock<std::mutex> lock(mu_);
      threads_.insert(std::this_thread::get_id());
      max_running_ = std::max(max_running_, ++running_);
      cv_.notify_all();
      cv_.wait(lock, [&] { return gate_open_; });
      --running_;
      out[static_cast<size_t>(i)] = PageStatus::kOk;
    });
  }

 private:
  void Note() {
    std::lock_guard<std::mutex> lock(mu_);
    threads_.insert(std::this_thread::get_id());
  }
  int running_ = 0, max_running_ = 0;
  std::set<std::thread::id> threads_;
};

// One set of threads: a hook's ParallelFor runs its pages on the backend's own idle I/O threads
// (no pool of its own), a write's pages on at most the writes' share of them (8 threads: 8, as
// many as reads have), and a Get still runs on the reads' own threads while those pages are held.
TEST(StorageBackendTest, ParallelForSharesPagesWithinTheWritersShare) {
  StorageOptions o;
  o.io_threads = 8;
  o.max_batch_pages = 64;
  o.timeout = 60s;
  ParallelBackend b(SmallNamespace(), o);
  ASSERT_TRUE(b.Open().ok());
  std::vector<std::byte> page(512);
  std::vector<PageKey> keys;
  std::vector<PageBuffer> buffers;
  for (int i = 0; i < 16; ++i) {
    keys.push_back(KeyOf(i));
    buffers.push_back(PageBuffer::Of(page));
  }
  auto set = b.Set(keys, buffers);
  ASSERT_TRUE(b.WaitRunning(8)) << "a write's pages did not spread over the I/O threads";
  std::vector<PageKey> other_keys;  // keys no write names (else read-your-writes holds the Get)
  for (int i = 100; i < 116; ++i) other_keys.push_back(KeyOf(i));
  auto get = b.Get(other_keys, buffers);
  const bool served = get.wait_for(30s) == std::future_status::ready;
  if (!served) b.OpenGate();  // let Close drain
  ASSERT_TRUE(served) << "the Get waited for held writes";
  EXPECT_EQ(get.get().leading_ok(), 16);
  EXPECT_EQ(b.max_running(), 8);
  b.OpenGate();
  EXPECT_EQ(set.get().leading_ok(), 16);
  EXPECT_EQ(b.max_running(), 8);
  // Only the backend's own threads ever ran a page: io_threads and the writers' 8 beyond them.
  EXPECT_LE(b.threads().size(), 8u + 8u);
}

// A slow store: each Set takes 5 ms and records how many run at once, separately while a read
// is running; each Get waits at the gate (OpenGate), which only reads wait at. With `meet_writers`
// the first Sets wait (30 s at most, a hang guard) until that many are writing at once, so a share
// of that many threads is seen whatever the box's speed.
class SlowWritesBackend final : public FakeBackend {
 public:
  SlowWritesBackend(const StorageNamespace& ns, const StorageOptions& options, int meet_writers = 0)
      : FakeBackend("slow://", ns, options), meet_writers_(meet_writers) {}
  ~SlowWritesBackend() override { Close(); }

  // Waits (bounded) until a Get is held at the gate / `n` Sets have completed.
  bool WaitReading() {
    return WaitFor([&] { return reading_ > 0; });
  }
  bool WaitSetsDone(int n) {
    return WaitFor([&] { return sets_done_ >= n; }, 60s);
  }
  int max_writers_while_reading() { return Locked(max_while_reading_); }
  int max_writers() { return Locked(max_writers_); }

 protected:
  void DoGet(std::span<const PageKey> keys, std::span<const PageBuffer>, std::span<PageStatus> out,
             Clock::time_point) override {
    std::unique_lock<std::mutex> lock(mu_);
    ++reading_;
    cv_.notify_all();
    cv_.wait(lock, [&] { return gate_open_; });
    --reading_;
    for (size_t i = 0; i < keys.size(); ++i) out[i] = PageStatus::kOk;
  }
  void DoSet(std::span<const PageKey> keys, std::span<const PageBuffer>, std::span<PageStatus> out,
             Clock::time_point) override {
    {
      std::unique_lock<std::mutex> lock(mu_);
      ++writing_;
      max_writers_ = std::max(max_writers_, writing_);
      if (reading_ > 0) max_while_reading_ = std::max(max_while_reading_, writing_);
      if (!met_) {
        cv_.notify_all();
        cv_.wait_for(lock, 30s, [&] { return met_ || writing_ >= meet_writers_; });
        met_ = true;  // one meeting: after it (or the guard) no Set waits
      }
    }
    std::this_thread::sleep_for(5ms);
    std::lock_guard<std::mutex> lock(mu_);
    --writing_;
    ++sets_done_;
    cv_.notify_all();
    for (size_t i = 0; i < keys.size(); ++i) out[i] = PageStatus::kOk;
  }

 private:
  const int meet_writers_;
  bool met_ = false;
  int reading_ = 0, writing_ = 0, sets_done_ = 0;
  int max_while_reading_ = 0, max_writers_ = 0;
};

// Backups never starve reads: while a read waits or runs, a backlog of writes on a slow store
// runs on at most a quarter of the I/O threads (8 threads: 2), not the writes' full share (8);
// once no read is left, writes get their full share back.
TEST(StorageBackendTest, WritesTakeAQuarterOfTheThreadsWhileReadsRun) {
  StorageOptions o;
  o.io_threads = 8;
  o.timeout = 60s;
  SlowWritesBackend b(SmallNamespace(), o);
  ASSERT_TRUE(b.Open().ok());
  std::vector<std::byte> page(512);
  auto get = b.Get({KeyOf(1000)}, {PageBuffer::Of(page)});
  ASSERT_TRUE(b.WaitReading());
  std::vector<std::future<BatchResult>> sets;
  for (int i = 0; i < 64; ++i) sets.push_back(b.Set({KeyOf(i)}, {PageBuffer::Of(page)}));
  const bool done = b.WaitSetsDone(32);  // the writes go on meanwhile, on their smaller share
  b.OpenGate();
  ASSERT_TRUE(done) << "writes stalled while a read ran";
  EXPECT_EQ(get.get().leading_ok(), 1);
  EXPECT_GE(b.max_writers_while_reading(), 1);
  EXPECT_LE(b.max_writers_while_reading(), 2);
  // No read left: the rest of the backlog (and more) spreads over the writers' full share.
  for (int i = 64; i < 256; ++i) sets.push_back(b.Set({KeyOf(i)}, {PageBuffer::Of(page)}));
  for (auto& f : sets) EXPECT_EQ(f.get().leading_ok(), 1);
  EXPECT_GT(b.max_writers(), 2);
  EXPECT_LE(b.max_writers(), 8);
}

// StorageOptions::writers_while_reading sets the writers' share while a read waits or runs: 5 of 8
// threads here, where the default is 2. The first Sets meet (5 writing at once, while the read is
// held), so the share is reached deterministically; it is never passed. Out of its bounds, the
// option is refused by name.
TEST(StorageBackendTest, WritersWhileReadingSetsTheWritersShareBesideReads) {
  StorageOptions o;
  o.io_threads = 8;
  o.writers_while_reading = 5;
  o.timeout = 60s;
  SlowWritesBackend b(SmallNamespace(), o, /*meet_writers=*/5);
  ASSERT_TRUE(b.Open().ok());
  std::vector<std::byte> page(512);
  auto get = b.Get({KeyOf(1000)}, {PageBuffer::Of(page)});
  ASSERT_TRUE(b.WaitReading());
  std::vector<std::future<BatchResult>> sets;
  for (int i = 0; i < 64; ++i) sets.push_back(b.Set({KeyOf(i)}, {PageBuffer::Of(page)}));
  const bool done = b.WaitSetsDone(32);
  b.OpenGate();
  ASSERT_TRUE(done) << "writes stalled while a read ran";
  EXPECT_EQ(get.get().leading_ok(), 1);
  for (auto& f : sets) EXPECT_EQ(f.get().leading_ok(), 1);
  EXPECT_EQ(b.max_writers_while_reading(), 5);

  for (int bad : {-1, 65}) {
    StorageOptions options;
    options.writers_while_reading = bad;
    const Status st = options.Validate();
    EXPECT_TRUE(st.IsInvalidArgument()) << bad;
    EXPECT_NE(st.message().find("writers_while_reading"), std::string::npos) << st.ToString();
  }
}

// A store whose hooks run pages through ParallelFor: a Set's page takes 2 ms, a Get's 5 ms; it
// records how many Get pages ran at once and how many Set pages ran at the end of each Get page.
// A Set starts its pages only once `owners` Sets have entered DoSet, so each of them is owned
// by its own I/O thread (no thread is left to help another's pages), as in a long backlog. A Get
// page starts its 5 ms only once `meet_readers` Get pages have run at once (or after 30 s, a hang
// guard): how many threads a Get gets does not depend on how fast the box wakes them.
class SlowPagesBackend final : public FakeBackend {
 public:
  SlowPagesBackend(const StorageNamespace& ns, const StorageOptions& options, int owners,
                   int meet_readers)
      : FakeBackend("slow-pages://", ns, options), owners_(owners), meet_readers_(meet_readers) {}
  ~SlowPagesBackend() override { Close(); }

  bool WaitWriting(int n) {
    return WaitFor([&] { return writing_ >= n; });
  }
  int max_reading() { return Locked(max_reading_); }
  int min_writing_after_read_page() { return Locked(min_writing_after_read_); }

 protected:
  void DoGet(std::span<const PageKey> keys, std::span<const PageBuffer>, std::span<PageStatus> out,
             Clock::time_point) override {
    ParallelFor(static_cast<int64_t>(keys.size()), [&](int64_t i) {
      {
        std::unique_lock<std::mutex> lock(mu_);
        max_reading_ = std::max(max_reading_, ++reading_);
        cv_.notify_all();
        // After one page gave up waiting, the others do not wait: one 30 s guard in all.
        if (!cv_.wait_for(lock, 30s, [&] { return gave_up_ || max_reading_ >= meet_readers_; })) {
          gave_up_ = true;
          cv_.notify_all();
        }
      }
      std::this_thread::sleep_for(5ms);
      std::lock_guard<std::mutex> lock(mu_);
      --reading_;
      min_writing_after_read_ = std::min(min_writing_after_read_, writing_);
      out[static_cast<size_t>(i)] = PageStatus::kOk;
    });
  }
  void DoSet(std::span<const PageKey> keys, std::span<const PageBuffer>, std::span<PageStatus> out,
             Clock::time_point) override {
    {
      std::unique_lock<std::mutex> lock(mu_);
      ++entered_;
      cv_.notify_all();
      cv_.wait_for(lock, 30s, [&] { return entered_ >= owners_; });
    }
    ParallelFor(static_cast<int64_t>(keys.size()), [&](int64_t i) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        ++writing_;
        cv_.notify_all();
      }
      std::this_thread::sleep_for(2ms);
      std::lock_guard<std::mutex> lock(mu_);
      --writing_;
      out[static_cast<size_t>(i)] = PageStatus::kOk;
    });
  }

 private:
  const int owners_;
  const int meet_readers_;
  bool gave_up_ = false;
  int entered_ = 0;
  int reading_ = 0, writing_ = 0, max_reading_ = 0;
  int min_writing_after_read_ = 1 << 30;
};

// Reads that arrive behind a backlog of long write batches keep all io_threads threads, and the
// writes drop to their read-time share: the writers run on threads of their own beyond
// io_threads, and each write call's owner steps aside before its next page (running read pages,
// or waiting) instead of keeping its thread for its whole batch. 8 I/O threads, eight 300-page
// Sets each owned by its own thread (the writers' full share): a 24-page Get then runs on at
// least 8 threads at once while the writes go on on 2. Before, the Get ran on the 2 threads the
// writers left free (a quarter of the store's threads: the GPU replay read at 6.7 GB/s against
// a 22.7 GB/s baseline of 8 pread threads) and all the writers kept going.
TEST(StorageBackendTest, ReadsKeepTheirThreadsAndWriteOwnersStepAside) {
  StorageOptions o;
  o.io_threads = 8;
  o.max_batch_pages = 512;
  o.timeout = 60s;
  SlowPagesBackend b(SmallNamespace(), o, /*owners=*/8, /*meet_readers=*/8);
  ASSERT_TRUE(b.Open().ok());
  std::vector<std::byte> page(512);
  std::vector<std::future<BatchResult>> sets;
  for (int s = 0; s < 8; ++s) {
    std::vector<PageKey> keys;
    std::vector<PageBuffer> buffers;
    for (int i = 0; i < 300; ++i) {
      keys.push_back(KeyOf(s * 1000 + i));
      buffers.push_back(PageBuffer::Of(page));
    }
    sets.push_back(b.Set(keys, buffers));
  }
  ASSERT_TRUE(b.WaitWriting(8));
  std::vector<PageKey> keys;
  std::vector<PageBuffer> buffers;
  for (int i = 0; i < 24; ++i) {
    keys.push_back(KeyOf(100000 + i));
    buffers.push_back(PageBuffer::Of(page));
  }
  EXPECT_EQ(b.Get(keys, buffers).get().leading_ok(), 24);
  EXPECT_GE(b.max_reading(), 8) << "the Get had fewer than io_threads threads";
  EXPECT_LE(b.min_writing_after_read_page(), 2) << "writers kept more than their read-time share";
  const StorageStats st = b.Stats();
  // Every page's 5 ms is counted, whichever thread ran it (the owner alone ran a few).
  EXPECT_GE(st.get_page_seconds, 24 * 0.005) << "the helpers' pages were not counted";
  for (auto& f : sets) EXPECT_EQ(f.get().leading_ok(), 300);
}

// A Get whose pages run on other threads too: the first of the first Get's pages that a helper
// thread starts waits at a gate (a straggler); its other page (the owner's, or a second helper's
// when idle threads claimed both pages before the owner claimed one) returns once the straggler
// has started. Every page of the second Get takes 10 ms. Records which thread owns each call and
// which ran each page.
class StragglerBackend final : public FakeBackend {
 public:
  StragglerBackend(const StorageNamespace& ns, const StorageOptions& options)
      : FakeBackend("straggler://", ns, options) {}
  ~StragglerBackend() override { Close(); }

  // Waits (bounded) until a helper holds one page of the first Get and the other has run.
  bool WaitStraggling() {
    return WaitFor([&] { return straggling_ && other_page_done_; });
  }
  // Pages of the second Get run by the first Get's owner thread.
  int second_pages_on_first_owner() { return Locked(second_on_first_owner_); }

 protected:
  void DoGet(std::span<const PageKey> keys, std::span<const PageBuffer>, std::span<PageStatus> out,
             Clock::time_point) override {
    const bool first = keys.front() == KeyOf(0);
    if (first) {
      std::lock_guard<std::mutex> lock(mu_);
      first_owner_ = std::this_thread::get_id();
    }
    ParallelFor(static_cast<int64_t>(keys.size()), [&, first](int64_t i) {
      std::unique_lock<std::mutex> lock(mu_);
      const bool on_first_owner = std::this_thread::get_id() == first_owner_;
      if (first && (on_first_owner || straggling_)) {
        cv_.wait_for(lock, 30s, [&] { return straggling_; });
        other_page_done_ = true;
        cv_.notify_all();
      } else if (first) {
        straggling_ = true;
        cv_.notify_all();
        cv_.wait_for(lock, 30s, [&] { return gate_open_; });
      } else {
        second_on_first_owner_ += on_first_owner;
        lock.unlock();
        std::this_thread::sleep_for(10ms);
      }
      out[static_cast<size_t>(i)] = PageStatus::kOk;
    });
  }

 private:
  std::thread::id first_owner_;
  bool straggling_ = false, other_page_done_ = false;
  int second_on_first_owner_ = 0;
};

// A read call whose pages are all claimed does not leave its thread idle while another thread
// finishes its last page: the owner runs pages of the other read calls meanwhile. Before, it
// waited, and a prefetch's batches ran on fewer threads than the baseline's io_threads (the bench
// read 512 KiB pages at 59 % of 16 pread threads on the GPU machine's host).
TEST(StorageBackendTest, AReadOwnerRunsOtherReadsPagesWhileItsLastPageRuns) {
  StorageOptions o;
  o.io_threads = 3;  // at most 3 threads read at once: the owner, the straggler, one more
  o.timeout = 60s;
  StragglerBackend b(SmallNamespace(), o);
  ASSERT_TRUE(b.Open().ok());
  std::vector<std::byte> page(512);
  auto first = b.Get({KeyOf(0), KeyOf(1)}, {PageBuffer::Of(page), PageBuffer::Of(page)});
  const bool straggling = b.WaitStraggling();
  if (!straggling) b.OpenGate();
  ASSERT_TRUE(straggling) << "the first Get's pages did not spread over two threads";
  std::vector<PageKey> keys;
  std::vector<PageBuffer> buffers;
  for (int i = 100; i < 108; ++i) {
    keys.push_back(KeyOf(i));
    buffers.push_back(PageBuffer::Of(page));
  }
  const BatchResult second = b.Get(keys, buffers).get();
  b.OpenGate();
  EXPECT_EQ(second.leading_ok(), 8);
  EXPECT_EQ(first.get().leading_ok(), 2);
  EXPECT_GE(b.second_pages_on_first_owner(), 1)
      << "the first Get's owner idled while its straggler ran";
}

// Reads run on at most io_threads threads at once, though the backend runs more (the writers'
// threads beyond them): a Get is measured against io_threads plain pread threads, and the
// writers' threads are for writes. 4 I/O threads (7 threads), two 12-page Gets of 5 ms pages,
// whose pages meet 4 at once.
TEST(StorageBackendTest, ReadsRunOnAtMostIoThreadsAtOnce) {
  StorageOptions o;
  o.io_threads = 4;
  o.timeout = 60s;
  SlowPagesBackend b(SmallNamespace(), o, /*owners=*/0, /*meet_readers=*/4);
  ASSERT_TRUE(b.Open().ok());
  std::vector<std::byte> page(512);
  std::vector<PageKey> keys;
  std::vector<PageBuffer> buffers;
  for (int i = 0; i < 24; ++i) {
    keys.push_back(KeyOf(i));
    buffers.push_back(PageBuffer::Of(page));
  }
  // Two calls at once: each owner and the idle threads share both calls' pages.
  auto first = b.Get(std::vector<PageKey>(keys.begin(), keys.begin() + 12),
                     std::vector<PageBuffer>(buffers.begin(), buffers.begin() + 12));
  auto second = b.Get(std::vector<PageKey>(keys.begin() + 12, keys.end()),
                      std::vector<PageBuffer>(buffers.begin() + 12, buffers.end()));
  EXPECT_EQ(first.get().leading_ok(), 12);
  EXPECT_EQ(second.get().leading_ok(), 12);
  EXPECT_LE(b.max_reading(), 4) << "reads ran on the writers' threads too";
  EXPECT_GE(b.max_reading(), 4) << "the Gets' pages did not spread over io_threads threads";
}

// Where a Get's time went, through the fault wrapper over memory:// with its writes held (a slow
// store): a Get naming the key of a write submitted before it is held behind that write and
// counts its wait as held (get_held_seconds, get_held_calls), not queued; a Get of another key
// that finds the only I/O thread busy with a write counts its wait as queued
// (get_queue_seconds), not held; each Get's own run is in get_seconds and get_page_seconds.
// Nothing here depends on how fast the box is: each state is reached through a signal (a write
// held in the wrapper, a read held in the wrapper once it runs), the counts are exact, and each
// time is checked against a bound the test makes itself: at least the test's own sleep while the
// call was held or queued, or at most the interval the test saw around it (release ... run).
TEST(StorageBackendTest, HeldAndQueuedReadsCountWhereTheirTimeWent) {
  constexpr auto kHeld = 100ms;  // the test holds each call at least this long
  constexpr double kHeldS = std::chrono::duration<double>(kHeld).count();
  StorageOptions o;
  o.io_threads = 1;
  o.timeout = 60s;  // a hang guard: no call waits for it
  auto inner = OpenStorage("memory://?capacity=1MiB", SmallNamespace());
  ASSERT_TRUE(inner.ok()) << inner.status().ToString();
  auto wrapped = FaultInjectingStorage::Wrap(std::move(*inner), /*seed=*/1, o);
  ASSERT_TRUE(wrapped.ok()) << wrapped.status().ToString();
  FaultInjectingStorage& b = **wrapped;
  std::vector<std::byte> page(512, std::byte{7}), out(512);
  const PageKey a = KeyOf(0), other = KeyOf(2);
  ASSERT_EQ(b.Set({other}, {PageBuffer::Of(page)}).get().leading_ok(), 1);

  // Held: the Set of `a` runs (held by the wrapper) on the only thread; a Get of `a`, submitted
  // after it, is held by the queue from its submission until that Set completes.
  b.HoldWrites(true);
  auto set = b.Set({a}, {PageBuffer::Of(page)});
  while (b.held_writes() < 1) std::this_thread::sleep_for(1ms);
  b.HoldReads({a});  // once it runs, the Get waits in the wrapper: the test sees it start
  auto held_get = b.Get({a}, {PageBuffer::Of(out)});
  std::this_thread::sleep_for(kHeld);
  const auto released = Clock::now();
  b.HoldWrites(false);
  EXPECT_EQ(set.get().leading_ok(), 1);
  while (b.held_reads() < 1) std::this_thread::sleep_for(1ms);
  const double release_to_run = std::chrono::duration<double>(Clock::now() - released).count();
  b.HoldReads({});
  EXPECT_EQ(held_get.get().leading_ok(), 1);
  StorageStats s = b.Stats();
  EXPECT_EQ(s.get_calls, 1);
  EXPECT_EQ(s.get_held_calls, 1);
  EXPECT_GE(s.get_held_seconds, kHeldS) << "held from its submission to the Set's completion";
  // Its queue time lies between the Set's completion (after `released`) and the start of its run
  // (before the test saw it held in the wrapper); counted from its submission it would include
  // the test's sleep before `released`.
  EXPECT_LE(s.get_queue_seconds, release_to_run + 1e-6) << "a held read's wait counted as queued";
  const double queue_before = s.get_queue_seconds;

  // Queued: a Get of `other` (no write names it) waits for the thread the held Set occupies.
  b.HoldWrites(true);
  auto set2 = b.Set({KeyOf(4)}, {PageBuffer::Of(page)});
  while (b.held_writes() < 1) std::this_thread::sleep_for(1ms);
  auto queued_get = b.Get({other}, {PageBuffer::Of(out)});
  std::this_thread::sleep_for(kHeld);
  b.HoldWrites(false);
  EXPECT_EQ(set2.get().leading_ok(), 1);
  EXPECT_EQ(queued_get.get().leading_ok(), 1);
  s = b.Stats();
  EXPECT_EQ(s.get_calls, 2);
  EXPECT_EQ(s.get_held_calls, 1) << "a read of a key no write names counted as held";
  EXPECT_GE(s.get_queue_seconds - queue_before, kHeldS);
  EXPECT_GT(s.get_seconds, 0);
  EXPECT_GT(s.get_page_seconds, 0);
  EXPECT_GE(s.set_page_seconds, 2 * kHeldS) << "the held Sets' time is theirs";
  EXPECT_EQ(s.bytes_read, 2 * 512);
}

// io_threads = 0 (the default) means min(cores, 16), at least 4; a backend's options() show the
// number it runs.
TEST(StorageBackendTest, DefaultIoThreadsComeFromTheMachine) {
  const int cores = static_cast<int>(std::thread::hardware_concurrency());
  EXPECT_EQ(DefaultIoThreads(), std::min(16, std::max(4, cores)));
  EXPECT_EQ(StorageOptions{}.io_threads, 0);
  EXPECT_TRUE(StorageOptions{}.Validate().ok());
  auto b = OpenStorage("memory://?capacity=1MiB", SmallNamespace());
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_EQ((*b)->options().io_threads, DefaultIoThreads());
  StorageOptions three;
  three.io_threads = 3;
  auto c = OpenStorage("memory://?capacity=1MiB", SmallNamespace(), three);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ((*c)->options().io_threads, 3);
}

}  // namespace
}  // namespace kvtier
