// Prometheus text exposition and AtomicHistogram (see prometheus_text.h). Thread safety: there.
#include "util/prometheus_text.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <utility>

namespace kvtier::util {
namespace {

bool IsNameStart(char c, bool allow_colon) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || (allow_colon && c == ':');
}
bool IsNameChar(char c, bool allow_colon) {
  return IsNameStart(c, allow_colon) || (c >= '0' && c <= '9');
}

bool IsValidName(std::string_view name, bool allow_colon) {
  if (name.empty() || !IsNameStart(name[0], allow_colon)) return false;
  return std::all_of(name.begin() + 1, name.end(),
                     [&](char c) { return IsNameChar(c, allow_colon); });
}

// Go's strconv.ParseFloat spellings, which every Prometheus parser accepts; finite values in the
// shortest form that reads back exactly.
std::string FormatDouble(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  return fmt::format("{}", value);
}

// Backslash and line feed are escaped, and with `quote` (label values; help text keeps them)
// the double quote.
void AppendEscaped(std::string& out, std::string_view text, bool quote) {
  for (char c : text) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '"' && quote) {
      out += "\\\"";
    } else {
      out += c;
    }
  }
}

}  // namespace

const char* MetricTypeName(MetricType type) {
  switch (type) {
    case MetricType::kCounter:
      return "counter";
    case MetricType::kGauge:
      return "gauge";
    case MetricType::kHistogram:
      return "histogram";
  }
  return "untyped";
}

Status CheckHistogramBounds(std::span<const double> bounds) {
  if (bounds.empty()) {
    return Status::InvalidArgument("a histogram needs at least one finite bucket bound");
  }
  for (size_t i = 0; i < bounds.size(); ++i) {
    if (!std::isfinite(bounds[i])) {
      return Status::InvalidArgument(
          fmt::format("histogram bound [{}] = {} is not finite", i, FormatDouble(bounds[i])));
    }
    if (i > 0 && !(bounds[i] > bounds[i - 1])) {
      return Status::InvalidArgument(
          fmt::format("histogram bound [{}] = {} is not above bound [{}] = {}", i,
                      FormatDouble(bounds[i]), i - 1, FormatDouble(bounds[i - 1])));
    }
  }
  return Status::OK();
}

// ---- AtomicHistogram -----------------------------------------------------------------------

AtomicHistogram::AtomicHistogram(std::span<const double> upper_bounds)
    : upper_bounds_(upper_bounds.begin(), upper_bounds.end()),
      counts_(std::make_unique<std::atomic<uint64_t>[]>(upper_bounds.size() + 1)) {}

void AtomicHistogram::Observe(double value) {
  if (std::isnan(value)) return;
  // First bound >= value; a linear scan beats a binary search over the few bounds used here and
  // stays correct for unsorted bounds (which the writer refuses anyway).
  size_t bucket = 0;
  while (bucket < upper_bounds_.size() && value > upper_bounds_[bucket]) ++bucket;
  counts_[bucket].fetch_add(1, std::memory_order_relaxed);
  sum_.fetch_add(value, std::memory_order_relaxed);
}

HistogramSnapshot AtomicHistogram::Snapshot() const {
  HistogramSnapshot s;
  s.upper_bounds = upper_bounds_;
  s.cumulative_counts.resize(upper_bounds_.size() + 1);
  uint64_t running = 0;
  for (size_t i = 0; i <= upper_bounds_.size(); ++i) {
    running += counts_[i].load(std::memory_order_relaxed);
    s.cumulative_counts[i] = running;
  }
  s.sum = sum_.load(std::memory_order_relaxed);
  return s;
}

// ---- PrometheusTextWriter ------------------------------------------------------------------

void PrometheusTextWriter::Fail(std::string message) {
  if (status_.ok()) status_ = Status::InvalidArgument(message);
}

void PrometheusTextWriter::BeginFamily(std::string_view name, MetricType type,
                                       std::string_view help) {
  if (!status_.ok()) return;
  if (!IsValidName(name, /*allow_colon=*/true)) {
    return Fail(fmt::format("metric name '{}' is not [a-zA-Z_:][a-zA-Z0-9_:]*", name));
  }
  if (type == MetricType::kCounter && !name.ends_with("_total")) {
    return Fail(fmt::format("counter '{}' must be named <name>_total", name));
  }
  if (type == MetricType::kHistogram &&
      (name.ends_with("_bucket") || name.ends_with("_sum") || name.ends_with("_count"))) {
    return Fail(fmt::format("histogram '{}' must not end in _bucket, _sum or _count", name));
  }
  if (std::find(families_.begin(), families_.end(), name) != families_.end()) {
    return Fail(fmt::format("metric family '{}' is written twice", name));
  }
  families_.emplace_back(name);
  family_ = std::string(name);
  type_ = type;
  text_ += "# HELP ";
  text_ += name;
  text_ += ' ';
  AppendEscaped(text_, help, /*quote=*/false);
  text_ += "\n# TYPE ";
  text_ += name;
  text_ += ' ';
  text_ += MetricTypeName(type);
  text_ += '\n';
}

