// The storage oracle (RunStorageOracle, replay_oracle.h) on hand-made request chains whose
// answers can be read off: which pages the oracle holds at each request's service, given when the
// run admitted them.
#include "replay_oracle.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

namespace kvtier::tools {
namespace {

constexpr int64_t kPage = 16;  // tokens a page

PageKey Key(uint8_t id) {
  PageKey k;
  k.bytes[0] = id;
  return k;
}

// Runs the oracle over `chains` (every page a prompt page, no warm-up, no device or host hits).
StorageOracleResult RunOracle(const std::vector<std::vector<PageKey>>& chains,
                              const AdmittedAt& admitted, int64_t capacity_pages = -1) {
  std::vector<int64_t> prompt_pages;
  for (const auto& c : chains) prompt_pages.push_back(static_cast<int64_t>(c.size()));
  const std::vector<RequestRecord> records(chains.size());
  return RunStorageOracle({}, chains, prompt_pages, records, kPage, capacity_pages, &admitted);
}

TEST(ReplayOracleTest, APageAdmittedWhileTheNextRequestIsServedCountsForItsOwnRequest) {
  const PageKey a = Key(1), b = Key(2);
  // Request 0 has A and B; the run admits them while request 1 is served; request 2 has them.
  const StorageOracleResult r = RunOracle({{a, b}, {Key(3)}, {a, b}}, {{a, 1}, {b, 1}});
  EXPECT_EQ(r.oracle_storage_hit, (std::vector<int64_t>{0, 0, 2 * kPage}));
}

TEST(ReplayOracleTest, APageAdmittedLateIsHeldFromItsAdmissionOnWhicheverRequestIsServed) {
  const PageKey a = Key(1), b = Key(2);
  // Admitted while request 2 is served (a backup planned two requests late), by then in the
  // run's store: request 3 can read it although requests 1 and 2 do not have it.
  const StorageOracleResult r =
      RunOracle({{a, b}, {Key(3)}, {Key(4)}, {a, b}}, {{a, 2}, {b, 2}, {Key(3), 1}, {Key(4), 2}});
  EXPECT_EQ(r.oracle_storage_hit, (std::vector<int64_t>{0, 0, 0, 2 * kPage}));
}

TEST(ReplayOracleTest, ARequestsOwnPagesAdmittedDuringItsServiceAreNotItsHits) {
  const PageKey a = Key(1), b = Key(2);
  // Request 1 repeats request 0's pages, admitted only while request 1 is served: no hit for 1
  // (the run wrote them after its lookup), a hit for request 2.
  const StorageOracleResult r = RunOracle({{Key(9)}, {a, b}, {a, b}}, {{a, 1}, {b, 1}});
  EXPECT_EQ(r.oracle_storage_hit, (std::vector<int64_t>{0, 0, 2 * kPage}));
}

TEST(ReplayOracleTest, PagesNeverAdmittedAreNeverHeld) {
  const PageKey a = Key(1), b = Key(2);
  const StorageOracleResult r = RunOracle({{a, b}, {a, b}}, {{a, 0}});
  EXPECT_EQ(r.oracle_storage_hit, (std::vector<int64_t>{0, kPage}));  // A only: B was refused
}

TEST(ReplayOracleTest, CapacityEvictsTheLeastRecentlyUsedChainTailFirst) {
  const PageKey a = Key(1), b = Key(2), c = Key(3);
  // Two pages of room: request 1's C pushes out the least recent of A and B, the tail B.
  const StorageOracleResult r =
      RunOracle({{a, b}, {c}, {a, b}}, {{a, 0}, {b, 0}, {c, 1}}, /*capacity_pages=*/2);
  EXPECT_EQ(r.oracle_storage_hit, (std::vector<int64_t>{0, 0, kPage}));
}

}  // namespace
}  // namespace kvtier::tools
