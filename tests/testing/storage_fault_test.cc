// FaultInjectingStorage over the real memory backend: each fault has the outcome its contract
// names (and no wrong bytes reported as a hit), faults are reproducible from the seed, settings
// can change from another thread while calls run, and clearing them restores normal service.
#include "kvtier/testing/storage_fault.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <future>
#include <random>
#include <thread>

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
  return ns;  // page_bytes = 512
}

std::vector<PageKey> Keys(int n, int first = 0) {
  std::vector<int32_t> tokens(static_cast<size_t>(n + first) * 4);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>(i * 3 + 1);
  auto all = *ComputePromptPageKeys(tokens, 4);
  return std::vector<PageKey>(all.begin() + first, all.end());
}

struct Pages {
  std::vector<std::vector<std::byte>> bytes;
  std::vector<PageBuffer> buffers;
  Pages(int n, uint32_t seed, bool poison = false) : bytes(static_cast<size_t>(n)) {
    std::mt19937 rng(seed);
    for (auto& page : bytes) {
      page.resize(512);
      for (auto& b : page) b = poison ? std::byte{0xCD} : static_cast<std::byte>(rng());
      buffers.push_back(PageBuffer::Of(page));
    }
  }
};

// A wrapped memory store. The default timeout (60 s) is a hang guard for calls that must
// succeed, which a loaded machine never reaches; a test that provokes time-outs passes its own.
std::unique_ptr<FaultInjectingStorage> Wrapped(uint64_t seed, int io_threads = 1,
                                               std::chrono::milliseconds timeout = 60s) {
  auto inner = OpenStorage("memory://?capacity=16MiB", SmallNamespace());
  EXPECT_TRUE(inner.ok());
  StorageOptions o;
  o.io_threads = io_threads;
  o.timeout = timeout;
  auto w = FaultInjectingStorage::Wrap(std::move(*inner), seed, o);
  EXPECT_TRUE(w.ok()) << w.status().ToString();
  return std::move(*w);
}

TEST(StorageFaultTest, NoFaultsPassesThrough) {
  auto w = Wrapped(1);
  EXPECT_EQ(w->url(), "faulty+memory://");
  const auto keys = Keys(8);
  Pages in(8, 1), out(8, 0, true);
  ASSERT_EQ(w->Set(keys, in.buffers).get().leading_ok(), 8);
  EXPECT_EQ(w->Exists(keys).get().leading, 8);
  ASSERT_EQ(w->Get(keys, out.buffers).get().leading_ok(), 8);
  EXPECT_EQ(out.bytes, in.bytes);
  EXPECT_EQ(w->Remove({keys[7]}).get().leading_ok(), 1);
  EXPECT_EQ(w->Stats().stored_pages, 7);  // the wrapped store's gauge
  const InjectedFaults f = w->injected();
  EXPECT_EQ(f.failed_pages + f.corrupted_pages + f.dropped_pages + f.down_calls, 0);
}

TEST(StorageFaultTest, ErrorOnEveryCall) {
  auto w = Wrapped(2);
  const auto keys = Keys(4);
  Pages in(4, 2), out(4, 0, true);
  ASSERT_TRUE(w->SetErrorFraction(1.0).ok());
  EXPECT_EQ(w->Set(keys, in.buffers).get().count(PageStatus::kFailed), 4);
  EXPECT_EQ(w->inner().Exists(keys).get().leading, 0);  // nothing reached the store
  ASSERT_TRUE(w->SetErrorFraction(0).ok());
  ASSERT_EQ(w->Set(keys, in.buffers).get().leading_ok(), 4);
  ASSERT_TRUE(w->SetErrorFraction(1.0).ok());
  EXPECT_EQ(w->Get(keys, out.buffers).get().count(PageStatus::kFailed), 4);
  const ExistsResult e = w->Exists(keys).get();
  EXPECT_TRUE(e.status.IsUnavailable());
  EXPECT_EQ(e.leading, 0);
  EXPECT_EQ(w->Remove(keys).get().count(PageStatus::kFailed), 4);
  EXPECT_EQ(w->inner().Exists(keys).get().leading, 4);
  const StorageStats s = w->Stats();
  EXPECT_EQ(s.get_failed_pages, 4);
  EXPECT_EQ(s.set_failed_pages, 4);
  EXPECT_EQ(w->injected().failed_exists, 1);
}

TEST(StorageFaultTest, FractionsAreReproducibleFromTheSeed) {
  const auto keys = Keys(200);
  Pages in(200, 3);
  auto run = [&](uint64_t seed) {
    auto w = Wrapped(seed);
    EXPECT_TRUE(w->SetErrorFraction(0.5).ok());
    return w->Set(keys, in.buffers).get().pages;
  };
  const auto a = run(7), b = run(7), c = run(8);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  const auto failed = std::count(a.begin(), a.end(), PageStatus::kFailed);
  EXPECT_GT(failed, 60);  // 200 draws at 0.5: far outside 60..140 is a broken generator
  EXPECT_LT(failed, 140);
  EXPECT_EQ(std::count(a.begin(), a.end(), PageStatus::kOk), 200 - failed);
}

