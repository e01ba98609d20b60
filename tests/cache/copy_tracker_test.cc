// CopyTracker: registration, completion from other threads, storage batches, waiting, and
// reaping (completed operations stay visible to ForEachOp until their turn).
#include "cache/copy_tracker.h"

#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <thread>
#include <vector>

namespace kvtier {
namespace {

using Clock = std::chrono::steady_clock;

std::shared_ptr<CopyOp> StorageOp(int64_t pages, int64_t batch_pages) {
  auto op = std::make_shared<CopyOp>();
  op->kind = CopyOp::Kind::kPrefetch;
  op->keys.resize(static_cast<size_t>(pages));
  op->batch_pages = batch_pages;
  op->page_status.assign(static_cast<size_t>(pages), PageStatus::kSkipped);
  op->batch_done.assign(static_cast<size_t>(op->num_batches()), 0);
  op->batches_left = op->num_batches();
  return op;
}

TEST(CopyTrackerTest, TakeDoneReturnsOnlyCompletedOpsAndKeepsTheOrderOfTheRest) {
  CopyTracker t;
  std::vector<std::shared_ptr<CopyOp>> ops;
  for (int i = 0; i < 4; ++i) {
    ops.push_back(std::make_shared<CopyOp>());
    t.Add(ops.back());
  }
  t.Complete(*ops[1], Status::OK());
  t.Complete(*ops[3], Status::IOError("disk"));
  std::vector<std::shared_ptr<CopyOp>> done = t.TakeDone();
  ASSERT_EQ(done.size(), 2u);
  EXPECT_EQ(done[0], ops[1]);
  EXPECT_EQ(done[1], ops[3]);
  EXPECT_EQ(done[1]->status.code(), StatusCode::kIOError);
  ASSERT_EQ(t.ops().size(), 2u);
  EXPECT_EQ(t.ops()[0], ops[0]);
  EXPECT_EQ(t.ops()[1], ops[2]);
  EXPECT_TRUE(t.TakeDone().empty());
}

TEST(CopyTrackerTest, TheFirstFailureIsKept) {
  CopyTracker t;
  auto op = std::make_shared<CopyOp>();
  t.Add(op);
  t.MarkSubmitted(*op, Status::IOError("first"));
  EXPECT_FALSE(t.IsDone(*op));  // a cpu op completes only through Complete
  t.Complete(*op, Status::Internal("second"));
  EXPECT_TRUE(t.IsDone(*op));
  EXPECT_EQ(op->status.code(), StatusCode::kIOError);
}

TEST(CopyTrackerTest, BatchesCompleteInAnyOrderAndArrivedCountsTheLeadingOkPages) {
  CopyTracker t;
  auto op = StorageOp(6, 2);  // batches [0,2) [2,4) [4,6)
  t.Add(op);
  t.CompleteBatch(*op, 1, Status::OK(), {PageStatus::kOk, PageStatus::kOk});
  EXPECT_EQ(t.ArrivedPages(*op), 0);  // batch 0 is still running
  EXPECT_FALSE(t.IsDone(*op));
  t.CompleteBatch(*op, 0, Status::OK(), {PageStatus::kOk, PageStatus::kOk});
  EXPECT_EQ(t.ArrivedPages(*op), 4);
  EXPECT_FALSE(t.IsDone(*op));
  t.CompleteBatch(*op, 2, Status::OK(), {PageStatus::kOk, PageStatus::kAbsent});
  EXPECT_EQ(t.ArrivedPages(*op), 5);
  EXPECT_TRUE(t.IsDone(*op));
  std::vector<PageStatus> pages;
  std::vector<uint8_t> batches;
  Status st;
  t.Snapshot(*op, &pages, &batches, &st);
  EXPECT_TRUE(st.ok());
  EXPECT_EQ(pages[5], PageStatus::kAbsent);
  EXPECT_EQ(batches, (std::vector<uint8_t>{1, 1, 1}));
}

TEST(CopyTrackerTest, ShortBatchResultsLeaveTheOtherPagesSkipped) {
  CopyTracker t;
  auto op = StorageOp(3, 3);
  t.Add(op);
  t.CompleteBatch(*op, 0, Status::Unavailable("queue full"), {PageStatus::kOk});
  std::vector<PageStatus> pages;
  std::vector<uint8_t> batches;
  Status st;
  t.Snapshot(*op, &pages, &batches, &st);
  EXPECT_EQ(st.code(), StatusCode::kUnavailable);
  EXPECT_EQ(pages,
            (std::vector<PageStatus>{PageStatus::kOk, PageStatus::kSkipped, PageStatus::kSkipped}));
  EXPECT_EQ(t.ArrivedPages(*op), 1);
}

TEST(CopyTrackerTest, WaitReturnsWhenAnotherThreadCompletes) {
  CopyTracker t;
  auto op = std::make_shared<CopyOp>();
  t.Add(op);
  EXPECT_FALSE(t.WaitUntil(*op, Clock::now() + std::chrono::milliseconds(5)));
  std::thread worker([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    t.Complete(*op, Status::OK());
  });
  t.Wait(*op);
  EXPECT_TRUE(t.IsDone(*op));
  worker.join();
  EXPECT_TRUE(t.WaitUntil(*op, Clock::now()));  // completed: no wait
}

TEST(CopyTrackerTest, WaitUntilReturnsTrueWhenABatchCompletesTheOp) {
  CopyTracker t;
  auto op = StorageOp(2, 1);
  t.Add(op);
  std::thread worker([&] {
    t.CompleteBatch(*op, 0, Status::OK(), {PageStatus::kOk});
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    t.CompleteBatch(*op, 1, Status::OK(), {PageStatus::kOk});
  });
  EXPECT_TRUE(t.WaitUntil(*op, Clock::now() + std::chrono::seconds(30)));
  worker.join();
  EXPECT_EQ(t.ArrivedPages(*op), 2);
}

// WaitArrival (a streamed LoadBack): returns when the arrived prefix grows past what the caller
// saw, or when it can no longer grow (the batch after it completed without its first page, every
// batch completed, the op abandoned), or at the deadline; a batch that completes after a gap
// does not wake it.
TEST(CopyTrackerTest, WaitArrivalWakesOnPrefixGrowthOrFinalityOnly) {
  CopyTracker t;
  const std::vector<PageStatus> ok(2, PageStatus::kOk);
  auto op = StorageOp(6, 2);  // batches 0, 1, 2
  t.CompleteBatch(*op, 1, Status::OK(), ok);
  // Batch 1 is in, batch 0 is not: nothing arrived, and the wait runs to its deadline.
  CopyTracker::Arrival a = t.WaitArrival(*op, 0, Clock::now() + std::chrono::milliseconds(20));
  EXPECT_EQ(a.pages, 0);
  EXPECT_FALSE(a.final);
  std::thread batch0([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    t.CompleteBatch(*op, 0, Status::OK(), ok);
  });
  a = t.WaitArrival(*op, 0, Clock::time_point::max());
  batch0.join();
  EXPECT_EQ(a.pages, 4);  // batches 0 and 1
  EXPECT_FALSE(a.final);
  // Batch 2 misses its first page: the prefix ends at 4, for good.
  t.CompleteBatch(*op, 2, Status::OK(), {PageStatus::kAbsent, PageStatus::kOk});
  a = t.WaitArrival(*op, 4, Clock::time_point::max());
  EXPECT_EQ(a.pages, 4);
  EXPECT_TRUE(a.final);

  auto abandoned = StorageOp(4, 2);
  std::thread conclude([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    t.Abandon(*abandoned);
  });
  a = t.WaitArrival(*abandoned, 0, Clock::time_point::max());
  conclude.join();
  EXPECT_EQ(a.pages, 0);
  EXPECT_TRUE(a.final);

  auto whole = StorageOp(4, 2);
  t.CompleteBatch(*whole, 0, Status::OK(), ok);
  t.CompleteBatch(*whole, 1, Status::OK(), ok);
  a = t.WaitArrival(*whole, 4, Clock::time_point::max());
  EXPECT_EQ(a.pages, 4);
  EXPECT_TRUE(a.final);
}

TEST(CopyTrackerTest, ReapKeepsLaterCompletedOpsVisibleAndTakesOpsAddedMeanwhileNextTime) {
  CopyTracker t;
  std::vector<std::shared_ptr<CopyOp>> ops;
  for (int i = 0; i < 3; ++i) {
    ops.push_back(std::make_shared<CopyOp>());
    t.Add(ops.back());
    t.Complete(*ops.back(), Status::OK());
  }
  auto running = std::make_shared<CopyOp>();
  t.Add(running);
  std::vector<std::shared_ptr<CopyOp>> reaped;
  std::vector<size_t> visible;  // ops ForEachOp sees while each is reaped
  t.Reap([&](const std::shared_ptr<CopyOp>& op) {
    reaped.push_back(op);
    size_t n = 0;
    t.ForEachOp([&](const std::shared_ptr<CopyOp>& seen) {
      EXPECT_NE(seen, op);  // the one being reaped is handed over, not listed twice
      ++n;
    });
    visible.push_back(n);
    if (op == ops[0]) t.Add(op);  // handed back (as an unconcluded prefetch is)
  });
  EXPECT_EQ(reaped, ops);
  // While ops[0] is reaped: ops[1], ops[2] and `running`; then ops[0] is back in the list.
  EXPECT_EQ(visible, (std::vector<size_t>{3, 3, 2}));
  ASSERT_EQ(t.ops().size(), 2u);
  size_t after = 0;
  t.ForEachOp([&](const std::shared_ptr<CopyOp>&) { ++after; });
  EXPECT_EQ(after, 2u);
  std::vector<std::shared_ptr<CopyOp>> again;
  t.Reap([&](const std::shared_ptr<CopyOp>& op) { again.push_back(op); });
  EXPECT_EQ(again, (std::vector<std::shared_ptr<CopyOp>>{ops[0]}));  // completed already
  EXPECT_EQ(t.ops().size(), 1u);
}

}  // namespace
}  // namespace kvtier
