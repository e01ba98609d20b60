// The replay report's statistics on data whose answers are known: percentiles with linear
// interpolation between order statistics, and the paired bootstrap interval of a quantile ratio
// (a fixed seed: the same records give the same report).
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <vector>

#include "replay_report.h"

namespace kvtier::tools {
namespace {

TEST(ReplayStatisticsTest, PercentilesOfOneToOneHundredAndOne) {
  // 101 values 1..101, shuffled: position q * 100 of the sorted values, so p50 = 51, p90 = 91,
  // p99 = 100; mean 51.
  std::vector<double> v;
  for (int i = 1; i <= 101; ++i) v.push_back(i);
  std::shuffle(v.begin(), v.end(), std::mt19937(7));
  const Percentiles p = PercentilesOf(v);
  EXPECT_DOUBLE_EQ(p.p50, 51);
  EXPECT_DOUBLE_EQ(p.p90, 91);
  EXPECT_DOUBLE_EQ(p.p99, 100);
  EXPECT_DOUBLE_EQ(p.mean, 51);
}

TEST(ReplayStatisticsTest, PercentilesInterpolateBetweenTwoValues) {
  const Percentiles p = PercentilesOf({10, 0});
  EXPECT_DOUBLE_EQ(p.p50, 5);
  EXPECT_DOUBLE_EQ(p.p90, 9);
  EXPECT_DOUBLE_EQ(p.p99, 9.9);
  EXPECT_DOUBLE_EQ(p.mean, 5);
}

TEST(ReplayStatisticsTest, PercentilesOfNothingAreZero) {
  const Percentiles p = PercentilesOf({});
  EXPECT_EQ(p.p50, 0);
  EXPECT_EQ(p.p99, 0);
  EXPECT_EQ(p.mean, 0);
}

TEST(ReplayStatisticsTest, RatioOfProportionalRequestsHasNoSpread) {
  // Every request twice as slow: every resample's ratio is 2, so the interval is [2, 2].
  std::vector<double> den, num;
  for (int i = 1; i <= 50; ++i) {
    den.push_back(i * 1.5);
    num.push_back(i * 3.0);
  }
  const Interval r = QuantileRatio(num, den, 0.5);
  EXPECT_EQ(r.requests, 50);
  EXPECT_DOUBLE_EQ(r.value, 2);
  EXPECT_DOUBLE_EQ(r.lo, 2);
  EXPECT_DOUBLE_EQ(r.hi, 2);
}

TEST(ReplayStatisticsTest, BootstrapIntervalOfAMedianWithOneOutlier) {
  // num = {1, 1, 1, 100} over den = 1: the median ratio is 1. A resample of the 4 requests holds
  // the outlier 3 or 4 times with probability 4 (1/4)^3 (3/4) + (1/4)^4 = 5.1 % (median 100),
  // twice with 21 % (median 50.5), else its median is 1 (74 %). The middle 95 % of 1000
  // resamples therefore runs from 1 to 100.
  const Interval r = QuantileRatio({1, 1, 1, 100}, {1, 1, 1, 1}, 0.5);
  EXPECT_EQ(r.requests, 4);
  EXPECT_DOUBLE_EQ(r.value, 1);
  EXPECT_DOUBLE_EQ(r.lo, 1);
  EXPECT_DOUBLE_EQ(r.hi, 100);
  // The seed is fixed: the same records give the same interval.
  const Interval again = QuantileRatio({1, 1, 1, 100}, {1, 1, 1, 1}, 0.5);
  EXPECT_EQ(again.lo, r.lo);
  EXPECT_EQ(again.hi, r.hi);
}

TEST(ReplayStatisticsTest, BootstrapIntervalHoldsTheValue) {
  // Noisy ratios around 1.5: the interval is not empty and holds the ratio of the medians.
  std::mt19937 rng(3);
  std::uniform_real_distribution<double> u(1, 2);
  std::vector<double> num, den;
  for (int i = 0; i < 200; ++i) {
    den.push_back(10 * u(rng));
    num.push_back(15 * u(rng));
  }
  const Interval r = QuantileRatio(num, den, 0.5);
  EXPECT_LT(r.lo, r.hi);
  EXPECT_LE(r.lo, r.value);
  EXPECT_GE(r.hi, r.value);
  EXPECT_GT(r.lo, 1.2);
  EXPECT_LT(r.hi, 1.8);
}

TEST(ReplayStatisticsTest, RatioOverAZeroQuantileIsZeroAndNoRequestsGiveNothing) {
  EXPECT_DOUBLE_EQ(QuantileRatio({1, 2, 3}, {0, 0, 0}, 0.5).value, 0);
  const Interval none = QuantileRatio({}, {}, 0.5);
  EXPECT_EQ(none.requests, 0);
  EXPECT_EQ(none.value, 0);
}

}  // namespace
}  // namespace kvtier::tools