TEST(StorageFaultTest, CorruptedReadsAreMissesWithOneFlippedByte) {
  auto w = Wrapped(4);
  const auto keys = Keys(6);
  Pages in(6, 4), out(6, 0, true);
  ASSERT_EQ(w->Set(keys, in.buffers).get().leading_ok(), 6);
  ASSERT_TRUE(w->SetCorruptFraction(1.0).ok());
  const BatchResult r = w->Get(keys, out.buffers).get();
  EXPECT_EQ(r.count(PageStatus::kCorrupt), 6);
  for (size_t i = 0; i < 6; ++i) {
    int differing = 0;
    for (size_t j = 0; j < 512; ++j) differing += out.bytes[i][j] != in.bytes[i][j];
    EXPECT_EQ(differing, 1) << i;
  }
  EXPECT_EQ(w->Stats().get_corrupt_pages, 6);
  EXPECT_EQ(w->injected().corrupted_pages, 6);
  // Two segments: the flipped byte lands in one of them.
  std::vector<std::byte> k(256), v(256);
  EXPECT_EQ(w->Get({keys[0]}, {PageBuffer::Of(k, v)}).get().pages[0], PageStatus::kCorrupt);
  w->ClearFaults();
  ASSERT_EQ(w->Get(keys, out.buffers).get().leading_ok(), 6);
  EXPECT_EQ(out.bytes, in.bytes);
}

TEST(StorageFaultTest, DroppedWritesReportOkButMiss) {
  auto w = Wrapped(5);
  const auto keys = Keys(3);
  Pages in(3, 5), out(3, 0, true);
  ASSERT_TRUE(w->SetDropFraction(1.0).ok());
  EXPECT_EQ(w->Set(keys, in.buffers).get().leading_ok(), 3);
  EXPECT_EQ(w->Exists(keys).get().leading, 0);
  EXPECT_EQ(w->Get(keys, out.buffers).get().count(PageStatus::kAbsent), 3);
  EXPECT_EQ(w->injected().dropped_pages, 3);
}

TEST(StorageFaultTest, DownFailsEverythingUntilUp) {
  auto w = Wrapped(6);
  const auto keys = Keys(2);
  Pages in(2, 6), out(2, 0, true);
  ASSERT_EQ(w->Set(keys, in.buffers).get().leading_ok(), 2);
  w->SetDown(true);
  EXPECT_TRUE(w->faults().down);
  const auto t0 = Clock::now();
  EXPECT_EQ(w->Get(keys, out.buffers).get().count(PageStatus::kFailed), 2);
  EXPECT_EQ(w->Set(keys, in.buffers).get().count(PageStatus::kFailed), 2);
  EXPECT_EQ(w->Remove(keys).get().count(PageStatus::kFailed), 2);
  const ExistsResult e = w->Exists(keys).get();
  EXPECT_TRUE(e.status.IsUnavailable());
  EXPECT_NE(e.status.message().find("down"), std::string::npos);
  // At once: failed (not timed out) and counted as down calls; the bound is only a hang guard.
  EXPECT_LT(Clock::now() - t0, 30s);
  EXPECT_EQ(w->injected().down_calls, 4);
  w->SetDown(false);
  ASSERT_EQ(w->Get(keys, out.buffers).get().leading_ok(), 2);
  EXPECT_EQ(out.bytes, in.bytes);
}

TEST(StorageFaultTest, DelaysAndTimeouts) {
  const auto keys = Keys(2);
  Pages in(2, 7), out(2, 0, true);
  {
    // A delay within the deadline (60 s, a hang guard: with 300 ms a loaded box that kept the
    // I/O thread off its core for 250 ms timed the delayed call out).
    auto delayed = Wrapped(7);
    ASSERT_TRUE(delayed->SetDelay(50ms).ok());
    const auto t0 = Clock::now();
    ASSERT_EQ(delayed->Set(keys, in.buffers).get().leading_ok(), 2);
    EXPECT_GE(Clock::now() - t0, 50ms);
    EXPECT_EQ(delayed->injected().delayed_calls, 1);
    EXPECT_EQ(delayed->injected().timed_out_calls, 0);
  }
  auto w = Wrapped(7, 1, /*timeout=*/300ms);
  // A delay far beyond the hang guard: a call that ends within the guard was ended by its
  // deadline (300 ms), not the delay, however slow the machine.
  ASSERT_TRUE(w->SetDelay(600s).ok());
  const auto t0 = Clock::now();
  const BatchResult r = w->Get(keys, out.buffers).get();
  const auto took = Clock::now() - t0;
  EXPECT_EQ(r.count(PageStatus::kTimedOut), 2);
  EXPECT_GE(took, 290ms);
  EXPECT_LT(took, 30s);  // the deadline, not the delay (a hang guard: 100 timeouts)
  EXPECT_TRUE(w->Exists(keys).get().status.IsUnavailable());
  EXPECT_EQ(w->Stats().get_timed_out_pages, 2);
  EXPECT_EQ(w->injected().timed_out_calls, 2);
}

