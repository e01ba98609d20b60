// Tests of util/prometheus_text: the exact exposition text (HELP/TYPE lines, escaping, counters,
// gauges, cumulative histogram buckets), every misuse the writer refuses, and AtomicHistogram's
// bucket rules and its monotonic snapshots while four threads observe.
#include "util/prometheus_text.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <thread>
#include <vector>

namespace kvtier::util {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

std::string FinishOk(PrometheusTextWriter&& w) {
  Result<std::string> text = std::move(w).Finish();
  EXPECT_TRUE(text.ok()) << text.status().ToString();
  return text.ok() ? *text : std::string();
}

TEST(PrometheusTextWriter, CountersAndGaugesWithLabels) {
  PrometheusTextWriter w;
  w.BeginFamily("kvtier:cached_tokens_total", MetricType::kCounter, "Tokens served from cache.");
  w.AddSample({{"cache_source", "device"}}, int64_t{12});
  w.AddSample({{"cache_source", "host"}}, uint64_t{18446744073709551615u});
  w.Gauge("kvtier:hicache_host_used_tokens", "Host tokens in use.", 7);
  w.Counter("kvtier:load_back_seconds_total", "Seconds.", 0.25);
  w.BeginFamily("kvtier:ratio", MetricType::kGauge, "Two labels, odd values.");
  w.AddSample({{"a", "x"}, {"b", "y"}}, kInf);
  w.AddSample({{"a", "z"}}, -kInf);
  w.AddSample({}, kNaN);
  w.AddSample({}, 1e-5);
  EXPECT_EQ(FinishOk(std::move(w)),
            "# HELP kvtier:cached_tokens_total Tokens served from cache.\n"
            "# TYPE kvtier:cached_tokens_total counter\n"
            "kvtier:cached_tokens_total{cache_source=\"device\"} 12\n"
            "kvtier:cached_tokens_total{cache_source=\"host\"} 18446744073709551615\n"
            "# HELP kvtier:hicache_host_used_tokens Host tokens in use.\n"
            "# TYPE kvtier:hicache_host_used_tokens gauge\n"
            "kvtier:hicache_host_used_tokens 7\n"
            "# HELP kvtier:load_back_seconds_total Seconds.\n"
            "# TYPE kvtier:load_back_seconds_total counter\n"
            "kvtier:load_back_seconds_total 0.25\n"
            "# HELP kvtier:ratio Two labels, odd values.\n"
            "# TYPE kvtier:ratio gauge\n"
            "kvtier:ratio{a=\"x\",b=\"y\"} +Inf\n"
            "kvtier:ratio{a=\"z\"} -Inf\n"
            "kvtier:ratio NaN\n"
            "kvtier:ratio 1e-05\n");
}

TEST(PrometheusTextWriter, EscapesLabelValuesAndHelp) {
  PrometheusTextWriter w;
  w.BeginFamily("x", MetricType::kGauge, "line one\nback\\slash \"quotes\" stay");
  w.AddSample({{"path", "C:\\dir\n\"q\""}}, 1);
  EXPECT_EQ(FinishOk(std::move(w)),
            "# HELP x line one\\nback\\\\slash \"quotes\" stay\n"
            "# TYPE x gauge\n"
            "x{path=\"C:\\\\dir\\n\\\"q\\\"\"} 1\n");
}

TEST(PrometheusTextWriter, HistogramBucketsAreCumulativeAndEndAtInf) {
  const std::vector<double> bounds = {0.001, 0.01, 1};
  AtomicHistogram h(bounds);
  for (double v : {0.0005, 0.001, 0.002, 0.5, 1.0, 3.0, kInf}) h.Observe(v);
  h.Observe(kNaN);  // ignored
  PrometheusTextWriter w;
  w.BeginFamily("kvtier:load_back_duration_seconds", MetricType::kHistogram, "LoadBack time.");
  w.AddHistogram({{"tier", "host"}}, h.Snapshot());
  w.AddHistogram({}, AtomicHistogram(bounds).Snapshot());
  EXPECT_EQ(FinishOk(std::move(w)),
            "# HELP kvtier:load_back_duration_seconds LoadBack time.\n"
            "# TYPE kvtier:load_back_duration_seconds histogram\n"
            "kvtier:load_back_duration_seconds_bucket{tier=\"host\",le=\"0.001\"} 2\n"
            "kvtier:load_back_duration_seconds_bucket{tier=\"host\",le=\"0.01\"} 3\n"
            "kvtier:load_back_duration_seconds_bucket{tier=\"host\",le=\"1\"} 5\n"
            "kvtier:load_back_duration_seconds_bucket{tier=\"host\",le=\"+Inf\"} 7\n"
            "kvtier:load_back_duration_seconds_sum{tier=\"host\"} +Inf\n"
            "kvtier:load_back_duration_seconds_count{tier=\"host\"} 7\n"
            "kvtier:load_back_duration_seconds_bucket{le=\"0.001\"} 0\n"
            "kvtier:load_back_duration_seconds_bucket{le=\"0.01\"} 0\n"
            "kvtier:load_back_duration_seconds_bucket{le=\"1\"} 0\n"
            "kvtier:load_back_duration_seconds_bucket{le=\"+Inf\"} 0\n"
            "kvtier:load_back_duration_seconds_sum 0\n"
            "kvtier:load_back_duration_seconds_count 0\n");
}

TEST(AtomicHistogram, ValueOnABoundCountsInThatBucketAndSumAddsUp) {
  const std::vector<double> bounds = {1, 2, 4};
  AtomicHistogram h(bounds);
  for (double v : {-3.0, 1.0, 1.5, 2.0, 4.0, 4.5}) h.Observe(v);
  const HistogramSnapshot s = h.Snapshot();
  EXPECT_EQ(s.cumulative_counts, (std::vector<uint64_t>{2, 4, 5, 6}));
  EXPECT_EQ(s.count(), 6u);
  EXPECT_DOUBLE_EQ(s.sum, 10.0);
  EXPECT_EQ(s.upper_bounds, bounds);
}

// Each misuse is refused with a message naming it, and Finish returns no text.
TEST(PrometheusTextWriter, RefusesMisuse) {
  struct Case {
    const char* what;
    void (*write)(PrometheusTextWriter&);
    const char* message;
  };
  const std::vector<double> bounds = {1, 2};
  static AtomicHistogram histogram(bounds);
  const Case cases[] = {
      {"bad metric name", [](PrometheusTextWriter& w) { w.Gauge("9lives", "", 1); }, "9lives"},
      {"space in name", [](PrometheusTextWriter& w) { w.Gauge("a b", "", 1); }, "a b"},
      {"counter without _total", [](PrometheusTextWriter& w) { w.Counter("kvtier:hits", "", 1); },
       "_total"},
      {"family twice",
       [](PrometheusTextWriter& w) {
         w.Gauge("g", "", 1);
         w.Gauge("g", "", 2);
       },
       "twice"},
      {"sample before family", [](PrometheusTextWriter& w) { w.AddSample({}, 1); }, "before"},
      {"negative counter", [](PrometheusTextWriter& w) { w.Counter("c_total", "", -1); },
       "negative"},
      {"NaN counter", [](PrometheusTextWriter& w) { w.Counter("c_total", "", kNaN); }, "NaN"},
      {"histogram series in a counter",
       [](PrometheusTextWriter& w) {
         w.BeginFamily("c_total", MetricType::kCounter, "");
         w.AddHistogram({}, histogram.Snapshot());
       },
       "is a counter"},
      {"plain sample in a histogram",
       [](PrometheusTextWriter& w) {
         w.BeginFamily("h", MetricType::kHistogram, "");
         w.AddSample({}, 1);
       },
       "is a histogram"},
      {"histogram name with a reserved suffix",
       [](PrometheusTextWriter& w) { w.BeginFamily("h_count", MetricType::kHistogram, ""); },
       "_count"},
      {"le label on a histogram",
       [](PrometheusTextWriter& w) {
         w.BeginFamily("h", MetricType::kHistogram, "");
         w.AddHistogram({{"le", "1"}}, histogram.Snapshot());
       },
       "'le'"},
      {"bad label name",
       [](PrometheusTextWriter& w) {
         w.BeginFamily("g", MetricType::kGauge, "");
         w.AddSample({{"cache-source", "x"}}, 1);
       },
       "cache-source"},
      {"reserved label name",
       [](PrometheusTextWriter& w) {
         w.BeginFamily("g", MetricType::kGauge, "");
         w.AddSample({{"__name__", "x"}}, 1);
       },
       "__name__"},
      {"label twice",
       [](PrometheusTextWriter& w) {
         w.BeginFamily("g", MetricType::kGauge, "");
         w.AddSample({{"a", "x"}, {"a", "y"}}, 1);
       },
       "twice"},
      {"unsorted bounds",
       [](PrometheusTextWriter& w) {
         const double bad[] = {2, 1};
         w.BeginFamily("h", MetricType::kHistogram, "");
         w.AddHistogram({}, AtomicHistogram(bad).Snapshot());
       },
       "not above"},
      {"counts that are not cumulative",
       [](PrometheusTextWriter& w) {
         w.BeginFamily("h", MetricType::kHistogram, "");
         w.AddHistogram({}, HistogramSnapshot{{1}, {3, 2}, 0});
       },
       "cumulative"},
      {"count vector of the wrong size",
       [](PrometheusTextWriter& w) {
         w.BeginFamily("h", MetricType::kHistogram, "");
         w.AddHistogram({}, HistogramSnapshot{{1, 2}, {3}, 0});
       },
       "+Inf needs one more"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    PrometheusTextWriter w;
    c.write(w);
    w.Gauge("after_the_error", "", 1);  // ignored once an error is recorded
    EXPECT_TRUE(w.status().IsInvalidArgument());
    EXPECT_NE(w.status().message().find(c.message), std::string::npos) << w.status().message();
    Result<std::string> text = std::move(w).Finish();
    EXPECT_FALSE(text.ok());
  }
}

TEST(CheckHistogramBounds, NamesTheOffendingBound) {
  EXPECT_TRUE(CheckHistogramBounds(std::vector<double>{0.1, 1, 10}).ok());
  EXPECT_TRUE(CheckHistogramBounds(std::vector<double>{}).IsInvalidArgument());
  Status s = CheckHistogramBounds(std::vector<double>{1, kInf});
  EXPECT_NE(s.message().find("[1] = +Inf"), std::string::npos) << s.message();
  s = CheckHistogramBounds(std::vector<double>{1, 1});
  EXPECT_NE(s.message().find("[1] = 1 is not above"), std::string::npos) << s.message();
  EXPECT_FALSE(CheckHistogramBounds(std::vector<double>{kNaN}).ok());
}

// Four threads observe while the main thread takes snapshots: every bucket of every snapshot is
// at least its value in the previous one, and at the end every observation is counted exactly.
TEST(AtomicHistogram, ConcurrentObserversAndSnapshotsStayMonotonic) {
  const std::vector<double> bounds = {1, 10, 100};
  AtomicHistogram h(bounds);
  constexpr int kThreads = 4;
  constexpr int kPerThread = 20000;
  std::atomic<int> running{kThreads};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kPerThread; ++i) h.Observe(static_cast<double>((i + t) % 200));
      running.fetch_sub(1);
    });
  }
  HistogramSnapshot previous = h.Snapshot();
  int snapshots = 0;
  while (running.load() > 0 || snapshots < 10) {
    HistogramSnapshot s = h.Snapshot();
    for (size_t i = 0; i < s.cumulative_counts.size(); ++i) {
      ASSERT_GE(s.cumulative_counts[i], previous.cumulative_counts[i]) << "bucket " << i;
      if (i > 0) {
        ASSERT_GE(s.cumulative_counts[i], s.cumulative_counts[i - 1]);
      }
    }
    PrometheusTextWriter w;
    w.BeginFamily("h", MetricType::kHistogram, "");
    w.AddHistogram({}, s);
    ASSERT_TRUE(w.status().ok()) << w.status().ToString();
    previous = std::move(s);
    ++snapshots;
  }
  for (auto& t : threads) t.join();
  const HistogramSnapshot s = h.Snapshot();
  // Per thread, values (i + t) % 200 for i < 20000: each residue 100 times.
  // <= 1: residues 0, 1; <= 10: 0..10; <= 100: 0..100; all: 200 residues.
  EXPECT_EQ(s.cumulative_counts,
            (std::vector<uint64_t>{kThreads * 2 * 100, kThreads * 11 * 100, kThreads * 101 * 100,
                                   kThreads * kPerThread}));
  EXPECT_DOUBLE_EQ(s.sum, kThreads * 100.0 * (199.0 * 200.0 / 2.0));
}

}  // namespace
}  // namespace kvtier::util