bool PrometheusTextWriter::CheckSample(std::span<const MetricLabel> labels, bool histogram_series) {
  if (!status_.ok()) return false;
  if (family_.empty()) {
    Fail("a sample was added before any BeginFamily");
    return false;
  }
  if (histogram_series != (type_ == MetricType::kHistogram)) {
    Fail(fmt::format("metric '{}' is a {}; a {} was added to it", family_, MetricTypeName(type_),
                     histogram_series ? "histogram series" : "plain sample"));
    return false;
  }
  for (size_t i = 0; i < labels.size(); ++i) {
    const std::string_view name = labels[i].name;
    if (!IsValidName(name, /*allow_colon=*/false) || name.starts_with("__")) {
      Fail(
          fmt::format("label name '{}' of metric '{}' is not [a-zA-Z_][a-zA-Z0-9_]* or starts "
                      "with the reserved '__'",
                      name, family_));
      return false;
    }
    if (histogram_series && name == "le") {
      Fail(fmt::format("histogram '{}' has a label named 'le', which its buckets use", family_));
      return false;
    }
    for (size_t j = 0; j < i; ++j) {
      if (labels[j].name == name) {
        Fail(fmt::format("label '{}' appears twice in a sample of metric '{}'", name, family_));
        return false;
      }
    }
  }
  return true;
}

void PrometheusTextWriter::WriteLine(std::string_view suffix, std::span<const MetricLabel> labels,
                                     std::string_view le, std::string_view value) {
  text_ += family_;
  text_ += suffix;
  if (!labels.empty() || !le.empty()) {
    text_ += '{';
    bool first = true;
    for (const MetricLabel& label : labels) {
      if (!first) text_ += ',';
      first = false;
      text_ += label.name;
      text_ += "=\"";
      AppendEscaped(text_, label.value, /*quote=*/true);
      text_ += '"';
    }
    if (!le.empty()) {
      if (!first) text_ += ',';
      text_ += "le=\"";
      text_ += le;
      text_ += '"';
    }
    text_ += '}';
  }
  text_ += ' ';
  text_ += value;
  text_ += '\n';
}

void PrometheusTextWriter::AddIntSample(std::span<const MetricLabel> labels, int64_t value) {
  if (!CheckSample(labels, /*histogram_series=*/false)) return;
  if (type_ == MetricType::kCounter && value < 0) {
    return Fail(fmt::format("counter '{}' has the negative value {}", family_, value));
  }
  WriteLine("", labels, "", fmt::format("{}", value));
}

void PrometheusTextWriter::AddUintSample(std::span<const MetricLabel> labels, uint64_t value) {
  if (!CheckSample(labels, /*histogram_series=*/false)) return;
  WriteLine("", labels, "", fmt::format("{}", value));
}

void PrometheusTextWriter::AddDoubleSample(std::span<const MetricLabel> labels, double value) {
  if (!CheckSample(labels, /*histogram_series=*/false)) return;
  if (type_ == MetricType::kCounter && !(value >= 0)) {
    return Fail(fmt::format("counter '{}' has the value {}; counters are >= 0", family_,
                            FormatDouble(value)));
  }
  WriteLine("", labels, "", FormatDouble(value));
}

void PrometheusTextWriter::AddHistogram(std::span<const MetricLabel> labels,
                                        const HistogramSnapshot& snapshot) {
  if (!CheckSample(labels, /*histogram_series=*/true)) return;
  if (Status s = CheckHistogramBounds(snapshot.upper_bounds); !s.ok()) {
    return Fail(fmt::format("histogram '{}': {}", family_, s.message()));
  }
  if (snapshot.cumulative_counts.size() != snapshot.upper_bounds.size() + 1) {
    return Fail(fmt::format("histogram '{}' has {} counts for {} bounds (+Inf needs one more)",
                            family_, snapshot.cumulative_counts.size(),
                            snapshot.upper_bounds.size()));
  }
  if (!std::is_sorted(snapshot.cumulative_counts.begin(), snapshot.cumulative_counts.end())) {
    return Fail(fmt::format("histogram '{}' has bucket counts that are not cumulative", family_));
  }
  for (size_t i = 0; i < snapshot.upper_bounds.size(); ++i) {
    WriteLine("_bucket", labels, FormatDouble(snapshot.upper_bounds[i]),
              fmt::format("{}", snapshot.cumulative_counts[i]));
  }
  WriteLine("_bucket", labels, "+Inf", fmt::format("{}", snapshot.count()));
  WriteLine("_sum", labels, "", FormatDouble(snapshot.sum));
  WriteLine("_count", labels, "", fmt::format("{}", snapshot.count()));
}

Result<std::string> PrometheusTextWriter::Finish() && {
  if (!status_.ok()) return status_;
  return std::move(text_);
}

}  // namespace kvtier::util