TEST(StorageFaultTest, BadSettingsAreInvalidArgument) {
  auto w = Wrapped(8);
  EXPECT_TRUE(w->SetErrorFraction(1.5).IsInvalidArgument());
  EXPECT_TRUE(w->SetCorruptFraction(-0.1).IsInvalidArgument());
  EXPECT_TRUE(w->SetDropFraction(std::nan("")).IsInvalidArgument());
  const Status s = w->SetDelay(-1ms);
  EXPECT_TRUE(s.IsInvalidArgument());
  EXPECT_NE(s.message().find("delay"), std::string::npos);
  EXPECT_EQ(w->faults().error_fraction, 0);
  EXPECT_TRUE(FaultInjectingStorage::Wrap(nullptr, 1).status().IsInvalidArgument());
}

// Settings flip from another thread while several callers run; every hit has the right bytes.
TEST(StorageFaultTest, ConcurrentSettingChangesKeepHitsCorrect) {
  auto w = Wrapped(9, /*io_threads=*/3);
  const auto keys = Keys(16);
  Pages in(16, 9);
  ASSERT_EQ(w->Set(keys, in.buffers).get().leading_ok(), 16);
  std::atomic<bool> stop{false};
  std::thread flipper([&] {
    std::mt19937 rng(1);
    while (!stop.load()) {
      EXPECT_TRUE(w->SetErrorFraction((rng() % 3) * 0.25).ok());
      EXPECT_TRUE(w->SetCorruptFraction((rng() % 3) * 0.25).ok());
      w->SetDown(rng() % 5 == 0);
      std::this_thread::sleep_for(1ms);
    }
  });
  std::atomic<int> wrong{0}, hits{0};
  std::vector<std::thread> callers;
  // 30 rounds each, and on until some page was a hit (60 s at most, a hang guard): a flipper
  // that a loaded box kept off its core with the store down for all 90 rounds left no hit to
  // check.
  const auto give_up = Clock::now() + 60s;
  for (int t = 0; t < 3; ++t) {
    callers.emplace_back([&] {
      for (int round = 0; round < 30 || (hits.load() == 0 && Clock::now() < give_up); ++round) {
        Pages out(16, 0, true);
        const BatchResult r = w->Get(keys, out.buffers).get();
        for (size_t i = 0; i < 16; ++i) {
          if (r.pages[i] != PageStatus::kOk) continue;
          ++hits;
          if (out.bytes[i] != in.bytes[i]) ++wrong;
        }
      }
    });
  }
  for (auto& c : callers) c.join();
  stop.store(true);
  flipper.join();
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_GT(hits.load(), 0) << "no hit within the hang guard";
}

