// The ideal of a replay run (IdealTtft) on two requests whose ideal TTFTs are computed by hand:
// host hits charged at the host -> device ceiling, storage hits at the slower of that copy and
// the storage read less the part hidden behind queueing or the run's prefetch lead.
#include "replay_ideal.h"

#include <gtest/gtest.h>

#include <vector>

#include "replay_report.h"
#include "replay_timeline.h"

namespace kvtier::tools {
namespace {

constexpr int64_t kTokenBytes = 1000;  // a token's KV: 1000 tokens = 1 MB
constexpr double kPcie = 1e9;          // host -> device: 1 MB a ms

RequestRecord Request(int64_t host_hit, int64_t storage_hit, double compute_ms,
                      double prefetch_lead_ms = 0) {
  RequestRecord r;
  r.host_hit = host_hit;
  r.storage_hit = storage_hit;
  r.compute_ms = compute_ms;
  r.prefetch_lead_ms = prefetch_lead_ms;
  return r;
}

TEST(ReplayIdealTest, HostHitsAreChargedAtTheCeilingOverlappedWithCompute) {
  // Request 0: 3000 host-hit tokens = 3 MB at 1 MB/ms = 3 ms, compute 1 ms: service 3 ms.
  // Request 1 arrives at 1, 1000 host-hit tokens (1 ms) and compute 2 ms: starts at 3 (behind
  // request 0), service 2 ms, ends at 5: TTFT 4 ms.
  const std::vector<RequestRecord> records = {Request(3000, 0, 1), Request(1000, 0, 2)};
  const std::vector<double> ideal =
      IdealTtft(Timeline(std::vector<double>{0, 1}), records, kTokenBytes, kPcie, /*storage=*/0);
  ASSERT_EQ(ideal.size(), 2u);
  EXPECT_DOUBLE_EQ(ideal[0], 3);
  EXPECT_DOUBLE_EQ(ideal[1], 4);
}

TEST(ReplayIdealTest, HalvingTheCeilingDoublesTheCopy) {
  // 3 ms of copy at 1 MB/ms become 6 ms at 0.5 MB/ms (compute 1 ms stays hidden).
  const std::vector<RequestRecord> records = {Request(3000, 0, 1)};
  EXPECT_DOUBLE_EQ(
      IdealTtft(Timeline(std::vector<double>{0}), records, kTokenBytes, kPcie / 2, 0)[0], 6);
}

TEST(ReplayIdealTest, StorageReadIsHiddenBehindQueueingAndThePrefetchLead) {
  // Storage read at 0.5 MB/ms: 2000 storage-hit tokens = 2 MB read in 4 ms, copied in 2 ms.
  // Request 0 (0 ms queueing, no lead): load max(2, 4 - 0) = 4 ms > compute 1: ends at 4.
  // Request 1 arrives at 1 and starts at 4: 3 ms of queueing hide 3 ms of its read: load
  // max(2, 4 - 3) = 2 ms, compute 1: ends at 6, TTFT 5.
  // Request 2 arrives at 6 (idle device, no queueing) with a measured prefetch lead of 3.5 ms:
  // load max(2, 4 - 3.5) = 2 ms: ends at 8, TTFT 2.
  const std::vector<RequestRecord> records = {Request(0, 2000, 1), Request(0, 2000, 1),
                                              Request(0, 2000, 1, /*prefetch_lead_ms=*/3.5)};
  const std::vector<double> ideal =
      IdealTtft(Timeline(std::vector<double>{0, 1, 6}), records, kTokenBytes, kPcie, 0.5e9);
  ASSERT_EQ(ideal.size(), 3u);
  EXPECT_DOUBLE_EQ(ideal[0], 4);
  EXPECT_DOUBLE_EQ(ideal[1], 5);
  EXPECT_DOUBLE_EQ(ideal[2], 2);
}

TEST(ReplayIdealTest, WithoutAStorageCeilingStorageHitsMoveAtTheHostCeiling) {
  // storage <= 0: 2000 storage-hit tokens cost their 2 ms copy only.
  const std::vector<RequestRecord> records = {Request(0, 2000, 1)};
  EXPECT_DOUBLE_EQ(IdealTtft(Timeline(std::vector<double>{0}), records, kTokenBytes, kPcie, 0)[0],
                   2);
}

TEST(ReplayIdealTest, NoHitsCostTheComputeAlone) {
  const std::vector<RequestRecord> records = {Request(0, 0, 7.5)};
  EXPECT_DOUBLE_EQ(
      IdealTtft(Timeline(std::vector<double>{0}), records, kTokenBytes, kPcie, 0.5e9)[0], 7.5);
}

}  // namespace
}  // namespace kvtier::tools
