// The replay scheduler's Timeline on requests whose arrivals and starts are computed by hand: an
// open loop queueing behind a busy device, a closed loop whose next request waits for a finished
// one, and a closed loop with decode, where a prefill pauses the decode it overlaps.
#include "replay_timeline.h"

#include <gtest/gtest.h>

#include <vector>

#include "replay.h"
#include "workload.h"

namespace kvtier::tools {
namespace {

// A workload of requests with these arrivals (ms) and output lengths.
Workload MakeWorkload(const std::vector<double>& arrivals_ms, const std::vector<int64_t>& outputs) {
  Workload w;
  for (size_t i = 0; i < arrivals_ms.size(); ++i) {
    WorkloadRequest r;
    r.arrival_ms = arrivals_ms[i];
    r.output_length = outputs[i];
    w.requests.push_back(r);
  }
  return w;
}

TEST(ReplayTimelineTest, OpenLoopQueuesBehindTheDevice) {
  // Request 0 arrives at 0 and is served for 10 ms; request 1 arrives at 5 while the device is
  // busy, starts at 10, ends at 14: TTFT 9 ms (5 queueing + 4 service).
  Timeline t(std::vector<double>{0, 5});
  EXPECT_TRUE(t.Known(1, 0));  // open loop: every arrival is known
  EXPECT_DOUBLE_EQ(t.StartOf(0), 0);
  EXPECT_DOUBLE_EQ(t.Serve(0, 10), 10);
  EXPECT_DOUBLE_EQ(t.Arrival(1), 5);
  EXPECT_DOUBLE_EQ(t.StartOf(1), 10);
  EXPECT_DOUBLE_EQ(t.Serve(1, 4) - t.Arrival(1), 9);
}

TEST(ReplayTimelineTest, OpenLoopIdleDeviceStartsAtArrivalScaledBySpeed) {
  // The workload's timestamps from its first request, divided by --speed 2: 0, 50, 150 ms.
  ReplayOptions o;
  o.speed = 2;
  Timeline t(MakeWorkload({1000, 1100, 1300}, {1, 1, 1}), o);
  EXPECT_DOUBLE_EQ(t.Arrival(0), 0);
  EXPECT_DOUBLE_EQ(t.Arrival(1), 50);
  EXPECT_DOUBLE_EQ(t.Arrival(2), 150);
  EXPECT_DOUBLE_EQ(t.Serve(0, 20), 20);
  EXPECT_DOUBLE_EQ(t.StartOf(1), 50);  // the device is idle from 20: no queueing
  EXPECT_DOUBLE_EQ(t.Serve(1, 120), 170);
  EXPECT_DOUBLE_EQ(t.StartOf(2), 170);  // 20 ms behind request 1
}

TEST(ReplayTimelineTest, SequentialRequestArrivesWhenThePreviousEnds) {
  // --sequential (a closed loop of 1): the timestamps do not matter; request i arrives when
  // request i - 1 is done, and is not known before.
  ReplayOptions o;
  o.sequential = true;
  Timeline t(MakeWorkload({0, 1, 2}, {1, 1, 1}), o);
  EXPECT_TRUE(t.Known(0, 0));
  EXPECT_FALSE(t.Known(1, 0));
  EXPECT_DOUBLE_EQ(t.Serve(0, 7), 7);
  EXPECT_TRUE(t.Known(1, 1));
  EXPECT_DOUBLE_EQ(t.Arrival(1), 7);
  EXPECT_DOUBLE_EQ(t.Serve(1, 3), 10);
  EXPECT_DOUBLE_EQ(t.Arrival(2), 10);
}

TEST(ReplayTimelineTest, ClosedLoopOfTwoQueuesTheSecondBehindTheFirst) {
  // --concurrency 2: requests 0 and 1 arrive at 0; request 1 waits for request 0's prefill
  // (TTFT 5 + 5 = 10); request 2 arrives when request 0 is done (its first token, at 5).
  ReplayOptions o;
  o.concurrency = 2;
  Timeline t(MakeWorkload({0, 0, 0}, {1, 1, 1}), o);
  EXPECT_FALSE(t.Known(2, 0));
  EXPECT_DOUBLE_EQ(t.Serve(0, 5), 5);
  EXPECT_TRUE(t.Known(2, 1));
  EXPECT_DOUBLE_EQ(t.Arrival(1), 0);
  EXPECT_DOUBLE_EQ(t.Serve(1, 5) - t.Arrival(1), 10);
  EXPECT_DOUBLE_EQ(t.Arrival(2), 5);
  EXPECT_DOUBLE_EQ(t.StartOf(2), 10);
}

TEST(ReplayTimelineTest, ClosedLoopWithDecodePausesTheDecodeDuringAPrefill) {
  // --concurrency 2, 4 ms a decoded token. Request 0 (output 3: 2 decode steps, 8 ms) is
  // prefilled 0..10, request 1 10..20: request 0's decode is paused by request 1's prefill, so it
  // runs 20..28 and request 2 arrives at 28 (18 without the pause). Request 1 (output 6: 5 steps,
  // 20 ms) decodes from 20: request 2's prefill waits for the step in progress at 28 (steps from
  // 20: 20, 24, 28), i.e. starts at 28, and runs 28..38. Request 1 decoded 8 ms before it and has
  // 12 ms left after it: done at 50, when request 3 arrives.
  ReplayOptions o;
  o.concurrency = 2;
  Timeline t(MakeWorkload({0, 0, 0, 0}, {3, 6, 1, 1}), o, /*decode_ms_per_token=*/4);
  EXPECT_DOUBLE_EQ(t.Serve(0, 10), 10);
  EXPECT_FALSE(t.Known(2, 1));  // with decode: every request before it served
  EXPECT_DOUBLE_EQ(t.Serve(1, 10), 20);
  EXPECT_TRUE(t.Known(2, 2));
  EXPECT_DOUBLE_EQ(t.Arrival(2), 28);
  EXPECT_DOUBLE_EQ(t.StartOf(2), 28);
  EXPECT_DOUBLE_EQ(t.Serve(2, 10), 38);
  EXPECT_DOUBLE_EQ(t.Arrival(3), 50);
  EXPECT_DOUBLE_EQ(t.StartOf(3), 50);
}

}  // namespace
}  // namespace kvtier::tools