// A slow store's backups never delay a read: writes run on at most their share of threads of
// their own (4 I/O threads: 4 writers beside the 4 that reads keep), so with every write held a
// Get still finds a thread and completes;
// writes that cannot keep up fill their queue and the next is rejected at once ("write queue
// full", what the cache counts as queue_full) instead of waiting. No timing: the writes stay held
// until the Get has completed.
TEST(StorageFaultTest, HeldWritesNeverDelayAReadAndOverflowIsRejected) {
  auto inner = OpenStorage("memory://?capacity=16MiB", SmallNamespace());
  ASSERT_TRUE(inner.ok());
  StorageOptions o;
  o.io_threads = 4;
  o.max_queued_batches = 2;
  o.timeout = 60s;  // a bound for a broken build, never reached by a passing one
  auto w = FaultInjectingStorage::Wrap(std::move(*inner), 1, o);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  FaultInjectingStorage& b = **w;
  const auto keys = Keys(9);
  Pages pages(9, 3);
  ASSERT_EQ(b.Set({keys[0]}, {pages.buffers[0]}).get().leading_ok(), 1);

  b.HoldWrites(true);
  std::vector<std::future<BatchResult>> sets;
  // Four writers, the writes' share (io_threads), are held; then two more wait in the queue.
  // One Set at a time, each until an I/O thread holds it: submitted together, the third could
  // find the first two still queued and be rejected by the queue bound of two.
  const auto give_up = Clock::now() + 30s;
  for (size_t i = 1; i <= 4; ++i) {
    sets.push_back(b.Set({keys[i]}, {pages.buffers[i]}));
    while (b.held_writes() < static_cast<int>(i) && Clock::now() < give_up) {
      std::this_thread::sleep_for(1ms);
    }
    ASSERT_EQ(b.held_writes(), static_cast<int>(i));
  }
  for (size_t i = 5; i <= 6; ++i) sets.push_back(b.Set({keys[i]}, {pages.buffers[i]}));
  EXPECT_EQ(b.Stats().queued_batches, 2);
  auto overflow = b.Set({keys[7]}, {pages.buffers[7]});
  ASSERT_EQ(overflow.wait_for(0s), std::future_status::ready);  // rejected in the call
  const BatchResult rejected = overflow.get();
  EXPECT_TRUE(rejected.status.IsUnavailable());
  EXPECT_NE(rejected.status.message().find("write queue full"), std::string::npos)
      << rejected.status.ToString();

  // The reads' own threads serve them while every write is held.
  Pages out(1, 0, /*poison=*/true);
  auto get = b.Get({keys[0]}, out.buffers);
  ASSERT_EQ(get.wait_for(30s), std::future_status::ready) << "the Get waited for held writes";
  EXPECT_EQ(get.get().leading_ok(), 1);
  EXPECT_EQ(out.bytes[0], pages.bytes[0]);
  EXPECT_EQ(b.Exists({keys[0]}).get().leading, 1);
  EXPECT_EQ(b.held_writes(), 4);
  for (auto& f : sets) EXPECT_NE(f.wait_for(0s), std::future_status::ready);

  b.HoldWrites(false);
  for (auto& f : sets) EXPECT_EQ(f.get().leading_ok(), 1);
  EXPECT_EQ(b.Stats().rejected_calls, 1);
  Pages back(6, 0, /*poison=*/true);
  ASSERT_EQ(b.Get({keys.begin() + 1, keys.begin() + 7}, back.buffers).get().leading_ok(), 6);
  for (size_t i = 0; i < 6; ++i) EXPECT_EQ(back.bytes[i], pages.bytes[i + 1]);
}

// Held reads: a Get naming a held key waits (its I/O thread held) while the others complete, so
// batches complete out of order; released, it reads the right bytes; held past its deadline, its
// pages time out without reaching the wrapped backend.
TEST(StorageFaultTest, HeldReadsCompleteAfterLaterOnesAndTimeOutPastTheirDeadline) {
  auto w = Wrapped(1, /*io_threads=*/3, /*timeout=*/30s);
  const auto keys = Keys(3);
  Pages pages(3, 5);
  ASSERT_EQ(w->Set(keys, pages.buffers).get().leading_ok(), 3);
  w->HoldReads({keys[0]});
  Pages first(1, 0, /*poison=*/true), second(2, 0, /*poison=*/true);
  auto held = w->Get({keys[0]}, first.buffers);
  const auto give_up = Clock::now() + 30s;
  while (w->held_reads() < 1 && Clock::now() < give_up) std::this_thread::sleep_for(1ms);
  ASSERT_EQ(w->held_reads(), 1);
  auto later = w->Get({keys[1], keys[2]}, second.buffers);
  ASSERT_EQ(later.wait_for(30s), std::future_status::ready) << "a Get waited for a held one";
  EXPECT_EQ(later.get().leading_ok(), 2);
  EXPECT_EQ(second.bytes[0], pages.bytes[1]);
  EXPECT_EQ(second.bytes[1], pages.bytes[2]);
  EXPECT_NE(held.wait_for(0s), std::future_status::ready);
  EXPECT_EQ(first.bytes[0], Pages(1, 0, /*poison=*/true).bytes[0]);
  w->HoldReads({});
  EXPECT_EQ(held.get().leading_ok(), 1);
  EXPECT_EQ(first.bytes[0], pages.bytes[0]);
  EXPECT_EQ(w->held_reads(), 0);

  auto quick = Wrapped(1, /*io_threads=*/1, /*timeout=*/50ms);
  ASSERT_EQ(quick->Set({keys[0]}, {pages.buffers[0]}).get().leading_ok(), 1);
  quick->HoldReads({keys[0]});
  Pages out(1, 0, /*poison=*/true);
  const BatchResult r = quick->Get({keys[0]}, out.buffers).get();
  ASSERT_EQ(r.pages.size(), 1u);
  EXPECT_EQ(r.pages[0], PageStatus::kTimedOut);
  EXPECT_EQ(out.bytes[0], Pages(1, 0, /*poison=*/true).bytes[0]);
  EXPECT_EQ(quick->injected().timed_out_calls, 1);
  quick->ClearFaults();
  EXPECT_EQ(quick->Get({keys[0]}, out.buffers).get().leading_ok(), 1);
  EXPECT_EQ(out.bytes[0], pages.bytes[0]);
}

}  // namespace
}  // namespace kvtier
