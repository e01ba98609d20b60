// Internal: Prometheus text exposition (format 0.0.4) and a lock-free histogram to feed it.
//
// PrometheusTextWriter builds the text one metric family at a time: a `# HELP` and a `# TYPE`
// line, then the family's samples, label values and help text escaped as the format requires.
// Names follow the format's conventions, which the writer checks: metric names match
// [a-zA-Z_:][a-zA-Z0-9_:]*, label names [a-zA-Z_][a-zA-Z0-9_]* without the reserved "__" prefix,
// counter names end in "_total" (samples carry the family name), a histogram family named `x`
// writes `x_bucket{...,le="..."}` (cumulative, ending at le="+Inf"), `x_sum` and `x_count`, and
// `le` is not a label of its own. A misuse (bad name, sample of the wrong kind, a family written
// twice, a negative counter) is recorded as the first error and makes Finish() fail; nothing
// malformed is ever returned.
//
// AtomicHistogram counts observations into fixed buckets with relaxed atomic increments, so a
// hot path (a copy's completion, an eviction) can observe without taking a lock, and a reader
// takes a Snapshot() at any time without stopping observers. Each bucket's count only grows, so
// successive snapshots are monotonic; `count` is the sum of the bucket counts that snapshot read
// (the +Inf bucket equals `count` by construction), and `sum` may lag or lead those counts by the
// observations in flight at that instant.
//
// Thread safety: a PrometheusTextWriter is used by one thread. AtomicHistogram::Observe and
// Snapshot may be called from any thread at once.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "kvtier/status.h"

namespace kvtier::util {

enum class MetricType : uint8_t { kCounter, kGauge, kHistogram };
// "counter", "gauge", "histogram".
const char* MetricTypeName(MetricType type);

struct MetricLabel {
  std::string_view name;
  std::string_view value;  // any UTF-8; escaped by the writer
};

// OK when `bounds` is non-empty, finite and strictly increasing (the +Inf bucket is implicit);
// else InvalidArgument naming the first offending bound.
Status CheckHistogramBounds(std::span<const double> bounds);

struct HistogramSnapshot {
  std::vector<double> upper_bounds;         // finite, strictly increasing
  std::vector<uint64_t> cumulative_counts;  // upper_bounds.size() + 1 entries; the last is +Inf
  double sum = 0;
  uint64_t count() const { return cumulative_counts.empty() ? 0 : cumulative_counts.back(); }
};

class AtomicHistogram {
 public:
  // REQUIRES: CheckHistogramBounds(upper_bounds).ok(). (Otherwise the histogram still counts
  // safely, and the writer refuses its snapshots.)
  explicit AtomicHistogram(std::span<const double> upper_bounds);
  AtomicHistogram(const AtomicHistogram&) = delete;
  AtomicHistogram& operator=(const AtomicHistogram&) = delete;

  // Counts `value` in the first bucket whose upper bound is >= value (+Inf when none) and adds
  // it to the sum. NaN is ignored. Lock-free; never blocks.
  void Observe(double value);
  HistogramSnapshot Snapshot() const;
  std::span<const double> upper_bounds() const { return upper_bounds_; }

 private:
  const std::vector<double> upper_bounds_;
  // Per-bucket (not cumulative) counts; upper_bounds_.size() + 1 entries, the last for +Inf.
  const std::unique_ptr<std::atomic<uint64_t>[]> counts_;
  std::atomic<double> sum_{0.0};
};

class PrometheusTextWriter {
 public:
  PrometheusTextWriter() = default;
  PrometheusTextWriter(const PrometheusTextWriter&) = delete;
  PrometheusTextWriter& operator=(const PrometheusTextWriter&) = delete;

  // Starts a metric family: its `# HELP` and `# TYPE` lines. Each name once per exposition;
  // counters' names end in "_total".
  void BeginFamily(std::string_view name, MetricType type, std::string_view help);

  // One sample of the current counter or gauge family. Counter values must not be negative or
  // NaN. Integers are written exactly.
  template <typename T>
  requires std::is_arithmetic_v<T>
  void AddSample(std::span<const MetricLabel> labels, T value) {
    if constexpr (std::is_floating_point_v<T>) {
      AddDoubleSample(labels, static_cast<double>(value));
    } else if constexpr (std::is_signed_v<T>) {
      AddIntSample(labels, static_cast<int64_t>(value));
    } else {
      AddUintSample(labels, static_cast<uint64_t>(value));
    }
  }
  template <typename T>
  requires std::is_arithmetic_v<T>
  void AddSample(std::initializer_list<MetricLabel> labels, T value) {
    AddSample(std::span<const MetricLabel>(labels.begin(), labels.size()), value);
  }

  // One labelled series of the current histogram family.
  void AddHistogram(std::span<const MetricLabel> labels, const HistogramSnapshot& snapshot);
  void AddHistogram(std::initializer_list<MetricLabel> labels, const HistogramSnapshot& snapshot) {
    AddHistogram(std::span<const MetricLabel>(labels.begin(), labels.size()), snapshot);
  }

  // A family with one unlabelled sample.
  template <typename T>
  void Counter(std::string_view name, std::string_view help, T value) {
    BeginFamily(name, MetricType::kCounter, help);
    AddSample({}, value);
  }
  template <typename T>
  void Gauge(std::string_view name, std::string_view help, T value) {
    BeginFamily(name, MetricType::kGauge, help);
    AddSample({}, value);
  }

  // OK, or the first misuse (InvalidArgument naming the metric and what is wrong).
  const Status& status() const { return status_; }
  // The exposition text, or status() when it is not OK.
  Result<std::string> Finish() &&;

 private:
  void AddIntSample(std::span<const MetricLabel> labels, int64_t value);
  void AddUintSample(std::span<const MetricLabel> labels, uint64_t value);
  void AddDoubleSample(std::span<const MetricLabel> labels, double value);
  // Checks the labels and that a family of the sample's kind is open; false (status_ set) on
  // misuse.
  bool CheckSample(std::span<const MetricLabel> labels, bool histogram_series);
  // name{labels[,le="<le>"]} <value>\n
  void WriteLine(std::string_view suffix, std::span<const MetricLabel> labels, std::string_view le,
                 std::string_view value);
  void Fail(std::string message);

  std::string text_;
  std::string family_;  // the open family's name; empty before the first
  MetricType type_ = MetricType::kCounter;
  std::vector<std::string> families_;  // every name begun so far
  Status status_;
};

}  // namespace kvtier::util
