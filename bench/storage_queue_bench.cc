// The storage queue's thread use (StorageBackend: its I/O threads, ParallelFor, the writers'
// share), apart from any store: a backend whose every page sleeps a fixed time, so the pages take
// no CPU and a 2-core box measures the queue as a 16-core one would. A pass of 2,048 pages in
// batches of 64, eight batches in flight (as `kvtier bench --storage` runs the file store), Set or
// Get, with io_threads I/O threads: the ideal is pages x page time / io_threads (every thread on
// a page all the time). Counter `of_ideal`: the ideal over the pass's time (1 = no thread idle;
// a sleep overshoots by ~50-80 us on a VM, 2-3 % of a 2.5 ms page). Counter `busy`: the threads
// on pages on average over io_threads, the pages' time measured around each sleep (the queue's
// own share, whatever the sleeps' accuracy). Answers "is a Set alone below the write ceiling
// short of threads?": if `busy` stays near 1, the queue keeps every writer on a page and the
// shortfall is in the pages themselves.
//
//   kvtier_bench_storage_queue [--benchmark_filter=...]
#include <benchmark/benchmark.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <thread>
#include <vector>

#include "kvtier/page_key.h"
#include "kvtier/storage_backend.h"

namespace kvtier {
namespace {

using Clock = std::chrono::steady_clock;
constexpr int64_t kPages = 2048;
constexpr int64_t kBatchPages = 64;
constexpr int kInFlight = 8;

// Every page of every call sleeps `page_time` on an I/O thread (through ParallelFor, as the file
// store's pages run); Exists finds nothing, Remove does nothing.
class SleepingPagesStore final : public StorageBackend {
 public:
  SleepingPagesStore(StorageNamespace ns, StorageOptions options,
                     std::chrono::microseconds page_time)
      : StorageBackend("sleep://", std::move(ns), options), page_time_(page_time) {}
  ~SleepingPagesStore() override { Close(); }
  Status Open() { return Start(); }
  // The pages' time as measured around each sleep, all threads summed (a sleep overshoots).
  double page_seconds() const { return static_cast<double>(page_ns_.load()) / 1e9; }

 protected:
  ExistsResult DoExists(std::span<const PageKey>, Clock::time_point) override { return {}; }
  void DoGet(std::span<const PageKey>, std::span<const PageBuffer>, std::span<PageStatus> out,
             Clock::time_point) override {
    Pages(out);
  }
  void DoSet(std::span<const PageKey>, std::span<const PageBuffer>, std::span<PageStatus> out,
             Clock::time_point) override {
    Pages(out);
  }
  void DoRemove(std::span<const PageKey>, std::span<PageStatus>, Clock::time_point) override {}

 private:
  void Pages(std::span<PageStatus> out) {
    ParallelFor(static_cast<int64_t>(out.size()), [&](int64_t i) {
      const auto start = Clock::now();
      std::this_thread::sleep_for(page_time_);
      page_ns_ +=
          std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - start).count();
      out[static_cast<size_t>(i)] = PageStatus::kOk;
    });
  }
  const std::chrono::microseconds page_time_;
  std::atomic<int64_t> page_ns_{0};
};

void Die(const Status& st, const char* what) {
  if (st.ok()) return;
  std::fprintf(stderr, "%s: %s\n", what, st.ToString().c_str());
  std::abort();
}

// args: io_threads, page time (us), 1 = Set / 0 = Get.
void BM_QueuePass(benchmark::State& state) {
  const int io_threads = static_cast<int>(state.range(0));
  const auto page_time = std::chrono::microseconds(state.range(1));
  const bool set = state.range(2) != 0;
  StorageNamespace ns;
  ns.model_id = "queue-bench";
  ns.num_layers = 1;
  ns.slot_bytes = 32;
  ns.page_size = 1;
  StorageOptions options;
  options.io_threads = io_threads;
  options.max_queued_batches = kInFlight;
  SleepingPagesStore store(ns, options, page_time);
  Die(store.Open(), "start");
  const int64_t page_bytes = ns.page_bytes();
  std::vector<std::byte> bytes(static_cast<size_t>(kPages * page_bytes));
  std::vector<PageKey> keys(kPages);
  for (int64_t i = 0; i < kPages; ++i) {
    keys[static_cast<size_t>(i)].bytes[0] = static_cast<uint8_t>(i);
    keys[static_cast<size_t>(i)].bytes[1] = static_cast<uint8_t>(i >> 8);
  }
  double seconds = 0;
  for (auto _ : state) {
    std::mutex mu;
    std::condition_variable cv;
    int in_flight = 0;
    bool failed = false;
    const auto start = Clock::now();
    for (int64_t first = 0; first < kPages; first += kBatchPages) {
      {
        std::unique_lock<std::mutex> lock(mu);
        cv.wait(lock, [&] { return in_flight < kInFlight; });
        ++in_flight;
      }
      std::vector<PageKey> batch(keys.begin() + first, keys.begin() + first + kBatchPages);
      std::vector<PageBuffer> buffers;
      for (int64_t i = first; i < first + kBatchPages; ++i) {
        buffers.push_back(PageBuffer::Of(
            std::span<std::byte>(bytes.data() + i * page_bytes, static_cast<size_t>(page_bytes))));
      }
      auto done = [&](BatchResult r) {
        std::lock_guard<std::mutex> lock(mu);
        failed = failed || !r.status.ok();
        --in_flight;
        cv.notify_all();
      };
      if (set) {
        store.SetAsync(std::move(batch), std::move(buffers), done);
      } else {
        store.GetAsync(std::move(batch), std::move(buffers), done);
      }
    }
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return in_flight == 0; });
    if (failed) state.SkipWithError("a call failed");
    seconds += std::chrono::duration<double>(Clock::now() - start).count();
  }
  const double ideal = static_cast<double>(kPages) *
                       std::chrono::duration<double>(page_time).count() / io_threads *
                       static_cast<double>(state.iterations());
  state.counters["of_ideal"] = seconds > 0 ? ideal / seconds : 0;
  // The threads on pages on average, of io_threads: the queue's part alone (the sleeps' overshoot
  // counts as page time).
  state.counters["busy"] = seconds > 0 ? store.page_seconds() / seconds / io_threads : 0;
}
BENCHMARK(BM_QueuePass)
    ->ArgNames({"io_threads", "page_us", "set"})
    ->ArgsProduct({{4, 16}, {500, 2500}, {0, 1}})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

}  // namespace
}  // namespace kvtier

BENCHMARK_MAIN();
